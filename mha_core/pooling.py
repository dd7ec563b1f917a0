"""Pooling an attention matrix onto a coarser grid: the overview of a head at any zoom.

A region ``[r0, r1) x [c0, c1)`` of one head's weights shown at ``size`` cells a side: each axis is cut into
``min(size, length)`` bins of near-equal width (``bin_edges``), and a cell holds the mean (or the max) of the
exact weights inside it. Mean pooling counts every entry of the cell, masked (future) keys of a decoder too,
so a cell's mean times its area is the mass it holds. The dense path pools the stored matrix
(``pool_dense``); the long path accumulates the same sums and maxima block by block (``PooledGrid``).
"""

from __future__ import annotations

import numpy as np
import torch

REDUCTIONS = ("mean", "max")


def bin_edges(start: int, stop: int, size: int) -> np.ndarray:
    """``min(size, stop - start) + 1`` integer edges from ``start`` to ``stop``, bins of near-equal width."""
    length = stop - start
    if length <= 0 or size <= 0:
        raise ValueError(f"a region needs a positive length and size, got [{start}, {stop}) at size {size}")
    count = min(size, length)
    return start + (np.arange(count + 1) * length) // count


def bin_of(edges: np.ndarray) -> np.ndarray:
    """The bin index of each position between ``edges[0]`` and ``edges[-1]``."""
    return np.repeat(np.arange(len(edges) - 1), np.diff(edges))


def check_reduce(reduce: str) -> str:
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    return reduce


def pool_dense(weights: np.ndarray, rows: tuple[int, int], cols: tuple[int, int], size: int, reduce: str) -> np.ndarray:
    """The region of a dense ``[n, n]`` matrix pooled to ``[rows bins, cols bins]`` (numpy: the reference)."""
    check_reduce(reduce)
    row_edges, col_edges = bin_edges(*rows, size), bin_edges(*cols, size)
    region = np.asarray(weights, dtype=np.float64)[rows[0] : rows[1], cols[0] : cols[1]]
    if reduce == "max":
        by_col = np.maximum.reduceat(region, col_edges[:-1] - cols[0], axis=1)
        return np.maximum.reduceat(by_col, row_edges[:-1] - rows[0], axis=0).astype(np.float32)
    sums = np.add.reduceat(np.add.reduceat(region, col_edges[:-1] - cols[0], axis=1), row_edges[:-1] - rows[0], axis=0)
    area = np.diff(row_edges)[:, None] * np.diff(col_edges)[None, :]
    return (sums / area).astype(np.float32)


def chunk_reduce(block: torch.Tensor, width: int, reduce: str) -> torch.Tensor:
    """``[..., ceil(keys / width)]``: the max or sum of each run of ``width`` keys of ``block [..., keys]`` (the last
    run may be shorter): one pass over the block, a view for the whole runs."""
    if reduce not in ("max", "sum"):
        raise ValueError(f"reduce must be 'max' or 'sum', got {reduce!r}")
    keys = block.shape[-1]
    whole = keys // width
    parts = []
    if whole:
        runs = block[..., : whole * width].unflatten(-1, (whole, width))
        parts.append(runs.amax(dim=-1) if reduce == "max" else runs.sum(dim=-1))
    if whole * width < keys:
        tail = block[..., whole * width :]
        parts.append(tail.amax(dim=-1, keepdim=True) if reduce == "max" else tail.sum(dim=-1, keepdim=True))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


def chunk_entries(block: torch.Tensor, chunk: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, positions)`` ``[..., width]``: each row's keys in its run ``chunk [...]`` of ``width`` keys;
    positions past the last key read 0."""
    positions = chunk[..., None] * width + torch.arange(width)
    keys = block.shape[-1]
    values = block.gather(-1, positions.clamp(max=keys - 1))
    return values.masked_fill_(positions >= keys, 0), positions


def first_argmax(block: torch.Tensor, chunk_max: torch.Tensor, maxima: torch.Tensor, width: int) -> torch.Tensor:
    """Each row's first key holding its maximum ``maxima [...]`` (``torch.argmax``'s answer), from the row's
    maxima over runs of ``width`` keys (``chunk_reduce``): the first run whose max is the row's, then the first
    key in it; short passes over small arrays instead of an indexed reduction over the block."""
    chunk = (chunk_max == maxima[..., None]).to(torch.uint8).argmax(dim=-1)
    values, positions = chunk_entries(block, chunk, width)
    within = (values == maxima[..., None]).to(torch.uint8).argmax(dim=-1)
    return positions.gather(-1, within[..., None])[..., 0]


class PooledGrid:
    """Sums and maxima of ``heads`` matrices' region on one grid, filled from blocks of rows.

    ``add(row_start, block)`` takes ``block [heads, rows, keys]`` holding columns ``cols[0]`` up to
    ``cols[0] + keys`` (fewer than the region's: the rest are zeros, as the future keys of a decoder).
    ``chunks(reduce)``, when given, are the block's maxima or sums over runs of ``chunk_width`` keys from
    ``cols[0]`` (``chunk_reduce``): bins made of whole runs are then pooled from them, without another pass.
    """

    def __init__(self, heads: int, rows: tuple[int, int], cols: tuple[int, int], size: int):
        self.rows, self.cols = rows, cols
        self.row_edges, self.col_edges = bin_edges(*rows, size), bin_edges(*cols, size)
        self.row_bin = torch.from_numpy(bin_of(self.row_edges))
        # Column bins of unequal widths: a [bins, widest] gather of key offsets (a narrower bin repeats its last
        # key, which changes no maximum) and each bin's last key (sums from differences of running sums).
        starts, widths = self.col_edges[:-1] - cols[0], np.diff(self.col_edges)
        spread = np.minimum(starts[:, None] + np.arange(widths.max())[None, :], (starts + widths - 1)[:, None])
        self.col_gather = torch.from_numpy(spread.reshape(-1))
        self.col_last = torch.from_numpy(starts + widths - 1)
        bins = len(self.col_edges) - 1
        width = cols[1] - cols[0]
        self.step = width // bins if (width // bins) * bins == width else 0  # bins of one width, else 0
        shape = (heads, len(self.row_edges) - 1, bins)
        self.sums = torch.zeros(shape, dtype=torch.float64)
        self.maxima = torch.zeros(shape, dtype=torch.float32)  # weights are >= 0: 0 is the max of an empty part

    def add(self, row_start: int, block: torch.Tensor, chunks=None, chunk_width: int = 0) -> None:
        r0, r1 = max(row_start, self.rows[0]), min(row_start + block.shape[1], self.rows[1])
        if r0 >= r1:
            return
        c0, c1 = self.cols[0], min(self.cols[1], self.cols[0] + block.shape[2])
        if c0 >= c1:
            return
        part = block[:, r0 - row_start : r1 - row_start, : c1 - c0].float()
        row_bin = self.row_bin[r0 - self.rows[0] : r1 - self.rows[0]]
        if self.step and chunks is not None and chunk_width and self.step % chunk_width == 0:
            rows = slice(r0 - row_start, r1 - row_start)
            col_max = self._uniform(chunks("max")[:, rows], self.step // chunk_width, "max")
            by_col = self._uniform(chunks("sum")[:, rows], self.step // chunk_width, "sum")
        elif self.step:
            col_max, by_col = self._uniform(part, self.step, "max"), self._uniform(part, self.step, "sum")
        else:
            self._rows_first(part, row_bin, c1)
            return
        self.sums.index_add_(1, row_bin, by_col.double())
        heads, rows, bins = col_max.shape
        self.maxima.scatter_reduce_(1, row_bin[None, :, None].expand(heads, rows, bins), col_max, "amax")

    def _uniform(self, part: torch.Tensor, step: int, reduce: str) -> torch.Tensor:
        """``[heads, rows, bins]`` from ``part [heads, rows, entries]`` whose bins are runs of ``step`` entries
        (keys, or chunks of keys); a decoder's block that ends inside a bin gives that bin's part (the keys after
        it are zeros), and bins after it stay 0."""
        heads, rows, _ = part.shape
        reduced = chunk_reduce(part, step, reduce)
        bins = self.sums.shape[2]
        if reduced.shape[-1] == bins:
            return reduced
        out = torch.zeros(heads, rows, bins, dtype=reduced.dtype)
        out[..., : reduced.shape[-1]] = reduced
        return out

    def _rows_first(self, part: torch.Tensor, row_bin: torch.Tensor, c1: int) -> None:
        """Bins of unequal widths: reduce each row bin's rows first (contiguous runs, one pass over the block),
        then gather the columns of that much smaller array."""
        heads = part.shape[0]
        bounds = torch.unique_consecutive(row_bin, return_counts=True)
        bins, counts = bounds[0].tolist(), bounds[1].tolist()
        by_row_max = torch.empty(heads, len(bins), part.shape[2])
        by_row_sum = torch.empty(heads, len(bins), part.shape[2], dtype=torch.float64)
        start = 0
        for index, count in enumerate(counts):
            rows = part[:, start : start + count]
            by_row_max[:, index] = rows.amax(dim=1)
            by_row_sum[:, index] = rows.sum(dim=1)
            start += count
        if c1 < self.cols[1]:  # the rest of the region's keys are zeros
            pad = self.cols[1] - c1
            by_row_max = torch.nn.functional.pad(by_row_max, (0, pad))
            by_row_sum = torch.nn.functional.pad(by_row_sum, (0, pad))
        col_bins = self.sums.shape[2]
        col_max = by_row_max.index_select(2, self.col_gather).view(heads, len(bins), col_bins, -1).amax(dim=-1)
        running = by_row_sum.cumsum(dim=-1).index_select(2, self.col_last)
        by_col = torch.diff(running, dim=-1, prepend=torch.zeros(heads, len(bins), 1, dtype=torch.float64))
        index = torch.tensor(bins, dtype=torch.long)
        self.sums[:, index] += by_col
        self.maxima[:, index] = torch.maximum(self.maxima[:, index], col_max)

    def result(self, reduce: str) -> np.ndarray:
        """``[heads, row bins, col bins]`` float32: each cell's mean or max."""
        if check_reduce(reduce) == "max":
            return self.maxima.numpy().copy()
        area = np.diff(self.row_edges)[:, None] * np.diff(self.col_edges)[None, :]
        return (self.sums.numpy() / area).astype(np.float32)
