"""The long part of a decoder's head cards (``long_cards(model)``): every head over the shipped long documents.

One ``LongCard`` per (layer, head):

* ``roles``: its long-context roles with their numbers, each from one run (``run``: a document's label, or
  ``NEEDLE_RUN``): "sink at length" and "local (window w)" from ``LongRun.roles()`` of each long document;
  "retrieval" from ``LongRun.roles(copies)`` of the needle prompt (``needle_prompt``: the documents as haystack, the
  needle at half depth, the question, the needle repeated as a teacher-forced answer, ``NEEDLE_TOKENS`` tokens). Its
  scores are Wu et al.'s argmax rule on that answer: after the answer's first token a repeated sequence is an
  induction task, so the heads it finds include the induction heads (docs/findings.md, section 8);
* ``contexts``: the ``top`` (document, query, key) where the head puts the most weight on a key that is not a sink,
  one per query row, ranked over every document. A decoder's row depends only on the tokens up to it, so rows a
  document shares with an earlier one (the shipped examples are nested: each begins with the one before) are read
  once, in the earlier document. A sink here is what the sink counts use: the first
  ``SINK_TOKENS`` positions (and any special token). Each row's largest weight and its key are in the row
  statistics the pass streams (``confidence``, ``argmax``): where the argmax is not a sink, that is the row's
  value; where it is, ``1 - first_tokens`` bounds the row's largest non-sink weight from above, and those rows are
  read from exact blocks (``LongRun.attention_block``), largest bound first, until no bound can enter the top.
  Every kept weight is read again from an exact block. A context keeps ``CONTEXT_TOKENS`` tokens either side of
  its query and of its key.

One ``LongRun`` is held at a time (each document, then the needle prompt), and only what the cards keep survives
it. The cards are cached beside the corpus cards (``cards_cache_dir``), keyed by the weights' fingerprint, the code
and every document. Decoders only (``LongCardsError`` otherwise): an encoder's long run stops at its learned
positions (MiniLM, MPNet: 512 tokens), shorter than the documents.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.streamed import SINK_TOKENS
from ..engine.blockwise import BLOCK_BYTES
from ..engine.core import core_family
from ..errors import EngineNotSupported
from ..models.long import NEEDLE, NEEDLE_QUESTION, long_documents, long_run_limit, needle_prompt, run_long
from ..progress import Progress, progress_part, report
from .cards import TOP_CONTEXTS, CardsError, card_index, cards_cache_dir
from .storage import atomic_file, code_version, weights_fingerprint

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

LONG_CARDS_FORMAT = 1
NEEDLE_TOKENS = 2048  # the needle prompt's length (at most the model's long-run limit)
NEEDLE_RUN = "needle prompt (teacher-forced)"
CONTEXT_TOKENS = 6  # tokens kept either side of a context's query and key
LONG_ROLE_FIELDS = ("run", "role", "score", "threshold", "n", "evidence")
EXPLORE_MARGIN = 16  # tokens around a context's query and key in the Explore zoom a link opens


class LongCardsError(CardsError):
    """A long part of the cards that cannot be built: an encoder, a family the long path does not read, no
    documents."""


@dataclass(frozen=True)
class LongContext:
    """One long-document context: document ``document`` (its index among the documents, its ``label``), the
    ``query`` and ``key`` positions, the exact ``weight`` of the query on the key, and the tokens around them:
    ``query_tokens`` from ``query_start``, ``key_tokens`` from ``key_start``."""

    document: int
    label: str
    query: int
    key: int
    weight: float
    query_start: int
    query_tokens: tuple[str, ...]
    key_start: int
    key_tokens: tuple[str, ...]

    def zoom(self, num_tokens: int, margin: int = EXPLORE_MARGIN) -> tuple[int, int, int, int]:
        """``(r0, r1, c0, c1)``: the rows around the query and the keys around the key, inside the document's
        ``num_tokens`` (Explore's ``lzoom``)."""
        query, key = self.query, self.key
        return (
            max(0, query - margin),
            min(num_tokens, query + margin + 1),
            max(0, key - margin),
            min(num_tokens, key + margin + 1),
        )


@dataclass(frozen=True)
class LongCard:
    layer: int
    head: int
    roles: tuple[dict, ...]  # LONG_ROLE_FIELDS, every long role the head holds in any run
    contexts: tuple[LongContext, ...]

    @property
    def name(self) -> str:
        return f"{self.layer}-{self.head}"


@dataclass(frozen=True)
class LongCards:
    """Every head's long card of one model over ``documents`` (their labels) and the needle prompt."""

    model_name: str
    num_layers: int
    num_heads: int
    documents: tuple[str, ...]
    document_tokens: tuple[int, ...]
    needle_tokens: int
    cards: tuple[LongCard, ...]
    from_cache: bool = False

    def card(self, layer: int, head: int) -> LongCard:
        return self.cards[card_index(layer, head, self.num_layers, self.num_heads)]

    def explore_query(self, card: LongCard, context: LongContext) -> dict[str, str]:
        """The address values that open Explore's long-document zoom on ``context``: the document (``long``: its
        index among the shipped examples), the head and the region around its query and key (``lzoom``)."""
        r0, r1, c0, c1 = context.zoom(self.document_tokens[context.document])
        return {
            "model": self.model_name,
            "layer": str(card.layer),
            "head": str(card.head),
            "long": str(context.document),
            "lzoom": f"{card.layer}.{card.head}.{r0}-{r1}.{c0}-{c1}",
        }

    def to_json(self) -> dict:
        return {
            "format": LONG_CARDS_FORMAT,
            "model_name": self.model_name,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "documents": list(self.documents),
            "document_tokens": list(self.document_tokens),
            "needle_tokens": self.needle_tokens,
            "cards": [
                {
                    "layer": c.layer,
                    "head": c.head,
                    "roles": list(c.roles),
                    "contexts": [
                        [x.document, x.query, x.key, x.weight, x.query_start, x.query_tokens, x.key_start, x.key_tokens]
                        for x in c.contexts
                    ],
                }
                for c in self.cards
            ],
        }

    @classmethod
    def from_json(cls, data: dict, from_cache: bool = False) -> LongCards:
        if data.get("format") != LONG_CARDS_FORMAT:
            raise LongCardsError("long cards of another format")
        labels = tuple(str(label) for label in data["documents"])

        def context(row) -> LongContext:
            document, query, key, weight, query_start, query_tokens, key_start, key_tokens = row
            return LongContext(
                document=int(document),
                label=labels[int(document)],
                query=int(query),
                key=int(key),
                weight=float(weight),
                query_start=int(query_start),
                query_tokens=tuple(query_tokens),
                key_start=int(key_start),
                key_tokens=tuple(key_tokens),
            )

        cards = tuple(
            LongCard(int(c["layer"]), int(c["head"]), tuple(c["roles"]), tuple(context(r) for r in c["contexts"]))
            for c in data["cards"]
        )
        return cls(
            model_name=str(data["model_name"]),
            num_layers=int(data["num_layers"]),
            num_heads=int(data["num_heads"]),
            documents=labels,
            document_tokens=tuple(int(n) for n in data["document_tokens"]),
            needle_tokens=int(data["needle_tokens"]),
            cards=cards,
            from_cache=from_cache,
        )


# ---- the contexts of one run ---------------------------------------------------------------------------------
def sink_keys(run) -> np.ndarray:
    """The keys the contexts leave out: the first ``SINK_TOKENS`` positions (what the sink counts use) and any
    special token."""
    sinks = np.asarray(run.special_mask, dtype=bool).copy()
    sinks[:SINK_TOKENS] = True
    return sinks


class _Best:
    """Per head, the ``top`` largest (value, document, query, key) seen so far; ties go to the earlier document
    and query."""

    def __init__(self, num_layers: int, num_heads: int, top: int):
        self.top = top
        self.found: dict[tuple[int, int], list[tuple[float, int, int, int]]] = {
            (layer, head): [] for layer in range(num_layers) for head in range(num_heads)
        }

    def add(self, layer: int, head: int, rows: list[tuple[float, int, int, int]]) -> None:
        merged = self.found[layer, head] + rows
        merged.sort(key=lambda row: (-row[0], row[1], row[2]))
        self.found[layer, head] = merged[: self.top]

    def floor(self, layer: int, head: int) -> float:
        """What a row must beat to enter the head's top (-inf while it has fewer)."""
        found = self.found[layer, head]
        return found[-1][0] if len(found) >= self.top else -np.inf


def run_contexts(run, document: int, best: _Best, skip: int = 0) -> None:
    """``run``'s rows from ``skip`` on added to ``best``: each row's largest weight on a non-sink key (see the
    module's docstring)."""
    rows = run.statistics.rows
    n = run.num_tokens
    sinks = sink_keys(run)
    visible = np.cumsum(~sinks) > 0 if run.is_causal else np.full(n, (~sinks).any())  # a non-sink key to see
    visible[:skip] = False
    queries = np.arange(n)
    chunk = max(1, (BLOCK_BYTES // 4) // n)
    for layer in range(run.num_layers):
        for head in range(run.num_heads):
            argmax, confidence = rows["argmax"][layer, head], rows["confidence"][layer, head]
            exact = visible & ~sinks[argmax]
            values, where, keys = confidence[exact].astype(np.float64), queries[exact], argmax[exact]
            order = np.argsort(-values, kind="stable")[: best.top]
            best.add(layer, head, [(float(values[i]), document, int(where[i]), int(keys[i])) for i in order])
            bound = (rows["total"][layer, head] - rows["first_tokens"][layer, head]).astype(np.float64)
            bound = np.minimum(bound, confidence)
            rest = queries[visible & ~exact]
            rest = rest[np.argsort(-bound[rest], kind="stable")]
            for start in range(0, len(rest), chunk):
                part = rest[start : start + chunk]
                part = part[bound[part] >= best.floor(layer, head)]
                if len(part) == 0:
                    break  # sorted by bound: no later row can enter the top
                weights = run.attention_block(layer, head, part.tolist(), (0, n)).astype(np.float64)
                weights[:, sinks] = -1.0
                if run.is_causal:
                    weights[np.arange(n)[None, :] > part[:, None]] = -1.0
                keys = weights.argmax(axis=1)
                found = weights[np.arange(len(part)), keys]
                best.add(layer, head, [(float(v), document, int(q), int(k)) for v, q, k in zip(found, part, keys)])


def shared_prefix(first, second) -> int:
    """How many tokens two documents begin with in common: a decoder's rows there are the same in both (the shipped
    examples are nested: each begins with the one before), so their contexts are read once, from the earlier."""
    size = min(len(first), len(second))
    differ = np.flatnonzero(np.asarray(first[:size]) != np.asarray(second[:size]))
    return int(differ[0]) if len(differ) else size


def _window(tokens: list[str], position: int) -> tuple[int, tuple[str, ...]]:
    start = max(0, position - CONTEXT_TOKENS)
    return start, tuple(tokens[start : position + CONTEXT_TOKENS + 1])


def _keep_contexts(run, document: int, label: str, best: _Best, kept: dict) -> None:
    """The contexts of ``document`` still in ``best``, their weights read from exact blocks, kept with their tokens
    (before the run is let go)."""
    for (layer, head), found in best.found.items():
        for _, doc, query, key in found:
            if doc != document or (layer, head, doc, query) in kept:
                continue
            weight = float(run.attention_block(layer, head, [query], [key])[0, 0])
            query_start, query_tokens = _window(run.tokens, query)
            key_start, key_tokens = _window(run.tokens, key)
            kept[layer, head, doc, query] = LongContext(
                document=doc,
                label=label,
                query=query,
                key=key,
                weight=weight,
                query_start=query_start,
                query_tokens=query_tokens,
                key_start=key_start,
                key_tokens=key_tokens,
            )


def _role_rows(roles, run_label: str, wanted) -> dict[tuple[int, int], list[dict]]:
    by_head: dict[tuple[int, int], list[dict]] = {}
    for row in roles.itertuples(index=False):
        if not wanted(str(row.role)):
            continue
        entry = {
            "run": run_label,
            "role": str(row.role),
            "score": float(row.score),
            "threshold": float(row.threshold),
            "n": int(row.n),
            "evidence": str(row.evidence),
        }
        by_head.setdefault((int(row.layer), int(row.head)), []).append(entry)
    return by_head


# ---- the cards -----------------------------------------------------------------------------------------------
def document_entries(documents) -> list[tuple[str, str]]:
    """(label, text) of each document: the shipped examples by default, or strings, ``{"label", "text"}`` dicts or
    (label, text) pairs."""
    documents = long_documents() if documents is None else documents
    entries = []
    for index, document in enumerate(documents):
        if isinstance(document, tuple) and len(document) == 2:
            entries.append((str(document[0]), str(document[1])))
        elif isinstance(document, dict):
            entries.append((str(document.get("label", f"document {index}")), str(document["text"])))
        elif isinstance(document, str) and document.strip():
            entries.append((f"document {index}", document))
        else:
            raise LongCardsError(f"a long document must be a non-empty string or a label and text, got {document!r}")
    if not entries:
        raise LongCardsError("the long part of the cards needs at least one document")
    return entries


def check_long_model(model) -> None:
    """``LongCardsError`` unless ``model`` is a decoder the long path reads."""
    if not model.is_causal:
        raise LongCardsError(
            f"{model.name} is an encoder: head cards have a long part only for decoders (such as SmolLM2), whose "
            "long runs read the long documents; an encoder's stop at its learned positions (512 tokens here)."
        )
    try:
        core_family(model.hf_model)
    except EngineNotSupported as exc:
        raise LongCardsError(f"the long part of the cards needs the long path: {exc}") from exc


def needle_length(model, needle_tokens: int | None) -> int:
    return int(min(NEEDLE_TOKENS if needle_tokens is None else needle_tokens, long_run_limit(model)))


def build_long_cards(
    model: LoadedModel, documents=None, top: int = TOP_CONTEXTS, needle_tokens: int | None = None, progress=None
) -> LongCards:
    """The long cards, computed (``long_cards`` without the cache)."""
    check_long_model(model)
    entries = document_entries(documents)
    parts = len(entries) + 1
    best = _Best(model.num_layers, model.num_heads, top)
    kept: dict = {}
    roles: dict[tuple[int, int], list[dict]] = {}
    counts, read = [], []
    for index, (label, text) in enumerate(entries):
        run = run_long(model, text, progress=progress_part(progress, index, parts))
        counts.append(run.num_tokens)
        run_contexts(run, index, best, skip=max((shared_prefix(run.token_ids, ids) for ids in read), default=0))
        read.append(run.token_ids)
        _keep_contexts(run, index, label, best, kept)
        for head, rows in _role_rows(run.roles(), label, lambda role: role != "retrieval").items():
            roles.setdefault(head, []).extend(rows)
        del run  # one long run at a time
    length = needle_length(model, needle_tokens)
    haystack = "\n\n".join(text for _, text in entries[::-1])
    ids, copies = needle_prompt(model, haystack, NEEDLE, NEEDLE_QUESTION, num_tokens=length)
    run = run_long(model, token_ids=ids, progress=progress_part(progress, len(entries), parts))
    for head, rows in _role_rows(run.roles(copies), NEEDLE_RUN, lambda role: role == "retrieval").items():
        roles.setdefault(head, []).extend(rows)
    del run
    report(progress, 1, 1, "long cards done")
    cards = tuple(
        LongCard(
            layer,
            head,
            tuple(roles.get((layer, head), ())),
            tuple(kept[layer, head, doc, query] for _, doc, query, _ in best.found[layer, head]),
        )
        for layer in range(model.num_layers)
        for head in range(model.num_heads)
    )
    labels = tuple(label for label, _ in entries)
    return LongCards(
        model_name=model.name,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        documents=labels,
        document_tokens=tuple(counts),
        needle_tokens=length,
        cards=cards,
    )


def long_cards_key(model, entries: list[tuple[str, str]], top: int, needle_tokens: int) -> str:
    """What names a model's long cards: its weights, the code that computes them, every document and the settings."""
    digest = hashlib.sha256(json.dumps([LONG_CARDS_FORMAT, model.name, top, needle_tokens]).encode())
    digest.update(weights_fingerprint(model).encode())
    digest.update(code_version().encode())
    digest.update(Path(__file__).read_bytes())
    for label, text in entries:
        digest.update(hashlib.sha1(f"{label}\n{text}".encode()).digest())
    return digest.hexdigest()


def _cache_file(key: str) -> Path:
    return cards_cache_dir() / f"long-{key}.json.gz"


def load_long_cards(key: str) -> LongCards | None:
    try:
        with gzip.open(_cache_file(key), "rt", encoding="utf-8") as handle:
            return LongCards.from_json(json.load(handle), from_cache=True)
    except (OSError, ValueError, KeyError, TypeError, EOFError, IndexError):
        return None  # missing or damaged: compute again


def store_long_cards(key: str, cards: LongCards) -> None:
    try:
        cards_cache_dir().mkdir(parents=True, exist_ok=True)
        with atomic_file(_cache_file(key)) as temporary, gzip.open(temporary, "wt", encoding="utf-8") as out:
            json.dump(cards.to_json(), out)
    except OSError:
        pass  # a read-only cache directory costs speed, not correctness


def long_cards(
    model: LoadedModel,
    documents: Sequence | None = None,
    top: int = TOP_CONTEXTS,
    needle_tokens: int | None = None,
    progress: Progress | None = None,
    cache: bool = True,
) -> LongCards:
    """Every head's long card over ``documents`` (default: the shipped long examples, ``long_documents``) and the
    needle prompt (``needle_tokens`` long, default ``NEEDLE_TOKENS``): the module's docstring says what a card
    holds. ``top``: contexts kept per head; ``cache``: read and write the cards' cache."""
    check_long_model(model)
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise LongCardsError(f"top must be a whole number of at least 1, got {top!r}")
    entries = document_entries(documents)
    key = long_cards_key(model, entries, top, needle_length(model, needle_tokens)) if cache else None
    if key is not None:
        cached = load_long_cards(key)
        if cached is not None:
            report(progress, 1, 1, "long cards from the cache")
            return cached
    cards = build_long_cards(model, entries, top=top, needle_tokens=needle_tokens, progress=progress)
    if key is not None:
        store_long_cards(key, cards)
    return cards
