"""The from-scratch core against torch.nn.MultiheadAttention, F.scaled_dot_product_attention and hand formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import mha_core as mc
from mha_core.edits import scale_heads
from tests.conftest import require

ATOL = 1e-5


def reference_pair(d_model=32, num_heads=4, batch_first=True, bias=True, seed=0):
    """A random nn.MultiheadAttention (non-zero biases) and our copy of it."""
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(d_model, num_heads, bias=bias, batch_first=batch_first).eval()
    if bias:
        with torch.no_grad():
            ref.in_proj_bias.normal_()
            ref.out_proj.bias.normal_()
    return ref, mc.MultiHeadAttention.from_torch(ref).eval()


def torch_mha(ref, query, key, value, attn_mask=None, key_padding_mask=None):
    """nn.MultiheadAttention with per-head weights, inputs always given batch-first."""
    if not ref.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    out, weights = ref(
        query,
        key,
        value,
        need_weights=True,
        average_attn_weights=False,
        attn_mask=attn_mask,
        key_padding_mask=key_padding_mask,
    )
    return (out if ref.batch_first else out.transpose(0, 1)), weights


def assert_close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual, expected, atol=atol, rtol=0)


@pytest.mark.parametrize("batch_first", [True, False])
def test_self_attention_matches_torch(batch_first):
    ref, core = reference_pair(batch_first=batch_first)
    x = torch.randn(3, 7, 32)
    expected_out, expected_weights = torch_mha(ref, x, x, x)
    out, weights = core(x)
    assert weights.shape == (3, 4, 7, 7)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)


@pytest.mark.parametrize("batch_first", [True, False])
def test_cross_attention_matches_torch(batch_first):
    ref, core = reference_pair(batch_first=batch_first, seed=1)
    query, key, value = torch.randn(2, 5, 32), torch.randn(2, 9, 32), torch.randn(2, 9, 32)
    expected_out, expected_weights = torch_mha(ref, query, key, value)
    out, weights = core(query, key, value)
    assert weights.shape == (2, 4, 5, 9)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("batch", "n"), [(1, 6), (3, 6), (1, 600)])
@pytest.mark.parametrize("no_autograd", [torch.no_grad, torch.inference_mode])
def test_self_attention_without_autograd_matches_torch(bias, batch, n, no_autograd):
    """Without autograd self-attention lays Q, K, V out per head (one sequence: the transposed product W X^T, whose
    heads' [d_k, n] blocks q, k, v view transposed; a batch: one product copied into [3, batch, heads, n, d_k]): each
    way gives torch's numbers, and the grad path's."""
    ref, core = reference_pair(bias=bias, seed=3)
    x = torch.randn(batch, n, 32)
    expected_out, expected_weights = torch_mha(ref, x, x, x)
    with_grad_out, with_grad_weights = core(x)
    with no_autograd():
        q, k, v = core.project(x, x, x)
        out, weights = core(x)
    assert q.shape == k.shape == v.shape == (batch, 4, n, 8)
    if batch == 1:  # each head's block is Q^T: the views' rows are its columns
        assert q.stride()[-2:] == k.stride()[-2:] == v.stride()[-2:] == (1, n)
        assert q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    else:
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)
    assert_close(out, with_grad_out)
    assert_close(weights, with_grad_weights)


def test_no_bias_matches_torch():
    ref, core = reference_pair(bias=False, seed=2)
    x = torch.randn(2, 6, 32)
    expected_out, expected_weights = torch_mha(ref, x, x, x)
    out, weights = core(x)
    assert core.qkv_bias is None
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)


@pytest.mark.parametrize("batch_first", [True, False])
def test_key_padding_mask_matches_torch(batch_first):
    ref, core = reference_pair(batch_first=batch_first, seed=3)
    x = torch.randn(3, 6, 32)
    lengths = torch.tensor([6, 4, 2])
    real = torch.arange(6)[None, :] < lengths[:, None]  # ours: True = real token
    expected_out, expected_weights = torch_mha(ref, x, x, x, key_padding_mask=~real)  # torch: True = ignore
    out, weights = core(x, key_padding_mask=real)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)
    assert float(weights[1, :, :, 4:].detach().abs().max()) == 0.0


def test_causal_mask_matches_torch():
    ref, core = reference_pair(seed=4)
    x = torch.randn(2, 8, 32)
    future = torch.ones(8, 8, dtype=torch.bool).triu(1)  # torch: True = not allowed
    expected_out, expected_weights = torch_mha(ref, x, x, x, attn_mask=future)
    out, weights = core(x, causal=True)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)
    assert float(weights.detach().triu(1).abs().max()) == 0.0


def test_causal_and_padding_together_match_torch():
    ref, core = reference_pair(seed=5)
    x = torch.randn(2, 6, 32)
    real = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    expected_out, expected_weights = torch_mha(ref, x, x, x, attn_mask=future, key_padding_mask=~real)
    out, weights = core(x, causal=True, key_padding_mask=real)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)


def test_additive_float_mask_matches_torch():
    ref, core = reference_pair(seed=6)
    x = torch.randn(2, 5, 32)
    additive = torch.randn(5, 5)
    additive[0, 3] = float("-inf")
    expected_out, expected_weights = torch_mha(ref, x, x, x, attn_mask=additive)
    out, weights = core(x, mask=additive)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)
    assert float(weights.detach()[:, :, 0, 3].abs().max()) == 0.0


def test_unbatched_input_matches_torch_and_batched():
    ref, core = reference_pair(seed=7)
    x = torch.randn(5, 32)
    expected_out, expected_weights = ref(x, x, x, need_weights=True, average_attn_weights=False)
    out, weights = core(x)
    assert out.shape == (5, 32) and weights.shape == (4, 5, 5)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)
    batched_out, batched_weights = core(x[None])
    assert_close(out, batched_out[0])
    assert_close(weights, batched_weights[0])


def test_gradients_match_torch():
    """Outside inference mode the core must not overwrite tensors autograd still needs."""
    ref, core = reference_pair(seed=8)
    core.train()
    x_ours = torch.randn(2, 5, 32, requires_grad=True)
    x_ref = x_ours.detach().clone().requires_grad_(True)
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    out, weights = core(x_ours, causal=True, key_padding_mask=real)
    (out.square().sum() + weights[:, 0].sum()).backward()
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    ref_out, ref_weights = torch_mha(ref, x_ref, x_ref, x_ref, attn_mask=future, key_padding_mask=~real)
    (ref_out.square().sum() + ref_weights[:, 0].sum()).backward()
    assert_close(x_ours.grad, x_ref.grad, atol=1e-4)
    assert_close(core.qkv_weight.grad, ref.in_proj_weight.grad, atol=1e-4)


def test_set_weights_views_and_split_merge():
    core = mc.MultiHeadAttention(8, 2, bias=True)
    w_q, w_k, w_v, w_o = (torch.randn(8, 8) for _ in range(4))
    b_q = torch.randn(8)
    core.set_weights(w_q, w_k, w_v, w_o, b_q=b_q)
    assert torch.equal(core.W_q, w_q) and torch.equal(core.W_k, w_k) and torch.equal(core.W_v, w_v)
    assert torch.equal(core.W_o, w_o)
    assert torch.equal(core.qkv_bias[:8], b_q) and float(core.qkv_bias.detach()[8:].abs().max()) == 0.0
    x = torch.randn(3, 4, 8)
    split = core.split_heads(x)
    assert split.shape == (3, 2, 4, 4)
    assert torch.equal(split[:, 1], x[..., 4:])
    assert torch.equal(core.merge_heads(split), x)
    with torch.no_grad():
        q, _, _ = core.project(x, x, x)
        assert_close(core.merge_heads(q), x @ w_q.T + b_q)


@pytest.mark.parametrize("use_onednn", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_is_the_affine_map_through_either_product(monkeypatch, use_onednn, bias):
    """``linear`` gives x W^T + b (float64 reference) through oneDNN or F.linear, for contiguous and transposed
    input and weight; with autograd following it, it takes F.linear and the gradients are the reference's."""
    from mha_core import attention

    if use_onednn and not attention.USE_ONEDNN:
        pytest.skip("this torch has no oneDNN linear")
    monkeypatch.setattr(attention, "USE_ONEDNN", use_onednn)
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(2, 37, 48, generator=generator)
    weight = torch.randn(20, 48, generator=generator)
    b = torch.randn(20, generator=generator) if bias else None
    expected = x.double() @ weight.double().T + (0 if b is None else b.double())
    with torch.no_grad():
        for xs, ws in ((x, weight), (x.transpose(0, 1).contiguous().transpose(0, 1), weight.T.contiguous().T)):
            out = attention.linear(xs, ws, b)
            assert out.shape == (2, 37, 20) and out.dtype == torch.float32
            torch.testing.assert_close(out.double(), expected, atol=1e-4, rtol=1e-5)
        # a broadcast row (stride 0) against every other column of a wider weight
        wide = torch.randn(20, 96, generator=generator)
        out = attention.linear(x[:1, :1].expand(2, 37, 48), wide[:, ::2], b)
        row = x[0, 0].double() @ wide[:, ::2].double().T + (0 if b is None else b.double())
        torch.testing.assert_close(out.double(), row.expand(2, 37, 20), atol=1e-4, rtol=1e-5)
    x.requires_grad_(True)
    assert not attention._onednn_takes(x, weight, b)
    attention.linear(x, weight, b).pow(2).sum().backward()
    x64 = x.detach().double().requires_grad_(True)
    (x64 @ weight.double().T + (0 if b is None else b.double())).pow(2).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-3, rtol=1e-5)


def test_one_sequences_forward_copies_no_activation():
    """Without autograd, one sequence's Q, K, V and Concat are views of the products (or, with the C kernels, Concat is
    what ``native.attend`` writes): torch's profiler sees no copy of a tensor as large as the input in the forward
    (oneDNN would copy a transposed Concat before W^O's product; that goes to MKL, which reads it transposed), and the
    output is torch's. (Without
    biases: F.linear with a bias first copies the bias into every row of its output, as torch's own layer does.)"""
    from torch.profiler import profile

    from mha_core import attention

    torch.manual_seed(2)
    reference = nn.MultiheadAttention(48, 4, bias=False, batch_first=True).eval()
    core = mc.MultiHeadAttention.from_torch(reference).eval()
    x = torch.randn(1, 40, 48)
    assert not attention._onednn_takes(torch.randn(48, 40).T, reference.out_proj.weight.detach(), None)
    with torch.inference_mode():
        with profile(record_shapes=True) as prof:
            out, _ = core(x)
        expected, _ = reference(x, x, x, need_weights=False)
    copies = [e.input_shapes for e in prof.events() if e.name in ("aten::copy_", "aten::clone", "aten::contiguous")]
    large = [shapes for shapes in copies if any(len(shape) and math.prod(shape) >= 40 * 48 for shape in shapes)]
    assert large == []
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("causal", "bias"), [(False, True), (True, False)])
def test_one_sequence_takes_the_c_attention_with_torchs_numbers(monkeypatch, causal, bias):
    """Without autograd or hooks on the scores, one sequence's attention is ``native.attend`` (scores, softmax and
    output a block of rows at a time): its output and weights are torch's path's (``native`` off) and
    nn.MultiheadAttention's to float32 rounding; a hook on the pattern, a batch or autograd takes torch's path."""
    from mha_core import native

    require(native.available(), f"the C kernels ({native.why_not()})")
    calls = []
    attend = native.attend
    monkeypatch.setattr(native, "attend", lambda *a, **k: calls.append(a[0].shape) or attend(*a, **k))
    torch.manual_seed(4)
    reference = nn.MultiheadAttention(96, 6, bias=bias, batch_first=True).eval()
    core = mc.MultiHeadAttention.from_torch(reference).eval()
    x = torch.randn(1, 37, 96)
    mask = torch.ones(37, 37, dtype=torch.bool).tril().logical_not() if causal else None
    with torch.inference_mode():
        out, weights = core(x, causal=causal)
        assert calls == [(1, 6, 37, 16)]
        expected, expected_weights = reference(x, x, x, attn_mask=mask, need_weights=True, average_attn_weights=False)
        hooked_out, hooked_weights = core(x, causal=causal, hooks={"hook_pattern": lambda pattern: pattern})
        core(torch.cat([x, x]), causal=causal)  # a batch: each head's block is not transposed
        assert len(calls) == 1
        monkeypatch.setattr(native, "USE_NATIVE", False)
        torch_out, torch_weights = core(x, causal=causal)
    assert len(calls) == 1 and out.is_contiguous()
    for got, want in ((out, torch_out), (weights, torch_weights), (out, hooked_out), (weights, hooked_weights)):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    if causal:
        assert (weights[0].triu(1) == 0).all()


def test_a_transposed_value_gives_a_transposed_output_with_the_same_numbers():
    """scaled_dot_product_attention writes the output in the layout of v: for a transposed view (the one-sequence
    projection's), (V^T W^T)^T, whose heads Concat views without a copy; the numbers are W V's."""
    q, k, v = random_qkv(batch=1, heads=3, n_query=9, n_key=9, d_k=8, seed=5)
    v_t = v.transpose(-2, -1).contiguous().transpose(-2, -1)
    out, weights = mc.scaled_dot_product_attention(q, k, v)
    out_t, weights_t = mc.scaled_dot_product_attention(q, k, v_t)
    assert out_t.stride()[-2:] == (1, 9) and out.is_contiguous()
    torch.testing.assert_close(out_t, out, atol=1e-6, rtol=1e-6)
    assert torch.equal(weights_t, weights)
    reference = torch.einsum("bhqk,bhkd->bhqd", weights.double(), v.double())
    torch.testing.assert_close(out_t.double(), reference, atol=1e-6, rtol=1e-6)
    merged = out_t.transpose(1, 2).reshape(1, 9, 24)
    assert merged.untyped_storage().data_ptr() == out_t.untyped_storage().data_ptr()  # a view


# --- the weighted core against F.scaled_dot_product_attention ------------------------------------


def random_qkv(batch=2, heads=3, n_query=5, n_key=7, d_k=8, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, heads, n, d_k, generator=generator, dtype=dtype) for n in (n_query, n_key, n_key))


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "causal"])
def test_weighted_core_matches_torch_sdpa(mask_kind):
    q, k, v = random_qkv(n_query=7, n_key=7)
    mask, causal, sdpa_mask = None, False, None
    if mask_kind == "bool":
        mask = torch.rand(2, 1, 7, 7, generator=torch.Generator().manual_seed(1)) > 0.3
        mask[..., 0] = True  # keep every row non-empty: torch gives NaN for empty rows
        sdpa_mask = mask  # both: True = attend
    elif mask_kind == "float":
        mask = sdpa_mask = torch.randn(7, 7)
    elif mask_kind == "causal":
        causal = True
    out, weights = mc.scaled_dot_product_attention(q, k, v, mask=mask, causal=causal)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, is_causal=causal)
    assert_close(out, expected)
    assert_close(weights.sum(-1), torch.ones(2, 3, 7))


@pytest.mark.parametrize("score", ["dot", "cosine"])
def test_unscaled_scores_match_torch_sdpa_with_scale_one(score):
    q, k, v = random_qkv(seed=2)
    out, _ = mc.scaled_dot_product_attention(q, k, v, score=score)
    if score == "cosine":
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=1.0))


def test_score_functions_equal_hand_formulas():
    q, k, _ = random_qkv(batch=1, heads=1, n_query=3, n_key=4, d_k=5, seed=3, dtype=torch.float64)
    q_np, k_np = q[0, 0].numpy(), k[0, 0].numpy()
    for score in mc.SCORE_FUNCTIONS:
        expected = np.empty((3, 4))
        for i in range(3):
            for j in range(4):
                dot = sum(q_np[i, c] * k_np[j, c] for c in range(5))
                expected[i, j] = {
                    "dot": dot,
                    "scaled": dot / math.sqrt(5),
                    "cosine": dot / (math.sqrt(sum(x * x for x in q_np[i])) * math.sqrt(sum(x * x for x in k_np[j]))),
                }[score]
        np.testing.assert_allclose(mc.attention_scores(q, k, score)[0, 0].numpy(), expected, rtol=0, atol=1e-12)
        weights = mc.masked_softmax(torch.from_numpy(expected))
        by_hand = np.exp(expected - expected.max(1, keepdims=True))
        np.testing.assert_allclose(weights.numpy(), by_hand / by_hand.sum(1, keepdims=True), rtol=0, atol=1e-12)


# --- stability -------------------------------------------------------------------------------------


@pytest.mark.parametrize("score", ["dot", "scaled"])
def test_huge_scores_stay_finite_and_correct(score):
    q, k, v = random_qkv(seed=4)
    q, k = q * 100.0, k * 100.0  # scores of magnitude ~1e4 to 1e5
    out, weights = mc.scaled_dot_product_attention(q, k, v, score=score)
    assert float(mc.attention_scores(q, k, score).abs().max()) > 1e4
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    expected, expected_weights = mc.scaled_dot_product_attention(q.double(), k.double(), v.double(), score=score)
    assert_close(weights.double(), expected_weights, atol=1e-5)
    assert_close(out.double(), expected, atol=1e-4)


@pytest.mark.parametrize("mask_kind", ["bool", "float"])
def test_fully_masked_rows_give_zero_weights_and_zero_output(mask_kind):
    q, k, v = random_qkv(n_query=4, n_key=4, seed=5)
    keep = torch.ones(4, 4, dtype=torch.bool)
    keep[2] = False
    mask = keep if mask_kind == "bool" else torch.zeros(4, 4).masked_fill(~keep, float("-inf"))
    out, weights = mc.scaled_dot_product_attention(q * 1e3, k, v, mask=mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert float(weights[:, :, 2].abs().max()) == 0.0 and float(out[:, :, 2].abs().max()) == 0.0
    assert_close(weights[:, :, [0, 1, 3]].sum(-1), torch.ones(2, 3, 3))


def test_fully_padded_sequence_in_module_is_finite():
    _, core = reference_pair(seed=9)
    x = torch.randn(2, 4, 32)
    real = torch.tensor([[True] * 4, [False] * 4])
    with torch.no_grad():
        out, weights = core(x, key_padding_mask=real)
    assert torch.isfinite(out).all()
    assert float(weights[1].abs().max()) == 0.0
    assert_close(out[1], core.out_proj.bias.expand(4, 32))  # zero heads, so only the output bias is left


def test_public_masked_softmax_leaves_its_input_alone():
    scores = torch.randn(2, 3, 3)
    before = scores.clone()
    mc.masked_softmax(scores, mask=torch.randn(3, 3), causal=True)
    assert torch.equal(scores, before)


def test_broadcast_mask_larger_than_scores():
    q, k, v = random_qkv(batch=1, heads=2, n_query=3, n_key=3, seed=6)
    keep = torch.rand(4, 1, 3, 3, generator=torch.Generator().manual_seed(0)) > 0.4
    with torch.no_grad():
        _, weights = mc.scaled_dot_product_attention(q, k, v, mask=keep)
    assert weights.shape == (4, 2, 3, 3)
    assert float(weights.masked_select(~keep.expand(4, 2, 3, 3)).abs().max()) == 0.0


# --- errors ----------------------------------------------------------------------------------------


def test_value_errors():
    with pytest.raises(ValueError, match="divisible"):
        mc.MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="positive"):
        mc.MultiHeadAttention(8, 0)
    with pytest.raises(ValueError, match="score"):
        mc.MultiHeadAttention(8, 2, score="euclid")
    core = mc.MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="d_model=8"):
        core(torch.randn(2, 3, 9))
    with pytest.raises(ValueError, match="same length"):
        core(torch.randn(2, 3, 8), torch.randn(2, 4, 8), torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"\[batch, n, d_model\]"):
        core(torch.randn(1, 2, 3, 8))
    q, k, v = random_qkv()
    with pytest.raises(ValueError, match="last dimension"):
        mc.scaled_dot_product_attention(q, k[..., :4], v)
    with pytest.raises(ValueError, match="same length"):
        mc.scaled_dot_product_attention(q, k, v[..., :3, :])
    with pytest.raises(ValueError, match="score"):
        mc.attention_scores(q, k, "manhattan")


def test_explicit_d_k_allows_any_head_size():
    core = mc.MultiHeadAttention(10, 3, d_k=4)
    out, weights = core(torch.randn(2, 5, 10))
    assert core.W_q.shape == (12, 10) and out.shape == (2, 5, 10) and weights.shape == (2, 3, 5, 5)


# --- properties --------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    heads=st.integers(1, 3),
    n_query=st.integers(1, 6),
    n_key=st.integers(1, 6),
    d_k=st.integers(1, 5),
    causal=st.booleans(),
    score=st.sampled_from(mc.SCORE_FUNCTIONS),
    mask_seed=st.integers(0, 2**16),
    density=st.floats(0.0, 1.0),
)
def test_weights_are_distributions_over_kept_keys(batch, heads, n_query, n_key, d_k, causal, score, mask_seed, density):
    generator = torch.Generator().manual_seed(mask_seed)
    q = torch.randn(batch, heads, n_query, d_k, generator=generator) * 10
    k = torch.randn(batch, heads, n_key, d_k, generator=generator) * 10
    v = torch.randn(batch, heads, n_key, 2, generator=generator)
    keep = torch.rand(batch, 1, n_query, n_key, generator=generator) < density
    with torch.no_grad():
        out, weights = mc.scaled_dot_product_attention(q, k, v, mask=keep, causal=causal, score=score)
    assert out.shape == (batch, heads, n_query, 2) and weights.shape == (batch, heads, n_query, n_key)
    allowed = keep & mc.causal_keep_mask(n_query, n_key) if causal else keep
    allowed = allowed.expand(batch, heads, n_query, n_key)
    assert torch.isfinite(weights).all() and torch.isfinite(out).all()
    assert float(weights.masked_select(~allowed).abs().sum()) == 0.0
    expected_sums = allowed.any(-1).to(weights.dtype)  # 1 where some key is kept, 0 for empty rows
    assert_close(weights.sum(-1), expected_sums)
    assert float(out.masked_select(~allowed.any(-1, keepdim=True)).abs().sum()) == 0.0


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    n=st.integers(1, 6),
    n_key=st.integers(1, 6),
    heads=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**16),
)
def test_module_shapes_and_torch_agreement(batch, n, n_key, heads, seed):
    ref, core = reference_pair(d_model=8, num_heads=heads, seed=seed % 97)
    generator = torch.Generator().manual_seed(seed)
    query, memory = torch.randn(batch, n, 8, generator=generator), torch.randn(batch, n_key, 8, generator=generator)
    with torch.no_grad():
        out, weights = core(query, memory)
        expected_out, expected_weights = torch_mha(ref, query, memory, memory)
    assert out.shape == (batch, n, 8) and weights.shape == (batch, heads, n, n_key)
    assert_close(out, expected_out)
    assert_close(weights, expected_weights)


def test_from_torch_rejects_what_it_cannot_copy():
    with pytest.raises(ValueError, match="kdim"):
        mc.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, kdim=4, vdim=4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        mc.MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True))


def test_from_torch_keeps_double_precision():
    ref = nn.MultiheadAttention(8, 2, batch_first=False).double().eval()
    core = mc.MultiHeadAttention.from_torch(ref)
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    out, weights = core(x)
    expected_out, expected_weights = torch_mha(ref, x, x, x)
    assert out.dtype == torch.float64
    assert_close(out, expected_out, atol=1e-12)
    assert_close(weights, expected_weights, atol=1e-12)


@pytest.mark.parametrize(
    "mask_kind", ["none", "bool", "additive", "bool-broadcast", "additive-broadcast", "all-masked"]
)
@pytest.mark.parametrize("causal", [False, True])
def test_in_place_softmax_is_the_formula(mask_kind, causal):
    """``masked_softmax_`` (the fast path, writing into the scores) gives the formula's numbers exactly."""
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(2, 3, 5, 5, generator=generator) * 4
    masks = {
        "none": None,
        "bool": torch.rand(2, 3, 5, 5, generator=generator) > 0.3,
        "additive": torch.where(torch.rand(2, 3, 5, 5, generator=generator) > 0.3, 0.0, float("-inf")),
        "bool-broadcast": torch.rand(2, 1, 1, 5, generator=generator) > 0.3,
        "additive-broadcast": torch.randn(1, 1, 5, 5, generator=generator),
        "all-masked": torch.zeros(2, 3, 5, 5, dtype=torch.bool),
    }
    mask = masks[mask_kind]
    expected = mc.masked_softmax(scores, mask, causal)
    fast = mc.attention.masked_softmax_(scores.clone(), mask, causal)
    assert torch.equal(fast, expected)  # the same operations on the same numbers, in another buffer
    assert not torch.isnan(fast).any()


def test_an_edit_zeroes_exactly_that_heads_share_of_the_output():
    """Ablating head h removes its slice of the Concat: the output equals W^O applied to the other heads."""
    torch.manual_seed(3)
    mha = mc.MultiHeadAttention(16, 4).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        full, weights = mha(x, causal=True)
        ablated, ablated_weights = mha(
            x, causal=True, hooks={"hook_z": scale_heads(torch.tensor([1.0, 0.0, 1.0, 1.0]))}
        )
        q, k, v = mha.project(x, x, x)
        heads, _ = mc.scaled_dot_product_attention(q, k, v, causal=True)
        heads[:, 1] = 0.0
        expected = mha.merge_heads(heads) @ mha.W_o.T + mha.out_proj.bias
        # Per example: the first sequence keeps every head, the second drops head 3.
        gates = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
        per_batch, _ = mha(x, causal=True, hooks={"hook_z": scale_heads(gates)})
    torch.testing.assert_close(ablated, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(ablated_weights, weights, atol=0, rtol=0)  # weights are what the head computed
    assert (ablated - full).abs().max() > 1e-3
    torch.testing.assert_close(per_batch[0], full[0], atol=ATOL, rtol=0)
    assert (per_batch[1] - full[1]).abs().max() > 1e-3
    torch.testing.assert_close(
        mha(x, causal=True, hooks={"hook_z": scale_heads(torch.ones(4))})[0], full, atol=ATOL, rtol=0
    )
    with pytest.raises(ValueError, match="factors"):
        mha(x, hooks={"hook_z": scale_heads(torch.ones(3))})
