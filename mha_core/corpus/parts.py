"""Mergeable partial results of a profile: per-head totals and label tallies of consecutive sentences, added up in
corpus order whatever order they were computed in."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..analysis.syntax import DependencyAccumulator
from ..errors import HeadscopeError

# Metric columns that name a category rather than measure an amount: aggregated by their most common value.
LABEL_COLUMNS = ("kovaleva_pattern", "seed_pattern", "argmax_offset")


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
        return cls(
            num_sentences=num_sentences,
            columns=tuple(columns),
            sums=sums,
            counts=counts,
            labels=labels,
            squares=squares,
        )

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
        return cls(
            num_sentences=int(sum(sizes)),
            columns=first.columns,
            sums=added("sums"),
            counts=counts,
            labels=labels,
            squares=added("squares"),
        )

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
            num_sentences=int(arrays["num_sentences"]),
            columns=columns,
            sums={name: arrays[f"sum.{name}"] for name in numeric},
            counts={name: arrays[f"count.{name}"] for name in numeric},
            labels=labels,
            squares={name: arrays[f"squares.{name}"] for name in numeric},
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
