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


class PooledGrid:
    """Sums and maxima of ``heads`` matrices' region on one grid, filled from blocks of rows.

    ``add(row_start, block)`` takes ``block [heads, rows, keys]`` holding columns ``cols[0]`` up to
    ``cols[0] + keys`` (fewer than the region's: the rest are zeros, as the future keys of a decoder).
    """

    def __init__(self, heads: int, rows: tuple[int, int], cols: tuple[int, int], size: int):
        self.rows, self.cols = rows, cols
        self.row_edges, self.col_edges = bin_edges(*rows, size), bin_edges(*cols, size)
        self.row_bin = torch.from_numpy(bin_of(self.row_edges))
        # Column bins as a [bins, widest] gather of key offsets; a narrower bin repeats its last key, which
        # changes no maximum. Sums come from differences of the running sum at the bins' ends.
        starts, widths = self.col_edges[:-1] - cols[0], np.diff(self.col_edges)
        spread = np.minimum(starts[:, None] + np.arange(widths.max())[None, :], (starts + widths - 1)[:, None])
        self.col_gather = torch.from_numpy(spread.reshape(-1))
        self.col_last = torch.from_numpy(starts + widths - 1)
        shape = (heads, len(self.row_edges) - 1, len(self.col_edges) - 1)
        self.sums = torch.zeros(shape, dtype=torch.float64)
        self.maxima = torch.zeros(shape, dtype=torch.float32)  # weights are >= 0: 0 is the max of an empty part

    def add(self, row_start: int, block: torch.Tensor) -> None:
        r0, r1 = max(row_start, self.rows[0]), min(row_start + block.shape[1], self.rows[1])
        if r0 >= r1:
            return
        c0, c1 = self.cols[0], min(self.cols[1], self.cols[0] + block.shape[2])
        if c0 >= c1:
            return
        part = block[:, r0 - row_start : r1 - row_start, : c1 - c0].float()
        heads, rows, width = part.shape
        bins = self.sums.shape[2]
        step = (self.cols[1] - self.cols[0]) // bins
        if step * bins == self.cols[1] - self.cols[0]:
            # Bins of one width (the region a multiple of the size): whole bins as a view, no copy; a decoder's
            # block that ends inside a bin adds that bin's part (the keys after it are zeros).
            whole = width // step
            col_max = torch.zeros(heads, rows, bins)
            by_col = torch.zeros(heads, rows, bins)
            cells = part[..., : whole * step].reshape(heads, rows, whole, step)
            col_max[..., :whole], by_col[..., :whole] = cells.amax(dim=-1), cells.sum(dim=-1)
            if whole * step < width:
                rest = part[..., whole * step :]
                col_max[..., whole], by_col[..., whole] = rest.amax(dim=-1), rest.sum(dim=-1)
        else:
            if c1 < self.cols[1]:  # the rest of the region's keys are zeros
                part = torch.nn.functional.pad(part, (0, self.cols[1] - c1))
            col_max = part.index_select(2, self.col_gather).view(heads, rows, bins, -1).amax(dim=-1)
            running = part.cumsum(dim=-1).index_select(2, self.col_last)
            by_col = torch.diff(running, dim=-1, prepend=torch.zeros(heads, rows, 1))
        row_bin = self.row_bin[r0 - self.rows[0] : r1 - self.rows[0]]
        self.sums.index_add_(1, row_bin, by_col.double())
        self.maxima.scatter_reduce_(1, row_bin[None, :, None].expand(heads, rows, bins), col_max, "amax")

    def result(self, reduce: str) -> np.ndarray:
        """``[heads, row bins, col bins]`` float32: each cell's mean or max."""
        if check_reduce(reduce) == "max":
            return self.maxima.numpy().copy()
        area = np.diff(self.row_edges)[:, None] * np.diff(self.col_edges)[None, :]
        return (self.sums.numpy() / area).astype(np.float32)
