"""The C row pass (mha_core.native): built here with the system's compiler, and each of its numbers against a float64
computation written in the test."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from mha_core import native
from mha_core.engine.blockwise import flushing_denormals
from tests.conftest import require

CHUNK = 32


@pytest.fixture(autouse=True)
def _built():
    require(native.available(), f"the native row pass ({native.why_not()})")


def reference(scores: np.ndarray, row_start: int, causal: bool, chunk: int) -> dict:
    """Every output of ``row_pass``, in float64 from the scores, with a decoder's later keys hidden."""
    _, rows, keys = scores.shape
    s = scores.astype(np.float64)
    visible = np.arange(keys)[None, :] <= (row_start + np.arange(rows))[:, None] if causal else np.ones((rows, keys))
    visible = np.broadcast_to(visible.astype(bool), s.shape)
    m = np.where(visible, s, -np.inf).max(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(s - m), 0.0)
    w = e / e.sum(axis=-1, keepdims=True)
    edges = np.arange(0, keys, chunk)
    return {
        "weights": w,
        "log_sum_exp": (m + np.log(e.sum(axis=-1, keepdims=True)))[..., 0],
        "weighted_scores": np.where(visible, w * s, 0.0).sum(axis=-1),
        "max_weight": w.max(axis=-1),
        "chunk_max": np.maximum.reduceat(w, edges, axis=-1),
        "chunk_sum": np.add.reduceat(w, edges, axis=-1),
        "columns": w.sum(axis=1),
    }


@pytest.mark.parametrize(
    "heads, rows, keys, row_start, causal, spread",
    [
        (3, 7, 100, 93, True, 3.0),  # a decoder's last rows: keys not a whole number of chunks
        (2, 64, 64, 0, True, 3.0),  # a decoder's first block: the first row sees one key
        (4, 5, 257, 0, False, 5.0),  # an encoder
        (2, 9, 300, 0, False, 60.0),  # peaked rows: most weights below float32's smallest normal number (0)
        (1, 1, 1, 0, False, 1.0),
    ],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_row_pass_is_the_softmax_and_its_row_reductions(heads, rows, keys, row_start, causal, spread, threads):
    rng = np.random.default_rng(heads * keys + rows)
    scores = (rng.standard_normal((heads, rows, keys)) * spread).astype(np.float32)
    expected = reference(scores, row_start, causal, CHUNK)
    block = torch.from_numpy(scores.copy())
    before = torch.from_numpy(rng.random((heads, keys)).astype(np.float32))
    columns = before.clone()
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = native.row_pass(block, row_start, causal, CHUNK, columns)
    finally:
        torch.set_num_threads(old)
    w = block.numpy()
    np.testing.assert_allclose(w, expected["weights"], rtol=2e-6, atol=1e-7)
    assert not ((w > 0) & (w < np.finfo(np.float32).tiny)).any()  # flushed: never a denormal number
    if spread > 50:
        assert (w == 0).mean() > 0.3
    if causal:
        hidden = np.arange(keys)[None, :] > (row_start + np.arange(rows))[:, None]
        assert (w[:, hidden] == 0).all()
    np.testing.assert_allclose(got.log_sum_exp.numpy(), expected["log_sum_exp"], rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(got.weighted_scores.numpy(), expected["weighted_scores"], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got.max_weight.numpy(), expected["max_weight"], rtol=2e-6, atol=1e-7)
    assert got.argmax.dtype == torch.long
    np.testing.assert_array_equal(got.argmax.numpy(), w.argmax(axis=-1))  # the first key of the largest weight
    for name in ("chunk_max", "chunk_sum"):
        assert getattr(got, name).shape == (heads, rows, -(-keys // CHUNK))
        np.testing.assert_allclose(getattr(got, name).numpy(), expected[name], rtol=2e-6, atol=1e-6)
    np.testing.assert_allclose(columns.numpy(), before.numpy() + expected["columns"], rtol=1e-5, atol=1e-5)


def test_argmax_is_the_first_key_of_the_largest_weight_across_chunks():
    scores = torch.zeros(1, 4, 100)
    scores[0, 0, [31, 32]] = 5.0  # a tie across a chunk boundary
    scores[0, 1, [5, 64, 99]] = 5.0
    scores[0, 2, [99, 98]] = 5.0  # in the last, shorter chunk
    # row 3: all equal, key 0
    got = native.row_pass(scores, 0, False, CHUNK)
    assert got.argmax[0].tolist() == [31, 5, 98, 0]


def test_the_exponential_is_within_float32s_rounding_over_its_range():
    """One row whose scores run from 0 down to -100: each weight within 2 ulp of float64's softmax while it is a
    normal float32 number, 0 below ln(smallest normal) = -87.34."""
    x = np.linspace(-100.0, 0.0, 200001)
    row = torch.from_numpy(x.astype(np.float32))[None, None].clone()
    native.row_pass(row, 0, False, CHUNK)
    s = x.astype(np.float32).astype(np.float64)
    expected = np.exp(s) / np.exp(s).sum()
    w = row[0, 0].numpy().astype(np.float64)
    normal = expected > 1.2e-38 * 2
    assert np.abs(w[normal] / expected[normal] - 1).max() < 4e-7
    assert (w[s < -87.34 - np.log(np.exp(s).sum())] == 0).all()


def test_the_callers_denormal_setting_is_as_it_was():
    assert not flushing_denormals()
    native.row_pass(torch.randn(2, 8, 40) * 50, 0, False, CHUNK)
    assert not flushing_denormals() and torch.tensor(1e-39).item() > 0
    torch.set_flush_denormal(True)
    try:
        native.row_pass(torch.randn(2, 8, 40), 0, True, CHUNK)
        assert flushing_denormals()
    finally:
        torch.set_flush_denormal(False)


def test_bad_blocks_raise_clear_errors():
    with pytest.raises(ValueError, match="contiguous float32"):
        native.row_pass(torch.zeros(2, 3, 8).transpose(1, 2), 0, False, CHUNK)
    with pytest.raises(ValueError, match="contiguous float32"):
        native.row_pass(torch.zeros(2, 3, 8, dtype=torch.float64), 0, False, CHUNK)
    with pytest.raises(ValueError, match=r"columns must be float32 \[2, 8\]"):
        native.row_pass(torch.zeros(2, 3, 8), 0, False, CHUNK, torch.zeros(2, 7))


def test_the_library_is_built_once_into_its_cache_and_a_failed_build_says_why(tmp_path, monkeypatch):
    cc = native.compiler()
    built = native._build(cc, tmp_path / "cache")
    assert built.parent == tmp_path / "cache" and built.suffix == ".so"
    stamp = built.stat().st_mtime_ns
    assert native._build(cc, tmp_path / "cache") == built and built.stat().st_mtime_ns == stamp  # not rebuilt
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [built.name]  # no partial file left
    with pytest.raises(RuntimeError, match=r"could not build rows\.c"):
        native._build(["/bin/false"], tmp_path / "failed")
    assert not list((tmp_path / "failed").iterdir())
    monkeypatch.setenv("CC", f"env {cc[0]}")  # a command of several words, as "ccache gcc"
    assert native.compiler() == [shutil.which("env"), cc[0]]
    assert native._build(native.compiler(), tmp_path / "wrapped").suffix == ".so"
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert native.compiler() is None
    monkeypatch.setattr(native, "USE_NATIVE", False)
    assert not native.available() and "turned off" in native.why_not()
    with pytest.raises(RuntimeError, match="not available: turned off"):
        native.row_pass(torch.zeros(1, 1, 4), 0, False, CHUNK)


# ---- attend: one sequence's dense attention, a block of query rows at a time ----------------------------------------


def transposed(rng: np.random.Generator, heads: int, n: int, d_k: int, spread: float = 1.0) -> torch.Tensor:
    """``[1, heads, n, d_k]`` laid out as MultiHeadAttention's one-sequence projection lays it: each head's block
    transposed (``[d_k, n]`` in memory)."""
    block = torch.from_numpy((rng.standard_normal((1, heads, d_k, n)) * spread).astype(np.float32))
    return block.transpose(-2, -1)


def attention_reference(q, k, v, scale: float, causal: bool) -> tuple[np.ndarray, np.ndarray]:
    """softmax(scale q k^T) v in float64, a decoder's row i seeing keys j <= i + n_k - n_q, a row that sees none all
    zeros."""
    q, k, v = (t.double().numpy()[0] for t in (q, k, v))
    n_q, n_k = q.shape[1], k.shape[1]
    s = scale * q @ k.transpose(0, 2, 1)
    visible = np.ones((n_q, n_k), bool)
    if causal:
        visible = np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(s - np.where(np.isfinite(m), m, 0.0)), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    w = np.divide(e, total, out=np.zeros_like(e), where=total > 0)
    return w @ v, w


@pytest.mark.parametrize(
    "heads, n_q, n_k, d_k, causal, spread",
    [
        (12, 256, 256, 32, False, 1.0),  # d_model 384's heads (bench/core.py)
        (3, 100, 100, 64, False, 1.0),  # rows not a whole number of tiles of 8, keys not of 32
        (2, 77, 77, 7, True, 1.0),  # d_k padded to 16; a decoder
        (2, 5, 40, 16, True, 1.0),  # a decoder's last rows over earlier keys: row i sees 36 + i keys
        (2, 40, 5, 16, True, 1.0),  # more queries than keys: the first 35 rows see none (zeros)
        (1, 1, 1, 8, False, 1.0),
        (2, 33, 70, 24, False, 40.0),  # peaked rows: weights below float32's smallest normal number (0)
    ],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_attend_is_the_softmax_of_the_scores_times_the_values(heads, n_q, n_k, d_k, causal, spread, threads):
    rng = np.random.default_rng(n_q * 1000 + n_k + d_k)
    # spread scales the queries only: the scores' rounding grows with their size, and a float32 weight's with it
    q, k, v = (
        transposed(rng, heads, n_q, d_k, spread),
        transposed(rng, heads, n_k, d_k),
        transposed(rng, heads, n_k, d_k),
    )
    scale = 1.0 / np.sqrt(d_k)
    expected_out, expected_w = attention_reference(q, k, v, scale, causal)
    assert native.attends(q, k, v)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, weights = native.attend(q, k, v, scale, causal)
    finally:
        torch.set_num_threads(old)
    assert out.shape == (1, heads, n_q, d_k) and weights.shape == (1, heads, n_q, n_k)
    assert out.transpose(1, 2).is_contiguous()  # Concat of the heads is a view: W^O reads it without a copy
    w = weights[0].numpy()
    np.testing.assert_allclose(w, expected_w, rtol=2e-5, atol=2e-7)
    # the scores' rounding grows with their size (spread): a weight's error with it, and the output's
    np.testing.assert_allclose(out[0].numpy(), expected_out, rtol=2e-5, atol=2e-6 * spread)
    assert not ((w > 0) & (w < np.finfo(np.float32).tiny)).any()
    assert (w[expected_w == 0] == 0).all()  # hidden keys get exactly 0, not a tiny weight
    if spread > 10:
        assert (w == 0).mean() > 0.2
    if causal and n_q > n_k:
        assert (w[:, : n_q - n_k] == 0).all() and (out[0, :, : n_q - n_k] == 0).all()


def test_attend_writes_into_a_given_buffer_and_keeps_the_callers_denormal_setting():
    rng = np.random.default_rng(5)
    q, k, v = (transposed(rng, 2, 20, 8, 30.0) for _ in range(3))
    buffer = torch.full((1, 2, 20, 20), float("nan"))
    assert not flushing_denormals()
    _, weights = native.attend(q, k, v, 0.5, False, weights=buffer)
    assert weights is buffer and torch.isfinite(buffer).all()
    assert not flushing_denormals() and torch.tensor(1e-39).item() > 0


def test_attend_takes_only_its_layout_and_says_so():
    rng = np.random.default_rng(6)
    q, k, v = (transposed(rng, 2, 10, 8) for _ in range(3))
    assert native.attends(q, k, v)
    normal = torch.zeros(1, 2, 10, 8)  # contiguous [n, d_k] per head: torch's path
    assert not native.attends(normal, k, v)
    assert not native.attends(q.double(), k.double(), v.double())
    assert not native.attends(torch.cat([q, q]), torch.cat([k, k]), torch.cat([v, v]))  # a batch of two
    assert not native.attends(q, k[:, :1], v[:, :1])  # fewer key heads (torch broadcasts them)
    assert not native.attends(q[..., :4], k, v)
    assert not native.attends(q[:, :, :0], k, v)
    with pytest.raises(ValueError, match="stride"):
        native.attend(normal, k, v, 1.0, False)
    with pytest.raises(ValueError, match=r"contiguous float32 \[1, 2, 10, 10\]"):
        native.attend(q, k, v, 1.0, False, weights=torch.zeros(1, 2, 10, 9))
