"""Which token (or word) of one run stands for which of another, and the difference of their attention.

A difference map subtracts two attention matrices cell by cell, so each cell must mean the same pair of
tokens on both sides. ``align_runs`` finds that correspondence:

* **position by position** (``level="token"``) when both runs have the same number of tokens and one
  tokenizer made them (one model: two sentences that differ in a word, or one text through two engines),
  or their tokens are equal. Positions holding different tokens are listed (``differing``).
* **at word level** (``level="word"``) when the same text went through two tokenizers: each run's tokens
  are grouped by the words of the text they belong to, found by where each word stands in the text. A word
  both runs cut out the same way is one unit; where they cut differently ("didn't" as ``didn ' t`` and
  ``didn 't``) the smallest stretch of text both agree on is one unit. Special tokens, and words only one
  run has (a longer text cut short by one model), are left out, and each row is rescaled to sum to 1 over
  the units (as the app's "hide special tokens" does), so the map compares how each query shares its
  attention among the words both runs hold.
* none: two different texts whose token counts differ (``NoAlignment``).

``layer_difference`` subtracts one layer of each, head by head where heads correspond (one model), or the
layers' averages over their heads where they do not (two models: their head numbers mean nothing to each
other, and their head counts may differ).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import HeadscopeError
from ..run import AttentionRun, word_level_attentions

# Two weights closer than this are the same number: float32 rounding between two exact computations of one
# model (another engine, another thread count) stays below it, a real difference of attention is far above.
IDENTICAL_ATOL = 1e-6


class NoAlignment(HeadscopeError):
    """No token or word of one run stands for one of the other (different texts of different lengths)."""


@dataclass(frozen=True)
class RunAlignment:
    """How two runs' tokens map onto common units (tokens or words).

    level         "token" (position by position) or "word"
    labels        one label per unit: the token (``"sat | lay"`` where the two differ) or the word's text
    left_units    int ``[n_left]``: the unit of each left token, -1 for a token left out
    right_units   int ``[n_right]``
    differing     units whose left and right tokens differ (token level)
    merged        units that join several words of one run (word level: the tokenizers cut differently)
    left_out      how many tokens of each side are in no unit: ``(left, right)``
    """

    level: str
    labels: list[str]
    left_units: np.ndarray
    right_units: np.ndarray
    differing: list[int] = field(default_factory=list)
    merged: list[int] = field(default_factory=list)
    left_out: tuple[int, int] = (0, 0)

    @property
    def num_units(self) -> int:
        return len(self.labels)


def same_tokenizer(left: AttentionRun, right: AttentionRun) -> bool:
    """Both runs tokenized by one model's tokenizer (its name), so that equal counts mean equal slots."""
    return left.model_name == right.model_name


def same_text(left: AttentionRun, right: AttentionRun) -> bool:
    return left.text == right.text and (left.text_pair or None) == (right.text_pair or None)


def align_runs(left: AttentionRun, right: AttentionRun) -> RunAlignment:
    """The units a difference of ``left`` and ``right`` is taken over (see the module's description)."""
    if left.level != "token" or right.level != "token":
        raise ValueError("align_runs takes token-level runs (it makes the word level itself)")
    if left.num_tokens == right.num_tokens and (same_tokenizer(left, right) or left.tokens == right.tokens):
        return _positions(left, right)
    if same_text(left, right):
        return _words(left, right)
    raise NoAlignment(
        f"The two texts have {left.num_tokens} and {right.num_tokens} tokens"
        + ("" if same_tokenizer(left, right) else " from two tokenizers")
        + ", so no token of one stands for a token of the other: a cell-by-cell difference needs the same "
        "number of tokens (or the same text)."
    )


def _positions(left: AttentionRun, right: AttentionRun) -> RunAlignment:
    units = np.arange(left.num_tokens)
    differing = [i for i, (a, b) in enumerate(zip(left.tokens, right.tokens)) if a != b]
    labels = [a if a == b else f"{a} | {b}" for a, b in zip(left.tokens, right.tokens)]
    return RunAlignment("token", labels, units, units.copy(), differing=differing)


def word_spans(run: AttentionRun) -> list[tuple[int, int] | None]:
    """Where each of ``run.words`` stands in the run's text, as ``(start, end)`` in ``text + "\\n" +
    text_pair``; None for a word not found there (a whitespace-only piece shown as a symbol)."""
    sources = [run.text, run.text_pair or ""]
    offsets = [0, len(run.text) + 1]
    segment_of_word = {}
    for word, segment in zip(run.word_ids.tolist(), run.segment_ids.tolist()):
        if word >= 0:
            segment_of_word.setdefault(word, segment)
    cursors = [0, 0]
    spans: list[tuple[int, int] | None] = []
    for index, word in enumerate(run.words):
        segment = min(max(segment_of_word.get(index, 0), 0), 1)
        start = sources[segment].find(word, cursors[segment]) if word else -1
        if start < 0:
            spans.append(None)
            continue
        cursors[segment] = start + len(word)
        spans.append((offsets[segment] + start, offsets[segment] + start + len(word)))
    return spans


def _words(left: AttentionRun, right: AttentionRun) -> RunAlignment:
    # Every word of both runs as an interval of the text; overlapping intervals (of either run) join one unit.
    sides = (word_spans(left), word_spans(right))
    intervals = sorted(
        (span[0], span[1], side, word) for side, spans in enumerate(sides) for word, span in enumerate(spans) if span
    )
    unit_of_word: list[dict[int, int]] = [{}, {}]
    groups: list[list] = []  # [start, end, words of left, words of right]
    for start, end, side, word in intervals:
        if not groups or start >= groups[-1][1]:
            groups.append([start, end, [], []])
        group = groups[-1]
        group[1] = max(group[1], end)
        group[2 + side].append(word)
    full_text = left.text + "\n" + (left.text_pair or "")
    labels, merged = [], []
    for start, end, left_words, right_words in groups:
        if not left_words or not right_words:
            continue  # a word only one run has: nothing to subtract it from
        unit = len(labels)
        labels.append(" ".join(full_text[start:end].split()))
        if len(left_words) > 1 or len(right_words) > 1:
            merged.append(unit)
        for side, words in ((0, left_words), (1, right_words)):
            for word in words:
                unit_of_word[side][word] = unit
    if not labels:
        raise NoAlignment("The two runs share no word of the text, so there is nothing to compare cell by cell.")
    units = []
    for side, run in enumerate((left, right)):
        word_ids = run.word_ids.tolist()
        units.append(
            np.array(
                [
                    -1 if special or word < 0 else unit_of_word[side].get(word, -1)
                    for word, special in zip(word_ids, run.special_mask.tolist())
                ],
                dtype=np.int64,
            )
        )
    left_out = (int(np.sum(units[0] < 0)), int(np.sum(units[1] < 0)))
    return RunAlignment("word", labels, units[0], units[1], merged=merged, left_out=left_out)


def aligned_layer(run: AttentionRun, layer: int, units: np.ndarray, num_units: int, level: str) -> np.ndarray:
    """One layer ``[H, U, U]`` of ``run`` over the alignment's units. Token level: the layer as it is. Word
    level: attention TO a unit sums its tokens', FROM a unit averages them (``AttentionRun.to_words``), tokens
    in no unit left out, and every row rescaled to sum to 1 over the units (a row with nothing left stays 0)."""
    attention = run.attentions[layer]
    if level == "token":
        return attention
    grouped = word_level_attentions(attention[None, None], units[None], num_units)[0, 0]
    totals = grouped.sum(axis=-1, keepdims=True)
    return np.divide(grouped, totals, out=np.zeros_like(grouped), where=totals > 0)


@dataclass(frozen=True)
class LayerDifference:
    """``values``: left minus right, ``[H, U, U]`` head by head, or ``[1, U, U]`` when ``head_averaged``
    (each layer's mean over its heads); ``alignment`` names the units."""

    values: np.ndarray
    alignment: RunAlignment
    head_averaged: bool
    heads: tuple[int, int]  # each side's head count

    @property
    def largest(self) -> float:
        return float(np.abs(self.values).max()) if self.values.size else 0.0

    @property
    def identical(self) -> bool:
        """Equal within ``IDENTICAL_ATOL`` everywhere: rounding, not a difference."""
        return self.largest <= IDENTICAL_ATOL


def layer_difference(left: AttentionRun, right: AttentionRun, left_layer: int, right_layer: int) -> LayerDifference:
    """``left``'s layer ``left_layer`` minus ``right``'s layer ``right_layer``, over ``align_runs``' units.
    Head by head where the heads correspond (one model, the same head count); else each layer's average
    over its heads (``head_averaged``)."""
    alignment = align_runs(left, right)
    sides = [
        aligned_layer(run, layer, units, alignment.num_units, alignment.level)
        for run, layer, units in ((left, left_layer, alignment.left_units), (right, right_layer, alignment.right_units))
    ]
    per_head = same_tokenizer(left, right) and left.num_heads == right.num_heads
    if per_head:
        values = sides[0] - sides[1]
    else:
        values = sides[0].mean(axis=0, keepdims=True) - sides[1].mean(axis=0, keepdims=True)
    return LayerDifference(
        values.astype(np.float32), alignment, head_averaged=not per_head, heads=(left.num_heads, right.num_heads)
    )
