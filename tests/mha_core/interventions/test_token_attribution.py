"""Token attribution and its faithfulness (issue 33), each checked against a computation written here.

The prediction f is recomputed from the transformers model itself (``inputs_embeds``, the LM head, mean pooling of
``last_hidden_state``), never through the library's hook points; integrated gradients against a midpoint Riemann
sum of gradients taken here, occlusion by running every shortened sequence by hand, Spearman against scipy's.
Small random Llama and BERT checkpoints cover a decoder and a sentence encoder; SmolLM2 and MiniLM in the slow
tests.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
import torch

import mha_core as mc
from mha_core.analysis.flow import attention_rollout
from mha_core.errors import HeadscopeError
from mha_core.interventions.faithfulness import aopc_table, head_agreement, method_agreement, method_order, spearman
from mha_core.interventions.prompts import CIRCUIT_TASKS
from mha_core.interventions.token_attribution import METHODS, AttributionError, padded_batches
from mha_core.operations.attribution import TokenAttribution as TokenAttributionOp
from tests.model_fixtures import build_tiny_bert, build_tiny_llama

TEXT = "The cat sat on the mat and the dog"
PAIR = "A dog sat on a mat."
# f is a float32 pass read in float64; the library batches rows that the test runs one by one (different kernels
# and summation orders): agreement to float32 rounding of a log-probability of magnitude ~5.
F_TOL = dict(rtol=1e-4, atol=1e-4)
APPROX = dict(rel=1e-4, abs=1e-4)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("llama"), head=True, randomised=True, tie_word_embeddings=False)
    return mc.load_model(str(path))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return mc.load_model(str(build_tiny_bert(tmp_path_factory.mktemp("bert"), randomised=True)))


# ---- f, written here from the transformers model --------------------------------------------------------
def decoder_f(model, ids: list[int], target: int, embeds: torch.Tensor | None = None) -> torch.Tensor:
    """log p(target | ids) at the last position, from the causal LM with ``inputs_embeds`` (``[n, d]``)."""
    lm = model.lm_model
    if embeds is None:
        embeds = lm.get_input_embeddings()(torch.tensor([ids]))[0]
    logits = lm(inputs_embeds=embeds[None]).logits[0, -1].double()
    return torch.log_softmax(logits, dim=-1)[target]


def encoder_f(model, ids: list[int], other: list[int]) -> float:
    """Cosine similarity of the mean-pooled last hidden states of two token sequences."""
    with torch.no_grad():
        a = model.hf_model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0).double()
        b = model.hf_model(input_ids=torch.tensor([other])).last_hidden_state[0].mean(0).double()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def riemann_ig(model, ids, target, special, steps: int) -> np.ndarray:
    """Integrated gradients by the midpoint rule, each point's gradient taken on its own."""
    x = model.lm_model.get_input_embeddings()(torch.tensor([ids]))[0].detach()
    baseline = torch.where(torch.tensor(special)[:, None], x, torch.zeros_like(x))
    total = torch.zeros_like(x, dtype=torch.float64)
    for k in range(steps):
        point = (baseline + (k + 0.5) / steps * (x - baseline)).requires_grad_(True)
        (grad,) = torch.autograd.grad(decoder_f(model, ids, target, point), point)
        total += grad.double()
    return ((x - baseline).double() * total / steps).sum(-1).numpy()


# ---- a decoder -----------------------------------------------------------------------------------------
def test_decoder_scores_equal_computations_by_hand(decoder):
    result = mc.token_attribution(decoder, TEXT, steps=8)
    encoded = decoder.encode(TEXT)
    ids, special = list(encoded.input_ids), np.asarray(encoded.special_mask)
    target = result.metadata["target_id"]
    with torch.no_grad():
        logits = decoder.lm_model(input_ids=torch.tensor([ids])).logits[0, -1]
    assert target == int(logits.argmax())  # the default target: the model's own top token
    with torch.no_grad():
        full = float(decoder_f(decoder, ids, target))
    assert result.prediction == pytest.approx(full, **APPROX)
    scores = result.scores
    assert scores["token"].tolist() == decoder.run(TEXT).tokens
    # integrated gradients: the midpoint Riemann sum, and its completeness error as reported
    ig = scores["integrated_gradients"].to_numpy()
    np.testing.assert_allclose(ig, riemann_ig(decoder, ids, target, special, 8), rtol=1e-3, atol=1e-5)
    assert np.all(ig[special] == 0)  # special tokens are their own baseline
    x = decoder.lm_model.get_input_embeddings()(torch.tensor([ids]))[0].detach()
    baseline = torch.where(torch.tensor(special)[:, None], x, torch.zeros_like(x))
    with torch.no_grad():
        start = float(decoder_f(decoder, ids, target, baseline))
    assert result.baseline_prediction == pytest.approx(start, **APPROX)
    assert result.completeness_error == pytest.approx(ig.sum() - (full - start), abs=1e-3)
    # gradient x input
    point = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(decoder_f(decoder, ids, target, point), point)
    np.testing.assert_allclose(scores["gradient_x_input"], (x * grad).sum(-1).numpy(), rtol=1e-3, atol=1e-5)
    # occlusion: every shortened sequence by hand; special tokens are not occluded
    with torch.no_grad():
        by_hand = [full - float(decoder_f(decoder, ids[:i] + ids[i + 1 :], target)) for i in np.flatnonzero(~special)]
    np.testing.assert_allclose(scores["occlusion"].to_numpy()[~special], by_hand, **F_TOL)
    assert np.isnan(scores["occlusion"].to_numpy()[special]).all()
    # the attention-based scores read the last position's row
    run = decoder.run(TEXT, norms=True)
    np.testing.assert_allclose(scores["attention"], run.attentions[-1, :, -1].mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(scores["rollout"], attention_rollout(run)[-1, -1], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(scores["attention_norms"], run.norms[-1, :, -1].sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.head_rows, run.attentions[:, :, -1], rtol=1e-5, atol=1e-7)


def test_integrated_gradients_completes_with_enough_steps(encoder):
    """Completeness: the scores sum to f(x) - f(baseline) as the Riemann sum converges (on BERT, where position
    vectors keep the path smooth; a pre-norm decoder's RMSNorm of near-zero vectors jumps near the baseline, which
    is why the error is reported)."""
    coarse = mc.token_attribution(encoder, TEXT, PAIR, methods=("integrated_gradients",), steps=2)
    fine = mc.token_attribution(encoder, TEXT, PAIR, methods=("integrated_gradients",), steps=128)
    assert abs(fine.completeness_error) < 0.02 * abs(fine.prediction - fine.baseline_prediction)
    assert abs(fine.completeness_error) < abs(coarse.completeness_error)


def test_a_named_target_is_explained(decoder):
    word = next(w for w in (" mat", " cat", " the", " dog") if len(decoder.tokenizer.encode(w)) == 1)
    result = mc.token_attribution(decoder, TEXT, target=word, methods=("occlusion",))
    assert result.target == word
    ids = list(decoder.encode(TEXT).input_ids)
    with torch.no_grad():
        assert result.prediction == pytest.approx(float(decoder_f(decoder, ids, decoder.tokenizer.encode(word)[0])))


def test_faithfulness_curves_and_aopc_by_hand(decoder):
    result = mc.token_attribution(decoder, TEXT, methods=("occlusion", "attention"))
    measured = mc.faithfulness(decoder, TEXT, result, seeds=2)
    encoded = decoder.encode(TEXT)
    ids, special = list(encoded.input_ids), np.asarray(encoded.special_mask)
    target = result.metadata["target_id"]
    ordinary = np.flatnonzero(~special)
    occlusion = result.scores["occlusion"].to_numpy()[ordinary]
    order = ordinary[np.argsort(-occlusion, kind="stable")]
    curves = measured.curves
    for curve in ("deletion", "insertion"):
        mine = curves[(curves["order"] == "occlusion") & (curves["curve"] == curve)].sort_values("k")
        assert mine["k"].tolist() == list(range(len(ordinary) + 1))
        expected = []
        for k in range(len(ordinary) + 1):
            chosen = set(order[:k].tolist())
            keep = [p for p in range(len(ids)) if (p not in chosen) == (curve == "deletion") or special[p]]
            with torch.no_grad():
                expected.append(float(decoder_f(decoder, [ids[p] for p in keep], target)))
        np.testing.assert_allclose(mine["value"], expected, **F_TOL)
        expected = np.array(expected)
        area = np.mean(expected[0] - expected[1:]) if curve == "deletion" else np.mean(expected[1:] - expected[0])
        row = measured.aopc.set_index("method").loc["occlusion", f"{curve}_aopc"]
        assert row == pytest.approx(area, **APPROX)
    # occlusion's order removes the tokens that raised f first: its deletion area beats its insertion's opposite
    random = curves[curves["order"] == "random"]
    assert sorted(random["seed"].unique()) == [0, 1]
    first_random = random[(random["seed"] == 0) & (random["curve"] == "deletion")].sort_values("k")
    assert first_random["value"].iloc[0] == pytest.approx(result.prediction, **APPROX)
    assert measured.aopc["method"].tolist() == ["occlusion", "attention", "random"]
    assert measured.removal == "drop"


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_every_orders_curves_in_padded_batches_equal_one_pass_per_sequence(kind, request):
    """The curves go in a few passes of mixed lengths padded on the right (a decoder read at each row's last token,
    an encoder's padding masked): every point of every method's and every random order's curves equals f of its
    sequence run alone here."""
    model = request.getfixturevalue(kind)
    target = None if kind == "decoder" else PAIR
    result = mc.token_attribution(model, TEXT, target, steps=4)
    measured = mc.faithfulness(model, TEXT, result, seeds=3)
    ids, special = list(model.encode(TEXT).input_ids), np.asarray(model.encode(TEXT).special_mask)
    ordinary = np.flatnonzero(~special)

    def f(kept: list[int]) -> float:
        if kind == "encoder":
            return encoder_f(model, kept, list(model.encode(PAIR).input_ids))
        with torch.no_grad():
            return float(decoder_f(model, kept, result.metadata["target_id"]))

    orders = {(m, 0): ordinary[np.argsort(-np.nan_to_num(result.method_scores(m), nan=-np.inf), kind="stable")]
              for m in result.methods}  # fmt: skip
    orders |= {("random", s): ordinary[np.random.default_rng(s).permutation(len(ordinary))] for s in range(3)}
    alone: dict[tuple, float] = {}
    for (order, seed), positions in orders.items():
        for curve in ("deletion", "insertion"):
            curves = measured.curves
            chosen_rows = (curves["order"] == order) & (curves["seed"] == seed) & (curves["curve"] == curve)
            line = curves[chosen_rows].sort_values("k")
            expected = []
            for k in range(len(ordinary) + 1):
                chosen = set(positions[:k].tolist())
                kept = tuple(
                    ids[p] for p in range(len(ids)) if (p not in chosen) == (curve == "deletion") or special[p]
                )
                if kept not in alone:
                    alone[kept] = f(list(kept))
                expected.append(alone[kept])
            np.testing.assert_allclose(line["value"], expected, **F_TOL)
    assert len({len(kept) for kept in alone}) == len(ordinary) + 1  # every length from the special tokens alone


def test_padded_batches_cover_every_sequence_at_least_cost():
    lengths = [3, 9, 9, 2, 5, 9, 4, 1, 8]
    batches = padded_batches(lengths, budget=20, pass_cost=4)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    assert all(len(b) * max(lengths[i] for i in b) <= 20 or len(b) == 1 for b in batches)

    def cost(plan):
        return sum(4 + len(b) * max(lengths[i] for i in b) for b in plan)

    # every split of the sorted lengths into consecutive batches, by brute force
    ranked = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    splits = []
    for mask in range(2 ** (len(ranked) - 1)):
        cuts = [0] + [j + 1 for j in range(len(ranked) - 1) if mask >> j & 1] + [len(ranked)]
        plan = [ranked[a:b] for a, b in itertools.pairwise(cuts)]
        if all(len(b) * lengths[b[0]] <= 20 or len(b) == 1 for b in plan):
            splits.append(cost(plan))
    assert cost(batches) == min(splits)
    assert padded_batches([], budget=20) == []
    assert padded_batches([30, 2], budget=20, pass_cost=100) == [[0], [1]]  # over budget: one row each


def test_aopc_of_random_orders_is_their_mean():
    import pandas as pd

    rows = []
    for seed, values in ((0, [1.0, 0.5, 0.0]), (1, [1.0, 0.9, 0.0])):
        for k, value in enumerate(values):
            rows.append(("random", seed, "deletion", k, k / 2, value))
            rows.append(("random", seed, "insertion", k, k / 2, 1.0 - value))
    table = aopc_table(pd.DataFrame(rows, columns=["order", "seed", "curve", "k", "fraction", "value"]))
    assert table["deletion_aopc"].iloc[0] == pytest.approx(np.mean([(0.5 + 1.0) / 2, (0.1 + 1.0) / 2]))
    assert table["insertion_aopc"].iloc[0] == pytest.approx(np.mean([(0.5 + 1.0) / 2, (0.1 + 1.0) / 2]))


def test_agreement_is_spearman(decoder):
    result = mc.token_attribution(decoder, TEXT, methods=("occlusion", "rollout", "attention"), steps=4)
    table = method_agreement(result)
    ordinary = result.ordinary
    a = np.abs(result.scores["occlusion"].to_numpy()[ordinary])
    b = result.scores["attention"].to_numpy()[ordinary]
    assert table.loc["occlusion", "attention"] == pytest.approx(scipy.stats.spearmanr(a, b).statistic, abs=1e-12)
    assert np.allclose(np.diag(table), 1.0)
    heads = head_agreement(result, "occlusion")
    assert heads.shape == (decoder.num_layers, decoder.num_heads)
    row = result.head_rows[1, 2, ordinary]
    assert heads[1, 2] == pytest.approx(scipy.stats.spearmanr(row, a).statistic, abs=1e-12)
    assert np.isnan(spearman(np.ones(4), np.arange(4.0)))
    assert method_order(np.array([0.1, np.nan, 0.3, 0.1])).tolist() == [2, 0, 3, 1]


# ---- a sentence encoder ---------------------------------------------------------------------------------
def test_encoder_similarity_and_occlusion_by_hand(encoder):
    result = mc.token_attribution(encoder, TEXT, target=PAIR, methods=("occlusion", "attention", "rollout"))
    assert result.kind == "similarity" and result.target == PAIR
    encoded = encoder.encode(TEXT)
    ids, special = list(encoded.input_ids), np.asarray(encoded.special_mask)
    other = list(encoder.encode(PAIR).input_ids)
    full = encoder_f(encoder, ids, other)
    assert result.prediction == pytest.approx(full, **APPROX)
    by_hand = [full - encoder_f(encoder, ids[:i] + ids[i + 1 :], other) for i in np.flatnonzero(~special)]
    np.testing.assert_allclose(result.scores["occlusion"].to_numpy()[~special], by_hand, **F_TOL)
    run = encoder.run(TEXT)  # mean pooling reads every row: the mean of the rows
    np.testing.assert_allclose(result.scores["attention"], run.attentions[-1].mean(0).mean(0), rtol=1e-5, atol=1e-7)


def test_encoder_gradients_through_the_pooled_similarity(encoder):
    result = mc.token_attribution(encoder, TEXT, target=PAIR, methods=("gradient_x_input",))
    ids = list(encoder.encode(TEXT).input_ids)
    other = list(encoder.encode(PAIR).input_ids)
    with torch.no_grad():
        b = encoder.hf_model(input_ids=torch.tensor([other])).last_hidden_state[0].mean(0).double()
    x = encoder.hf_model.get_input_embeddings()(torch.tensor([ids])).detach()
    point = x.clone().requires_grad_(True)

    def replace(module, inputs, output):
        return point

    handle = encoder.hf_model.get_input_embeddings().register_forward_hook(replace)
    try:
        pooled = encoder.hf_model(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0).double()
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(torch.nn.functional.cosine_similarity(pooled, b, dim=0), point)
    np.testing.assert_allclose(result.scores["gradient_x_input"], (x * grad).sum(-1)[0].numpy(), rtol=1e-3, atol=1e-6)


# ---- errors and the operation ------------------------------------------------------------------------------
def test_clear_errors(decoder, encoder):
    with pytest.raises(AttributionError, match="Unknown attribution method"):
        mc.token_attribution(decoder, TEXT, methods=("saliency",))
    with pytest.raises(AttributionError, match="second sentence"):
        mc.token_attribution(encoder, TEXT)
    with pytest.raises(AttributionError, match="steps"):
        mc.token_attribution(decoder, TEXT, steps=0)
    with pytest.raises(HeadscopeError, match="empty"):
        mc.token_attribution(decoder, "   ")


def test_operation_runs_explain(decoder):
    encoded = decoder.encode(TEXT)
    op = TokenAttributionOp(decoder.name, encoded, methods=("occlusion", "attention"), steps=4, seeds=1)
    assert op.key == TokenAttributionOp(decoder.name, decoder.encode(TEXT), methods=("occlusion", "attention"),
                                        steps=4, seeds=1).key  # fmt: skip
    assert op.peak_bytes(decoder) > 0
    explained = op.run(decoder)
    direct = mc.token_attribution(decoder, TEXT, methods=("occlusion", "attention"))
    np.testing.assert_allclose(explained.attribution.scores["occlusion"], direct.scores["occlusion"], **F_TOL)
    assert list(explained.agreement.index) == ["occlusion", "attention"]
    assert set(explained.faithfulness.aopc["method"]) == {"occlusion", "attention", "random"}


@pytest.mark.slow
def test_smollm2_and_minilm(tmp_path: Path):
    smollm2 = mc.load_model("smollm2")
    text = CIRCUIT_TASKS[0].clean
    result = mc.token_attribution(smollm2, text, steps=32)
    assert abs(result.completeness_error) < 0.1 * abs(result.prediction - result.baseline_prediction) + 0.05
    ids = list(smollm2.encode(text).input_ids)
    with torch.no_grad():
        assert result.prediction == pytest.approx(
            float(decoder_f(smollm2, ids, result.metadata["target_id"])), abs=1e-3
        )
    minilm = mc.load_model("minilm")
    similar = mc.token_attribution(minilm, "A man is playing a guitar.", target="Someone plays an instrument.")
    assert 0 < similar.prediction <= 1


def test_median_interval_takes_the_order_statistics():
    from mha_core.analysis.stats import median_interval

    values = np.arange(100.0)
    median, low, high = median_interval(np.append(values, np.nan))
    assert median == 49.5
    half = 1.959963984540054 * 10 / 2  # 1.96 sqrt(n) / 2 order statistics either side of n/2
    assert (low, high) == (values[int(np.floor(50 - half))], values[int(np.ceil(50 + half)) - 1])
    assert np.isnan(median_interval([np.nan])[0])


def test_attribution_study_rows_are_each_texts_agreement_and_aopc(decoder):
    from mha_core.interventions.attribution_study import attribution_study, study_summary

    items = [(TEXT, None), ("The dog sat on the mat", None)]
    per_text, heads = attribution_study(decoder, items, steps=4, seeds=1)
    assert len(per_text) == 2 * (len(METHODS) + 1) and heads.shape == (2, decoder.num_layers, decoder.num_heads)
    first = mc.token_attribution(decoder, TEXT, steps=4)
    agreement = method_agreement(first)
    rows = per_text[per_text["text"] == 0].set_index("method")
    for method in first.methods:
        assert rows.loc[method, "vs_occlusion"] == pytest.approx(agreement.loc[method, "occlusion"], abs=1e-6)
    aopc = mc.faithfulness(decoder, TEXT, first, seeds=1).aopc.set_index("method")
    assert rows.loc["random", "deletion_aopc"] == pytest.approx(aopc.loc["random", "deletion_aopc"], **APPROX)
    second = mc.token_attribution(decoder, "The dog sat on the mat", steps=4)
    expected = (head_agreement(first, "occlusion") + head_agreement(second, "occlusion")) / 2
    np.testing.assert_allclose(heads[1], expected, atol=1e-9)
    summary = study_summary(per_text).set_index("method")
    assert summary.loc["occlusion", "vs_occlusion"] == pytest.approx(1.0)
    assert summary.loc["attention", "texts"] == 2


def test_attribution_study_adds_one_method_with_the_rows_of_the_whole_study(decoder):
    from mha_core.interventions.attribution_study import attribution_study

    whole, heads = attribution_study(decoder, [(TEXT, None)], steps=4, seeds=1)
    added, added_heads = attribution_study(decoder, [(TEXT, None)], steps=4, seeds=0, methods=("value_zeroing",))
    assert list(added["method"]) == ["value_zeroing"]  # no random orders, no other method's curves
    expected = whole.set_index("method").loc["value_zeroing"]
    for column in ("tokens", "vs_integrated_gradients", "vs_occlusion", "deletion_aopc", "insertion_aopc"):
        assert added[column].iloc[0] == pytest.approx(expected[column], **APPROX), column
    np.testing.assert_allclose(added_heads, heads, atol=1e-9)
