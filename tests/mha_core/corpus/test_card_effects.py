"""A card's measured effects: read from planted tables with known numbers (each kind, "not measured" when absent),
and from a real ablation on a tiny GPT-2 checked against the loss computed here with the head's slice of the output
projection's input zeroed by a hook on the transformers module."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

import mha_core as mc
from mha_core.corpus.card_effects import CardEffectsError, head_effects
from tests.model_fixtures import CORPUS, build_tiny_gpt2


def planted_importance(method: str) -> pd.DataFrame:
    table = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1]})
    table["raw"] = [0.5, -1.5, 3.0, 0.25]
    table["importance"] = [0.1, 0.2, 0.3, 0.4]
    table.attrs.update(method=method, texts=5, loss="next-token loss", normalized=True)
    return table


def planted_patching(method: str = "exact") -> pd.DataFrame:
    table = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "score": [0.05, 0.6, -0.2, 0.01]})
    if method == "attribution":
        table["exact"] = [np.nan, 0.55, np.nan, np.nan]
    table.attrs.update(over="heads", method=method, answer=" Mary", foil=" John")
    return table


def test_planted_tables_give_their_numbers():
    measured = {"corpus": planted_importance("ablation"), "ioi": planted_patching()}
    effects = head_effects(1, 0, measured)
    assert [(e.kind, e.task) for e in effects] == [("ablation", "corpus"), ("patching", "ioi")]
    assert effects[0].value == pytest.approx(3.0 / 5)  # raw is summed over the texts: the mean per text
    assert "mean over 5 texts" in effects[0].measure and "next-token loss" in effects[0].measure
    assert effects[1].value == pytest.approx(-0.2)
    assert "' Mary' against ' John'" in effects[1].measure and "exact" in effects[1].measure
    gradient = head_effects(0, 1, {"corpus": planted_importance("gradient")})
    assert gradient[0].kind == "importance" and gradient[0].value == pytest.approx(0.2)


def test_attribution_patching_uses_the_exact_score_where_it_has_one():
    table = planted_patching("attribution")
    exact, estimate = head_effects(0, 1, {"t": table})[0], head_effects(1, 0, {"t": table})[0]
    assert exact.value == pytest.approx(0.55) and "exact" in exact.measure
    assert estimate.value == pytest.approx(-0.2) and "attribution estimate" in estimate.measure


def test_path_patching_reads_the_senders_and_skips_those_that_cannot_reach():
    table = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "metric": [1.0, np.nan], "score": [-0.3, np.nan]})
    table.attrs.update(via="q", receivers=[(1, 1)], answer=" Mary", foil=" John")
    (effect,) = head_effects(0, 0, {"ioi": table})
    assert effect.kind == "path patching" and effect.value == pytest.approx(-0.3)
    assert "1-1" in effect.measure and "q" in effect.measure
    assert head_effects(1, 0, {"ioi": table}) == ()


def test_nothing_measured_gives_no_number():
    assert head_effects(0, 0, {}) == ()
    other = planted_patching().iloc[1:]  # a table without head 0-0
    assert head_effects(0, 0, {"ioi": other}) == ()


def test_a_table_of_another_kind_is_refused():
    with pytest.raises(CardEffectsError, match="not a head importance"):
        head_effects(0, 0, {"x": pd.DataFrame({"layer": [0], "head": [0], "weight": [1.0]})})
    with pytest.raises(CardEffectsError, match="per-head table"):
        head_effects(0, 0, {"x": pd.DataFrame({"a": [1]})})


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    """(the loaded model, the same checkpoint loaded by transformers alone with its LM head)."""
    from transformers import GPT2LMHeadModel

    path = build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), head=True, randomised=True)
    return mc.load_model(str(path)), GPT2LMHeadModel.from_pretrained(path, attn_implementation="eager").eval()


def loss_with_head_zeroed(model, hf, text: str, layer: int | None, head: int) -> float:
    """The text's mean next-token loss from the transformers model ``hf`` itself, head ``layer``-``head``'s slice of
    its output projection's input set to 0 (None: no head)."""
    blocks = hf.transformer.h
    width = hf.config.n_embd // hf.config.n_head

    def zero(_module, inputs):
        x = inputs[0].clone()
        x[..., head * width : (head + 1) * width] = 0
        return (x,)

    handle = None if layer is None else blocks[layer].attn.c_proj.register_forward_pre_hook(zero)
    try:
        ids = torch.tensor([model.encode(text).input_ids])
        with torch.no_grad():
            logits = hf(input_ids=ids).logits[0].float()
        return float(F.cross_entropy(logits[:-1], ids[0, 1:]))
    finally:
        if handle is not None:
            handle.remove()


def test_a_real_ablation_equals_an_independent_computation(gpt2):
    model, hf = gpt2
    texts = CORPUS[:4]
    table = mc.head_importance(model, texts, method="ablation")
    for layer, head in [(0, 1), (1, 3)]:
        (effect,) = head_effects(layer, head, {"tiny": table})
        base = np.mean([loss_with_head_zeroed(model, hf, text, None, 0) for text in texts])
        zeroed = np.mean([loss_with_head_zeroed(model, hf, text, layer, head) for text in texts])
        assert effect.kind == "ablation"
        assert effect.value == pytest.approx(zeroed - base, rel=1e-3, abs=1e-5)
        assert abs(effect.value) > 1e-4  # a randomised head changes the loss: the check compares real numbers
