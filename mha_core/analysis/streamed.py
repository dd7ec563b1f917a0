"""Head metrics streamed: ``head_metrics``' numbers from blocks of query rows, for runs too long to hold.

``RowStatistics`` sees every block of a head's exact weights once (``add``, called by the long path's kernel)
and keeps a handful of numbers per query row and head (``[layers, heads, n]`` each: memory grows with n);
``finish`` turns them into the same table ``mha_core.analysis.metrics.head_metrics`` gives for the dense
weights, with the same definitions (docs/metrics.md; the per-row quantities of
``mha_core.analysis.metrics_kernel``). A long run holds one text without padding, so every token is real.

It also keeps what the long-context roles read (``mha_core.analysis.long_roles``): each row's argmax key,
its mass on the first ``SINK_TOKENS`` positions, and the narrowest window of offsets that holds
``LOCAL_WINDOW_MASS`` of it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import torch

from ..engine.blockwise import CHUNK, Block, Scratch
from ..pooling import chunk_entries
from ..run import per_head_frame
from .metrics import (
    KOVALEVA_VERTICAL_COLUMNS,
    METRIC_COLUMNS,
    TUTORIAL_LOCAL_WINDOW,
    kovaleva_pattern,
    tutorial_pattern,
)

SINK_TOKENS = 4  # StreamingLLM (Xiao et al. 2024) keeps the first four tokens as attention sinks
LOCAL_WINDOW_MASS = 0.9  # a local head's window: the narrowest |i - j| <= w that holds 90% of a row's mass
NEAR_OFFSETS = tuple(range(-TUTORIAL_LOCAL_WINDOW, TUTORIAL_LOCAL_WINDOW + 1))  # -2..2

# Per-row values kept for every (layer, head, query row).
ROW_FIELDS = (
    "total",
    "x_log_x",
    "confidence",
    "argmax",
    "distance",
    "special",
    "sink",
    "punctuation",
    "same_segment",
    *(f"near_{o}" for o in NEAR_OFFSETS),
    "first_tokens",
    "window",
)


def causal_window(weights: torch.Tensor, chunk_sum: torch.Tensor, rows: torch.Tensor, share: float) -> torch.Tensor:
    """Per row of a decoder's block (keys after a row are 0), the smallest w with mass(i - w <= j <= i) >= share x
    the row's mass: the keys before i - w hold at most the rest. The last chunk whose running sum still leaves
    enough is found from the block's ``chunk_sum`` (``Block.chunks``), then the exact key inside the next chunk."""
    ends = torch.cumsum(chunk_sum, dim=-1)  # the running sum at each chunk's last key
    total = ends[..., -1:]
    need = share * total
    leading = (total - ends >= need).sum(dim=-1)  # chunks that may lie wholly before the window
    before = torch.where(
        leading > 0, ends.gather(-1, (leading - 1).clamp(min=0)[..., None])[..., 0], torch.zeros((), dtype=ends.dtype)
    )
    values, _ = chunk_entries(weights, leading, CHUNK)
    running = before[..., None] + torch.cumsum(values, dim=-1)
    last_before = leading * CHUNK - 1 + (total - running >= need).sum(dim=-1)  # the last key outside the window
    return (rows - 1 - last_before).clamp(min=0)


def window_holding(cumulative: torch.Tensor, rows: torch.Tensor, share: float) -> torch.Tensor:
    """Per row, the smallest w with mass(|i - j| <= w) >= share x the row's mass; ``cumulative [..., rows, keys]``
    is the running sum of each row over keys (a decoder's rows may stop at the last key they see)."""
    keys = cumulative.shape[-1]
    total = cumulative[..., -1]

    def mass_within(width: torch.Tensor) -> torch.Tensor:
        right = (rows + width).clamp(max=keys - 1)
        left = rows - width - 1
        inside = cumulative.gather(-1, right[..., None])[..., 0]
        before = cumulative.gather(-1, left.clamp(min=0)[..., None])[..., 0]
        return inside - torch.where(left >= 0, before, torch.zeros_like(before))

    low = torch.zeros_like(total, dtype=torch.long)  # binary search on the monotone mass(w)
    high = torch.full_like(low, max(keys - 1, int(rows.max()) if rows.numel() else 0))
    rows = rows.expand_as(low)
    while bool((low < high).any()):
        middle = (low + high) // 2
        enough = mass_within(middle) >= share * total
        high = torch.where(enough, middle, high)
        low = torch.where(enough, low, middle + 1)
    return low


class RowStatistics:
    """Per-row statistics of every head, filled block by block (an observer of ``BlockwiseAttention``)."""

    def __init__(self, num_layers: int, num_heads: int, special_mask, segment_ids, punctuation_mask, is_causal: bool):
        n = len(special_mask)
        self.n, self.is_causal = n, bool(is_causal)
        self.special = np.asarray(special_mask, dtype=bool)
        self.sinks = self.special.copy()
        self.sinks[0] = True  # as metrics.batch_head_metrics: special tokens and the first token
        self.punctuation = np.asarray(punctuation_mask, dtype=bool)
        self.segment_ids = np.asarray(segment_ids, dtype=np.int64)
        segments = np.unique(self.segment_ids)
        self.segment_index = torch.from_numpy(np.searchsorted(segments, self.segment_ids))
        first = np.zeros(n, dtype=bool)
        first[:SINK_TOKENS] = True
        # Key features one product reads from a block: every key (the row's total), the key's position, special,
        # sink, punctuation, first tokens, each segment.
        features = [np.ones(n, dtype=bool), np.arange(n), self.special, self.sinks, self.punctuation, first]
        features += [self.segment_ids == s for s in segments]
        self.key_features = torch.from_numpy(np.stack(features, axis=1).astype(np.float32))
        shape = (num_layers, num_heads, n)
        # ROW_FIELDS in order, written once a block; float32 as computed (positions up to 2^24 exactly)
        self.values = np.zeros((len(ROW_FIELDS), *shape), dtype=np.float32)
        self.column_mass = np.zeros(shape, dtype=np.float64)
        self._near = torch.tensor(NEAR_OFFSETS)
        self._scratch = Scratch()  # one [heads, rows, keys] buffer for a block's products and running sums

    @property
    def rows(self) -> dict[str, np.ndarray]:
        """Each of ``ROW_FIELDS`` as ``[layers, heads, n]``: views of the float32 values, ``argmax`` as int64."""
        rows = {name: self.values[index] for index, name in enumerate(ROW_FIELDS)}
        rows["argmax"] = rows["argmax"].astype(np.int64)
        return rows

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + self.column_mass.nbytes + self.key_features.numel() * 4

    def end_pass(self) -> None:
        """Let the block buffer go: the pass is over."""
        self._scratch = Scratch()

    def add(self, block: Block) -> None:
        """One block of exact weights (``mha_core.engine.blockwise.Block``): a few dozen operations whatever its size
        (blocks are small enough to stay in cache, so there are many)."""
        weights, row_start, layer = block.weights, block.row_start, block.layer
        heads, count, keys = weights.shape
        rows = torch.arange(row_start, row_start + count)
        out = {}
        on = block.key_sums(self.key_features)  # [heads, rows, features]
        out["total"], by_position = on[..., 0], on[..., 1]
        out["special"], out["sink"], out["punctuation"] = on[..., 2], on[..., 3], on[..., 4]
        out["first_tokens"] = on[..., 5]
        segment = self.segment_index[row_start : row_start + count]
        out["same_segment"] = on[..., 6:].gather(-1, segment.expand(heads, count)[..., None])[..., 0]
        # sum w ln w = sum w (score - log_sum_exp), without a logarithm per weight; sum w score from the kernel's
        # product when it gave it, else a pass into a reused buffer (no page faults)
        weighted = block.weighted_scores(None if block.score_sums is not None else self._scratch(*weights.shape))
        out["x_log_x"] = weighted - block.log_sum_exp[..., 0] * out["total"]
        out["confidence"] = block.max_weight
        out["argmax"] = block.argmax.float()
        if self.is_causal:  # j <= i: sum a |i - j| = i sum a - sum a j
            out["distance"] = rows * out["total"] - by_position
        else:
            cols = torch.arange(keys)
            out["distance"] = (weights * (rows[:, None] - cols[None, :]).abs().float()).sum(dim=-1)
        key = rows[:, None] + self._near[None, :]  # [rows, offsets]
        near = weights.gather(-1, key.clamp(0, keys - 1).expand(heads, count, len(NEAR_OFFSETS)))
        near.masked_fill_((key < 0) | (key >= keys), 0.0)
        for index, offset in enumerate(NEAR_OFFSETS):
            out[f"near_{offset}"] = near[..., index]
        if self.is_causal:
            out["window"] = causal_window(weights, block.chunks("sum"), rows, LOCAL_WINDOW_MASS).float()
        else:
            cumulative = torch.cumsum(weights, dim=-1, out=self._scratch(*weights.shape))
            out["window"] = window_holding(cumulative, rows, LOCAL_WINDOW_MASS).float()
            del cumulative
        self.values[:, layer, :, row_start : row_start + count] = torch.stack(
            [out[name] for name in ROW_FIELDS]
        ).numpy()
        # Float32 within a block, float64 across.
        self.column_mass[layer, :, :keys] += block.column_sums.numpy()

    def finish(self, weights_at: Callable[[int, np.ndarray], np.ndarray]) -> pd.DataFrame:
        """The ``head_metrics`` table. ``weights_at(layer, cols [heads, k])`` gives every head's exact weights
        ``[heads, n, k]`` at a few key columns of its own (the vertical test's two most attended keys)."""
        r = {name: values.astype(np.float64) for name, values in self.rows.items()}  # sums over rows in float64
        r["argmax"] = self.rows["argmax"]
        num_layers, num_heads, n = r["total"].shape
        positions = np.arange(n)
        total = r["total"]
        valid = total > 1e-6  # metrics.ROW_EPS
        safe = np.where(valid, total, 1.0)
        visible = positions + 1 if self.is_causal else np.full(n, n)
        entropy = -r["x_log_x"] / safe + np.log(safe)
        normalized = entropy / np.where(visible > 1, np.log(np.maximum(visible, 2)), 1.0)
        near = {o: r[f"near_{o}"] / safe for o in NEAR_OFFSETS}
        local = sum(near.values())
        diagonal = near[-1] + near[0] + near[1]
        sinks_seen = np.cumsum(self.sinks) if self.is_causal else np.full(n, self.sinks.sum())
        punctuation_seen = np.cumsum(self.punctuation) if self.is_causal else np.full(n, self.punctuation.sum())
        columns: dict[str, np.ndarray] = {name: np.full((num_layers, num_heads), np.nan) for name in METRIC_COLUMNS[2:]}
        vertical_rows = np.zeros((num_layers, num_heads, n))
        diagonal_only_rows = diagonal.copy()
        modes = np.zeros((num_layers, num_heads), dtype=np.int64)
        mode_share = np.full((num_layers, num_heads), np.nan)
        mode_queries = np.zeros((num_layers, num_heads), dtype=np.int64)
        mode_chance = np.full((num_layers, num_heads), np.nan)
        # The vertical columns: the most attended keys over all rows, ties to the lower index.
        tops = np.argsort(-self.column_mass, axis=-1, kind="stable")[..., :KOVALEVA_VERTICAL_COLUMNS]
        for layer in range(num_layers):
            at_tops = np.asarray(weights_at(layer, tops[layer]), dtype=np.float64)
            for head in range(num_heads):
                top = tops[layer, head]
                at_top = at_tops[head] / safe[layer, head][:, None]
                vertical_rows[layer, head] = at_top.sum(axis=1)
                for index, key in enumerate(top):
                    close = np.abs(key - positions) <= 1
                    diagonal_only_rows[layer, head] -= np.where(close, at_top[:, index], 0.0)
                row_valid = valid[layer, head]
                offsets = r["argmax"][layer, head][row_valid] - positions[row_valid]
                counts = np.bincount(offsets + n - 1, minlength=2 * n - 1)
                span = np.arange(-(n - 1), n)
                mode_index = int(np.argmax(counts * (2 * n) - np.abs(span)))  # ties: nearest 0, then negative
                mode = mode_index - (n - 1)
                key = positions + mode
                mask = row_valid & (key >= 0) & (key < n) & (mode <= 0 or not self.is_causal)
                modes[layer, head], mode_queries[layer, head] = mode, int(mask.sum())
                if mask.any():
                    mode_share[layer, head] = counts[mode_index] / mask.sum()
                    mode_chance[layer, head] = np.mean(1.0 / visible[mask])

        def mean(values, mask=valid):
            counts = mask.sum(axis=-1)
            return np.where(counts > 0, np.where(mask, values, 0.0).sum(axis=-1) / np.maximum(counts, 1), np.nan)

        def sd(values, mask=valid):
            counts = mask.sum(axis=-1)
            centred = np.where(mask, values - mean(values, mask)[..., None], 0.0)
            return np.where(counts > 1, np.sqrt((centred**2).sum(axis=-1) / np.maximum(counts - 1, 1)), np.nan)

        normalized_mask = valid & (visible > 1)
        columns.update(
            num_queries=valid.sum(axis=-1),
            entropy=mean(entropy),
            normalized_entropy=mean(normalized, normalized_mask),
            normalized_entropy_sd=sd(normalized, normalized_mask),
            confidence=mean(r["confidence"] / safe),
            mean_distance=mean(r["distance"] / safe),
            special_mass=mean(r["special"] / safe),
            sink_mass=mean(r["sink"] / safe),
            sink_mass_sd=sd(r["sink"] / safe),
            sink_mass_uniform=mean(np.broadcast_to(sinks_seen / visible, total.shape)),
            punctuation_mass=mean(r["punctuation"] / safe),
            punctuation_mass_sd=sd(r["punctuation"] / safe),
            punctuation_mass_uniform=mean(np.broadcast_to(punctuation_seen / visible, total.shape)),
            same_segment_mass=mean(r["same_segment"] / safe),
            diagonal_mass=mean(diagonal),
            vertical_mass=mean(vertical_rows),
            local_mass=mean(local),
            argmax_offset=modes,
            argmax_offset_share=mode_share,
            argmax_offset_queries=mode_queries,
            argmax_offset_chance=mode_chance,
        )
        for name, offset in (("prev_token_mass", -1), ("self_mass", 0), ("next_token_mass", 1)):
            key = positions + offset
            mask = valid & ((key >= 0) & (key < n) & (offset <= 0 or not self.is_causal))
            columns[name] = mean(near[offset], mask)
        num_segments = len(np.unique(self.segment_ids))
        columns["kovaleva_pattern"] = kovaleva_pattern(
            columns["vertical_mass"], mean(diagonal_only_rows), columns["same_segment_mass"], num_segments
        )
        columns["seed_pattern"] = tutorial_pattern(columns["normalized_entropy"], columns["local_mass"])
        # The column order of head_metrics: the measurements, then the two pattern classes.
        order = [name for name in METRIC_COLUMNS if not name.endswith("_pattern")] + [
            "kovaleva_pattern",
            "seed_pattern",
        ]
        return per_head_frame(num_layers, num_heads, **columns)[order]
