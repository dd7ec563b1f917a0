"""Value zeroing (Mohebbi et al. 2023), checked against a computation written here.

The reference zeros one token's value rows in one layer with a plain torch forward hook on the transformers value
projection (BERT's ``value``, GPT-2's third of ``c_attn``, Llama's ``v_proj``), runs the transformers model, reads
the layer's output with a forward hook on its block, and measures the cosine distances itself: one full pass per
layer and token, never through the library's hook points or its batching.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.interventions.token_attribution import METHOD_LABELS, METHODS, target_rows
from mha_core.interventions.value_zeroing import context_mixing, value_zeroing_rollout
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2, build_tiny_llama

TEXT = "The cat sat on the mat and the dog"
# The library's rows are batched (other kernels, other summation orders) and both sides are float32 passes: a
# cosine distance is exact to ~1e-7, and after the row normalisation (row sums ~0.05 to 1) to ~1e-5.
TOL = dict(rtol=1e-3, atol=2e-5)


def blocks_and_values(hf) -> tuple[list, object]:
    """The transformers blocks of a base model and a function (block, j) -> the hook zeroing j's value rows."""
    config = hf.config

    def zero_rows(j: int, columns: slice = slice(None)):
        def hook(module, args, output):
            output = output.clone()
            output[:, j, columns] = 0
            return output

        return hook

    if config.model_type == "bert":
        return list(hf.encoder.layer), lambda block, j: block.attention.self.value.register_forward_hook(zero_rows(j))
    if config.model_type == "gpt2":
        d = config.n_embd
        return list(hf.h), lambda block, j: block.attn.c_attn.register_forward_hook(zero_rows(j, slice(2 * d, 3 * d)))
    return list(hf.layers), lambda block, j: block.self_attn.v_proj.register_forward_hook(zero_rows(j))


class Stop(Exception):
    """Raised by the hook that read the layer asked for: the layers after it are not run."""


def reference_mixing(model, ids: list[int], layers: list[int] | None = None) -> np.ndarray:
    """C[l, i, j] = 1 - cos(output_l[i], output_l[i] with v_j zeroed in layer l), rows normalised to sum 1, for
    ``layers`` (default all; the others stay 0). Each altered pass stops after the layer it reads."""
    hf = model.hf_model
    blocks, zero_hook = blocks_and_values(hf)
    layers = range(len(blocks)) if layers is None else layers

    def output_of(block, stop: bool = False) -> torch.Tensor:
        kept = []

        def hook(module, args, output):
            kept.append((output[0] if isinstance(output, tuple) else output).detach()[0].double())
            if stop:
                raise Stop

        handle = block.register_forward_hook(hook)
        try:
            with torch.no_grad():
                hf(input_ids=torch.tensor([ids]))
        except Stop:
            pass
        finally:
            handle.remove()
        return kept[0]

    n = len(ids)
    mixing = np.zeros((len(blocks), n, n))
    for layer in layers:
        original = output_of(blocks[layer])
        for j in range(n):
            handle = zero_hook(blocks[layer], j)
            try:
                altered = output_of(blocks[layer], stop=True)
            finally:
                handle.remove()
            cosine = torch.nn.functional.cosine_similarity(original, altered, dim=-1)
            mixing[layer, :, j] = (1 - cosine).clamp_min(0).numpy()
    totals = mixing.sum(axis=-1, keepdims=True)
    return np.divide(mixing, totals, out=np.zeros_like(mixing), where=totals > 0)


def reference_rollout(mixing: np.ndarray) -> np.ndarray:
    rollout = mixing[0]
    for layer in range(1, len(mixing)):
        rollout = mixing[layer] @ rollout
    return rollout


@pytest.fixture(scope="module", params=["bert", "gpt2", "llama"])
def tiny(request, tmp_path_factory):
    build = {"bert": build_tiny_bert, "gpt2": build_tiny_gpt2, "llama": build_tiny_llama}[request.param]
    options = {} if request.param == "bert" else {"head": True}
    return mc.load_model(str(build(tmp_path_factory.mktemp(request.param), randomised=True, **options)))


def test_context_mixing_equals_zeroing_by_hand(tiny):
    ids = list(tiny.encode(TEXT).input_ids)
    expected = reference_mixing(tiny, ids)
    for engine in ("transformers", "core"):
        mixing = context_mixing(tiny, ids, engine=engine, batch=4)  # several batches, the last one short
        assert mixing.shape == (tiny.num_layers, len(ids), len(ids))
        np.testing.assert_allclose(mixing, expected, **TOL)
        np.testing.assert_allclose(mixing.sum(axis=-1), 1.0, atol=1e-12)
    if tiny.is_causal:  # a token never reads a later token's value
        assert np.abs(np.triu(mixing, k=1)).max() < 1e-6
    np.testing.assert_allclose(value_zeroing_rollout(mixing)[-1], reference_rollout(expected), **TOL)


def test_token_attribution_reads_the_rollout_at_the_target(tiny):
    if tiny.is_causal:
        result = mc.token_attribution(tiny, TEXT, methods=("value_zeroing",))
    else:
        result = mc.token_attribution(tiny, TEXT, target="A dog sat on a mat.", methods=("value_zeroing",))
    expected = reference_rollout(reference_mixing(tiny, list(tiny.encode(TEXT).input_ids)))
    expected = target_rows(expected, result.kind)  # decoders: the last row; encoders: the mean of the rows
    np.testing.assert_allclose(result.scores["value_zeroing"].to_numpy(), expected, **TOL)
    assert result.scores["value_zeroing"].sum() == pytest.approx(1.0, abs=1e-9)
    assert "value_zeroing" in METHODS and METHOD_LABELS["value_zeroing"]


def test_planted_token_that_attention_is_forced_onto_gets_the_score(tmp_path):
    """One GPT-2 layer whose queries are a constant and whose keys read one direction that only the token " mat"
    has: every query from " mat" on attends to it alone, so zeroing its value moves those outputs and zeroing
    any other value almost does not."""
    from transformers import GPT2LMHeadModel

    path = build_tiny_gpt2(tmp_path, head=True, randomised=True)
    lm = GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager")
    lm.transformer.h = lm.transformer.h[:1]  # one layer
    lm.config.n_layer = 1
    model = mc.load_model(str(path))
    ids = list(model.encode(TEXT).input_ids)
    planted = ids.index(model.tokenizer.encode(" mat", add_special_tokens=False)[0])
    d = lm.config.n_embd
    with torch.no_grad():
        direction = torch.zeros(d)
        direction[0] = 1.0
        lm.transformer.wte.weight[ids[planted]] = 20 * direction  # ln_1 leaves it about sqrt(d) along e_0
        lm.transformer.wpe.weight.mul_(0.01)
        attn = lm.transformer.h[0].attn.c_attn
        attn.weight[:, : 2 * d] = 0  # no query or key depends on the token...
        attn.bias[: 2 * d] = 0
        attn.bias[:d] = 1.0  # ...but every query is the constant 1,
        attn.weight[0, d : 2 * d] = 10.0  # and a key is large where the token's normalised e_0 is
    lm.save_pretrained(path)
    model = mc.load_model(str(path))
    pattern = model.run(TEXT).attentions[0].mean(axis=0)
    assert pattern[planted + 1 :, planted].min() > 0.99  # the planted attention, checked
    mixing = context_mixing(model, ids)[0]
    later = mixing[planted + 1 :]
    assert later[:, planted].min() > 0.9
    assert (later.argmax(axis=-1) == planted).all()
    scores = mc.token_attribution(model, TEXT, methods=("value_zeroing", "attention")).scores
    assert int(scores["value_zeroing"].to_numpy().argmax()) == planted
    assert scores["value_zeroing"][planted] > 0.9


def test_value_zeroing_in_faithfulness_and_agreement(tiny):
    target = None if tiny.is_causal else "A dog sat on a mat."
    explained = mc.explain(tiny, TEXT, target, methods=("occlusion", "value_zeroing"), steps=4, seeds=1)
    assert "value_zeroing" in set(explained.faithfulness.aopc["method"])
    assert np.isfinite(explained.agreement.loc["value_zeroing", "occlusion"])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_real_models_equal_zeroing_by_hand(name):
    model = mc.load_model(name)
    text = "The cat sat on the mat." if name == "smollm2" else "A man is playing a guitar."
    ids = list(model.encode(text).input_ids)
    mixing = context_mixing(model, ids)
    np.testing.assert_allclose(mixing.sum(axis=-1), 1.0, atol=1e-12)
    layers = [0, 1, model.num_layers // 2, model.num_layers - 1]  # the by-hand loop is one pass per layer and token
    np.testing.assert_allclose(mixing[layers], reference_mixing(model, ids, layers)[layers], **TOL)
