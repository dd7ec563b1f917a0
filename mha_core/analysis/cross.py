"""Measures of cross-attention heads (``CrossAttentionRun``, ``[L_dec, H, n_tgt, n_src]``): does a head align
target words with the source words they translate, how spread is its attention, how much of the source it reads.

    alignment_scores   share of aligned target tokens whose most-attended source token is one they align to
    diagonal_baseline  the same share for a head that reads the source in order (the diagonal), for monotonic pairs
    entropy            mean over target tokens of each row's entropy, in bits
    coverage           share of source tokens that some target token gives at least ``threshold`` of its attention
    cross_head_table   all of them, one row per head (the alignment columns when an alignment is given)

An alignment is a list of ``(target index, source index)`` pairs in the run's own units (tokens, or words after
``to_words()``); a target unit may align to several source units and counts as right when the head's argmax is
any of them. Target units without a pair are not scored.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..run import per_head_frame


def _weights(cross) -> np.ndarray:
    weights = np.asarray(getattr(cross, "attentions", cross), dtype=np.float32)
    if weights.ndim != 4:
        raise ValueError(f"cross-attention must be [layers, heads, n_target, n_source], got shape {weights.shape}")
    return weights


def _aligned_sets(alignment: Iterable[tuple[int, int]], n_target: int, n_source: int) -> dict[int, set[int]]:
    aligned: dict[int, set[int]] = {}
    for target, source in alignment:
        target, source = int(target), int(source)
        if not (0 <= target < n_target and 0 <= source < n_source):
            raise ValueError(
                f"alignment pair ({target}, {source}) is outside {n_target} target x {n_source} source units"
            )
        aligned.setdefault(target, set()).add(source)
    if not aligned:
        raise ValueError("the alignment is empty: give at least one (target, source) pair")
    return aligned


def alignment_scores(cross, alignment: Iterable[tuple[int, int]]) -> np.ndarray:
    """``[L, H]``: for each head, the share of aligned target units whose argmax source unit is aligned to them."""
    weights = _weights(cross)
    aligned = _aligned_sets(alignment, *weights.shape[2:])
    targets = sorted(aligned)
    argmax = weights[:, :, targets].argmax(axis=-1)  # [L, H, T]
    hits = np.zeros(argmax.shape, dtype=bool)
    for column, target in enumerate(targets):
        hits[:, :, column] = np.isin(argmax[:, :, column], sorted(aligned[target]))
    return hits.mean(axis=-1)


def diagonal_source(n_target: int, n_source: int) -> np.ndarray:
    """``[n_target]``: the source position a strictly monotonic reading puts beside each target position
    (position i of the target against position round(i (n_source - 1) / (n_target - 1)) of the source)."""
    if n_target == 1:
        return np.zeros(1, dtype=np.int64)
    return np.rint(np.arange(n_target) * (n_source - 1) / (n_target - 1)).astype(np.int64)


def diagonal_baseline(alignment: Iterable[tuple[int, int]], n_target: int, n_source: int) -> float:
    """The alignment score of a head that always attends to ``diagonal_source``: what a head scores on a
    monotonic pair by reading the source in order, with no knowledge of which word translates which."""
    aligned = _aligned_sets(alignment, n_target, n_source)
    diagonal = diagonal_source(n_target, n_source)
    return float(np.mean([diagonal[target] in sources for target, sources in aligned.items()]))


def entropy(cross) -> np.ndarray:
    """``[L, H]``: mean over target units (rows with any weight) of -sum_j a_ij log2 a_ij, in bits."""
    weights = _weights(cross)
    logs = np.log2(np.where(weights > 0, weights, 1.0))
    rows = -(weights * logs).sum(axis=-1)  # [L, H, n_tgt]
    real = weights.sum(axis=-1) > 0
    return np.where(real, rows, 0.0).sum(axis=-1) / np.maximum(real.sum(axis=-1), 1)


def coverage(cross, threshold: float = 0.1) -> np.ndarray:
    """``[L, H]``: the share of source units that at least one target unit gives ``threshold`` or more of its
    attention: how much of the source the head ever reads."""
    weights = _weights(cross)
    return (weights.max(axis=2) >= threshold).mean(axis=-1)


def cross_head_table(cross, alignment: Iterable[tuple[int, int]] | None = None, threshold: float = 0.1):
    """One row per decoder head (layer-major): ``entropy`` and ``coverage``, and with an alignment
    ``alignment_score`` and ``diagonal_baseline`` (the same for every head), sorted by nothing."""
    weights = _weights(cross)
    columns = {"entropy": entropy(weights), "coverage": coverage(weights, threshold)}
    if alignment is not None:
        alignment = list(alignment)
        columns["alignment_score"] = alignment_scores(weights, alignment)
        columns["diagonal_baseline"] = diagonal_baseline(alignment, *weights.shape[2:])
    return per_head_frame(weights.shape[0], weights.shape[1], **columns)
