"""An encoder-decoder model's three attentions for one source and one target: ``Seq2SeqRun``.

The encoder's self-attention (source tokens both ways) and the decoder's causal self-attention (target
tokens) are ordinary ``AttentionRun``s. The decoder's cross-attention is a ``CrossAttentionRun``: its queries
are the target tokens (the run's own ``tokens``, ``word_ids``, ...) and its keys the source tokens
(``key_tokens``, ``key_word_ids``, ...), ``attentions`` ``[L_dec, H, n_tgt, n_src]``. Every view and metric
that reads a run reads these three alike; the cross views put the source on one side, the target on the other.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .run import AttentionRun, token_units, word_level_attentions
from .views import standalone

KINDS = ("encoder", "decoder", "cross")  # the three attentions of an encoder-decoder model
SEQ2SEQ_FORMAT = "headscope-seq2seq-1"


@dataclass
class CrossAttentionRun(AttentionRun):
    """Cross-attention of every decoder layer and head: target tokens (queries) attending to source tokens (keys).

    ``tokens``/``raw_tokens``/``special_mask``/``word_ids``/``words``/``segment_ids`` describe the queries (the
    target); ``key_*`` the keys (the source), as ``encoder``'s run describes them.
    """

    key_tokens: list[str] = field(default_factory=list)
    key_raw_tokens: list[str] = field(default_factory=list)
    key_special_mask: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    key_word_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    key_words: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.key_tokens = [str(t) for t in self.key_tokens]
        self.key_raw_tokens = [str(t) for t in (self.key_raw_tokens or self.key_tokens)]
        self.key_special_mask = np.asarray(self.key_special_mask, dtype=bool)
        self.key_word_ids = np.asarray(self.key_word_ids, dtype=np.int64)
        super().__post_init__()

    def _check_keys(self) -> None:
        n_keys = self.attentions.shape[-1]
        for name in ("key_tokens", "key_raw_tokens", "key_special_mask", "key_word_ids"):
            if len(getattr(self, name)) != n_keys:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries but attentions cover {n_keys} keys")

    @classmethod
    def array_fields(cls) -> tuple[str, ...]:
        return (*super().array_fields(), "key_special_mask", "key_word_ids")

    @property
    def num_keys(self) -> int:
        return self.attentions.shape[-1]

    def head_frame(self, layer: int, head: int):
        """One head as a table: a row per target token, a column per source token."""
        rows = [f"{i}:{t}" for i, t in enumerate(self.tokens)]
        columns = [f"{j}:{t}" for j, t in enumerate(self.key_tokens)]
        return pd.DataFrame(
            self.attentions[layer, head], index=pd.Index(rows, name="target \\ source"), columns=columns
        )

    def summary(self) -> str:
        return (
            f"{self.model_name} ({self.family}): cross-attention, {self.num_layers} decoder layers x {self.num_heads} "
            f"heads, {self.num_tokens} target x {self.num_keys} source tokens, engine={self.engine}"
            + (f", max |core - transformers| = {self.max_abs_diff:.2e}" if self.max_abs_diff is not None else "")
        )

    def key_word_groups(self) -> tuple[np.ndarray, list[str], np.ndarray]:
        """The source side's units (one per word, one per special token): ``(unit_of_token, texts, is_special)``."""
        unit_of_token, first = token_units(self.key_word_ids, self.key_special_mask, np.zeros_like(self.key_word_ids))
        is_word = ~self.key_special_mask[first] & (self.key_word_ids[first] >= 0)
        texts = [self.key_words[self.key_word_ids[i]] if w else self.key_tokens[i] for i, w in zip(first, is_word)]
        return unit_of_token, texts, self.key_special_mask[first].copy()

    def to_words(self) -> CrossAttentionRun:
        """Word level on both sides: attention TO a source word sums its pieces, FROM a target word averages them."""
        if self.level == "word":
            return self
        unit_of_token, texts, special, segment = self.word_groups()
        key_units, key_texts, key_special = self.key_word_groups()
        attentions = word_level_attentions(
            self.attentions[None], unit_of_token[None], len(texts), key_units[None], len(key_texts)
        )[0]
        return self._reshaped(
            tokens=texts,
            raw_tokens=texts,
            attentions=attentions,
            special_mask=special,
            word_ids=np.where(special, -1, np.arange(len(texts))),
            words=texts,
            segment_ids=segment,
            key_tokens=key_texts,
            key_raw_tokens=key_texts,
            key_special_mask=key_special,
            key_word_ids=np.where(key_special, -1, np.arange(len(key_texts))),
            key_words=key_texts,
            level="word",
            metadata={
                **self.metadata,
                "token_to_word": unit_of_token.tolist(),
                "key_token_to_word": key_units.tolist(),
            },
        )

    def without_special(self) -> CrossAttentionRun:
        """Special tokens dropped on both sides, rows renormalised to sum to 1 (empty rows stay 0)."""
        rows, keys = ~self.special_mask, ~self.key_special_mask
        attn = self.attentions[:, :, rows][:, :, :, keys]
        totals = attn.sum(axis=-1, keepdims=True)
        attn = np.divide(attn, totals, out=np.zeros_like(attn), where=totals > 0)
        kept, kept_keys = np.flatnonzero(rows), np.flatnonzero(keys)
        return self._reshaped(
            tokens=[self.tokens[i] for i in kept],
            raw_tokens=[self.raw_tokens[i] for i in kept],
            attentions=attn,
            special_mask=np.zeros(len(kept), dtype=bool),
            word_ids=self.word_ids[rows],
            segment_ids=self.segment_ids[rows],
            key_tokens=[self.key_tokens[j] for j in kept_keys],
            key_raw_tokens=[self.key_raw_tokens[j] for j in kept_keys],
            key_special_mask=np.zeros(len(kept_keys), dtype=bool),
            key_word_ids=self.key_word_ids[keys],
            metadata={**self.metadata, "special_tokens_removed": True},
        )


@dataclass
class Seq2SeqRun:
    """The three attentions of one (source, target) pass: ``encoder`` ``[L_enc, H, n_src, n_src]``,
    ``decoder`` ``[L_dec, H, n_tgt, n_tgt]`` (causal), ``cross`` ``[L_dec, H, n_tgt, n_src]``.

    ``generated``: the target was written by the model (greedy decoding), not given.
    """

    encoder: AttentionRun
    decoder: AttentionRun
    cross: CrossAttentionRun
    generated: bool = False

    def kind(self, name: str) -> AttentionRun:
        """One of ``KINDS`` by name."""
        if name not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {name!r}")
        return getattr(self, name)

    @property
    def source(self) -> str:
        return self.encoder.text

    @property
    def target(self) -> str:
        return self.decoder.text

    def to_words(self) -> Seq2SeqRun:
        return replace(
            self, encoder=self.encoder.to_words(), decoder=self.decoder.to_words(), cross=self.cross.to_words()
        )

    def without_special(self) -> Seq2SeqRun:
        return replace(
            self,
            encoder=self.encoder.without_special(),
            decoder=self.decoder.without_special(),
            cross=self.cross.without_special(),
        )

    def summary(self) -> str:
        wrote = " (target written by the model)" if self.generated else ""
        return (
            f"{self.encoder.model_name} ({self.encoder.family}, encoder-decoder): {self.encoder.num_tokens} source "
            f"tokens, {self.decoder.num_tokens} target tokens{wrote}; encoder {self.encoder.num_layers} x "
            f"{self.encoder.num_heads}, decoder {self.decoder.num_layers} x {self.decoder.num_heads} heads"
        )

    # ---- persistence: one .npz holding the three runs' own .npz files (no pickle) ----
    def to_npz_bytes(self) -> bytes:
        buf = io.BytesIO()
        header = {"format": SEQ2SEQ_FORMAT, "generated": self.generated}
        parts = {name: np.frombuffer(self.kind(name).to_npz_bytes(), dtype=np.uint8) for name in KINDS}
        np.savez(buf, header=np.array(json.dumps(header)), **parts)
        return buf.getvalue()

    def to_html(self, path: str | Path | None = None, **options):
        """This run's view as one self-contained HTML page (data and scripts inside, nothing fetched when opened):
        its text, or written to ``path`` (returned). ``options``: ``layer``, ``head``, ``view`` ("head" or
        "model"), ``kind`` ("encoder", "decoder" or "cross", the default) (``mha_core.views.standalone.view_of``)."""
        return standalone.to_html(self, path, **options)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_bytes(self.to_npz_bytes())
        return path

    @classmethod
    def load(cls, path) -> Seq2SeqRun:
        with np.load(path, allow_pickle=False) as data:
            if "header" not in data.files or json.loads(str(data["header"])).get("format") != SEQ2SEQ_FORMAT:
                raise ValueError(f"{path}: not a Headscope encoder-decoder run file")
            header = json.loads(str(data["header"]))
            parts = {name: io.BytesIO(data[name].tobytes()) for name in KINDS}
        return cls(
            encoder=AttentionRun.load(parts["encoder"]),
            decoder=AttentionRun.load(parts["decoder"]),
            cross=CrossAttentionRun.load(parts["cross"]),
            generated=bool(header.get("generated")),
        )
