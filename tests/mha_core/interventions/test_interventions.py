"""Causal evidence: LM heads, head ablation in both engines, token losses, head importance, pruning curves.

Small random checkpoints (with their heads) are built here; the embedded models are checked in the slow tests.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.errors import HeadscopeError
from mha_core.interventions import experiments
from mha_core.interventions import importance as interventions_importance
from mha_core.models import ablation as models_ablation
from mha_core.models import outputs
from mha_core.models.forward import ForwardPass
from tests.conftest import ENGINE_ATOL, METRIC_TOL
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2, build_tiny_llama

TEXT = "The cat sat on the mat."


def build_lm(path: Path, kind: str) -> Path:
    """A tiny checkpoint WITH its head: "gpt2" (tied LM head), "llama" (untied LM head), "bert" (MLM head)."""
    builders = {"bert": build_tiny_bert, "gpt2": build_tiny_gpt2, "llama": build_tiny_llama}
    untied = {"tie_word_embeddings": False} if kind == "llama" else {}
    return builders[kind](path, head=True, randomised=True, **untied)


@pytest.fixture(scope="module", params=["gpt2", "llama", "bert"])
def lm(request, tmp_path_factory):
    return mc.load_model(str(build_lm(tmp_path_factory.mktemp(request.param), request.param)))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return mc.load_model(str(build_tiny_bert(tmp_path_factory.mktemp("bert_plain"))))


def test_heads_load_and_base_model_stays(lm, encoder):
    assert lm.has_lm_head and lm.lm_model is not None
    assert lm.lm_head_kind == ("masked" if lm.family == "bert" else "causal")
    assert lm.hf_model is lm.lm_model.base_model  # every other step reads the base model's layers
    assert len(lm.output_projections()) == lm.num_layers
    assert not encoder.has_lm_head and encoder.lm_head_kind is None
    assert "no language-model head" in encoder.head_description


def test_token_losses_equal_transformers_loss(lm):
    ids = lm.encode(TEXT).input_ids
    run = lm.run(TEXT, losses=True)
    with torch.inference_mode():
        if lm.lm_head_kind == "causal":
            # transformers' own loss with labels= is the mean of the per-token losses.
            reference = lm.lm_model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss
            assert run.token_losses.dtype == np.float32 and run.token_losses.shape == (len(ids) - 1,)
            np.testing.assert_allclose(run.token_losses.mean(), float(reference), **METRIC_TOL)
        else:
            # Each non-special token masked in turn; transformers' loss with labels only at that token.
            assert np.isnan(run.token_losses[run.special_mask]).all()
            for i in np.flatnonzero(~run.special_mask):
                masked = list(ids)
                masked[i] = lm.tokenizer.mask_token_id
                labels = torch.full((1, len(ids)), -100)
                labels[0, i] = ids[i]
                reference = lm.lm_model(input_ids=torch.tensor([masked]), labels=labels).loss
                np.testing.assert_allclose(run.token_losses[i], float(reference), **METRIC_TOL)


def _independent_zero_hook(projection, head: int, num_heads: int):
    """A test's own ablation: zero columns [head*d, (head+1)*d) of the output projection's input."""

    def hook(module, args):
        x = args[0].clone()
        d = x.shape[-1] // num_heads
        x[..., head * d : (head + 1) * d] = 0.0
        return (x,)

    return projection.register_forward_pre_hook(hook)


def test_ablation_equals_an_independent_hook_and_engines_agree(lm):
    layer, head = 1, 2
    ids = torch.tensor([lm.encode(TEXT).input_ids])
    ablated = lm.run(TEXT, ablate=[(layer, head)])
    plain = lm.run(TEXT, losses=True)
    # Independent reference: the test's own hook on the module named per family, attention via transformers.
    handle = _independent_zero_hook(lm.output_projections()[layer], head, lm.num_heads)
    try:
        with torch.inference_mode():
            out = lm.lm_model(input_ids=ids, output_attentions=True)
    finally:
        handle.remove()
    reference = torch.stack(out.attentions, dim=1)[0].numpy()
    np.testing.assert_allclose(ablated.attentions, reference, atol=ENGINE_ATOL, rtol=0)
    # The ablated layer's own weights are unchanged; the next layers' differ from the plain run (layer 1 is
    # the last here, so compare losses instead, which read the ablated output).
    np.testing.assert_allclose(ablated.attentions[: layer + 1], plain.attentions[: layer + 1], atol=ENGINE_ATOL)
    finite = np.isfinite(plain.token_losses)
    assert np.abs(ablated.token_losses[finite] - plain.token_losses[finite]).max() > 1e-3
    if lm.lm_head_kind == "causal":
        reference_losses = torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction="none")
        np.testing.assert_allclose(ablated.token_losses, reference_losses.numpy(), atol=ENGINE_ATOL, rtol=0)
    # The from-scratch engine ablates natively and agrees with the hooked transformers engine.
    for ablation in ("zero", "mean"):
        hooked = lm.run(TEXT, ablate=[(0, 1), (layer, head)], ablation=ablation)
        core = lm.run(TEXT, engine="core", ablate=[(0, 1), (layer, head)], ablation=ablation)
        np.testing.assert_allclose(core.attentions, hooked.attentions, atol=ENGINE_ATOL, rtol=0)
        assert core.max_abs_diff < ENGINE_ATOL
        np.testing.assert_allclose(core.token_losses, hooked.token_losses, atol=ENGINE_ATOL, rtol=1e-4)
        assert hooked.metadata["ablated"] == [[0, 1], [layer, head]] and hooked.metadata["ablation"] == ablation


def test_mean_ablation_uses_the_reference_mean(lm):
    reference = ["Where did you put the book?", "A dog chased the cat across the garden."]
    means = models_ablation.head_means(lm, reference)
    assert models_ablation.head_means(lm, reference) is means  # cached per reference set
    # The mean computed here: every token's Concat(heads) of both texts, one at a time, averaged.
    layer, head = 0, 1
    projection = lm.output_projections()[layer]
    seen = []
    handle = projection.register_forward_pre_hook(lambda module, args: seen.append(args[0][0].clone()))
    try:
        with torch.inference_mode():
            for text in reference:
                lm.hf_model(input_ids=torch.tensor([lm.encode(text).input_ids]))
    finally:
        handle.remove()
    expected = torch.cat(seen).mean(0)
    np.testing.assert_allclose(means[layer].numpy(), expected.numpy(), atol=ENGINE_ATOL)
    # Mean ablation = the slice replaced by that mean, by the test's own hook.
    d = expected.shape[0] // lm.num_heads

    def replace(module, args):
        x = args[0].clone()
        x[..., head * d : (head + 1) * d] = expected[head * d : (head + 1) * d]
        return (x,)

    ids = torch.tensor([lm.encode(TEXT).input_ids])
    hooks = models_ablation.ablation_hooks(lm, [(layer, head)], "mean", reference=reference)
    assert list(hooks) == [f"blocks.{layer}.attn.hook_z"]
    ablated = lm.hidden_states(ForwardPass(ids, hooks=hooks))
    handle = projection.register_forward_pre_hook(replace)
    try:
        with torch.inference_mode():
            own = lm.hf_model(input_ids=ids).last_hidden_state
    finally:
        handle.remove()
    np.testing.assert_allclose(ablated.numpy(), own.numpy(), atol=ENGINE_ATOL)
    assert np.abs(ablated.numpy() - lm.hidden_states(ForwardPass(ids)).numpy()).max() > 1e-3


def test_run_batch_ablated_equals_single_runs(lm):
    texts = [TEXT, "A dog chased the cat across the garden."]
    batch = lm.run_batch(texts, ablate=[(0, 3)], ablation="zero")
    for text, run in zip(texts, batch):
        single = lm.run(text, ablate=[(0, 3)])
        np.testing.assert_allclose(run.attentions, single.attentions, atol=ENGINE_ATOL)
        np.testing.assert_allclose(run.token_losses, single.token_losses, atol=ENGINE_ATOL, rtol=1e-4)


def test_losses_on_demand(lm):
    """Plain runs skip the losses (and stop the pass at the last layer's attention); ``losses=True`` or an
    ablation asks for them; ``losses=False`` drops them from an ablated run. Attentions are the same either way."""
    plain, with_losses = lm.run(TEXT), lm.run(TEXT, losses=True)
    assert plain.token_losses is None and with_losses.token_losses is not None
    np.testing.assert_array_equal(plain.attentions, with_losses.attentions)
    assert lm.run(TEXT, ablate=[(0, 1)], losses=False).token_losses is None
    ids = lm.encode(TEXT).input_ids
    np.testing.assert_array_equal(lm.run_ids(ids, losses=True).token_losses, with_losses.token_losses)
    assert lm.run_ids(ids).token_losses is None
    batch = lm.run_batch([TEXT, "A dog chased the cat."], losses=True)
    np.testing.assert_allclose(batch[0].token_losses, with_losses.token_losses, atol=ENGINE_ATOL, rtol=1e-4)
    assert all(run.token_losses is None for run in lm.run_batch([TEXT, "A dog chased the cat."]))


def test_plain_runs_stop_at_the_last_layers_attention(lm):
    """A run that keeps nothing of the model's output ends the pass once every layer's weights are in: the
    model's own forward never returns (its forward hook never fires); a run with losses runs it to the end."""
    finished = []
    handle = lm.hf_model.register_forward_hook(lambda module, args, output: finished.append(output))
    try:
        plain = lm.run(TEXT)
        assert finished == []
        full = lm.run(TEXT, losses=True)
        assert finished
    finally:
        handle.remove()
    np.testing.assert_array_equal(plain.attentions, full.attentions)


def test_runs_with_losses_save_and_load(lm, tmp_path):
    run = lm.run(TEXT, ablate=[(1, 0)])
    loaded = mc.AttentionRun.load(run.save(tmp_path / "run.npz"))
    np.testing.assert_array_equal(loaded.token_losses, run.token_losses)
    assert loaded.metadata["ablated"] == [[1, 0]]


def test_encoder_without_head_reports_output_change(encoder):
    plain = encoder.run(TEXT)
    assert plain.token_losses is None and plain.output_change is None
    run = encoder.run(TEXT, ablate=[(0, 0), (1, 1)])
    assert run.output_change > 0 and run.token_output_change.shape == (run.num_tokens,)
    # Against an independent computation: hidden states with the test's own hooks.
    ids = torch.tensor([encoder.encode(TEXT).input_ids])
    handles = [
        _independent_zero_hook(encoder.output_projections()[0], 0, encoder.num_heads),
        _independent_zero_hook(encoder.output_projections()[1], 1, encoder.num_heads),
    ]
    try:
        with torch.inference_mode():
            ablated = encoder.hf_model(input_ids=ids).last_hidden_state[0]
    finally:
        for handle in handles:
            handle.remove()
    with torch.inference_mode():
        base = encoder.hf_model(input_ids=ids).last_hidden_state[0]
    expected = 1 - torch.nn.functional.cosine_similarity(base.mean(0), ablated.mean(0), dim=0)
    np.testing.assert_allclose(run.output_change, float(expected), **METRIC_TOL)


def test_bad_ablations_are_clear_errors(lm):
    with pytest.raises(HeadscopeError, match="does not exist"):
        lm.run(TEXT, ablate=[(lm.num_layers, 0)])
    with pytest.raises(HeadscopeError, match="Unknown ablation"):
        lm.run(TEXT, ablate=[(0, 0)], ablation="half")
    with pytest.raises(HeadscopeError, match="layer, head"):
        lm.run(TEXT, ablate=["L0H0"])


def test_gradient_importance_equals_finite_differences(tmp_path):
    model = mc.load_model(str(build_lm(tmp_path / "gpt2", "gpt2")))
    texts = [TEXT, "Where did you put the book?"]
    frame = mc.head_importance(model, texts, normalize=False, batch_size=1)  # one text per pass
    batched = mc.head_importance(model, texts, normalize=False, batch_size=2)  # both in one pass: |.| still per text
    assert frame.attrs["method"] == "gradient" and list(frame.columns[:2]) == ["layer", "head"]
    projections = model.output_projections()
    step = 1e-4  # float64 differences: truncation error ~ step^2, rounding ~ 1e-16 / step
    for layer, head in [(0, 0), (1, 2)]:
        # dL/dxi by central differences in float64, summed over texts as |.| per text.
        total = 0.0
        for text in texts:
            ids = torch.tensor([model.encode(text).input_ids])
            values = []
            for xi in (1 + step, 1 - step):

                def scale(module, args, xi=xi, head=head):
                    x = args[0].double().clone()
                    d = x.shape[-1] // model.num_heads
                    x[..., head * d : (head + 1) * d] *= xi
                    return (x.to(args[0].dtype),)

                model.lm_model.double()
                handle = projections[layer].register_forward_pre_hook(scale)
                try:
                    with torch.inference_mode():
                        # The loss in float64 here (transformers' labels= loss upcasts only to float32).
                        logits = model.lm_model(input_ids=ids).logits[0]
                        values.append(float(torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:])))
                finally:
                    handle.remove()
                    model.lm_model.float()
            total += abs(values[0] - values[1]) / (2 * step)
        for table in (frame, batched):
            row = table[(table["layer"] == layer) & (table["head"] == head)].iloc[0]
            np.testing.assert_allclose(row["raw"], total, rtol=1e-3)
    # Normalised per layer: each layer's scores have unit L2 norm over its heads.
    normed = mc.head_importance(model, texts)
    norms = normed.groupby("layer")["importance"].apply(lambda v: float(np.sqrt((v**2).sum())))
    np.testing.assert_allclose(norms.to_numpy(), 1.0, rtol=1e-5)  # float32 sums of squares


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_gradient_importance_takes_the_absolute_value_per_text_in_any_batch(tmp_path, family):
    """A loop over texts written here: each text alone, dL/dxi_h = sum over its positions of (head h's slice of
    the output projection's input) . (its gradient), which is the gate's derivative at xi = 1 without a gate."""
    model = mc.load_model(str(build_lm(tmp_path / family, family)))
    texts = [TEXT, "Where did you put the book?", "No.", "The keys to the cabinet are on the table, said the cat."]
    projections = model.output_projections()
    expected = np.zeros((model.num_layers, model.num_heads))
    for text in texts:
        ids = torch.tensor([model.encode(text).input_ids])
        inputs = {}

        def keep(module, args, layer=None, inputs=inputs):
            args[0].retain_grad()
            inputs[layer] = args[0]

        handles = [p.register_forward_pre_hook(functools.partial(keep, layer=i)) for i, p in enumerate(projections)]
        try:
            with torch.enable_grad():
                logits = model.lm_model(input_ids=ids).logits[0]
                torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:]).backward()
        finally:
            for handle in handles:
                handle.remove()
            model.lm_model.zero_grad(set_to_none=True)
        for layer, x in inputs.items():
            per_head = (x * x.grad).detach().reshape(*x.shape[:-1], model.num_heads, -1).sum(dim=(0, 1, 3))
            expected[layer] += per_head.abs().double().numpy()
    for batch_size in (1, 3, 8):  # one text per pass, a batch that splits the texts, all texts in one pass
        raw = mc.head_importance(model, texts, normalize=False, batch_size=batch_size)
        np.testing.assert_allclose(
            raw["raw"].to_numpy().reshape(model.num_layers, model.num_heads), expected, rtol=2e-4, atol=1e-7
        )


def test_a_head_with_zero_output_weights_has_zero_importance(tmp_path):
    model = mc.load_model(str(build_lm(tmp_path / "llama", "llama")))
    projection = model.output_projections()[1]
    d = projection.in_features // model.num_heads
    with torch.no_grad():
        projection.weight[:, 2 * d : 3 * d] = 0.0
    texts = [TEXT, "The keys to the cabinet are on the table."]
    for method in ("gradient", "ablation"):
        frame = mc.head_importance(model, texts, method=method, normalize=False)
        values = frame.set_index(["layer", "head"])["raw"]
        assert values[(1, 2)] == 0.0
        assert (values.drop((1, 2)).abs() > 0).all()


def test_encoder_importance_falls_back_to_ablation(encoder):
    frame = mc.head_importance(encoder, [TEXT], method="gradient")
    assert frame.attrs["method"] == "ablation" and frame.attrs["loss"] == "output change"
    assert (frame["raw"] > 0).all()


def test_pruning_curve(lm):
    texts = [TEXT, "Where did you put the book?"]
    importance = mc.head_importance(lm, texts)
    curve = mc.pruning_curve(lm, texts, "importance", importance=importance, steps=4)
    assert curve["heads_removed"].tolist() == [0, 2, 4, 6, 8]
    probe = interventions_importance.LossProbe(lm, texts)
    np.testing.assert_allclose(curve["loss"].iloc[0], probe(), **METRIC_TOL)
    order = interventions_importance.pruning_order(importance, "importance")
    np.testing.assert_allclose(
        curve["loss"].iloc[2], probe(models_ablation.ablation_hooks(lm, order[:4])), **METRIC_TOL
    )
    random = mc.pruning_curve(lm, texts, "random", steps=2, seeds=(0, 1))
    assert sorted(set(random["seed"])) == [0, 1] and len(random) == 6
    # All heads removed: the same model whichever order removed them.
    np.testing.assert_allclose(random.groupby("seed")["loss"].last().to_numpy(), curve["loss"].iloc[-1], **METRIC_TOL)


def test_induction_experiment_on_a_tiny_decoder(tmp_path):
    model = mc.load_model(str(build_lm(tmp_path / "gpt2", "gpt2")))
    frame = experiments.induction_experiment(model, top_k=2, random_draws=3, seq_len=10, batch=2)
    assert frame["condition"].tolist() == ["none", "top 2 induction", "2 random", "2 random", "2 random"]
    summary = experiments.summarize_experiment(frame)
    assert summary["draws"].tolist() == [1, 1, 3]
    # The baseline equals the loss computed here from transformers directly.
    from mha_core.analysis.roles import repeated_random_tokens

    ids = torch.as_tensor(
        repeated_random_tokens(
            len(model.tokenizer), 10, 2, 2, 0, model.tokenizer.all_special_ids, model.encoder.bos_token_id
        )
    )
    with torch.inference_mode():
        logits = model.lm_model(input_ids=ids).logits
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    offset = ids.shape[1] - 20
    np.testing.assert_allclose(frame.loss_repeated_half[0], float(losses[:, offset + 9 :].mean()), **METRIC_TOL)


@pytest.mark.slow
def test_smollm2_token_losses_and_engines():
    model = mc.load_model("smollm2")
    assert model.lm_head_kind == "causal"
    text = "The quick brown fox jumps over the lazy dog."
    ids = torch.tensor([model.encode(text).input_ids])
    run = model.run(text, losses=True)
    with torch.inference_mode():
        reference = model.lm_model(input_ids=ids, labels=ids).loss
    np.testing.assert_allclose(run.token_losses.mean(), float(reference), **METRIC_TOL)
    hooked = model.run(text, ablate=[(3, 2), (20, 5)])
    core = model.run(text, engine="core", ablate=[(3, 2), (20, 5)])
    np.testing.assert_allclose(core.attentions, hooked.attentions, atol=ENGINE_ATOL, rtol=0)
    np.testing.assert_allclose(core.token_losses, hooked.token_losses, atol=1e-3, rtol=1e-4)


@pytest.mark.slow
def test_minilm_loads_without_head():
    model = mc.load_model("minilm")
    assert not model.has_lm_head
    run = model.run(TEXT, ablate=[(0, 0)])
    assert run.token_losses is None and 0 < run.output_change < 1


def test_group_ablation_against_random_groups(tmp_path):
    import pandas as pd

    model = mc.load_model(str(build_lm(tmp_path / "gpt2", "gpt2")))
    table = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 0],
            "head": [0, 1, 2, 3, 2],
            "primary_role": ["a", "a", "b", "none", "b"],
            "s": [5, 4, 3, 2, 1],
        }
    )
    groups = experiments.head_groups(table, "primary_role", ["s"], top_k=2)
    assert groups == {"a": [(0, 0), (0, 1)], "b": [(1, 2), (0, 2)], "top 2 s": [(0, 0), (0, 1)]}
    texts = [TEXT, "Where did you put the book?"]
    frame = experiments.group_ablation(model, texts, groups, draws=3)
    probe = interventions_importance.LossProbe(model, texts)
    np.testing.assert_allclose(frame["before"], probe(), **METRIC_TOL)
    np.testing.assert_allclose(
        frame["after"][0], probe(models_ablation.ablation_hooks(model, groups["a"])), **METRIC_TOL
    )
    assert frame["random_sd"].notna().all()
    expected = (frame["after"] - frame["before"]) / (frame["random_mean"] - frame["before"])
    np.testing.assert_allclose(frame["excess"], expected)


def test_cli_ablate_and_importance_write_the_library_tables(tmp_path):
    import pandas as pd

    from mha_core.__main__ import main

    path = str(build_lm(tmp_path / "gpt2", "gpt2"))
    model = mc.load_model(path)
    out = tmp_path / "ablate.csv"
    assert main(["ablate", "--model", path, "--text", TEXT, "--heads", "0.1, L1H2", "--out", str(out)]) == 0
    written = pd.read_csv(out)
    with pytest.raises(HeadscopeError, match="losses=True"):
        outputs.loss_table(model.run(TEXT), model.run(TEXT, ablate=[(0, 1), (1, 2)]))
    expected = outputs.loss_table(model.run(TEXT, losses=True), model.run(TEXT, ablate=[(0, 1), (1, 2)]))
    np.testing.assert_allclose(written["loss_before"], expected["loss_before"], rtol=1e-5)
    np.testing.assert_allclose(written["loss_after"], expected["loss_after"], rtol=1e-5)
    assert written["token"].tolist() == expected["token"].tolist()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"{TEXT}\nWhere did you put the book?\n")
    out = tmp_path / "importance.csv"
    assert main(["importance", "--model", path, "--corpus", str(corpus), "--out", str(out)]) == 0
    reference = mc.head_importance(model, [TEXT, "Where did you put the book?"])
    np.testing.assert_allclose(pd.read_csv(out)["importance"], reference["importance"], rtol=1e-5)
    assert main(["ablate", "--model", path, "--text", TEXT, "--heads", "9.9", "--out", str(out)]) == 2
    assert main(["ablate", "--model", path, "--heads", "0.1", "--out", str(out)]) == 2
