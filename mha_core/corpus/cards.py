"""Head cards: every head of a model described at corpus scale (``head_cards(model, sentences)``).

One card per (layer, head):

* its roles with their numbers: ``roles.head_roles`` on the corpus profile (``profile``: the mean metrics and,
  for trees, the held-out dependency tests), and the profile's metrics the search reads (``CARD_METRICS``);
* ``attention``: the ``top`` corpus contexts where it puts the most weight on a key other than a sink. A sink is
  what ``metrics.head_metrics`` calls one: a special token or the first token. One context per sentence (its
  largest such weight over every query and key), ranked over the corpus;
* ``output``: the ``top`` contexts where its output is largest: ``||z_h W_O^h||`` at one position (``z`` read at
  the named point ``blocks.{l}.attn.hook_z``, ``W_O^h`` the head's slice of the output projection; the output
  bias, shared by every head, left out), one position per sentence. The context's key is the key that query
  attends to most, so a view can highlight both;
* ``copying`` and ``previous_token``: the OV circuit's copying score and the QK circuit's previous-token score
  (``qkov.copying_scores``), None for families whose weights the circuits do not read.

A context is ``(sentence, tokens, query, key, weight)`` (and the ranked ``value``: the weight itself, or the output
norm); ``HeadCards.explore_query`` gives the address values that open the head on the context in the app's
Explore page (``model``, ``text``, ``layer``, ``head``, ``focus``: the query).

The cards are computed once per model, corpus and settings, and kept in ``$HEADSCOPE_CACHE_DIR/cards`` (beside the
profiles, ``storage.profile_cache_dir``), one gzipped JSON file written atomically, keyed by the weights'
fingerprint, the code that computes them and every sentence. The profile underneath keeps its own shards, so a
stopped build resumes its profile; the contexts' pass (one more pass over the corpus) starts again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..analysis.roles import head_roles, primary_roles
from ..analysis.syntax import Sentence
from ..errors import HeadscopeError
from ..hooks import block_point
from ..interventions.qkov import QKOVError, copying_scores, head_weights
from ..progress import Progress, progress_part, report
from .profiling import profile
from .storage import atomic_file, code_version, profile_cache_dir, weights_fingerprint

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

CARDS_FORMAT = 1
TOP_CONTEXTS = 20
# The profile's metrics a card keeps (the search reads prev_token_mass).
CARD_METRICS = ("prev_token_mass", "sink_mass", "normalized_entropy", "mean_distance", "argmax_offset_share")
ROLE_FIELDS = ("role", "group", "score", "threshold", "evidence")
CONTEXT_KINDS = ("attention", "output")


class CardsError(HeadscopeError, ValueError):
    """Head cards that cannot be built or read: no sentences, a family without the named head outputs, a head out
    of range."""


def card_index(layer: int, head: int, num_layers: int, num_heads: int) -> int:
    """Where head (``layer``, ``head``) is among a model's cards (``CardsError`` for a head it does not have)."""
    for value, size, what in ((layer, num_layers, "layer"), (head, num_heads, "head")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
            raise CardsError(f"The {what} must be a whole number from 0 to {size - 1}, not {value!r}.")
    return int(layer) * num_heads + int(head)


@dataclass(frozen=True)
class CardContext:
    """One corpus context of a head: sentence ``sentence`` (its index in the corpus, its ``text`` and ``tokens``),
    the ``query`` and ``key`` positions, the attention ``weight`` of the query on the key, and the ranked ``value``
    (the weight itself for the attention contexts; the output norm at the query for the output contexts)."""

    sentence: int
    text: str
    tokens: tuple[str, ...]
    query: int
    key: int
    weight: float
    value: float


@dataclass(frozen=True)
class HeadCard:
    layer: int
    head: int
    primary_role: str
    roles: tuple[dict, ...]  # every role the head passes: ROLE_FIELDS
    metrics: dict  # CARD_METRICS over the corpus
    attention: tuple[CardContext, ...]
    output: tuple[CardContext, ...]
    copying: float | None
    previous_token: float | None

    @property
    def name(self) -> str:
        return f"{self.layer}-{self.head}"

    def contexts(self, kind: str) -> tuple[CardContext, ...]:
        if kind not in CONTEXT_KINDS:
            raise CardsError(f"a card's contexts are {' or '.join(CONTEXT_KINDS)}, not {kind!r}")
        return self.attention if kind == "attention" else self.output


@dataclass(frozen=True)
class HeadCards:
    """Every head's card of one model over one corpus."""

    model_name: str
    num_layers: int
    num_heads: int
    num_sentences: int
    cards: tuple[HeadCard, ...]
    from_cache: bool = False

    def card(self, layer: int, head: int) -> HeadCard:
        return self.cards[card_index(layer, head, self.num_layers, self.num_heads)]

    def table(self) -> pd.DataFrame:
        """One row per head: layer, head, primary_role, copying, previous_token, the card's metrics, and the largest
        non-sink weight and output norm of its contexts."""
        rows = []
        for card in self.cards:
            rows.append(
                {
                    "layer": card.layer,
                    "head": card.head,
                    "primary_role": card.primary_role,
                    "copying": np.nan if card.copying is None else card.copying,
                    "previous_token": np.nan if card.previous_token is None else card.previous_token,
                    **card.metrics,
                    "top_weight": card.attention[0].value if card.attention else np.nan,
                    "top_output": card.output[0].value if card.output else np.nan,
                }
            )
        return pd.DataFrame(rows)

    def explore_query(self, card: HeadCard, context: CardContext) -> dict[str, str]:
        """The address values that open ``card``'s head on ``context`` in Explore, focused on its query."""
        return {
            "model": self.model_name,
            "text": context.text,
            "layer": str(card.layer),
            "head": str(card.head),
            "focus": str(context.query),
        }

    # ---- files ---------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        texts: dict[int, tuple[str, tuple[str, ...]]] = {}
        cards = []
        for card in self.cards:
            contexts = {}
            for kind in CONTEXT_KINDS:
                contexts[kind] = []
                for c in card.contexts(kind):
                    texts[c.sentence] = (c.text, c.tokens)
                    contexts[kind].append([c.sentence, c.query, c.key, c.weight, c.value])
            cards.append(
                {
                    "layer": card.layer,
                    "head": card.head,
                    "primary_role": card.primary_role,
                    "roles": list(card.roles),
                    "metrics": card.metrics,
                    "copying": card.copying,
                    "previous_token": card.previous_token,
                    **contexts,
                }
            )
        return {
            "format": CARDS_FORMAT,
            "model_name": self.model_name,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "num_sentences": self.num_sentences,
            "sentences": {str(index): [text, list(tokens)] for index, (text, tokens) in sorted(texts.items())},
            "cards": cards,
        }

    @classmethod
    def from_json(cls, data: dict, from_cache: bool = False) -> HeadCards:
        if data.get("format") != CARDS_FORMAT:
            raise CardsError("head cards of another format")
        texts = {int(index): (text, tuple(tokens)) for index, (text, tokens) in data["sentences"].items()}

        def context(row) -> CardContext:
            sentence, query, key, weight, value = row
            text, tokens = texts[int(sentence)]
            return CardContext(
                int(sentence), text, tokens, int(query), int(key), weight=float(weight), value=float(value)
            )

        cards = tuple(
            HeadCard(
                layer=int(c["layer"]),
                head=int(c["head"]),
                primary_role=str(c["primary_role"]),
                roles=tuple(c["roles"]),
                metrics=dict(c["metrics"]),
                attention=tuple(context(row) for row in c["attention"]),
                output=tuple(context(row) for row in c["output"]),
                copying=c["copying"],
                previous_token=c["previous_token"],
            )
            for c in data["cards"]
        )
        return cls(
            str(data["model_name"]),
            int(data["num_layers"]),
            int(data["num_heads"]),
            int(data["num_sentences"]),
            cards,
            from_cache=from_cache,
        )


# ---- the contexts: one pass over the corpus ------------------------------------------------------------------
def sentence_text(sentence: Sentence | str) -> str:
    """What a card runs and Explore opens: a tree's text (its words joined when it has none), or the string."""
    if isinstance(sentence, Sentence):
        return sentence.text.strip() or " ".join(sentence.words)
    if isinstance(sentence, str) and sentence.strip():
        return sentence
    raise CardsError(f"a corpus sentence must be a non-empty string or a Sentence, got {sentence!r}")


class _Top:
    """The ``top`` largest values per head seen so far, one per sentence, with where they are: ties go to the
    earlier sentence, so the result does not depend on the order the batches came in."""

    def __init__(self, num_layers: int, num_heads: int, top: int):
        self.top = top
        self.values = np.full((num_layers, num_heads, 0), -np.inf)
        self.where = np.zeros((num_layers, num_heads, 0, 4))  # sentence, query, key, weight

    def add(self, values: np.ndarray, where: np.ndarray) -> None:
        """``values [L, H, B]`` and ``where [L, H, B, 4]`` of a batch's sentences."""
        values = np.concatenate([self.values, values], axis=-1)
        where = np.concatenate([self.where, where], axis=-2)
        order = np.lexsort((where[..., 0], -values), axis=-1)[..., : self.top]
        self.values = np.take_along_axis(values, order, axis=-1)
        self.where = np.take_along_axis(where, order[..., None], axis=-2)


def _head_output_weights(model) -> torch.Tensor:
    """Every head's W_O ``[L, H, e, d]`` (``qkov.head_weights``: no norm reads the output projection)."""
    try:
        return head_weights(model).w_o
    except QKOVError as exc:
        raise CardsError(f"head cards read each head's output; {exc}") from exc


def _batch_contexts(model, encoded: list, w_o: torch.Tensor, sentence_ids: np.ndarray):
    """One padded pass over ``encoded``: ``(attention values, where, output values, where)`` per head, each
    ``[L, H, B]`` and ``[L, H, B, 4]``."""
    layers = range(model.num_layers)
    names = {block_point(layer, "attn.hook_z") for layer in layers}
    result = model.encoded_pass(encoded, keep=names.__contains__)
    attentions = result.attentions.numpy()  # [B, L, H, n, n], padding rows and columns exactly 0
    batch, num_layers, num_heads, n, _ = attentions.shape
    lengths = np.array([len(item) for item in encoded])
    real = np.arange(n)[None, :] < lengths[:, None]  # [B, n]
    sinks = np.zeros((batch, n), dtype=bool)
    for row, item in enumerate(encoded):
        sinks[row, : len(item)] = np.asarray(item.special_mask, dtype=bool)
    sinks[:, 0] = True
    allowed = real[:, :, None] & (real & ~sinks)[:, None, :]  # [B, query, key]
    masked = np.where(allowed[:, None, None], attentions, -1.0).reshape(batch, num_layers, num_heads, n * n)
    best = masked.argmax(axis=-1)  # [B, L, H]
    weight = np.take_along_axis(masked, best[..., None], axis=-1)[..., 0]
    attention_where = np.stack(
        [np.broadcast_to(sentence_ids[:, None, None], best.shape), best // n, best % n, weight], axis=-1
    )
    norms = np.empty((batch, num_layers, num_heads, n))
    with torch.inference_mode():
        for layer in layers:
            z = result.cache[block_point(layer, "attn.hook_z")].float()  # [B, n, H, e]
            written = torch.einsum("bnhe,hed->bhnd", z, w_o[layer])
            norms[:, layer] = torch.linalg.vector_norm(written, dim=-1).numpy()
    norms = np.where(real[:, None, None, :], norms, -1.0)
    position = norms.argmax(axis=-1)  # [B, L, H]
    value = np.take_along_axis(norms, position[..., None], axis=-1)[..., 0]
    rows = attentions[
        np.arange(batch)[:, None, None],
        np.arange(num_layers)[None, :, None],
        np.arange(num_heads)[None, None, :],
        position,
    ]  # [B, L, H, n]: the query's attention
    key = rows.argmax(axis=-1)
    output_where = np.stack(
        [
            np.broadcast_to(sentence_ids[:, None, None], best.shape),
            position,
            key,
            np.take_along_axis(rows, key[..., None], axis=-1)[..., 0],
        ],
        axis=-1,
    )
    first_heads = (1, 2, 0)  # [B, L, H] -> [L, H, B]
    return (
        weight.transpose(first_heads),
        attention_where.transpose(1, 2, 0, 3),
        value.transpose(first_heads),
        output_where.transpose(1, 2, 0, 3),
    )


def card_contexts(
    model: LoadedModel, texts: list[str], top: int = TOP_CONTEXTS, batch_size: int = 16, progress=None
) -> tuple[_Top, _Top, list]:
    """Every head's top attention and output contexts over ``texts``: ``(attention, output, encoded texts)``."""
    encoded = [model.encode(text) for text in texts]
    w_o = _head_output_weights(model)
    attention, output = _Top(model.num_layers, model.num_heads, top), _Top(model.num_layers, model.num_heads, top)
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        values = _batch_contexts(model, [encoded[i] for i in chunk], w_o, np.asarray(chunk))
        attention.add(*values[:2])
        output.add(*values[2:])
        report(progress, min(start + batch_size, len(order)), len(order), "sentences read for the contexts")
    return attention, output, encoded


def _contexts(top: _Top, layer: int, head: int, texts: list[str], tokens) -> tuple[CardContext, ...]:
    found = []
    for value, (sentence, query, key, weight) in zip(top.values[layer, head], top.where[layer, head]):
        if value < 0:
            continue  # a sentence with no key outside the sinks
        index = int(sentence)
        where = dict(query=int(query), key=int(key), weight=float(weight), value=float(value))
        found.append(CardContext(index, texts[index], tokens(index), **where))
    return tuple(found)


# ---- the cards -----------------------------------------------------------------------------------------------
def _circuit_scores(model) -> pd.DataFrame | None:
    try:
        return copying_scores(model)
    except QKOVError:
        return None


def build_cards(
    model: LoadedModel,
    sentences: list,
    top: int = TOP_CONTEXTS,
    batch_size: int = 16,
    progress: Progress | None = None,
    cache: bool = True,
    executor: dict | None = None,
) -> HeadCards:
    """The cards, computed (``head_cards`` without the cards' own cache); ``executor``: ``profile``'s executor
    settings (``{"executor": "ray", "workers": 4}``) for the profile underneath."""
    texts = [sentence_text(sentence) for sentence in sentences]
    settings = dict(batch_size=batch_size, progress=progress_part(progress, 0, 3), cache=cache, **(executor or {}))
    profiled = profile(model, sentences, **settings)
    roles = head_roles(None, metrics=profiled.metrics, dependency=profiled.dependency)
    primary = primary_roles(roles, model.num_layers, model.num_heads)
    attention, output, encoded = card_contexts(model, texts, top, batch_size, progress_part(progress, 1, 3))
    circuits = _circuit_scores(model)
    report(progress, 1, 1, "cards done")
    tokens_of: dict[int, tuple[str, ...]] = {}

    def tokens(index: int) -> tuple[str, ...]:
        if index not in tokens_of:
            item = encoded[index]
            tokens_of[index] = tuple(model.display.display(item.raw_tokens, item.word_ids))
        return tokens_of[index]

    metrics = profiled.metrics.set_index(["layer", "head"])
    by_head = {key: part for key, part in roles.groupby(["layer", "head"])}
    cards = []
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            own = by_head.get((layer, head))
            circuit = None if circuits is None else circuits.iloc[layer * model.num_heads + head]
            cards.append(
                HeadCard(
                    layer=layer,
                    head=head,
                    primary_role=str(primary["role"].iloc[layer * model.num_heads + head]),
                    roles=tuple(
                        {field: _plain(row[field]) for field in ROLE_FIELDS}
                        for _, row in (own.iterrows() if own is not None else iter(()))
                    ),
                    metrics={name: float(metrics.loc[(layer, head), name]) for name in CARD_METRICS},
                    attention=_contexts(attention, layer, head, texts, tokens),
                    output=_contexts(output, layer, head, texts, tokens),
                    copying=None if circuit is None else float(circuit["copying"]),
                    previous_token=None if circuit is None else float(circuit["previous_token"]),
                )
            )
    return HeadCards(model.name, model.num_layers, model.num_heads, len(texts), tuple(cards))


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


# ---- the cache -----------------------------------------------------------------------------------------------
def cards_cache_dir() -> Path:
    return profile_cache_dir().parent / "cards"


def cards_key(model, texts: list[str], top: int, batch_size: int) -> str:
    """What names a model's cards: its weights, the code that computes them, every text and the settings."""
    digest = hashlib.sha256(json.dumps([CARDS_FORMAT, model.name, top, batch_size]).encode())
    digest.update(weights_fingerprint(model).encode())
    digest.update(code_version().encode())
    digest.update(Path(__file__).read_bytes())
    for text in texts:
        digest.update(hashlib.sha1(text.encode("utf-8")).digest())
    return digest.hexdigest()


def load_cards(key: str) -> HeadCards | None:
    try:
        with gzip.open(cards_cache_dir() / f"{key}.json.gz", "rt", encoding="utf-8") as handle:
            return HeadCards.from_json(json.load(handle), from_cache=True)
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None  # missing or damaged: compute again


def store_cards(key: str, cards: HeadCards) -> None:
    folder = cards_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_file(folder / f"{key}.json.gz") as temporary, gzip.open(temporary, "wt", encoding="utf-8") as out:
            json.dump(cards.to_json(), out)
    except OSError:
        pass  # a read-only cache directory costs speed, not correctness


def head_cards(
    model: LoadedModel,
    sentences: Iterable[Sentence | str],
    top: int = TOP_CONTEXTS,
    batch_size: int = 16,
    progress: Progress | None = None,
    cache: bool = True,
    executor: dict | None = None,
) -> HeadCards:
    """Every head's card over ``sentences`` (UD trees or strings): the module's docstring says what a card holds.

    ``top``: contexts kept per head and kind; ``cache``: read and write the cards (and the profile's) cache;
    ``executor``: where the profile underneath runs, as ``profile`` takes it (``{"executor": "ray", "workers": 4,
    "address": ...}``; the contexts' pass runs here)."""
    sentences = list(sentences)
    if not sentences:
        raise CardsError("head cards need at least one sentence")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise CardsError(f"top must be a whole number of at least 1, got {top!r}")
    texts = [sentence_text(sentence) for sentence in sentences]
    key = cards_key(model, texts, top, batch_size) if cache and hasattr(model, "hf_model") else None
    if key is not None:
        cached = load_cards(key)
        if cached is not None:
            report(progress, 1, 1, "cards from the cache")
            return cached
    cards = build_cards(
        model, sentences, top=top, batch_size=batch_size, progress=progress, cache=cache, executor=executor
    )
    if key is not None:
        store_cards(key, cards)
    return cards
