"""Many sentences at once: profiling every head over a corpus, in shards that are cached and resumed.

``profile(model, sentences)`` returns the mean of ``head_metrics`` over the sentences and, when the
sentences carry dependency trees, the Clark et al. dependency accuracy of every head
(``syntax.dependency_scores``). It works in four steps, each usable alone (a distributed executor
runs ``compute_shard`` elsewhere and merges the parts the same way):

    plan_shards     the corpus cut into consecutive shards of ``shard_size`` sentences; the cut depends
                    on the sentences and the shard size only
    compute_shard   one shard measured, as a function of the model and the shard alone: padded batches
                    of similar lengths, each measured at once -> a ``ProfilePart`` (per-head sums and
                    counts, label tallies, dependency counts: small, mergeable, no model inside)
    merge_parts     parts added up in corpus order, whatever order they were computed in
    finish_profile  the merged part as a ``ProfileResult``

Cache, in ``$HEADSCOPE_CACHE_DIR/profiles`` (default ``~/.cache/headscope/profiles``), every file
written atomically (a temporary file, then one rename):

    shards/<settings key>/<shard digest>.npz   one finished shard (``ShardCache``): arrays and a JSON header
    results/<result key>/                      the finished profile (metrics.parquet, dependency.parquet, meta.json)

The settings key hashes the model name, a fingerprint of its weights and config, the source of the code
that computes the numbers, the batch size and the shard size; the shard digest hashes the shard's
sentences and trees; the result key hashes the settings key and every shard digest. A profile that is
stopped (a progress callback that raises, Ctrl-C, a killed process) keeps its finished shards, and the
same call resumes from them. Finished results are also kept in memory, the few most recently used.

``coreference_scores(model)`` scores every head on the hand-made pronoun -> antecedent set in
``assets/coreference.jsonl``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import secrets
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from .errors import HeadscopeError, InputTextError
from .metrics import METRIC_COLUMNS, batch_head_metrics
from .progress import Progress, report
from .roles import DELIMITER_MIN_MASS, POSITIONAL_MIN_SHARE, POSITIONAL_OFFSETS, SINK_MIN_MASS, SYNTACTIC_MIN_COUNT
from .run import per_head_frame, punctuation_mask, token_units, word_level_attentions
from .syntax import (
    ASSET_DIR,
    DependencyAccumulator,
    Sentence,
    batch_word_argmax,
    ud_ewt_dev,
    word_argmax,
    word_units,
    words_of_units,
)

if TYPE_CHECKING:
    from .models import LoadedModel

COREFERENCE_ASSET = ASSET_DIR / "coreference.jsonl"
# Metric columns that name a category rather than measure an amount: aggregated by their most common value.
LABEL_COLUMNS = ("kovaleva_pattern", "seed_pattern", "argmax_offset")
# Source files whose code decides a profile's numbers; editing any of them invalidates the cache.
_CODE_FILES = (
    "corpus.py",
    "syntax.py",
    "metrics.py",
    "kernels.py",
    "run.py",
    "models.py",
    "tokens.py",
    "capture.py",
    "families.py",
)
_PROFILE_CACHE_FORMAT = 3
# Sentences per shard: the unit that is cached and resumed. Large enough that batching by length within
# a shard pads little and a shard's file and bookkeeping cost nothing next to its forward passes.
DEFAULT_SHARD_SIZE = 256
# Finished profiles kept in memory (a server runs for days): the least recently used are dropped.
MEMORY_CACHE_ENTRIES = 4
# The per-head table names syntactic roles only from relations with as many examples as a syntactic
# role needs: a relation seen 22 times (vocative in the UD dev split) beats its offset baseline by chance.
HEAD_TABLE_MIN_RELATION_COUNT = SYNTACTIC_MIN_COUNT

_memory_cache: OrderedDict[str, ProfileResult] = OrderedDict()
_memory_lock = threading.Lock()  # the app profiles from several sessions' threads
_fingerprints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class ProfileResult:
    """A corpus profile.

    metrics        mean of ``head_metrics`` over the sentences, one row per (layer, head)
                   (numeric columns averaged; ``LABEL_COLUMNS`` hold their most common value)
    dependency     ``syntax.dependency_scores`` over the corpus, or None when the sentences have no trees
    num_sentences  how many sentences were profiled
    model_name     the model's name
    from_cache     True when the model did not run: the result, or every one of its shards, came from a cache
    """

    metrics: pd.DataFrame
    dependency: pd.DataFrame | None
    num_sentences: int
    model_name: str
    from_cache: bool = False

    def copy(self, from_cache: bool) -> ProfileResult:
        return ProfileResult(
            self.metrics.copy(),
            None if self.dependency is None else self.dependency.copy(),
            self.num_sentences,
            self.model_name,
            from_cache,
        )


# ---- corpora --------------------------------------------------------------------------------
# Files read lazily, by extension: a table's sentences come from one column, a treebank's from its trees.
TABLE_SUFFIXES = (".csv", ".parquet")
# Rows read from a table at a time: a few MB, whatever the file's size.
TABLE_BATCH_ROWS = 8192


class CorpusFile:
    """A corpus file read lazily: each iteration opens the file again and yields one sentence at a time.

    ``.conllu``: ``Sentence`` trees (parsed incrementally); ``.csv`` / ``.parquet``: the strings of one
    column (``column``; by default the column named ``text``, or the only column), read in batches of
    rows with pyarrow; any other file: one sentence per non-blank line. Blank sentences are skipped.
    ``max_sentences`` stops after that many. Memory stays that of one batch, whatever the file's size,
    so ``profile`` can stream millions of sentences (it iterates twice: once to plan, once to compute).
    """

    def __init__(self, path: str | Path, column: str | None = None, max_sentences: int | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise HeadscopeError(f"corpus {str(path)!r} is neither 'ud-ewt-dev' nor an existing file")
        if max_sentences is not None and max_sentences < 1:
            raise HeadscopeError(f"max_sentences must be at least 1, got {max_sentences}")
        self.suffix = self.path.suffix.lower()
        if column is not None and self.suffix not in TABLE_SUFFIXES:
            raise HeadscopeError(f"a column is chosen only in a .csv or .parquet corpus, not in {self.path.name!r}")
        self.max_sentences = max_sentences
        self.column = self._table_column(column) if self.suffix in TABLE_SUFFIXES else None
        if self.suffix not in TABLE_SUFFIXES:
            self._check_text_start()

    def _check_text_start(self) -> None:
        """A text or CoNLL-U corpus must be UTF-8: its first 64 KB are checked here, before any slow work (a
        binary file given by mistake), and the rest as it is read."""
        import codecs

        try:
            with open(self.path, "rb") as handle:
                codecs.getincrementaldecoder("utf-8")().decode(handle.read(1 << 16), final=False)
        except UnicodeDecodeError as exc:
            raise self._not_text(exc) from exc
        except OSError as exc:
            raise HeadscopeError(f"cannot read the corpus {self.path.name!r}: {exc.strerror}") from exc

    def _not_text(self, exc: UnicodeDecodeError) -> HeadscopeError:
        return HeadscopeError(
            f"the corpus {self.path.name!r} is not UTF-8 text (byte {exc.start} of a block): give a text file with "
            "one sentence per line, a .conllu treebank, or a .csv / .parquet table"
        )

    def __repr__(self) -> str:
        return f"CorpusFile({self.path.name!r}, column={self.column!r}, max_sentences={self.max_sentences})"

    def __iter__(self) -> Iterator[Sentence | str]:
        return itertools.islice(self._sentences(), self.max_sentences)

    def _sentences(self) -> Iterator[Sentence | str]:
        if self.suffix == ".conllu":
            from .syntax import iter_conllu

            yield from iter_conllu(self.path)
            return
        if self.suffix in TABLE_SUFFIXES:
            for batch in self._batches([self.column]):
                for value in batch.column(0).to_pylist():
                    if value is not None and str(value).strip():
                        yield str(value).strip()
            return
        try:
            with open(self.path, encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        yield line.strip()
        except UnicodeDecodeError as exc:
            raise self._not_text(exc) from exc

    def _batches(self, columns: list[str] | None):
        """pyarrow record batches of a table's ``columns`` (None: all), a few thousand rows at a time."""
        try:
            if self.suffix == ".parquet":
                import pyarrow.parquet as pq

                yield from pq.ParquetFile(self.path).iter_batches(batch_size=TABLE_BATCH_ROWS, columns=columns)
                return
            import pyarrow.csv as pacsv

            reader = pacsv.open_csv(
                self.path,
                read_options=pacsv.ReadOptions(block_size=1 << 22),
                convert_options=pacsv.ConvertOptions(
                    include_columns=columns, column_types=dict.fromkeys(columns or [], "string")
                ),
            )
            yield from reader
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError, ArrowIOError an OSError
            raise HeadscopeError(f"cannot read {self.path.name!r} as a {self.suffix[1:]} table: {exc}") from exc

    def _table_column(self, column: str | None) -> str:
        if self.suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                names = list(pq.read_schema(self.path).names)
            except (OSError, ValueError) as exc:
                raise HeadscopeError(f"cannot read {self.path.name!r} as a parquet table: {exc}") from exc
        else:
            names = next(iter(self._batches(None)), None)
            names = [] if names is None else list(names.schema.names)
        if column is None:
            column = "text" if "text" in names else names[0] if len(names) == 1 else None
            if column is None:
                raise HeadscopeError(
                    f"{self.path.name!r} has columns {', '.join(map(repr, names))}: choose the sentences' column"
                )
        if column not in names:
            raise HeadscopeError(f"{self.path.name!r} has no column {column!r} (it has {', '.join(map(repr, names))})")
        return column


def open_corpus(
    spec: str | Path, column: str | None = None, max_sentences: int | None = None
) -> list[Sentence] | CorpusFile:
    """A corpus to profile, read lazily: ``"ud-ewt-dev"`` (the shipped UD dev split, a list), or a
    ``CorpusFile`` (``.conllu``, ``.csv`` / ``.parquet`` with ``column``, or text with one sentence per line)."""
    if max_sentences is not None and max_sentences < 1:
        raise HeadscopeError(f"max_sentences must be at least 1, got {max_sentences}")
    if str(spec) == "ud-ewt-dev":
        if column is not None:
            raise HeadscopeError("ud-ewt-dev is a treebank: it has no column to choose")
        return ud_ewt_dev(max_sentences)
    return CorpusFile(spec, column, max_sentences)


def read_corpus(spec: str, max_sentences: int | None = None, column: str | None = None) -> list[Sentence] | list[str]:
    """The whole corpus in memory (``open_corpus``, read to the end); HeadscopeError when it holds no sentences."""
    sentences = list(open_corpus(spec, column, max_sentences))
    if not sentences:
        raise HeadscopeError(f"corpus {spec!r} holds no sentences")
    return sentences


def _model_input(sentence: Sentence | str) -> str | list[str]:
    # Trees are run on their own words so that the run's words are the tree's words.
    if isinstance(sentence, Sentence):
        return sentence.words
    if isinstance(sentence, str) and sentence.strip():
        return sentence
    raise InputTextError(f"a corpus sentence must be a non-empty string or a Sentence, got {sentence!r}")


def _text_length(model_input: str | list[str]) -> int:
    return sum(len(word) + 1 for word in model_input) if isinstance(model_input, list) else len(model_input)


# ---- shards ---------------------------------------------------------------------------------
def check_profile_settings(batch_size: int = 16, shard_size: int = DEFAULT_SHARD_SIZE) -> None:
    """HeadscopeError unless both are whole numbers of at least 1 (checked before any slow work)."""
    for name, value in (("batch_size", batch_size), ("shard_size", shard_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise HeadscopeError(f"{name} must be a whole number of at least 1, got {value!r}")


@dataclass(frozen=True)
class Shard:
    """Consecutive sentences of a corpus: the unit of work that is computed, cached and resumed.

    index      position in the corpus's list of shards
    start      corpus index of the shard's first sentence
    sentences  the shard's sentences (``Sentence`` trees or plain strings)
    """

    index: int
    start: int
    sentences: tuple

    def __len__(self) -> int:
        return len(self.sentences)

    @functools.cached_property
    def digest(self) -> str:
        """A hash of the sentences (with their trees): the shard's name in the cache."""
        return _sentences_digest(self.sentences)


def iter_shards(sentences: Iterable[Sentence | str], shard_size: int = DEFAULT_SHARD_SIZE) -> Iterator[Shard]:
    """``plan_shards`` one shard at a time, reading ``sentences`` only as far as the shard being yielded."""
    check_profile_settings(shard_size=shard_size)
    iterator = iter(sentences)
    for index in itertools.count():
        chunk = tuple(itertools.islice(iterator, shard_size))
        if not chunk:
            return
        yield Shard(index, index * shard_size, chunk)


def plan_shards(sentences: Iterable[Sentence | str], shard_size: int = DEFAULT_SHARD_SIZE) -> list[Shard]:
    """The corpus cut into consecutive shards of ``shard_size`` sentences (the last may be shorter).

    The cut depends on the sentences and ``shard_size`` only, never on who computes the shards.
    """
    return list(iter_shards(sentences, shard_size))


# ---- mergeable partial results --------------------------------------------------------------
@dataclass
class LabelTally:
    """How often each head had each label over consecutive sentences, and in which sentence first.

    values      ``[V]`` the distinct labels, sorted
    counts      ``[heads, V]`` number of sentences in which the head had the label
    first_seen  ``[heads, V]`` index (counted from the first of these sentences) of the first sentence in
                which the head had the label; the number of sentences where it never had it
    """

    values: np.ndarray
    counts: np.ndarray
    first_seen: np.ndarray

    @classmethod
    def of_sentences(cls, labels: np.ndarray) -> LabelTally:
        """From ``[sentences, heads]`` labels in sentence order (None or NaN: no label)."""
        num_sentences, num_heads = labels.shape
        present = ~pd.isna(labels)
        sentence, head = np.nonzero(present)  # sentence-major, as labels[present]
        values, codes = np.unique(np.asarray(labels[present].tolist()), return_inverse=True)
        pair = head * len(values) + codes.reshape(-1)
        counts = np.bincount(pair, minlength=num_heads * len(values)).astype(np.int64)
        first_seen = np.full(num_heads * len(values), num_sentences, dtype=np.int64)
        seen_pairs, first = np.unique(pair, return_index=True)  # first occurrence = earliest sentence
        first_seen[seen_pairs] = sentence[first]
        return cls(values, counts.reshape(num_heads, -1), first_seen.reshape(num_heads, -1))

    @classmethod
    def merged(cls, tallies: Sequence[LabelTally], sizes: Sequence[int]) -> LabelTally:
        """Tallies of consecutive runs of sentences, in corpus order, as one (``sizes``: their numbers of sentences)."""
        total = int(sum(sizes))
        nonempty = [tally.values for tally in tallies if len(tally.values)]
        values = functools.reduce(np.union1d, nonempty) if nonempty else tallies[0].values
        num_heads = tallies[0].counts.shape[0]
        counts = np.zeros((num_heads, len(values)), dtype=np.int64)
        first_seen = np.full((num_heads, len(values)), total, dtype=np.int64)
        offset = 0
        for tally, size in zip(tallies, sizes, strict=True):
            column = np.searchsorted(values, tally.values)
            counts[:, column] += tally.counts
            first_seen[:, column] = np.minimum(
                first_seen[:, column], np.where(tally.counts > 0, tally.first_seen + offset, total)
            )
            offset += size
        return cls(values, counts, first_seen)

    def majority(self) -> np.ndarray:
        """``[heads]``: each head's most common label, ties to the one seen first; None where a head has none."""
        num_heads = self.counts.shape[0]
        if not len(self.values):
            return np.full(num_heads, None, dtype=object)
        # Count first, then the earlier first sighting: first_seen < scale, so one more count always wins.
        scale = int(self.first_seen.max()) + 1
        chosen = self.values[np.where(self.counts > 0, self.counts * scale - self.first_seen, -1).argmax(axis=-1)]
        if chosen.dtype.kind == "U":
            chosen = chosen.astype(object)
        unlabelled = self.counts.max(axis=-1) == 0
        if unlabelled.any():
            chosen = chosen.astype(object)
            chosen[unlabelled] = None
        return chosen


@dataclass
class MetricTotals:
    """Per-head totals of per-sentence measurements over consecutive sentences.

    Enough for the mean of every numeric column (missing values skipped) and the most common value
    of every label column, and mergeable: the totals of two runs of sentences add up.

    num_sentences  how many sentences
    columns        every column's name, in order
    sums, counts   numeric column -> ``[heads]`` float64 sum and int64 number of its non-missing values
    squares        numeric column -> ``[heads]`` float64 sum of squares (for the spread over sentences)
    labels         label column (``LABEL_COLUMNS`` and any non-numeric column) -> its ``LabelTally``
    """

    num_sentences: int
    columns: tuple[str, ...]
    sums: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    labels: dict[str, LabelTally]
    squares: dict[str, np.ndarray]

    @classmethod
    def of_sentences(cls, columns: dict[str, np.ndarray]) -> MetricTotals:
        """From ``name -> [sentences, heads]`` values in sentence order."""
        sums, counts, labels, squares = {}, {}, {}, {}
        num_sentences = 0
        for name, values in columns.items():
            values = np.asarray(values)
            num_sentences = values.shape[0]
            if name in LABEL_COLUMNS or values.dtype.kind not in "fiub":
                labels[name] = LabelTally.of_sentences(values)
            else:
                values = values.astype(np.float64)
                present = ~np.isnan(values)
                kept = np.where(present, values, 0.0)
                sums[name], squares[name] = kept.sum(axis=0), (kept * kept).sum(axis=0)
                counts[name] = present.sum(axis=0).astype(np.int64)
        return cls(num_sentences, tuple(columns), sums, counts, labels, squares)

    @classmethod
    def merged(cls, totals: Sequence[MetricTotals]) -> MetricTotals:
        """Totals of consecutive runs of sentences, given in corpus order, as one.

        Float sums are added in the order given, so the same totals in the same order give the same bits.
        """
        first = totals[0]
        if any(other.columns != first.columns or other.labels.keys() != first.labels.keys() for other in totals):
            raise HeadscopeError("cannot merge measurements with different columns")

        def added(field: str) -> dict[str, np.ndarray]:
            totals_of = {}
            for name, first_values in getattr(first, field).items():
                totals_of[name] = first_values.copy()
                for other in totals[1:]:
                    totals_of[name] += getattr(other, field)[name]
            return totals_of

        counts = {name: np.sum([other.counts[name] for other in totals], axis=0) for name in first.counts}
        sizes = [other.num_sentences for other in totals]
        labels = {name: LabelTally.merged([other.labels[name] for other in totals], sizes) for name in first.labels}
        return cls(int(sum(sizes)), first.columns, added("sums"), counts, labels, added("squares"))

    def means(self) -> dict[str, np.ndarray]:
        """Column -> ``[heads]``: numeric columns averaged over the sentences with a value (NaN if none),
        label columns by majority."""
        means = {}
        for name in self.columns:
            if name in self.labels:
                means[name] = self.labels[name].majority()
            else:
                with np.errstate(invalid="ignore", divide="ignore"):
                    means[name] = self.sums[name] / self.counts[name]
        return means

    def spreads(self) -> dict[str, np.ndarray]:
        """Numeric column -> ``[heads]`` sample standard deviation of its per-sentence values (NaN below two)."""
        spreads = {}
        for name, total in self.sums.items():
            count = self.counts[name].astype(np.float64)
            with np.errstate(invalid="ignore", divide="ignore"):
                variance = (self.squares[name] - total * total / count) / (count - 1)
            spreads[name] = np.where(count > 1, np.sqrt(np.maximum(variance, 0.0)), np.nan)
        return spreads

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "num_sentences": np.array(self.num_sentences, dtype=np.int64),
            "columns": np.array(self.columns, dtype=str),
            "label_columns": np.array(list(self.labels), dtype=str),
        }
        for name in self.sums:
            arrays[f"sum.{name}"], arrays[f"count.{name}"] = self.sums[name], self.counts[name]
            arrays[f"squares.{name}"] = self.squares[name]
        for name, tally in self.labels.items():
            arrays[f"values.{name}"], arrays[f"counts.{name}"] = tally.values, tally.counts
            arrays[f"first_seen.{name}"] = tally.first_seen
        return arrays

    @classmethod
    def from_arrays(cls, arrays) -> MetricTotals:
        columns = tuple(str(name) for name in arrays["columns"])
        label_columns = [str(name) for name in arrays["label_columns"]]
        labels = {
            name: LabelTally(arrays[f"values.{name}"], arrays[f"counts.{name}"], arrays[f"first_seen.{name}"])
            for name in label_columns
        }
        numeric = [name for name in columns if name not in labels]
        return cls(
            int(arrays["num_sentences"]),
            columns,
            {name: arrays[f"sum.{name}"] for name in numeric},
            {name: arrays[f"count.{name}"] for name in numeric},
            labels,
            {name: arrays[f"squares.{name}"] for name in numeric},
        )


@dataclass
class ProfilePart:
    """Everything a profile needs of some consecutive sentences (one shard, or shards merged).

    start                  corpus index of the first sentence
    num_layers, num_heads  the model's size
    metrics                ``MetricTotals`` of ``batch_head_metrics`` (one value per sentence and head)
    dependency             Clark et al. dependency counts, or None unless every sentence has a tree
    """

    start: int
    num_layers: int
    num_heads: int
    metrics: MetricTotals
    dependency: DependencyAccumulator | None

    @property
    def num_sentences(self) -> int:
        return self.metrics.num_sentences

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays, no pickle. ``start`` is left out: the same sentences may start elsewhere in another corpus."""
        arrays = {
            "shape": np.array([self.num_layers, self.num_heads], dtype=np.int64),
            **{f"metrics.{name}": values for name, values in self.metrics.to_arrays().items()},
        }
        if self.dependency is not None:
            arrays.update({f"dependency.{name}": values for name, values in self.dependency.to_arrays().items()})
        return arrays

    @classmethod
    def from_arrays(cls, arrays, start: int) -> ProfilePart:
        """The part ``to_arrays`` saved, placed at ``start``; ValueError or KeyError when the arrays do not fit."""

        def section(prefix: str) -> dict[str, np.ndarray]:
            return {name[len(prefix) :]: values for name, values in arrays.items() if name.startswith(prefix)}

        num_layers, num_heads = (int(size) for size in arrays["shape"])
        metrics = MetricTotals.from_arrays(section("metrics."))
        dependency = section("dependency.")
        part = cls(
            start, num_layers, num_heads, metrics, DependencyAccumulator.from_arrays(dependency) if dependency else None
        )
        heads = num_layers * num_heads
        if (
            any(values.shape != (heads,) for table in (metrics.sums, metrics.counts) for values in table.values())
            or any(
                tally.counts.shape != (heads, len(tally.values)) or tally.first_seen.shape != tally.counts.shape
                for tally in metrics.labels.values()
            )
            or (part.dependency is not None and part.dependency.shape not in (None, (num_layers, num_heads)))
        ):
            raise ValueError("profile part of inconsistent shapes")
        return part


class PartMerger:
    """Parts added up in corpus order as they arrive, in any order: a part that arrives before the parts
    it follows waits; the others are folded in at once, so memory holds only the early arrivals.

    Folding one part at a time in corpus order adds the same floats in the same order as any other
    corpus-order merge, so the result is the same, bit for bit, however the shards were scheduled.
    ``start``: corpus index of the first sentence (the first part must begin there).
    """

    def __init__(self, start: int = 0):
        self.next_start = start
        self.merged: ProfilePart | None = None
        self.waiting: dict[int, ProfilePart] = {}

    def add(self, part: ProfilePart) -> None:
        if part.start < self.next_start or part.start in self.waiting:
            raise HeadscopeError(f"profile parts leave a gap or an overlap at sentence {part.start}")
        self.waiting[part.start] = part
        while self.next_start in self.waiting:
            following = self.waiting.pop(self.next_start)
            self.merged = following if self.merged is None else _merged_pair(self.merged, following)
            self.next_start += following.num_sentences

    def result(self) -> ProfilePart:
        """Everything merged; HeadscopeError when nothing arrived or parts are missing."""
        if self.waiting:
            raise HeadscopeError(f"profile parts leave a gap or an overlap at sentence {self.next_start}")
        if self.merged is None:
            raise HeadscopeError("no profile parts to merge")
        return self.merged


def _merged_pair(before: ProfilePart, after: ProfilePart) -> ProfilePart:
    """``before`` and the part that follows it as one part (``before`` itself is left as it was)."""
    if (after.num_layers, after.num_heads) != (before.num_layers, before.num_heads):
        raise HeadscopeError("profile parts come from models of different sizes")
    dependency = None
    if before.dependency is not None and after.dependency is not None:
        dependency = DependencyAccumulator(full_relations=before.dependency.full_relations)
        dependency.merge(before.dependency)
        dependency.merge(after.dependency)
    return ProfilePart(
        before.start,
        before.num_layers,
        before.num_heads,
        MetricTotals.merged([before.metrics, after.metrics]),
        dependency,
    )


def merge_parts(parts: Iterable[ProfilePart]) -> ProfilePart:
    """Parts of consecutive sentences as one part, added up in corpus order whatever order they come in.

    So the result is the same, bit for bit, however the shards were scheduled. The parts must cover
    consecutive sentences without a gap or an overlap. Parts are folded one at a time in corpus order
    (``PartMerger``), so merging all parts at once or as they arrive gives the same bits.
    """
    parts = sorted(parts, key=lambda part: part.start)
    if not parts:
        raise HeadscopeError("no profile parts to merge")
    merger = PartMerger(parts[0].start)
    for part in parts:
        merger.add(part)
    return merger.result()


# The role statistics of a corpus profile rest on sentences: these columns hold the spread over sentences
# of the measurement a role reads (not, as in one sentence's table, the spread over its queries).
CORPUS_SPREADS = {
    "normalized_entropy_sd": "normalized_entropy",
    "sink_mass_sd": "sink_mass",
    "punctuation_mass_sd": "punctuation_mass",
    "argmax_offset_share_sd": "argmax_offset_share",
}


def finish_profile(part: ProfilePart, model_name: str, from_cache: bool = False) -> ProfileResult:
    """The ``ProfileResult`` of a whole corpus's merged part: means, majorities, spreads over sentences and
    dependency accuracy."""
    spreads = part.metrics.spreads()
    columns = {
        **part.metrics.means(),
        **{column: spreads[source] for column, source in CORPUS_SPREADS.items()},
        "num_sentences": part.num_sentences,
    }
    metrics = per_head_frame(part.num_layers, part.num_heads, **columns)
    return ProfileResult(
        metrics=metrics[[*METRIC_COLUMNS, "argmax_offset_share_sd", "num_sentences"]],
        dependency=part.dependency.result() if part.dependency is not None else None,
        num_sentences=part.num_sentences,
        model_name=str(model_name),
        from_cache=from_cache,
    )


def mean_metrics(frames: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Mean of per-sentence ``head_metrics`` tables: numeric columns averaged (NaN skipped), labels by majority."""
    if not frames:
        raise HeadscopeError("no metrics to average")
    first = frames[0]
    totals = MetricTotals.of_sentences(
        {
            column: np.stack([frame[column].to_numpy() for frame in frames])
            for column in first.columns
            if column not in ("layer", "head")
        }
    )
    return pd.DataFrame({"layer": first["layer"].to_numpy(), "head": first["head"].to_numpy(), **totals.means()})


# ---- cache keys -----------------------------------------------------------------------------
def weights_fingerprint(model) -> str:
    """A hash of the model's config and every byte of its weights.

    Bytes, not sums: a floating-point sum depends on the thread count that reduces it, and a key that
    changed with ``torch.set_num_threads`` would miss the cache of the same model in another process."""
    import torch

    hf_model = model.hf_model
    try:
        return _fingerprints[hf_model]
    except (KeyError, TypeError):
        pass
    digest = hashlib.sha256(hf_model.config.to_json_string(use_diff=False).encode())
    with torch.inference_mode():
        for name, tensor in hf_model.state_dict().items():
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
            digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    fingerprint = digest.hexdigest()
    with contextlib.suppress(TypeError):  # a model that cannot be weakly referenced is fingerprinted every time
        _fingerprints[hf_model] = fingerprint
    return fingerprint


def _code_version() -> str:
    digest = hashlib.sha256(str(_PROFILE_CACHE_FORMAT).encode())
    here = Path(__file__).resolve().parent
    for name in _CODE_FILES:
        if (here / name).is_file():
            digest.update((here / name).read_bytes())
    return digest.hexdigest()


def _sentences_digest(sentences: Sequence[Sentence | str]) -> str:
    digest = hashlib.sha256()
    for sentence in sentences:
        if isinstance(sentence, Sentence):
            item = [sentence.words, sentence.heads, sentence.relations, sentence.full_relations]
        else:
            item = str(sentence)
        digest.update(json.dumps(item, ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:32]


def profile_cache_dir() -> Path:
    root = os.environ.get("HEADSCOPE_CACHE_DIR") or Path.home() / ".cache" / "headscope"
    return Path(root).expanduser() / "profiles"


@contextlib.contextmanager
def _atomic_file(path: Path):
    """Yield a temporary path beside ``path``, renamed onto ``path`` when the block succeeds and deleted otherwise:
    a reader, or the next run after a kill, never finds half a file.

    The temporary file is created with mode 0666 less the process's umask, as ``open`` creates the user's
    other files (``tempfile.mkstemp`` would make it 0600, and the rename would keep that)."""
    for _ in range(100):
        temporary = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp{path.suffix}"
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free temporary name beside {path.name}")
    try:
        yield Path(temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class ShardCache:
    """Finished shards of one model and one set of settings, on disk.

    ``<profiles>/shards/<settings key>/<shard digest>.npz``: the settings key hashes the model name,
    its weights fingerprint, the code version, the batch size and the shard size (everything that
    changes the numbers); the digest hashes the shard's sentences. Each file holds the part's arrays
    and a JSON header of what it is (no pickle), and is written atomically.
    """

    def __init__(self, model: LoadedModel, batch_size: int = 16, shard_size: int = DEFAULT_SHARD_SIZE):
        parts = [_PROFILE_CACHE_FORMAT, model.name, weights_fingerprint(model), _code_version(), batch_size, shard_size]
        self.settings_key = hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:32]
        self.folder = profile_cache_dir() / "shards" / self.settings_key

    def path(self, shard: Shard) -> Path:
        return self.folder / f"{shard.digest}.npz"

    def result_key(self, shards: Sequence[Shard | str]) -> str:
        """The key of the whole profile's merged result: these settings and every shard's sentences
        (shards, or their digests)."""
        digests = [shard if isinstance(shard, str) else shard.digest for shard in shards]
        key = "|".join([self.settings_key, *digests])
        return hashlib.sha256(key.encode()).hexdigest()[:32]

    def _header(self, digest: str, num_sentences: int) -> dict:
        return {
            "format": _PROFILE_CACHE_FORMAT,
            "settings": self.settings_key,
            "shard": digest,
            "num_sentences": num_sentences,
        }

    def load(self, shard: Shard) -> ProfilePart | None:
        """The shard's part, or None when its file is missing, damaged or another's (then it is computed again)."""
        return self.load_digest(shard.digest, len(shard), shard.start)

    def load_digest(self, digest: str, num_sentences: int, start: int = 0) -> ProfilePart | None:
        """``load`` of the shard with this digest and size, placed at ``start``."""
        try:
            with np.load(self.folder / f"{digest}.npz", allow_pickle=False) as stored:
                arrays = {name: stored[name] for name in stored.files}  # reading checks each array's CRC
            if json.loads(arrays.pop("header").tobytes().decode("utf-8")) != self._header(digest, num_sentences):
                return None
            part = ProfilePart.from_arrays(arrays, start=start)
        except Exception:  # a damaged zip raises BadZipFile, EOFError, NotImplementedError, RuntimeError...
            return None  # ...and any of them only means: compute the shard again
        return part if part.num_sentences == num_sentences else None

    def store(self, shard: Shard, part: ProfilePart) -> None:
        header = np.frombuffer(json.dumps(self._header(shard.digest, len(shard))).encode("utf-8"), dtype=np.uint8)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with _atomic_file(self.path(shard)) as temporary:
                # Compressed: the dependency sums are mostly zeros (rare relations), 16 times smaller this way.
                np.savez_compressed(temporary, header=header, **part.to_arrays())
        except OSError:
            pass  # a read-only cache directory costs speed, not correctness


def shards_in_cache(
    model: LoadedModel, sentences: Iterable[Sentence | str], batch_size: int = 16, shard_size: int = DEFAULT_SHARD_SIZE
) -> tuple[int, int]:
    """``(finished shards in the cache, shards in all)`` of this profile: a new call computes only the others."""
    store = ShardCache(model, batch_size, shard_size)
    found = [store.load(shard) is not None for shard in iter_shards(sentences, shard_size)]
    return sum(found), len(found)


# ---- finished results: memory (a few, least recently used dropped) and disk -------------------
def clear_memory_cache() -> None:
    with _memory_lock:
        _memory_cache.clear()


def _remember(key: str, result: ProfileResult) -> None:
    with _memory_lock:
        _memory_cache[key] = result.copy(from_cache=False)
        _memory_cache.move_to_end(key)
        while len(_memory_cache) > MEMORY_CACHE_ENTRIES:
            _memory_cache.popitem(last=False)


def _load_result(key: str) -> ProfileResult | None:
    with _memory_lock:
        remembered = _memory_cache.get(key)
        if remembered is not None:
            _memory_cache.move_to_end(key)
    if remembered is not None:
        return remembered.copy(from_cache=True)
    folder = profile_cache_dir() / "results" / key
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        metrics = pd.read_parquet(folder / "metrics.parquet")
        dependency = pd.read_parquet(folder / "dependency.parquet") if meta["has_dependency"] else None
    except (OSError, ValueError, KeyError):
        return None  # missing or damaged entry: compute again
    result = ProfileResult(metrics, dependency, int(meta["num_sentences"]), str(meta["model_name"]))
    _remember(key, result)
    return result.copy(from_cache=True)


def _store_result(key: str, result: ProfileResult) -> None:
    _remember(key, result)
    root = profile_cache_dir() / "results"
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=root))
    except OSError:
        return  # a read-only cache directory costs speed, not correctness
    try:
        result.metrics.to_parquet(staging / "metrics.parquet", index=False)
        if result.dependency is not None:
            result.dependency.to_parquet(staging / "dependency.parquet", index=False)
        (staging / "meta.json").write_text(
            json.dumps(
                {
                    "model_name": result.model_name,
                    "num_sentences": result.num_sentences,
                    "has_dependency": result.dependency is not None,
                }
            ),
            encoding="utf-8",
        )
        if not (root / key).exists():
            staging.rename(root / key)  # atomic: a reader never sees half an entry
    except OSError:
        pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # whatever was not renamed (another process was first, an error)


# ---- profiling ----------------------------------------------------------------------------
@dataclass
class _TokenInfo:
    """What profiling needs of one tokenized sentence besides its attentions."""

    special_mask: np.ndarray
    punctuation_mask: np.ndarray
    segment_ids: np.ndarray
    word_ids: np.ndarray
    num_words: int

    @classmethod
    def of_run(cls, run) -> _TokenInfo:
        return cls(run.special_mask, run.punctuation_mask, run.segment_ids, run.word_ids, len(run.words))


def _padded(rows: Sequence[np.ndarray], width: int, fill) -> np.ndarray:
    out = np.full((len(rows), width), fill, dtype=np.asarray(rows[0]).dtype)
    for row, values in enumerate(rows):
        out[row, : len(values)] = values
    return out


def _forward_batches(model, inputs: list, batch_size: int):
    """Yield ``(sentence indices, attentions [B, L, H, n, n] with zero padding, token infos, is_causal)``.

    Sentences of similar lengths share a batch, to keep padding small: the same batches as ``run_batch``.
    """
    if not hasattr(model, "forward_encoded"):  # a model that only gives runs
        order = sorted(range(len(inputs)), key=lambda i: _text_length(inputs[i]))
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            runs = model.run_batch([inputs[i] for i in chunk], batch_size=batch_size)
            width = max(run.num_tokens for run in runs)
            attentions = np.zeros((len(runs), *runs[0].attentions.shape[:2], width, width), dtype=np.float32)
            for row, run in enumerate(runs):
                attentions[row, :, :, : run.num_tokens, : run.num_tokens] = run.attentions
            yield chunk, attentions, [_TokenInfo.of_run(run) for run in runs], runs[0].is_causal
        return
    # Tokenized once; one padded forward pass per batch; no per-sentence run objects. Each batch's
    # attentions are measured and dropped before the next pass, so every pass reuses the same memory.
    from .capture import AttentionBuffer

    buffer = AttentionBuffer()
    encoded = [model.encode(model_input) for model_input in inputs]
    order = sorted(range(len(inputs)), key=lambda i: len(encoded[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        attentions, _ = model.forward_encoded([encoded[i] for i in chunk], out=buffer)
        infos = [
            _TokenInfo(
                e.special_mask,
                punctuation_mask(model.display.display(e.raw_tokens), e.special_mask),
                e.segment_ids,
                e.word_ids,
                len(e.words),
            )
            for e in (encoded[i] for i in chunk)
        ]
        yield chunk, attentions.numpy(), infos, model.is_causal


def _add_dependencies(
    accumulator: DependencyAccumulator, attentions: np.ndarray, infos: list[_TokenInfo], sentences: list[Sentence]
) -> None:
    """Clark et al. word-level argmax for a padded batch at once, then each sentence's tree cases.

    Only word units are converted to word level: special units are never predicted nor scored, so their
    rows and columns would be computed only to be excluded (the word units keep their order, so every
    argmax and its ties are the same).
    """
    word_unit_of_token, unit_words = [], []
    for info in infos:
        unit_of_token, first = token_units(info.word_ids, info.special_mask, info.segment_ids)
        is_word = ~info.special_mask[first] & (info.word_ids[first] >= 0)
        word_unit = np.where(is_word, np.cumsum(is_word) - 1, -1)  # each unit's index among the word units
        word_unit_of_token.append(word_unit[unit_of_token])
        unit_words.append(info.word_ids[first][is_word])
    num_units = max(len(unit_word) for unit_word in unit_words)
    if num_units == 0:
        unit_words = [np.zeros(0, dtype=np.int64) for _ in infos]
        best_word = np.zeros((len(infos), *attentions.shape[1:3], 0), dtype=np.int64)
    else:
        word_attentions = word_level_attentions(
            attentions, _padded(word_unit_of_token, attentions.shape[-1], -1), num_units
        )
        best_word = batch_word_argmax(word_attentions, _padded(unit_words, num_units, -1), overwrite=True)
    predictions, has_words = [], []
    for row, (info, unit_word, sentence) in enumerate(zip(infos, unit_words, sentences)):
        if info.num_words != len(sentence.words):
            raise HeadscopeError(
                f"sentence {sentence.sent_id!r}: the run has {info.num_words} words, the tree {len(sentence.words)}; "
                "run the model on the sentence's words (model.run(sentence.words))"
            )
        prediction, has_word = words_of_units(best_word[row, ..., : len(unit_word)], unit_word, info.num_words)
        predictions.append(prediction)
        has_words.append(has_word)
    accumulator.add_predictions(predictions, has_words, sentences)


# A batch is measured in parts when that spares at least this many attention weights of padding
# (each part costs a fixed ~2 ms of numpy calls; a weight about 7 ns).
MEASURE_SPLIT_MIN_SAVING = 400_000


def _measured_parts(lengths: Sequence[int], weights_per_token_pair: int) -> list[np.ndarray]:
    """Rows of a padded batch grouped for measuring: one group, or the shorter rows apart from the longest
    when the batch's longest text would make most of their weights padding (e.g. a last batch of a few long
    texts). Groups hold rows in length order; measuring a group trimmed to its own longest text gives each
    row the same values (within float rounding) as measuring the whole padded batch."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    sorted_lengths = np.asarray(lengths)[order]
    width = int(sorted_lengths[-1])
    best_saving, best_cut = 0, 0
    for cut in range(1, len(order)):
        if sorted_lengths[cut - 1] < width:
            saving = cut * (width * width - int(sorted_lengths[cut - 1]) ** 2) * weights_per_token_pair
            if saving > best_saving:
                best_saving, best_cut = saving, cut
    if best_saving < MEASURE_SPLIT_MIN_SAVING:
        return [np.arange(len(order))]
    return [*_regrouped(order[:best_cut], sorted_lengths[:best_cut], weights_per_token_pair), order[best_cut:]]


def _regrouped(rows: np.ndarray, lengths: np.ndarray, weights_per_token_pair: int) -> list[np.ndarray]:
    return [rows[part] for part in _measured_parts(lengths, weights_per_token_pair)]


def compute_shard(
    model: LoadedModel, shard: Shard, batch_size: int = 16, progress: Progress | None = None
) -> ProfilePart:
    """Measure one shard: a function of the model, the shard's sentences and ``batch_size`` alone.

    The shard's sentences are tokenized, run in padded batches of similar lengths and each batch is
    measured at once (``batch_head_metrics``, batched word-level argmax); the part's means equal the
    means of ``head_metrics`` and ``dependency_scores`` of the single runs. ``progress(done, total,
    message)`` counts the shard's sentences.
    """
    check_profile_settings(batch_size=batch_size)
    if not len(shard):
        raise HeadscopeError(f"shard {shard.index} holds no sentences")
    sentences = list(shard.sentences)
    inputs = [_model_input(sentence) for sentence in sentences]
    accumulator = DependencyAccumulator() if all(isinstance(s, Sentence) for s in sentences) else None
    order: list[int] = []
    per_batch: list[dict[str, np.ndarray]] = []
    for chunk, attentions, infos, is_causal in _forward_batches(model, inputs, batch_size):
        num_layers, num_heads = attentions.shape[1:3]
        lengths = [len(info.special_mask) for info in infos]
        for rows in _measured_parts(lengths, num_layers * num_heads):
            width = max(lengths[row] for row in rows)
            if len(rows) == len(infos) and width == attentions.shape[-1]:
                part, part_infos = attentions, infos
            else:
                part = np.ascontiguousarray(attentions[rows, :, :, :width, :width])
                part_infos = [infos[row] for row in rows]
            per_batch.append(
                batch_head_metrics(
                    part,
                    _padded([info.special_mask for info in part_infos], width, False),
                    _padded([info.punctuation_mask for info in part_infos], width, False),
                    _padded([info.segment_ids for info in part_infos], width, -1),
                    is_causal,
                )
            )
            if accumulator is not None:
                _add_dependencies(accumulator, part, part_infos, [sentences[chunk[row]] for row in rows])
            order.extend(chunk[row] for row in rows)
        report(progress, len(order), len(sentences), "sentences profiled")
    in_sentence_order = np.argsort(order)
    columns = {name: np.concatenate([batch[name] for batch in per_batch])[in_sentence_order] for name in per_batch[0]}
    return ProfilePart(shard.start, num_layers, num_heads, MetricTotals.of_sentences(columns), accumulator)


def _within_shard(progress: Progress | None, shard: Shard, done_before: int, total: int, num_shards: int):
    """``compute_shard``'s progress as corpus progress; the shard's last batch is reported once it is stored."""
    if progress is None:
        return None

    def report_batch(done: float, shard_total: float, message: str = "") -> None:
        if done < shard_total:
            progress(done_before + done, total, f"shard {shard.index + 1} of {num_shards}: {message}")

    return report_batch


EXECUTORS = ("local", "ray")


def profile(
    model: LoadedModel,
    sentences: Iterable[Sentence | str],
    batch_size: int = 16,
    shard_size: int = DEFAULT_SHARD_SIZE,
    progress: Progress | None = None,
    cache: bool = True,
    executor: str = "local",
    workers: int | None = None,
    address: str | None = None,
    executor_options: dict | None = None,
) -> ProfileResult:
    """Profile every head of ``model`` over ``sentences`` (``Sentence`` trees or plain strings).

    The sentences are cut into shards of ``shard_size`` (``iter_shards``); each shard is computed
    (``compute_shard``) or, with ``cache``, loaded from the cache, where each finished shard is stored
    as soon as it arrives: a profile stopped half-way (a progress callback that raises, Ctrl-C, a
    killed process) resumes from its finished shards. The parts are merged in corpus order as they
    arrive (``PartMerger``), so the result does not depend on which shards came from the cache, nor on
    who computed them in which order. The result equals the mean of ``head_metrics`` and
    ``dependency_scores`` of the single runs (to float rounding: padding and shard size change the
    order of float sums).

    ``sentences``: a list, or a re-iterable corpus read lazily (``open_corpus``): it is read twice, once
    to plan and check the shards (nothing but their digests is kept), once to compute them, so a corpus
    of millions of sentences never sits in memory. A one-pass iterator is read into a list first.
    ``progress(done, total, message)`` counts sentences, those of cached shards included.

    ``executor``: ``"local"`` computes the shards in this process; ``"ray"`` on ``workers`` Ray actors
    (``mha_core.distributed``: each loads the model by its name once; a local Ray cluster unless
    ``address`` names one). Each shard is computed the same way by either, so both give the same
    numbers. ``executor_options``: further keyword arguments of ``distributed.ray_parts``.
    """
    if executor not in EXECUTORS:
        raise HeadscopeError(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if executor == "local" and (workers is not None or address is not None or executor_options):
        raise HeadscopeError("workers, address and executor_options are options of the ray executor")
    check_profile_settings(batch_size, shard_size)
    if iter(sentences) is sentences:
        sentences = list(sentences)  # a one-pass iterator: the two passes need it twice
    # Pass 1: check every sentence before any slow work, and name each shard; no sentence is kept.
    digests, sizes = [], []
    for shard in iter_shards(sentences, shard_size):
        for sentence in shard.sentences:
            _model_input(sentence)
        digests.append(shard.digest)
        sizes.append(len(shard))
    if not digests:
        raise HeadscopeError("the corpus is empty")
    total, num_shards = sum(sizes), len(digests)
    # A model without weights to fingerprint (a stand-in in a test) is never cached.
    store = ShardCache(model, batch_size, shard_size) if cache and hasattr(model, "hf_model") else None
    result_key = store.result_key(digests) if store is not None else None
    if result_key is not None:
        cached = _load_result(result_key)
        if cached is not None:
            report(progress, total, total, "profile from the cache")
            return cached
    in_cache = set()
    if store is not None:
        in_cache = {
            index for index, digest in enumerate(digests) if store.load_digest(digest, sizes[index]) is not None
        }
    done = sum(sizes[index] for index in in_cache)
    if in_cache:
        report(progress, done, total, f"{len(in_cache)} of {num_shards} shards from the cache")
    merger = PartMerger()
    finished = 0

    def to_compute() -> Iterator[Shard]:
        # Pass 2: cached shards are merged as they are read; the others go to the executor, in corpus order.
        nonlocal finished
        for shard in iter_shards(sentences, shard_size):
            part = store.load(shard) if shard.index in in_cache else None
            if part is not None:
                merger.add(part)
                finished += 1
            else:
                yield shard

    if executor == "local" or len(in_cache) == num_shards:  # nothing to compute: no cluster to start
        computed = _local_parts(model, to_compute(), batch_size, progress, lambda: done, total, num_shards)
    else:
        from .distributed import model_reference, ray_parts

        computed = ray_parts(
            model_reference(model),
            to_compute(),
            batch_size=batch_size,
            workers=workers,
            address=address,
            **(executor_options or {}),
        )
    with contextlib.closing(computed):
        for shard, part in computed:
            if part.num_sentences != len(shard) or part.start != shard.start:
                raise HeadscopeError(f"shard {shard.index} came back with the wrong sentences")
            if store is not None:
                store.store(shard, part)
            merger.add(part)
            finished += 1
            done += len(shard)
            report(progress, done, total, f"{finished} of {num_shards} shards done")
    result = finish_profile(merger.result(), model.name, from_cache=len(in_cache) == num_shards)
    if result_key is not None:
        _store_result(result_key, result)
    return result


def _local_parts(model, shards: Iterable[Shard], batch_size: int, progress, done_before, total: int, num_shards: int):
    """``(shard, part)`` of each shard, computed here, in order (``done_before()``: sentences finished so far)."""
    for shard in shards:
        yield (
            shard,
            compute_shard(model, shard, batch_size, _within_shard(progress, shard, done_before(), total, num_shards)),
        )


# ---- coreference ----------------------------------------------------------------------------
def load_coreference(path: str | Path | None = None) -> list[dict]:
    """The pronoun -> antecedent items: ``{"id", "words", "pronoun", "antecedent": [...], "distractor": [...]}``."""
    path = Path(path) if path is not None else COREFERENCE_ASSET
    items = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for item in items:
        n = len(item["words"])
        indices = [item["pronoun"], *item["antecedent"], *item.get("distractor", [])]
        if not item["antecedent"] or not all(0 <= i < n for i in indices):
            raise HeadscopeError(f"coreference item {item.get('id')!r}: word index outside the sentence")
    return items


def coreference_scores(model: LoadedModel, items: Sequence[dict] | None = None, batch_size: int = 16) -> pd.DataFrame:
    """Each head's coreference accuracy: from the pronoun, does its word-level argmax land on the antecedent?

    Word level (Clark et al. 2019): attention to a word sums over all its tokens, so "any token of the
    antecedent" counts; special tokens and the pronoun itself are excluded from the argmax. Columns:
    ``layer, head, accuracy`` (argmax on an antecedent word), ``count`` (pronouns scored),
    ``candidate_accuracy`` (the pronoun gives the antecedent more attention than the distractor noun),
    ``baseline_accuracy`` (the better of always choosing the first or the nearest candidate).
    """
    items = list(items) if items is not None else load_coreference()
    if not items:
        raise HeadscopeError("no coreference items")
    runs = model.run_batch([item["words"] for item in items], batch_size=batch_size)
    correct = candidate_correct = None
    count = candidate_count = 0
    first_right = nearest_right = 0
    for item, run in zip(items, runs):
        prediction, has_word = word_argmax(run)
        pronoun, antecedent = item["pronoun"], list(item["antecedent"])
        distractor = list(item.get("distractor", []))
        if not has_word[pronoun] or not has_word[antecedent].any():
            continue  # truncated or dropped by the tokenizer
        if correct is None:
            correct = np.zeros(prediction.shape[:2], dtype=np.int64)
            candidate_correct = np.zeros(prediction.shape[:2], dtype=np.int64)
        correct += np.isin(prediction[:, :, pronoun], antecedent)
        count += 1
        if distractor:
            word_run, unit_word = word_units(run)
            unit_of_word = {int(w): u for u, w in enumerate(unit_word) if w >= 0}
            row = word_run.attentions[:, :, unit_of_word[pronoun]]
            to_antecedent = row[..., [unit_of_word[w] for w in antecedent if w in unit_of_word]].sum(-1)
            to_distractor = row[..., [unit_of_word[w] for w in distractor if w in unit_of_word]].sum(-1)
            candidate_correct += to_antecedent > to_distractor
            candidate_count += 1
            first_right += min(antecedent) < min(distractor)
            nearest_right += max(antecedent) > max(distractor)
    if correct is None:
        raise HeadscopeError("no coreference item could be scored")
    num_layers, num_heads = correct.shape
    return pd.DataFrame(
        {
            "layer": np.repeat(np.arange(num_layers), num_heads),
            "head": np.tile(np.arange(num_heads), num_layers),
            "accuracy": correct.ravel() / count,
            "count": count,
            "candidate_accuracy": candidate_correct.ravel() / candidate_count if candidate_count else np.nan,
            "baseline_accuracy": max(first_right, nearest_right) / candidate_count if candidate_count else np.nan,
        }
    )


# ---- output ---------------------------------------------------------------------------------
def head_table(result: ProfileResult) -> pd.DataFrame:
    """One row per head: the averaged metrics, the head's roles, and (with trees) its best relation.

    ``best_relation`` is the relation and direction where the head beats the best fixed-offset baseline
    by the largest margin over the whole corpus, with its accuracy and baseline on the held-out half
    beside (``syntax.split_half``); roles and best relation use relations with at least
    ``HEAD_TABLE_MIN_RELATION_COUNT`` examples. A syntactic role is named on the held-out test of
    ``roles.syntactic_tests``.
    """
    from .roles import head_roles, primary_roles

    table = result.metrics.copy()
    frequent = None
    if result.dependency is not None and len(result.dependency):
        frequent = result.dependency[result.dependency["count"] >= HEAD_TABLE_MIN_RELATION_COUNT]
    roles = head_roles(None, metrics=result.metrics, dependency=frequent)
    joined = roles.groupby(["layer", "head"])["role"].agg("; ".join).rename("roles").reset_index()
    primary = primary_roles(roles, int(table["layer"].max()) + 1, int(table["head"].max()) + 1)
    table = table.merge(
        primary[["layer", "head", "role"]].rename(columns={"role": "primary_role"}), on=["layer", "head"], how="left"
    )
    table = table.merge(joined, on=["layer", "head"], how="left")
    table["roles"] = table["roles"].fillna("")
    if frequent is None:
        return table
    best_columns = [
        "best_relation",
        "best_direction",
        "best_relation_accuracy",
        "best_relation_baseline",
        "best_relation_margin",
        "best_relation_heldout_accuracy",
        "best_relation_heldout_baseline",
    ]
    if not len(frequent):
        return table.assign(**{column: np.nan for column in best_columns})
    frequent = frequent.assign(margin=frequent["accuracy"] - frequent["baseline_accuracy"])
    best = frequent.loc[frequent.groupby(["layer", "head"])["margin"].idxmax()]
    best = best.rename(
        columns={
            "relation": "best_relation",
            "direction": "best_direction",
            "accuracy": "best_relation_accuracy",
            "baseline_accuracy": "best_relation_baseline",
            "margin": "best_relation_margin",
            "heldout_accuracy": "best_relation_heldout_accuracy",
            "heldout_baseline_accuracy": "best_relation_heldout_baseline",
        }
    )
    table = table.merge(best[["layer", "head", *best_columns]], on=["layer", "head"], how="left")
    return table


def table_format(path: str | Path) -> str:
    """``".csv"`` or ``".parquet"``, from the file name; anything else is an error."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise HeadscopeError(f"--out must end in .csv or .parquet, got {Path(path).name!r}")
    return suffix


def write_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Write a table as ``.csv`` or ``.parquet`` (by extension), atomically: never half a file at ``path``."""
    path = Path(path)
    suffix = table_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _atomic_file(path) as temporary:
        if suffix == ".csv":
            table.to_csv(temporary, index=False, float_format="%.6g")
        else:
            table.to_parquet(temporary, index=False)
    return path


def profile_summary(result: ProfileResult, relations=("nsubj", "obj", "det", "amod", "case", "aux")) -> str:
    """A few lines for the command line: positional, sink and delimiter heads (the thresholds of their roles),
    the best head for common relations."""
    from .syntax import best_dependency_heads

    metrics = result.metrics
    lines = [
        f"{result.model_name}: {result.num_sentences} sentences, {len(metrics)} heads"
        + (" (from cache)" if result.from_cache else "")
    ]
    positional = metrics[
        (metrics["argmax_offset_share"] >= POSITIONAL_MIN_SHARE) & metrics["argmax_offset"].isin(POSITIONAL_OFFSETS)
    ]
    lines.append(
        f"positional heads (argmax at one offset >= {POSITIONAL_MIN_SHARE:.0%}): "
        + (
            ", ".join(
                f"{r.layer}-{r.head} ({int(r.argmax_offset):+d}, {r.argmax_offset_share:.0%})"
                for r in positional.itertuples()
            )
            or "none"
        )
    )
    sinks = int((metrics["sink_mass"] >= SINK_MIN_MASS).sum())
    delimiters = int((metrics["punctuation_mass"] >= DELIMITER_MIN_MASS).sum())
    lines.append(
        f"sink heads (>= {SINK_MIN_MASS:.0%} on special tokens and the first token): {sinks} of {len(metrics)}; "
        f"delimiter heads (>= {DELIMITER_MIN_MASS:.0%} on punctuation): {delimiters}"
    )
    if result.dependency is not None and len(result.dependency):
        best = best_dependency_heads(result.dependency[result.dependency["direction"] == "parent"])
        for r in best[best["relation"].isin(relations)].itertuples():
            lines.append(
                f"  {r.relation:<7} parent: head {r.layer}-{r.head} {r.accuracy:.1%} "
                f"(best offset {r.baseline_offset:+d}: {r.baseline_accuracy:.1%}, n={r.count})"
            )
    return "\n".join(lines)
