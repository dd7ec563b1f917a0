"""AttentionRun: the one data type that flows from extraction to metrics, roles and views.

A run holds one text's tokens and the attention of every layer and head, as float32
``[layers, heads, n, n]`` (row = query token, column = key token, rows sum to 1, or to 0 for
a fully masked row). Views and metrics take a run and nothing else; they do not care whether
it came from transformers, the from-scratch engine or a file.
"""

from __future__ import annotations

import io
import json
import unicodedata
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .pooling import pool_dense
from .views import standalone

FORMAT_VERSION = 1

# Array fields are stored as arrays in the .npz; everything else goes into one JSON header.
_ARRAY_FIELDS = ("attentions", "special_mask", "word_ids", "segment_ids")
_OPTIONAL_ARRAYS = ("norms", "value_norms", "output_norms")  # present when the run was made with norms=True


def is_punctuation(text: str) -> bool:
    """True for a token made only of Unicode punctuation or symbols ("," "." "--" "?!")."""
    text = text.strip()
    return bool(text) and all(unicodedata.category(ch)[0] in "PS" for ch in text)


def punctuation_mask(tokens: list[str], special_mask: np.ndarray) -> np.ndarray:
    """bool ``[n]``: non-special tokens that are punctuation."""
    return np.array([is_punctuation(t) and not s for t, s in zip(tokens, special_mask)], dtype=bool)


def token_units(
    word_ids: np.ndarray, special_mask: np.ndarray, segment_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Group tokens into units, one per word (per segment) and one per special token, in order of appearance.

    Returns ``(unit_of_token [n], first token of each unit [U])``.
    """
    unit_of_token = np.empty(len(word_ids), dtype=np.int64)
    first_token: list[int] = []
    key_to_unit: dict[tuple, int] = {}
    for i, (wid, is_special, segment) in enumerate(zip(word_ids.tolist(), special_mask.tolist(), segment_ids.tolist())):
        key = ("special", i) if is_special or wid < 0 else ("word", wid, segment)
        if key not in key_to_unit:
            key_to_unit[key] = len(first_token)
            first_token.append(i)
        unit_of_token[i] = key_to_unit[key]
    return unit_of_token, np.array(first_token, dtype=np.int64)


def _unit_onehot(unit_of_token: np.ndarray, num_units: int) -> np.ndarray:
    """``[B, n, U]``: 1 where token t belongs to unit u (padding tokens, -1, belong to none)."""
    batch, n = unit_of_token.shape
    onehot = np.zeros((batch, n, num_units), dtype=np.float32)
    rows, tokens = np.nonzero(unit_of_token >= 0)
    onehot[rows, tokens, unit_of_token[rows, tokens]] = 1.0
    return onehot


def word_level_attentions(
    attentions: np.ndarray,
    unit_of_token: np.ndarray,
    num_units: int,
    key_unit_of_token: np.ndarray | None = None,
    num_key_units: int | None = None,
) -> np.ndarray:
    """``[B, L, H, U, U]`` from ``[B, L, H, n, n]``: attention TO a unit sums its tokens, FROM a unit averages them.

    ``unit_of_token [B, n]`` is -1 for padding tokens; units a sentence does not have stay all zero.
    Queries and keys of different texts (cross-attention, ``[B, L, H, n_q, n_k]``): ``unit_of_token`` groups
    the queries, ``key_unit_of_token [B, n_k]`` (with ``num_key_units``) the keys.
    """
    onehot = _unit_onehot(unit_of_token, num_units)
    sizes = onehot.sum(axis=1, keepdims=True)  # [B, 1, U]
    mean_rows = np.swapaxes(onehot / np.maximum(sizes, 1.0), 1, 2)  # [B, U, n]
    key_onehot = onehot if key_unit_of_token is None else _unit_onehot(key_unit_of_token, num_key_units)
    # One small product per head (numpy runs these on one thread; a product as large as the whole batch
    # would wake BLAS threads that then compete with the model's own threads).
    return mean_rows[:, None, None] @ attentions @ key_onehot[:, None, None]


def head_indices(num_layers: int, num_heads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(layer, head)`` of every head in layer-major order: the row order of every per-head table."""
    return np.repeat(np.arange(num_layers), num_heads), np.tile(np.arange(num_heads), num_layers)


def per_head_frame(num_layers: int, num_heads: int, **columns) -> pd.DataFrame:
    """A table with one row per (layer, head), in layer-major order, and the given columns
    (each ``[L, H]``, ``[L*H]`` or a scalar)."""

    layer, head = head_indices(num_layers, num_heads)
    flat = {name: (np.asarray(value).reshape(-1) if np.ndim(value) > 1 else value) for name, value in columns.items()}
    return pd.DataFrame({"layer": layer, "head": head, **flat})


@dataclass
class AttentionRun:
    """Attention of every layer and head for one text.

    tokens        display text of each token (``##``, ``Ġ`` and ``▁`` markers made readable)
    raw_tokens    the tokenizer's own pieces
    attentions    float32 ``[layers, heads, n, n]``
    special_mask  bool ``[n]``, True for [CLS], [SEP], <s>, BOS, ...
    word_ids      int ``[n]``, index into ``words`` for each token, -1 for special tokens
    words         the words the tokens belong to
    segment_ids   int ``[n]``, 0 for the first text, 1 for the pair text
    is_causal     a decoder: token i sees only tokens j <= i
    engine        "transformers", "core" (the from-scratch engine), "toy" (a bare MultiHeadAttention) or
                  "lab" (a model trained by ``mha_core.lab``)
    truncated     True when the text was longer than the model allows; ``num_input_tokens`` is the full length
    max_abs_diff  for the core engine: largest |core - transformers| over every layer, head and entry
    level         "token", or "word" after ``to_words()``
    norms         optional float32 ``[layers, heads, n, n]``: ||alpha_ij f(x_j)|| (Kobayashi et al. 2020), from
                  ``model.run(text, norms=True)``; with ``value_norms`` ``[layers, heads, n]`` (||f(x_j)|| per key
                  token) and ``output_norms`` ``[layers, heads, n]`` (||sum_j alpha_ij f(x_j)|| per query token).
                  Token-level only: ``to_words()`` and ``without_special()`` drop them.
    """

    model_name: str
    family: str
    is_causal: bool
    tokens: list[str]
    attentions: np.ndarray
    special_mask: np.ndarray
    word_ids: np.ndarray
    words: list[str]
    segment_ids: np.ndarray
    raw_tokens: list[str] = field(default_factory=list)
    engine: str = "transformers"
    text: str = ""
    text_pair: str | None = None
    truncated: bool = False
    num_input_tokens: int = 0
    max_abs_diff: float | None = None
    level: str = "token"
    metadata: dict = field(default_factory=dict)
    norms: np.ndarray | None = None
    value_norms: np.ndarray | None = None
    output_norms: np.ndarray | None = None
    # Causal evidence (mha_core.interventions): float32 [n - 1] next-token losses (causal LM head; token_losses[i] =
    # -log p(token[i+1] | tokens[:i+1])) or [n] masked-token losses (MLM head; NaN at special tokens); None
    # without a head, and in runs that did not ask for them (plain runs: ``model.run(..., losses=True)``).
    # Encoders without a head report, for ablated runs, the cosine distance of the mean-pooled
    # output (output_change) and of each token's output (token_output_change [n]) from the unablated run.
    token_losses: np.ndarray | None = None
    output_change: float | None = None
    token_output_change: np.ndarray | None = None

    def __post_init__(self):
        for name in ("token_losses", "token_output_change"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, np.asarray(value, dtype=np.float32))
        self.attentions = np.ascontiguousarray(self.attentions, dtype=np.float32)
        if self.attentions.ndim != 4:
            raise ValueError(f"attentions must be [layers, heads, n, n], got shape {self.attentions.shape}")
        n = self.attentions.shape[-2]  # the query tokens: the fields below describe them
        self._check_keys()
        self.special_mask = np.asarray(self.special_mask, dtype=bool)
        self.word_ids = np.asarray(self.word_ids, dtype=np.int64)
        self.segment_ids = np.asarray(self.segment_ids, dtype=np.int64)
        self.tokens = [str(t) for t in self.tokens]
        self.raw_tokens = [str(t) for t in (self.raw_tokens or self.tokens)]
        for name, value in (
            ("tokens", self.tokens),
            ("raw_tokens", self.raw_tokens),
            ("special_mask", self.special_mask),
            ("word_ids", self.word_ids),
            ("segment_ids", self.segment_ids),
        ):
            if len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries but attentions cover {n} tokens")
        if not self.num_input_tokens:
            self.num_input_tokens = n
        for name, shape in (
            ("norms", self.attentions.shape),
            ("value_norms", self.attentions.shape[:3]),
            ("output_norms", self.attentions.shape[:3]),
        ):
            value = getattr(self, name)
            if value is not None:
                value = np.ascontiguousarray(value, dtype=np.float32)
                if value.shape != shape:
                    raise ValueError(f"{name} must have shape {shape}, got {value.shape}")
                setattr(self, name, value)

    def _check_keys(self) -> None:
        """Self-attention: the keys are the query tokens (``CrossAttentionRun`` keys another text's)."""
        if self.attentions.shape[-1] != self.attentions.shape[-2]:
            raise ValueError(f"attentions must be [layers, heads, n, n], got shape {self.attentions.shape}")

    # ---- shape -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.attentions.shape[0]

    @property
    def num_heads(self) -> int:
        return self.attentions.shape[1]

    @property
    def num_tokens(self) -> int:
        return self.attentions.shape[-2]

    @property
    def punctuation_mask(self) -> np.ndarray:
        """bool ``[n]``: non-special tokens that are punctuation."""
        return punctuation_mask(self.tokens, self.special_mask)

    def head(self, layer: int, head: int) -> np.ndarray:
        """One head's ``[n, n]`` attention."""
        return self.attentions[layer, head]

    def attention_block(self, layer: int, head: int, rows, cols) -> np.ndarray:
        """float32 ``[len(rows), len(cols)]`` of one head (rows, cols: slices or position lists), as a long run's."""
        weights = self.attentions[layer, head]
        rows = np.arange(self.num_tokens)[rows] if isinstance(rows, slice) else np.asarray(rows, dtype=np.int64)
        cols = np.arange(self.num_tokens)[cols] if isinstance(cols, slice) else np.asarray(cols, dtype=np.int64)
        return weights[np.ix_(rows.reshape(-1), cols.reshape(-1))]

    def attention_overview(
        self, layer: int, head: int, size: int, reduce: str = "mean", rows=None, cols=None
    ) -> np.ndarray:
        """One head's region (``(start, stop)`` pairs; default all) pooled to ``size`` cells a side (as a long run's)."""
        n = self.num_tokens
        return pool_dense(self.attentions[layer, head], rows or (0, n), cols or (0, n), size, reduce)

    def head_frame(self, layer: int, head: int) -> pd.DataFrame:
        """One head as a table: a row per query token, a column per key token (positions keep names unique)."""

        labels = [f"{i}:{t}" for i, t in enumerate(self.tokens)]
        return pd.DataFrame(self.attentions[layer, head], index=pd.Index(labels, name="query \\ key"), columns=labels)

    def summary(self) -> str:
        extra = f", max |core - transformers| = {self.max_abs_diff:.2e}" if self.max_abs_diff is not None else ""
        trunc = f", truncated from {self.num_input_tokens}" if self.truncated else ""
        return (
            f"{self.model_name} ({self.family}{', causal' if self.is_causal else ''}): "
            f"{self.num_layers} layers x {self.num_heads} heads, {self.num_tokens} tokens{trunc}, "
            f"engine={self.engine}{extra}"
        )

    # ---- word level (Clark et al. 2019) -------------------------------------------------
    def word_groups(self) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        """Group tokens into units: one per word, one per special token.

        Returns ``(unit_of_token [n], unit_text, unit_is_special, unit_segment)``.
        """
        unit_of_token, first = token_units(self.word_ids, self.special_mask, self.segment_ids)
        unit_is_word = ~self.special_mask[first] & (self.word_ids[first] >= 0)
        texts = [self.words[self.word_ids[i]] if is_word else self.tokens[i] for i, is_word in zip(first, unit_is_word)]
        return unit_of_token, texts, self.special_mask[first].copy(), self.segment_ids[first].copy()

    def to_words(self) -> AttentionRun:
        """Word-level run: attention TO a word sums over its pieces, attention FROM a word averages them.

        Rows still sum to 1 because summing columns keeps each row's total and averaging rows
        of total 1 gives 1.
        """
        if self.level == "word":
            return self
        unit_of_token, texts, special, segment = self.word_groups()
        num_units = len(texts)
        word_attn = word_level_attentions(self.attentions[None], unit_of_token[None], num_units)[0]
        word_ids = np.where(special, -1, np.arange(num_units))
        return self._reshaped(
            tokens=texts,
            raw_tokens=texts,
            attentions=word_attn,
            special_mask=special,
            word_ids=word_ids,
            words=texts,
            segment_ids=segment,
            level="word",
            metadata={**self.metadata, "token_to_word": unit_of_token.tolist()},
        )

    def without_special(self) -> AttentionRun:
        """The run restricted to non-special tokens, rows renormalised to sum to 1 (empty rows stay 0)."""
        keep = ~self.special_mask
        attn = self.attentions[:, :, keep][:, :, :, keep]
        totals = attn.sum(axis=-1, keepdims=True)
        attn = np.divide(attn, totals, out=np.zeros_like(attn), where=totals > 0)
        kept = np.flatnonzero(keep)
        return self._reshaped(
            tokens=[self.tokens[i] for i in kept],
            raw_tokens=[self.raw_tokens[i] for i in kept],
            attentions=attn,
            special_mask=np.zeros(len(kept), dtype=bool),
            word_ids=self.word_ids[keep],
            segment_ids=self.segment_ids[keep],
            metadata={**self.metadata, "special_tokens_removed": True},
        )

    def _reshaped(self, **changes) -> AttentionRun:
        """This run over other units (words, or tokens without the special ones): the given fields replaced,
        the per-token extras that no longer line up (norms, per-token losses) dropped."""
        dropped = dict(norms=None, value_norms=None, output_norms=None, token_losses=None, token_output_change=None)
        return replace(self, **{**dropped, **changes})

    # ---- persistence -------------------------------------------------------------------
    @classmethod
    def array_fields(cls) -> tuple[str, ...]:
        """The fields stored as arrays of their own in the .npz (the rest go into its JSON header)."""
        return _ARRAY_FIELDS

    def to_npz_bytes(self) -> bytes:
        """The run as a portable ``.npz`` (arrays + a JSON header; no pickle)."""

        header = {k: v for k, v in asdict(self).items() if k not in self.array_fields() + _OPTIONAL_ARRAYS}
        for name in ("token_losses", "token_output_change"):  # small optional arrays: JSON lists (NaN kept)
            if header.get(name) is not None:
                header[name] = [float(x) for x in header[name]]
        header["format_version"] = FORMAT_VERSION
        optional = {name: getattr(self, name) for name in _OPTIONAL_ARRAYS if getattr(self, name) is not None}
        buf = io.BytesIO()
        np.savez_compressed(
            buf,
            header=np.array(json.dumps(header, ensure_ascii=False)),
            **{name: getattr(self, name) for name in self.array_fields()},
            **optional,
        )
        return buf.getvalue()

    def to_html(self, path: str | Path | None = None, **options):
        """This run's view as one self-contained HTML page (data and scripts inside, nothing fetched when opened):
        its text, or written to ``path`` (returned). ``options``: ``layer``, ``head``, ``view`` ("head" or
        "model") (``mha_core.views.standalone.view_of``)."""
        return standalone.to_html(self, path, **options)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.to_npz_bytes())
        return path

    @classmethod
    def load(cls, path):
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            version = header.pop("format_version", None)
            if version != FORMAT_VERSION:
                raise ValueError(f"{path}: not a Headscope run file (format version {version!r})")
            known = {f.name for f in fields(cls)}
            kwargs = {k: v for k, v in header.items() if k in known}
            kwargs.update({name: data[name] for name in cls.array_fields()})
            kwargs.update({name: data[name] for name in _OPTIONAL_ARRAYS if name in data.files})
        return cls(**kwargs)
