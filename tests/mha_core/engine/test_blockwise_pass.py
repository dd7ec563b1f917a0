"""The long pass's one trip over each block (mha_core.engine.blockwise, mha_core.pooling, mha_core.analysis.streamed):
what the kernel and its observers read from a block is checked against plain computations written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mha_core import native
from mha_core.analysis.streamed import LOCAL_WINDOW_MASS, causal_window
from mha_core.attention import attention_scores
from mha_core.engine import blockwise
from mha_core.engine.blockwise import CHUNK, BlockwiseAttention
from mha_core.pooling import PooledGrid, chunk_reduce, first_argmax, pool_dense
from tests.conftest import require

FLOAT32_TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(params=["c", "torch"])
def row_path(request, monkeypatch):
    """Each block's softmax and row reductions in one trip in C (``mha_core.native.row_pass``), or by torch's
    operations: the kernel's two paths, which the tests hold to the same numbers."""
    if request.param == "c":
        require(native.available(), f"the native row pass ({native.why_not()})")
    monkeypatch.setattr(native, "USE_NATIVE", request.param == "c")
    return request.param


def causal_block(rng, heads: int, start: int, count: int, peaked: bool = False) -> torch.Tensor:
    """Rows ``start .. start + count`` of causal weights ``[heads, count, start + count]``, each row summing to 1."""
    keys = start + count
    w = rng.random((heads, count, keys)) ** 4
    if peaked:
        w[..., :] *= 1e-3
        for i in range(count):
            w[:, i, start + i] = 1.0
    w *= np.arange(keys)[None, None, :] <= (start + np.arange(count))[None, :, None]
    return torch.from_numpy(w / w.sum(axis=-1, keepdims=True)).float()


@pytest.mark.parametrize("keys, width", [(100, 32), (64, 32), (97, 7), (5, 32)])
def test_chunk_reduce_is_the_max_and_sum_of_each_run(keys, width):
    x = torch.from_numpy(np.random.default_rng(keys).random((2, 3, keys))).float()
    for reduce, numpy_reduce in (("max", np.maximum.reduceat), ("sum", np.add.reduceat)):
        expected = numpy_reduce(x.numpy().astype(np.float64), np.arange(0, keys, width), axis=-1)
        np.testing.assert_allclose(chunk_reduce(x, width, reduce).numpy(), expected, **FLOAT32_TOL)
    with pytest.raises(ValueError, match="reduce"):
        chunk_reduce(x, width, "mean")


def test_first_argmax_is_torch_argmax_with_ties_across_chunks():
    rng = np.random.default_rng(0)
    w = torch.from_numpy(rng.random((2, 6, 100))).float()
    top = float(w.max()) + 1.0
    w[0, 0, [31, 32]] = top  # a tie across a chunk boundary: the first wins
    w[0, 1, [5, 64, 99]] = top
    w[1, 2, [99, 98]] = top  # in the last, shorter chunk
    w[1, 3, :] = 0.25  # all equal: key 0
    maxima = w.amax(dim=-1)
    for width in (CHUNK, 7, 1):
        got = first_argmax(w, chunk_reduce(w, width, "max"), maxima, width)
        assert got.tolist() == torch.argmax(w, dim=-1).tolist()
    assert first_argmax(w, chunk_reduce(w, CHUNK, "max"), maxima, CHUNK)[0, :2].tolist() == [31, 5]


def _window_by_hand(w: np.ndarray, start: int, share: float) -> np.ndarray:
    heads, count, _ = w.shape
    out = np.zeros((heads, count), dtype=np.int64)
    for h in range(heads):
        for r in range(count):
            i = start + r
            row = w[h, r].astype(np.float64)
            total = row.sum()
            out[h, r] = next(width for width in range(i + 1) if row[max(0, i - width) : i + 1].sum() >= share * total)
    return out


@pytest.mark.parametrize("start, count, peaked", [(0, 40, False), (70, 25, False), (33, 31, True)])
def test_causal_window_is_the_narrowest_span_holding_the_share(start, count, peaked):
    w = causal_block(np.random.default_rng(start), 3, start, count, peaked)
    rows = torch.arange(start, start + count)
    got = causal_window(w, chunk_reduce(w, CHUNK, "sum"), rows, LOCAL_WINDOW_MASS).numpy()
    expected = _window_by_hand(w.numpy(), start, LOCAL_WINDOW_MASS)
    # Float32 sums in another order may move a row whose mass sits exactly at the share by one key; none here.
    np.testing.assert_array_equal(got, expected)
    if peaked:
        assert (got == 0).all()


@pytest.mark.parametrize("n, size, region", [(203, 16, None), (256, 8, None), (203, 16, ((40, 170), (10, 150)))])
def test_pooled_grid_from_causal_blocks_equals_pooling_the_matrix(n, size, region):
    """Bins of unequal width (rows first), of whole chunks (from the block's chunk reductions) and of equal
    width (from the block), all against ``pool_dense`` on the whole matrix."""
    rng = np.random.default_rng(n + size)
    full = np.zeros((n, n), dtype=np.float32)
    rows, cols = region or ((0, n), (0, n))
    grids = {"plain": PooledGrid(2, rows, cols, size), "chunks": PooledGrid(2, rows, cols, size)}
    dense = []
    for start in range(0, n, 37):
        count = min(37, n - start)
        block = causal_block(rng, 2, start, count)
        dense.append(block)
        part = block[..., cols[0] :] if block.shape[-1] > cols[0] else block[..., :0]
        if part.shape[-1] == 0:
            continue
        grids["plain"].add(start, part)
        chunks = {reduce: chunk_reduce(part, CHUNK, reduce) for reduce in ("max", "sum")}
        grids["chunks"].add(start, part, chunks.__getitem__, CHUNK)
    for head in range(2):
        full[:] = 0
        for start, block in zip(range(0, n, 37), dense):
            full[start : start + block.shape[1], : block.shape[2]] = block[head].numpy()
        for reduce in ("mean", "max"):
            expected = pool_dense(full, rows, cols, size, reduce)
            for grid in grids.values():
                np.testing.assert_allclose(grid.result(reduce)[head], expected, **FLOAT32_TOL)
    if (cols[1] - cols[0]) % size:
        assert grids["plain"].step == 0  # the unequal bins were pooled rows first


def test_the_kernel_hands_each_block_once_with_exact_sums(row_path):
    torch.manual_seed(0)
    heads, kv, n, d = 6, 2, 150, 16
    q = torch.randn(1, heads, n, d)
    k = torch.randn(1, kv, n, d).repeat_interleave(heads // kv, dim=1)
    v = torch.randn(1, heads, n, d)
    features = torch.stack([torch.ones(n), torch.arange(n).float(), (torch.arange(n) % 3 == 0).float()], dim=1)
    seen = []

    class Check:
        @staticmethod
        def add(block):
            rows, keys = block.weights.shape[1], block.weights.shape[2]
            start = block.row_start
            scores = torch.matmul(q[0, :, start : start + rows], k[0, :, :keys].transpose(-2, -1)) / math.sqrt(d)
            scores = scores.masked_fill(
                torch.arange(keys)[None, None, :] > torch.arange(start, start + rows)[None, :, None], float("-inf")
            )
            expected = torch.softmax(scores, dim=-1)
            torch.testing.assert_close(block.weights, expected, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(block.log_sum_exp[..., 0], torch.logsumexp(scores, dim=-1), rtol=1e-6, atol=1e-5)
            torch.testing.assert_close(block.key_sums(features), expected @ features[:keys], rtol=1e-5, atol=1e-4)
            assert block.argmax.tolist() == expected.argmax(dim=-1).tolist()
            torch.testing.assert_close(block.max_weight, expected.amax(dim=-1))
            torch.testing.assert_close(block.column_sums, expected.sum(dim=1), rtol=1e-5, atol=1e-5)
            for reduce in ("max", "sum"):
                torch.testing.assert_close(block.chunks(reduce), chunk_reduce(expected, CHUNK, reduce), **FLOAT32_TOL)
            assert (block.scores is None) == (row_path == "c")  # the C pass writes the weights over the scores
            seen.append((block.layer, start, rows))

    old = blockwise.BLOCK_BYTES
    blockwise.BLOCK_BYTES = 4 * heads * n * 70  # room for 70 rows (140 in C): whole row tiles, then the rest
    try:
        kernel = BlockwiseAttention(1, [Check], key_features=features)
        with torch.inference_mode():
            output, _ = kernel(q, k, v, None, True, "scaled")
    finally:
        blockwise.BLOCK_BYTES = old
    # the C pass's blocks hold twice the rows (the weights are written over the scores)
    assert seen == ([(0, 0, 128), (0, 128, 22)] if row_path == "c" else [(0, 0, 64), (0, 64, 64), (0, 128, 22)])
    reference = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(output, reference, rtol=1e-5, atol=1e-5)
    stored = kernel.layers[0]
    assert stored.key.shape[0] == kv and stored.key_of_head.tolist() == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(
    "causal, score, with_bias",
    [
        (True, "scaled", False),
        (False, "scaled", False),
        (True, "dot", False),
        (False, "dot", True),
        (True, "cosine", False),
    ],
)
def test_weighted_scores_equal_the_plain_sum_of_weights_times_scores(causal, score, with_bias, monkeypatch, row_path):
    """sum_j w_ij s_ij, which sum w ln w is made of: from the C row pass on every block; on torch's path, from the
    kernel's product with the values (the keys beside them: q_i . sum_j w_ij k_j) where the scores are products of
    queries and keys, from a pass over the block where they are not (a score bias of the offset, as MPNet's;
    cosine scores); all against the sum written out here."""
    torch.manual_seed(3)
    heads, n, d = 3, 90, 8
    q, k, v = (torch.randn(1, heads, n, d) * 2 for _ in range(3))
    positions = torch.arange(n)
    bias = torch.randn(heads, 2 * n - 1) if with_bias else None
    mask = bias[:, positions[:, None] - positions[None, :] + n - 1][None] if with_bias else None
    seen = []

    class Check:
        @staticmethod
        def add(block):
            rows = positions[block.row_start : block.row_start + block.weights.shape[1]]
            keys = block.weights.shape[2]
            scores = attention_scores(q[0, :, rows], k[0, :, :keys], score).double()
            if with_bias:
                scores = scores + bias[:, rows[:, None] - positions[None, :keys] + n - 1].double()
            hidden = positions[None, None, :keys] > rows[None, :, None] if causal else torch.zeros(1, 1, keys).bool()
            weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
            expected = (weights * scores.masked_fill(hidden, 0.0)).sum(dim=-1)
            from_kernel = row_path == "c" or (score != "cosine" and not with_bias)
            assert (block.score_sums is not None) == from_kernel
            torch.testing.assert_close(block.weighted_scores().double(), expected, rtol=1e-5, atol=1e-4)
            seen.append(block.row_start)

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 4 * heads * n * 40)  # blocks of 32 rows (64 in C)
    kernel = BlockwiseAttention(1, [Check], score_sums=True)
    with torch.inference_mode():
        output, _ = kernel(q, k, v, mask, causal, score)
    assert seen == ([0, 64] if row_path == "c" else [0, 32, 64])
    scores = attention_scores(q, k, score) + (mask if with_bias else 0.0)
    if causal:
        scores = scores.masked_fill(positions[None, :] > positions[:, None], float("-inf"))
    torch.testing.assert_close(output, torch.softmax(scores, dim=-1) @ v, rtol=1e-5, atol=1e-5)  # the output unchanged


def test_the_kernel_flushes_denormals_while_it_computes_blocks_and_restores_them(row_path):
    """Rows whose scores lie far below their largest (spread 100 here) have exponentials below float32's smallest
    normal number: inside the pass they are flushed to zero (no slow path), outside the pass the thread's
    arithmetic is as it was, and the output is the softmax's."""
    torch.manual_seed(5)
    heads, n, d = 2, 64, 8
    q, k, v = torch.randn(1, heads, n, d) * 6, torch.randn(1, heads, n, d) * 6, torch.randn(1, heads, n, d)
    flushing = []

    class Check:
        @staticmethod
        def add(block):
            flushing.append(blockwise.flushing_denormals())

    assert not blockwise.flushing_denormals()
    assert torch.tensor(1e-39).item() > 0  # a denormal number is kept outside the pass
    with torch.inference_mode():
        output, _ = BlockwiseAttention(1, [Check])(q, k, v, None, False, "dot")
    assert flushing == [True]
    assert not blockwise.flushing_denormals() and torch.tensor(1e-39).item() > 0
    scores = (q @ k.transpose(-2, -1)).double()
    assert (scores - scores.amax(dim=-1, keepdim=True) < -88).float().mean() > 0.3  # exp(-88) < 1.2e-38
    torch.testing.assert_close(output, (torch.softmax(scores, dim=-1) @ v.double()).float(), rtol=1e-5, atol=1e-5)
    torch.set_flush_denormal(True)  # a caller that flushes already keeps flushing after the pass
    try:
        BlockwiseAttention(1, [Check])(q, k, v, None, False, "dot")
        assert flushing == [True, True] and blockwise.flushing_denormals()
    finally:
        torch.set_flush_denormal(False)
