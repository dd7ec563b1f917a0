"""Course notes 000, section 3.2: every intermediate, the operation counts and the course notes' discrepancies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import mha_core as mc

# The package exports the function worked_example(), which hides the module of the same name.
from mha_core import walkthrough as we


@pytest.fixture(scope="module")
def example():
    return mc.worked_example()


def softmax_rows(scores):
    exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True)


def test_inputs_are_the_seeds_printed_matrices():
    assert we.TUTORIAL_X[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert we.TUTORIAL_X[3].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert we.TUTORIAL_W1_Q[0].tolist() == [0.1, 0.2, 0.3, 0.4] and we.TUTORIAL_W1_Q[7].tolist() == [0.8, 0.9, 1.0, 1.1]
    assert we.TUTORIAL_W1_K[0].tolist() == [0.2, 0.1, 0.4, 0.3] and we.TUTORIAL_W1_K[7].tolist() == [0.9, 0.8, 1.1, 1.0]
    assert we.TUTORIAL_W1_V[0].tolist() == [0.3, 0.4, 0.1, 0.2] and we.TUTORIAL_W1_V[7].tolist() == [1.0, 1.1, 0.8, 0.9]
    assert we.TUTORIAL_W2_Q[0].tolist() == [0.2, 0.4, 0.1, 0.3] and we.TUTORIAL_W2_Q[7].tolist() == [0.9, 1.1, 0.8, 1.0]
    assert we.TUTORIAL_W_O[0].tolist() == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    assert we.TUTORIAL_W_O[7].tolist() == [0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]


def test_chosen_head_two_matrices_follow_head_one():
    # Head 1: W_1^K and W_1^V are W_1^Q with permuted columns; head 2 gets the same permutations.
    np.testing.assert_array_equal(we.TUTORIAL_W1_Q[:, we.KEY_COLUMNS], we.TUTORIAL_W1_K)
    np.testing.assert_array_equal(we.TUTORIAL_W1_Q[:, we.VALUE_COLUMNS], we.TUTORIAL_W1_V)
    assert we.CHOSEN_W2_K[0].tolist() == [0.4, 0.2, 0.3, 0.1]
    assert we.CHOSEN_W2_V[0].tolist() == [0.1, 0.3, 0.2, 0.4]


def test_projections_are_x_times_w(example):
    x = we.TUTORIAL_X
    np.testing.assert_allclose(example.q[0], x @ we.TUTORIAL_W1_Q, atol=1e-12)
    np.testing.assert_allclose(example.k[0], x @ we.TUTORIAL_W1_K, atol=1e-12)
    np.testing.assert_allclose(example.v[0], x @ we.TUTORIAL_W1_V, atol=1e-12)
    np.testing.assert_allclose(example.q[1], x @ we.TUTORIAL_W2_Q, atol=1e-12)
    np.testing.assert_allclose(example.k[1], x @ we.CHOSEN_W2_K, atol=1e-12)
    np.testing.assert_allclose(example.v[1], x @ we.CHOSEN_W2_V, atol=1e-12)
    assert example.q[0, 0, 0] == pytest.approx(20.4)  # the course notes print 22.0
    np.testing.assert_allclose(example.q[0, 0], [20.4, 24.0, 27.6, 31.2], atol=1e-12)
    np.testing.assert_allclose(example.k[0, 3], [37.2, 31.2, 49.2, 43.2], atol=1e-12)
    np.testing.assert_allclose(example.v[0, 3], [43.2, 49.2, 31.2, 37.2], atol=1e-12)


def test_scores_weights_heads_concat_output(example):
    q, k, v = example.q, example.k, example.v
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(4)
    np.testing.assert_allclose(example.scores, scores, atol=1e-9)
    assert example.scores[0, 0, 0] == pytest.approx(1350.72)
    weights = softmax_rows(scores)
    np.testing.assert_allclose(example.weights, weights, atol=1e-12)
    # The scores differ by hundreds, so softmax is one-hot: every token attends to token 4.
    np.testing.assert_allclose(example.weights[:, :, 3], 1.0, atol=1e-12)
    assert example.is_one_hot and not mc.random_example(seed=0).is_one_hot
    heads = weights @ v
    np.testing.assert_allclose(example.heads, heads, atol=1e-9)
    concat = np.concatenate([heads[0], heads[1]], axis=1)
    np.testing.assert_allclose(example.concat, concat, atol=1e-9)
    np.testing.assert_allclose(example.output, concat @ we.TUTORIAL_W_O, atol=1e-9)
    np.testing.assert_allclose(
        example.output[0], [145.32, 177.48, 209.64, 241.8, 273.96, 306.12, 338.28, 370.44], atol=1e-9
    )


def test_module_and_torch_reference_give_the_same_output(example):
    assert example.module_max_abs_diff < 1e-10
    # An independent reference: nn.MultiheadAttention holding the same matrices.
    ref = nn.MultiheadAttention(8, 2, bias=False, batch_first=True).double()
    with torch.no_grad():
        w_q = np.concatenate(list(example.w_q), axis=1).T
        w_k = np.concatenate(list(example.w_k), axis=1).T
        w_v = np.concatenate(list(example.w_v), axis=1).T
        ref.in_proj_weight.copy_(torch.from_numpy(np.concatenate([w_q, w_k, w_v])))
        ref.out_proj.weight.copy_(torch.from_numpy(example.w_o.T.copy()))
        x = torch.from_numpy(example.x)[None]
        out, weights = ref(x, x, x, need_weights=True, average_attn_weights=False)
    np.testing.assert_allclose(out[0].numpy(), example.output, atol=1e-9)
    np.testing.assert_allclose(weights[0].numpy(), example.weights, atol=1e-12)


def test_dimension_trace(example):
    shapes = dict(zip(example.dimension_trace["tensor"], example.dimension_trace["shape"]))
    assert shapes["X"] == [1, 4, 8]
    assert shapes["Q"] == shapes["K"] == shapes["V"] == [1, 2, 4, 4]
    assert shapes["score(Q, K)"] == [1, 2, 4, 4]
    assert shapes["Concat(head_1..head_h)"] == [1, 4, 8]
    assert shapes["Concat W^O"] == [1, 4, 8]


def test_operation_counts(example):
    counts = example.operation_counts.set_index("step")["multiplications"].to_dict()
    assert counts == {
        "projections": 768,
        "scores": 128,
        "scale": 32,
        "softmax": 32,
        "weighted_values": 128,
        "output_projection": 256,
    }
    assert example.total_matmul_multiplications == 1280
    seed = example.operation_counts.set_index("step")["printed_count"]
    assert seed["projections"] == 768 and seed["scores"] == 128 and seed["output_projection"] == 256
    assert seed.isna()["weighted_values"]


@pytest.mark.parametrize("config", [(4, 8, 2, "scaled", False), (6, 12, 3, "dot", True), (5, 16, 4, "cosine", False)])
def test_matmul_count_equals_torch_flop_counter(config):
    """The counted matrix-product multiplications are what torch actually executes (flops = 2 x multiply-adds)."""
    seq_len, d_model, heads, score, causal = config
    example = mc.random_example(seq_len, d_model, heads, seed=1, score=score, causal=causal)
    module = we._module(example.w_q, example.w_k, example.w_v, example.w_o, score)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module(torch.from_numpy(example.x)[None], causal=causal)
    assert counter.get_total_flops() == 2 * example.total_matmul_multiplications


def test_discrepancies_with_the_seed():
    frame = mc.printed_discrepancies()
    entries = frame[frame["index"].notna()]
    q1 = entries[entries["quantity"] == "Q1"].set_index("index")
    assert q1.loc[[(0, 0)], "printed_value"].item() == 22.0
    assert q1.loc[[(0, 0)], "true_value"].item() == pytest.approx(20.4)
    assert (2, 3) not in q1.index  # the one entry the course notes get right: 43.2
    summary = we.discrepancy_summary(frame).set_index("quantity")
    assert summary["wrong_entries"].to_dict() == {"Q1": 15, "K1": 15, "V1": 16}
    assert summary.loc["V1", "max_abs_error"] == pytest.approx(4.2)
    for name, printed in we.TUTORIAL_PRINTED.items():
        rows = entries[entries["quantity"] == name]
        for (row, col), printed_value in zip(rows["index"], rows["printed_value"]):
            assert printed[row, col] == printed_value
    total = frame.set_index("quantity").loc["count: total"]
    assert (total["printed_value"], total["true_value"]) == (1152.0, 1280.0)
    attention = frame.set_index("quantity").loc["count: attention"]
    assert (attention["printed_value"], attention["true_value"]) == (128.0, 256.0)
    assert "twice" in frame.set_index("quantity").loc["scaling applied twice", "note"]


def test_discrepancies_need_the_seed_example():
    with pytest.raises(ValueError, match="seed"):
        mc.printed_discrepancies(mc.random_example())
    assert mc.random_example().discrepancies.empty
    assert len(mc.worked_example().discrepancies) == len(mc.printed_discrepancies()) == 49


@pytest.mark.parametrize("score", mc.SCORE_FUNCTIONS)
def test_seed_example_with_other_scores_and_causal(score):
    example = mc.worked_example(score=score, causal=True)
    assert example.module_max_abs_diff < 1e-9
    assert float(np.abs(np.triu(example.weights, 1)).max()) == 0.0
    np.testing.assert_allclose(example.weights.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(example.weights[:, 0, 0], 1.0)  # the first token can only see itself
    steps = set(example.operation_counts["step"])
    assert ("scale" in steps) == (score == "scaled") and ("normalise" in steps) == (score == "cosine")


def test_random_example_is_deterministic_and_consistent():
    a = mc.random_example(seq_len=6, d_model=12, num_heads=3, seed=5, score="dot", causal=True)
    b = mc.random_example(seq_len=6, d_model=12, num_heads=3, seed=5, score="dot", causal=True)
    c = mc.random_example(seq_len=6, d_model=12, num_heads=3, seed=6, score="dot", causal=True)
    np.testing.assert_array_equal(a.weights, b.weights)
    assert not np.allclose(a.weights, c.weights)
    assert a.weights.shape == (3, 6, 6) and a.output.shape == (6, 12) and a.d_k == 4
    assert a.module_max_abs_diff < 1e-10
    np.testing.assert_allclose(a.scores, a.q @ a.k.transpose(0, 2, 1), atol=1e-12)  # dot: no scaling
    assert a.total_matmul_multiplications == 3 * 6 * 12 * 12 + 2 * 3 * 6 * 6 * 4 + 6 * 12 * 12


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"d_model": 10, "num_heads": 3}, "divisible"),
        ({"seq_len": 0}, "seq_len"),
        ({"d_model": 1000}, "d_model"),
        ({"num_heads": 2.5}, "num_heads"),
        ({"score": "euclid"}, "score"),
    ],
)
def test_random_example_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mc.random_example(**kwargs)


def test_softmax_saturation_curve():
    table = mc.softmax_saturation(d_k_values=(1, 16, 512), n_keys=16, samples=128, seed=0)
    pivot = table.pivot(index="d_k", columns="score", values="max_weight")
    assert pivot.loc[1, "dot"] == pytest.approx(pivot.loc[1, "scaled"])  # sqrt(1) = 1
    assert pivot.loc[512, "dot"] > 0.9 > 0.4 > pivot.loc[512, "scaled"]  # unscaled scores saturate
    assert pivot["dot"].is_monotonic_increasing
    assert pivot.loc[512, "cosine"] < pivot.loc[1, "cosine"]  # bounded scores flatten toward uniform
    entropy = table.pivot(index="d_k", columns="score", values="entropy_fraction")
    assert entropy.loc[512, "dot"] < 0.2 < 0.8 < entropy.loc[512, "scaled"]
    assert ((table["max_weight"] >= 1 / 16) & (table["max_weight"] <= 1)).all()


def test_the_readable_example_asks_two_questions_you_can_read_off():
    example = mc.readable_example()
    assert example.token_labels == ["The", "cat", "sat", "down"] and len(example.notes["features"]) == 8
    # Head 1: the verb "sat" looks at the noun "cat" the most; head 2: every word at the one before it.
    assert int(np.argmax(example.weights[0, 2])) == 1
    assert [int(np.argmax(example.weights[1, i])) for i in range(1, 4)] == [0, 1, 2]
    assert not example.is_one_hot and example.weights.max() < 0.8
    assert example.module_max_abs_diff < 1e-12
