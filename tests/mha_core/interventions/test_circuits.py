"""Circuits: direct logit attribution, activation and attribution patching, the logit lens.

Each quantity is checked against an independent computation written here: the model's own logits, hooks on the
transformers modules, the head's slice of the output projection taken by hand. Small random GPT-2 and Llama
checkpoints (with their LM heads) cover both decoder families; SmolLM2's real weights are checked in the slow tests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.edits import replace_heads_per_row, replace_positions
from mha_core.interventions.patching import PatchRun
from mha_core.interventions.readout import CircuitError, lm_pass
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2, build_tiny_llama

CLEAN = "The cat sat on the mat."
CORRUPTED = "The dog sat on the mat."
# Logits are float32 sums over d products; the attribution splits them into ~100 float64 terms of float32
# inputs, so the sum and the model's own logit agree to float32 rounding of the logit's terms (measured
# differences: 1e-6 on SmolLM2's 5.3); a wrong term (a head's slice off by one, the norm's scale unfrozen) is
# off by 1e-2 or more.
LOGIT_TOL = dict(rtol=1e-5, atol=1e-4)
# Normalised patching scores: a ratio of float32 logit differences (batch rows against single runs).
SCORE_TOL = dict(rtol=1e-4, atol=1e-4)


def build_decoder(path: Path, kind: str) -> Path:
    builders = {"gpt2": build_tiny_gpt2, "llama": build_tiny_llama}
    untied = {"tie_word_embeddings": False} if kind == "llama" else {}
    return builders[kind](path, head=True, randomised=True, **untied)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def decoder(request, tmp_path_factory):
    return mc.load_model(str(build_decoder(tmp_path_factory.mktemp(request.param), request.param)))


def one_token_words(model, count: int = 2) -> list[str]:
    """Words of ``CLEAN``/``CORRUPTED`` that are one token each for this tokenizer (answer and foil)."""
    words = [w for w in (" cat", " dog", " mat", " sat", " the", " on") if len(model.tokenizer.encode(w)) == 1]
    assert len(words) >= count, words
    return words[:count]


def pair(model) -> tuple[str, str]:
    """A clean and corrupted prompt of the same token count (a different first word)."""
    clean, corrupted = CLEAN, CORRUPTED
    assert len(model.encode(clean).input_ids) == len(model.encode(corrupted).input_ids)
    return clean, corrupted


def patched_score(model, clean, corrupted, answer, foil, heads=(), mlps=()) -> float:
    """The normalised score of patching several components together (heads ``[(layer, head), ...]`` and the MLPs
    of the layers ``mlps``), with the library's hook functions on the named points."""
    run = PatchRun(model, clean, corrupted, answer, foil, metric=None)
    hooks = {}
    for layer in {layer for layer, _ in heads}:
        chosen = torch.zeros(1, model.num_heads, dtype=torch.bool)
        chosen[0, [head for other, head in heads if other == layer]] = True
        hooks[run.names["z"][layer]] = replace_heads_per_row(chosen, run.clean["z"][layer][0])
    for layer in mlps:
        hooks[run.names["mlp"][layer]] = replace_positions(run.clean["mlp"][layer][0])
    logits, _ = lm_pass(model, run.corrupted_ids, hooks=hooks)
    return float(run.normalised([float(run.metric(logits)[0])])[0])


def model_logits(model, text: str) -> torch.Tensor:
    ids = torch.tensor([model.encode(text).input_ids])
    with torch.inference_mode():
        return model.lm_model(input_ids=ids).logits[0].float()


# ---- logit attribution ----------------------------------------------------------------------------
def test_attribution_rows_sum_to_the_logit_difference(decoder):
    answer, foil = one_token_words(decoder)
    table = mc.logit_attribution(decoder, CLEAN, answer, foil)
    logits = model_logits(decoder, CLEAN)[-1]
    a, f = (decoder.tokenizer.encode(w)[0] for w in (answer, foil))
    np.testing.assert_allclose(table.attrs["logit_difference"], float(logits[a] - logits[f]), **LOGIT_TOL)
    np.testing.assert_allclose(table["contribution"].sum(), float(logits[a] - logits[f]), **LOGIT_TOL)
    heads = table[table["component"] == "head"]
    assert len(heads) == decoder.num_layers * decoder.num_heads
    assert (table["component"] == "mlp").sum() == decoder.num_layers
    assert table["component"].iloc[0] == "embed"
    # GPT-2 has biases (c_proj, ln_f); Llama none.
    assert ("attn_bias" in set(table["component"])) == (decoder.family == "gpt2")
    assert ("norm_bias" in set(table["component"])) == (decoder.family == "gpt2")
    # Without a foil: the answer's logit itself; at an earlier position: that position's logits.
    alone = mc.logit_attribution(decoder, CLEAN, a, position=2)
    np.testing.assert_allclose(alone["contribution"].sum(), float(model_logits(decoder, CLEAN)[2, a]), **LOGIT_TOL)


def test_a_heads_attribution_equals_its_slice_by_hand(tmp_path):
    """GPT-2: head h's term is z_h W_O[h rows] through ln_f with the run's scale, dotted with W_U[a] - W_U[f]."""
    model = mc.load_model(str(build_decoder(tmp_path / "gpt2", "gpt2")))
    answer, foil = one_token_words(model)
    table = mc.logit_attribution(model, CLEAN, answer, foil)
    ids = torch.tensor([model.encode(CLEAN).input_ids])
    base = model.lm_model.transformer
    z_by_layer, final = {}, {}

    def keep_concat(layer):
        return lambda module, args: z_by_layer.__setitem__(layer, args[0][0, -1].detach())

    handles = [block.attn.c_proj.register_forward_pre_hook(keep_concat(i)) for i, block in enumerate(base.h)]
    handles.append(base.ln_f.register_forward_pre_hook(lambda module, args: final.__setitem__("x", args[0][0, -1])))
    try:
        with torch.inference_mode():
            model.lm_model(input_ids=ids)
    finally:
        for handle in handles:
            handle.remove()
    x = final["x"].detach().double()
    scale = torch.sqrt(x.var(unbiased=False) + base.ln_f.eps)
    unembed = model.lm_model.lm_head.weight.detach().double()
    a, f = (model.tokenizer.encode(w)[0] for w in (answer, foil))
    d_head = model.hf_model.config.n_embd // model.num_heads
    for layer, head in [(0, 0), (1, 3), (model.num_layers - 1, model.num_heads - 1)]:
        z_h = z_by_layer[layer][head * d_head : (head + 1) * d_head].double()
        written = z_h @ base.h[layer].attn.c_proj.weight.detach().double()[head * d_head : (head + 1) * d_head]
        normed = base.ln_f.weight.detach().double() * (written - written.mean()) / scale
        expected = float(normed @ (unembed[a] - unembed[f]))
        row = table[(table["component"] == "head") & (table["layer"] == layer) & (table["head"] == head)]
        np.testing.assert_allclose(row["contribution"].item(), expected, rtol=1e-4, atol=1e-6)


# ---- patching -------------------------------------------------------------------------------------
def test_patching_nothing_is_0_and_every_head_and_mlp_is_1(decoder):
    clean, corrupted = pair(decoder)
    answer, foil = one_token_words(decoder)
    assert patched_score(decoder, clean, corrupted, answer, foil) == pytest.approx(0.0, abs=1e-6)
    every_head = [(layer, head) for layer in range(decoder.num_layers) for head in range(decoder.num_heads)]
    # The last token is the same in both prompts, so with every head and MLP patched the last position's
    # residual stream is the clean one: the embeddings there are equal.
    whole = patched_score(decoder, clean, corrupted, answer, foil, heads=every_head, mlps=range(decoder.num_layers))
    assert whole == pytest.approx(1.0, abs=1e-4)
    # The residual stream after the last layer at the last position: exactly the clean prediction.
    positions = mc.patch(decoder, clean, corrupted, answer, foil, over="positions")
    last = positions[(positions["layer"] == decoder.num_layers - 1)]
    assert last["score"].iloc[-1] == pytest.approx(1.0, abs=1e-4)
    assert last["token"].tolist() == decoder.display.display(
        decoder.tokenizer.convert_ids_to_tokens(decoder.encode(corrupted).input_ids)
    )


def test_exact_patching_equals_a_hook_written_here(decoder):
    clean, corrupted = pair(decoder)
    answer, foil = one_token_words(decoder)
    a, f = (decoder.tokenizer.encode(w)[0] for w in (answer, foil))
    table = mc.patch(decoder, clean, corrupted, answer, foil, batch_size=5)
    projections = decoder.output_projections()
    d_head = projections[0].in_features if hasattr(projections[0], "in_features") else projections[0].weight.shape[0]
    d_head //= decoder.num_heads
    clean_ids = torch.tensor([decoder.encode(clean).input_ids])
    corrupted_ids = torch.tensor([decoder.encode(corrupted).input_ids])
    kept = {}

    def logit_difference(ids, hooks):
        handles = [module.register_forward_pre_hook(hook) for module, hook in hooks]
        try:
            with torch.inference_mode():
                logits = decoder.lm_model(input_ids=ids).logits[0, -1].float()
        finally:
            for handle in handles:
                handle.remove()
        return float(logits[a] - logits[f])

    def keep(layer):
        return lambda module, args: kept.__setitem__(layer, args[0].detach().clone())

    clean_value = logit_difference(clean_ids, [(p, keep(i)) for i, p in enumerate(projections)])
    corrupted_value = logit_difference(corrupted_ids, [])
    assert table.attrs["clean_metric"] == pytest.approx(clean_value, rel=1e-5, abs=1e-5)
    assert table.attrs["corrupted_metric"] == pytest.approx(corrupted_value, rel=1e-5, abs=1e-5)
    for layer, head in [(0, 1), (1, 0), (decoder.num_layers - 1, 2)]:
        cols = slice(head * d_head, (head + 1) * d_head)

        def swap(module, args, layer=layer, cols=cols):
            concat = args[0].clone()
            concat[..., cols] = kept[layer][..., cols]
            return (concat,)

        patched = logit_difference(corrupted_ids, [(projections[layer], swap)])
        expected = (patched - corrupted_value) / (clean_value - corrupted_value)
        score = table[(table["layer"] == layer) & (table["head"] == head)]["score"].item()
        np.testing.assert_allclose(score, expected, **SCORE_TOL)
    # Batches of any size give the same scores as one component per pass.
    single = mc.patch(decoder, clean, corrupted, answer, foil, batch_size=1)
    np.testing.assert_allclose(single["score"], table["score"], **SCORE_TOL)
    # Layers: a layer's attention is all its heads; patching its MLP equals a forward hook written here.
    layers = mc.patch(decoder, clean, corrupted, answer, foil, over="layers")
    assert layers["component"].tolist()[:2] == ["attn", "mlp"]
    all_heads = patched_score(decoder, clean, corrupted, answer, foil, heads=[(0, h) for h in range(decoder.num_heads)])
    np.testing.assert_allclose(layers["score"].iloc[0], all_heads, **SCORE_TOL)


def test_attribution_patching_equals_exact_where_the_metric_is_linear(tmp_path):
    """With the last layer's MLP writing nothing and ln_f's epsilon so large that its scale barely moves (its
    weight scaled up as much, so the logits keep their size), the logit difference is linear in the last layer's
    head outputs to about 1e-6: the estimate is the exact score."""
    model = mc.load_model(str(build_decoder(tmp_path / "gpt2", "gpt2")))
    base = model.hf_model
    with torch.no_grad():
        base.h[-1].mlp.c_proj.weight.zero_()
        base.h[-1].mlp.c_proj.bias.zero_()
        base.ln_f.weight.mul_(1000.0)
    base.ln_f.eps = 1e6
    answer, foil = one_token_words(model)
    table = mc.patch(model, CLEAN, CORRUPTED, answer, foil, method="attribution", exact_top=1000)
    last = table[table["layer"] == model.num_layers - 1]
    assert last["exact"].notna().all()
    np.testing.assert_allclose(last["score"], last["exact"], rtol=1e-3, atol=1e-4)
    # Elsewhere the model is not linear: the estimate is only an estimate there.
    first = table[table["layer"] == 0]
    assert np.abs(first["score"] - first["exact"]).max() > 1e-3


def test_attribution_patching_has_the_exact_scores_of_its_top_heads(decoder):
    clean, corrupted = pair(decoder)
    answer, foil = one_token_words(decoder)
    estimate = mc.patch(decoder, clean, corrupted, answer, foil, method="attribution", exact_top=3)
    exact = mc.patch(decoder, clean, corrupted, answer, foil)
    assert estimate["exact"].notna().sum() == 3
    top = estimate["score"].abs().nlargest(3).index
    np.testing.assert_allclose(estimate.loc[top, "exact"], exact.loc[top, "score"], **SCORE_TOL)
    for over in ("layers", "positions"):
        rows = mc.patch(decoder, clean, corrupted, answer, foil, over=over, method="attribution", exact_top=2)
        assert rows["exact"].notna().sum() == 2 and np.isfinite(rows["score"]).all()


# ---- the logit lens -------------------------------------------------------------------------------
def test_logit_lens_last_layer_is_the_models_prediction(decoder):
    lens = mc.logit_lens(decoder, CLEAN, k=3)
    logits = model_logits(decoder, CLEAN)
    n = logits.shape[0]
    assert len(lens) == decoder.num_layers * n * 3
    last = lens[(lens["layer"] == decoder.num_layers - 1) & (lens["rank"] == 0)]
    assert last["token_id"].tolist() == logits.argmax(-1).tolist()
    np.testing.assert_allclose(last["logit"], logits.max(-1).values.numpy(), rtol=1e-5, atol=1e-4)
    top3 = lens[(lens["layer"] == decoder.num_layers - 1) & (lens["position"] == n - 1)]
    assert top3["token_id"].tolist() == torch.topk(logits[-1], 3).indices.tolist()
    assert (np.diff(top3["logit"]) <= 0).all()
    # An earlier layer reads its own block's output through the final norm and the unembedding.
    kept = {}
    stack = mc.families.FAMILY_OF_MODEL_TYPE[decoder.model_type].modules(decoder.hf_model).stacks["blocks"]
    block = stack.layers[0].block
    handle = block.register_forward_hook(
        lambda m, a, out: kept.__setitem__("x", out[0] if isinstance(out, tuple) else out)
    )
    try:
        model_logits(decoder, CLEAN)
    finally:
        handle.remove()
    final_norm = stack.final_norm
    with torch.inference_mode():
        first = decoder.lm_model.get_output_embeddings()(final_norm(kept["x"]))[0]
    layer0 = lens[(lens["layer"] == 0) & (lens["rank"] == 0)]
    assert layer0["token_id"].tolist() == first.argmax(-1).tolist()


# ---- bad input ------------------------------------------------------------------------------------
def test_bad_requests_are_clear_errors(decoder, tmp_path):
    answer, foil = one_token_words(decoder)
    with pytest.raises(CircuitError, match="not one"):
        mc.logit_attribution(decoder, CLEAN, " cat dog mat", foil)
    with pytest.raises(CircuitError, match="same number of tokens"):
        mc.patch(decoder, CLEAN, "The cat sat on the mat and the dog.", answer, foil)
    with pytest.raises(CircuitError, match="same tokens"):
        mc.patch(decoder, CLEAN, CLEAN, answer, foil)
    with pytest.raises(CircuitError, match="same token"):
        mc.patch(decoder, CLEAN, CORRUPTED, answer, answer)
    with pytest.raises(CircuitError, match="Patch over"):
        mc.patch(decoder, CLEAN, CORRUPTED, answer, foil, over="neurons")
    with pytest.raises(mc.errors.EmptyTextError):
        mc.logit_lens(decoder, "   ")
    with pytest.raises(CircuitError, match="at most"):
        mc.logit_attribution(decoder, "word " * 500, answer)
    with pytest.raises(CircuitError, match="outside"):
        mc.logit_attribution(decoder, CLEAN, 10**9)
    encoder = mc.load_model(str(build_tiny_bert(tmp_path / "bert", head=True)))
    with pytest.raises(CircuitError, match="next-token"):
        mc.logit_lens(encoder, CLEAN)


# ---- SmolLM2, real weights -------------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_attribution_identity_and_lens(smollm2):
    from mha_core.interventions.prompts import CIRCUIT_TASKS

    task = CIRCUIT_TASKS[0]
    table = mc.logit_attribution(smollm2, task.clean, task.answer, task.foil)
    logits = model_logits(smollm2, task.clean)[-1]
    a, f = (smollm2.tokenizer.encode(w)[0] for w in (task.answer, task.foil))
    np.testing.assert_allclose(table["contribution"].sum(), float(logits[a] - logits[f]), **LOGIT_TOL)
    assert table.attrs["logit_difference"] > 1  # the shipped task is one SmolLM2 gets right
    lens = mc.logit_lens(smollm2, task.clean, k=1)
    last = lens[lens["layer"] == smollm2.num_layers - 1]
    assert last["token_id"].tolist() == model_logits(smollm2, task.clean).argmax(-1).tolist()
    # Tokens are shown as the head view shows them: white space as symbols, never an empty cell or an escape.
    assert lens["shown"].str.strip().str.len().gt(0).all() and not lens["shown"].str.contains(r"\\x").any()
    blank = lens[lens["token"].str.strip() == ""]
    assert len(blank) > 0  # SmolLM2's early layers predict white space here (a no-break space among them)
    assert all(set(shown) <= {"␣", "⍽", "⏎", "⇥", "␍"} for shown in blank["shown"])


@pytest.mark.slow
def test_smollm2_patching_every_head_and_mlp_recovers_the_clean_run(smollm2):
    from mha_core.interventions.prompts import CIRCUIT_TASKS

    task = CIRCUIT_TASKS[0]
    every = [(layer, head) for layer in range(smollm2.num_layers) for head in range(smollm2.num_heads)]
    args = (smollm2, task.clean, task.corrupted, task.answer, task.foil)
    assert patched_score(*args) == pytest.approx(0.0, abs=1e-6)
    assert patched_score(*args, heads=every, mlps=range(smollm2.num_layers)) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.slow
def test_shipped_tasks_are_ones_smollm2_gets_right_with_the_recorded_differences(smollm2):
    from mha_core.interventions.prompts import CIRCUIT_TASKS, SMOLLM2_FAILURES

    assert len(CIRCUIT_TASKS) >= 3
    for task in CIRCUIT_TASKS:
        a, f = (smollm2.tokenizer.encode(w)[0] for w in (task.answer, task.foil))
        clean, corrupted = model_logits(smollm2, task.clean)[-1], model_logits(smollm2, task.corrupted)[-1]
        np.testing.assert_allclose(float(clean[a] - clean[f]), task.clean_difference, atol=1e-3)
        np.testing.assert_allclose(float(corrupted[a] - corrupted[f]), task.corrupted_difference, atol=1e-3)
        assert task.clean_difference > 0 > task.corrupted_difference
    for text, answer, foil, difference, _ in SMOLLM2_FAILURES:
        logits = model_logits(smollm2, text)[-1]
        a, f = (smollm2.tokenizer.encode(w)[0] for w in (answer, foil))
        np.testing.assert_allclose(float(logits[a] - logits[f]), difference, atol=1e-3)
        assert difference < 0


# ---- the command line ------------------------------------------------------------------------------
def test_cli_attribute_and_patch_write_the_library_tables(tmp_path, capsys):
    import pandas as pd

    from mha_core.__main__ import main

    path = str(build_decoder(tmp_path / "gpt2", "gpt2"))
    model = mc.load_model(path)
    answer, foil = one_token_words(model)
    out = tmp_path / "attribution.csv"
    assert (
        main(["attribute", "--model", path, "--text", CLEAN, "--answer", answer, "--foil", foil, "--out", str(out)])
        == 0
    )
    written = pd.read_csv(out)
    expected = mc.logit_attribution(model, CLEAN, answer, foil)
    assert written["component"].tolist() == expected["component"].tolist()
    np.testing.assert_allclose(written["contribution"], expected["contribution"], rtol=1e-5, atol=1e-6)
    captured = capsys.readouterr()
    assert f"{expected.attrs['logit_difference']:.4f}" in captured.out
    out = tmp_path / "patch.csv"
    args = ["--model", path, "--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", answer, "--foil", foil]
    assert main(["patch", *args, "--out", str(out)]) == 0
    expected = mc.patch(model, CLEAN, CORRUPTED, answer, foil)
    np.testing.assert_allclose(pd.read_csv(out)["score"], expected["score"], rtol=1e-5, atol=1e-6)
    assert "[" in capsys.readouterr().err  # progress on stderr
    assert main(["patch", *args, "--method", "attribution", "--top", "2", "--over", "layers", "--out", str(out)]) == 0
    written = pd.read_csv(out)
    assert written["component"].tolist()[:2] == ["attn", "mlp"] and written["exact"].notna().sum() == 2
    # Mistakes are one line and exit status 2, before the model loads where they can be.
    capsys.readouterr()
    bad = [
        ["attribute", "--model", path, "--text", CLEAN, "--answer", " cat dog mat", "--out", str(out)],
        ["attribute", "--model", path, "--answer", answer, "--out", str(out)],
        ["patch", *args[:-2], "--out", str(out)],
        [
            "patch",
            "--model",
            path,
            "--clean",
            CLEAN,
            "--corrupted",
            "The cat sat.",
            "--answer",
            answer,
            "--foil",
            foil,
            "--out",
            str(out),
        ],
        ["patch", *args, "--out", str(tmp_path / "table.txt")],
    ]
    for argv in bad:
        assert main(argv) == 2, argv
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and "Traceback" not in lines[0], argv


def test_cli_task_fills_what_the_arguments_leave_out(tmp_path):
    import pandas as pd

    from mha_core.__main__ import main
    from mha_core.interventions.prompts import TASKS_BY_NAME

    path = str(build_decoder(tmp_path / "gpt2", "gpt2"))
    model = mc.load_model(path)
    answer, foil = one_token_words(model)
    out = tmp_path / "attribution.csv"
    argv = ["attribute", "--model", path, "--task", "capital", "--answer", answer, "--foil", foil, "--out", str(out)]
    assert main(argv) == 0
    expected = mc.logit_attribution(model, TASKS_BY_NAME["capital"].clean, answer, foil)
    np.testing.assert_allclose(pd.read_csv(out)["contribution"], expected["contribution"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("over", ["heads", "layers", "positions"])
def test_patching_in_the_from_scratch_engine_equals_transformers(decoder, over):
    """The same hook functions on the same named points: exact and attribution patching over heads, layers and
    positions give the same scores in both engines."""
    clean, corrupted = pair(decoder)
    answer, foil = one_token_words(decoder)
    for method in ("exact", "attribution"):
        settings = dict(over=over, method=method, exact_top=3)
        core = mc.patch(decoder, clean, corrupted, answer, foil, engine="core", **settings)
        hooked = mc.patch(decoder, clean, corrupted, answer, foil, **settings)
        assert core.attrs["engine"] == "core"
        np.testing.assert_allclose(core.attrs["clean_metric"], hooked.attrs["clean_metric"], rtol=1e-4, atol=1e-4)
        # Two engines' float32 sums in another order, through every layer: ENGINE_ATOL-sized logit differences.
        np.testing.assert_allclose(core["score"], hooked["score"], rtol=1e-3, atol=1e-3)
        if method == "attribution":
            np.testing.assert_allclose(core["exact"], hooked["exact"], rtol=1e-3, atol=1e-3)
    assert np.abs(hooked["score"]).max() > 0.05  # the patching moved something
    with pytest.raises(CircuitError, match="Unknown engine"):
        mc.patch(decoder, clean, corrupted, answer, foil, engine="jax")


def test_attribution_and_the_lens_in_the_from_scratch_engine_equal_transformers(decoder):
    answer, foil = one_token_words(decoder)
    core = mc.logit_attribution(decoder, CLEAN, answer, foil, engine="core")
    hooked = mc.logit_attribution(decoder, CLEAN, answer, foil)
    np.testing.assert_allclose(core["contribution"], hooked["contribution"], rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(core["contribution"].sum(), core.attrs["logit_difference"], **LOGIT_TOL)
    lens_core, lens = mc.logit_lens(decoder, CLEAN, k=3, engine="core"), mc.logit_lens(decoder, CLEAN, k=3)
    assert lens_core["token_id"].tolist() == lens["token_id"].tolist()
    np.testing.assert_allclose(lens_core["logit"], lens["logit"], rtol=1e-3, atol=1e-3)
