"""The figures of "What does the prediction depend on?" (ui/figures/attribution.py), decoded from their JSON as the
browser receives them, and Explore's section driven by AppTest on a tiny decoder."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest

from mha_core.interventions.faithfulness import mean_curves
from tests.page_helpers import decode
from ui.figures.attribution import agreement_matrix, removal_curves, row_scaled, token_scores


def sent(fig) -> dict:
    """The figure as the browser gets it."""
    return json.loads(pio.to_json(fig))


def test_token_scores_scale_each_row_to_its_largest_magnitude():
    tokens = ["The", " cat", "<b>"]
    rows = {"Occlusion": np.array([0.5, -2.0, 1.0]), "Attention": np.array([0.1, 0.2, 0.7])}
    data = sent(token_scores(tokens, rows))["data"][0]
    z = np.array(decode(data["z"]), dtype=float)
    np.testing.assert_allclose(z[0], [0.25, -1.0, 0.5])
    np.testing.assert_allclose(z[1], [0.1 / 0.7, 0.2 / 0.7, 1.0])
    np.testing.assert_allclose(np.array(decode(data["customdata"]), dtype=float), [[0.5, -2.0, 1.0], [0.1, 0.2, 0.7]])
    assert data["zmin"] == -1 and data["zmax"] == 1
    assert "<b>" not in json.dumps(data["text"])  # user text is escaped for Plotly
    assert np.isnan(row_scaled(np.array([np.nan, 0.0]))[0]) and row_scaled(np.zeros(2)).tolist() == [0.0, 0.0]


def test_agreement_matrix_writes_each_correlation():
    table = pd.DataFrame(
        [[1.0, -0.5], [-0.5, 1.0]], index=["occlusion", "attention"], columns=["occlusion", "attention"]
    )
    data = sent(agreement_matrix(["Occlusion", "attention"], table.to_numpy()))["data"][0]
    np.testing.assert_allclose(np.array(decode(data["z"]), dtype=float), table.to_numpy())
    assert data["text"] == [["1.00", "-0.50"], ["-0.50", "1.00"]]
    assert data["x"] == ["Occlusion", "attention"]


def test_removal_curves_draw_each_order_and_the_mean_of_random_seeds():
    rows = []
    for order, seed, values in (("occlusion", 0, [0.0, -1.0, -3.0]), ("random", 0, [0.0, -0.5, -3.0]),
                                ("random", 1, [0.0, -1.5, -3.0])):  # fmt: skip
        for k, value in enumerate(values):
            rows.append((order, seed, "deletion", k, k / 2, value))
            rows.append((order, seed, "insertion", k, k / 2, -value))
    curves = pd.DataFrame(rows, columns=["order", "seed", "curve", "k", "fraction", "value"])
    lines = mean_curves(curves, "deletion")
    traces = sent(removal_curves(lines, "random", "deletion"))["data"]
    assert [t["name"] for t in traces] == ["occlusion", "random"]
    np.testing.assert_allclose(decode(traces[0]["y"]), [0.0, -1.0, -3.0])
    np.testing.assert_allclose(decode(traces[1]["y"]), [0.0, -1.0, -3.0])  # the seeds' mean
    np.testing.assert_allclose(decode(traces[1]["x"]), [0.0, 0.5, 1.0])
    assert traces[1]["line"]["dash"] == "dash"
    inserted = sent(removal_curves(mean_curves(curves, "insertion"), "random", "insertion"))["data"]
    np.testing.assert_allclose(decode(inserted[0]["y"]), [0.0, 1.0, 3.0])


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from tests.model_fixtures import build_tiny_llama

    path = build_tiny_llama(
        tmp_path_factory.mktemp("llama-attr"), head=True, randomised=True, tie_word_embeddings=False
    )
    return str(path)


TEXT = "The cat sat on the mat and the dog"


def test_explore_section_shows_the_scores_the_library_computes(tiny_llama):
    import mha_core as mc
    from mha_core.interventions.faithfulness import head_agreement
    from tests.page_helpers import open_app, plotly_elements

    app = open_app(
        "explore", {"model": tiny_llama, "text": TEXT, "attr": "1", "amethods": "occlusion,attention", "layer": 1}
    )
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert any(s.value == "What does the prediction depend on?" for s in app.subheader)
    charts = plotly_elements(app)
    model = mc.load_model(tiny_llama)
    expected = mc.token_attribution(model, TEXT, methods=("occlusion", "attention"))
    tokens = charts["attr_tokens"]["data"][0]
    raw = np.array(decode(tokens["customdata"]), dtype=float)
    np.testing.assert_allclose(raw[0], expected.method_scores("occlusion"), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(raw[1], expected.method_scores("attention"), rtol=1e-5, atol=1e-7)
    head = int(app.session_state["head"]) if "head" in app.session_state else 0
    np.testing.assert_allclose(raw[2], expected.head_rows[1, head, expected.ordinary], rtol=1e-5, atol=1e-7)
    heads = np.array(decode(charts["attr_heads"]["data"][0]["z"]), dtype=float)
    np.testing.assert_allclose(heads, np.nan_to_num(head_agreement(expected, "occlusion")), atol=1e-9)
    assert {"attr_agreement", "attr_deletion", "attr_insertion"} <= set(charts)


def test_classroom_closing_step_reveals_the_measured_agreement(tiny_llama, monkeypatch):
    import mha_core as mc
    from mha_core.interventions.faithfulness import method_agreement
    from tests.page_helpers import open_app, rerun
    from ui import attribution_view

    monkeypatch.setattr(attribution_view, "classroom_models", lambda: [tiny_llama])  # the embedded ones: slow
    app = open_app("classroom", {"atext": TEXT, "step": 10})
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert any("Is attention explanation?" in h.value for h in app.header)
    assert not [t for t in app.toggle if t.label == "Reveal the answer"]  # nothing computed before the click
    app.button(key="cls_attr_go").click()
    rerun(app)
    assert any("Are the tokens the last layer attends to most" in m.value for m in app.markdown)
    next(t for t in app.toggle if t.label == "Reveal the answer").set_value(True)
    rerun(app)
    answer = next(m.value for m in app.markdown if m.value.startswith("**Answer:**")).replace("\\", "")
    expected = method_agreement(mc.token_attribution(mc.load_model(tiny_llama), TEXT))
    assert f"{expected.loc['attention', 'integrated_gradients']:+.2f}" in answer
    assert f"{expected.loc['occlusion', 'integrated_gradients']:+.2f}" in answer


def test_explore_offers_value_zeroing_and_draws_the_library_scores(tiny_llama):
    import mha_core as mc
    from mha_core.interventions.token_attribution import METHOD_LABELS
    from tests.page_helpers import open_app, plotly_elements

    app = open_app("explore", {"model": tiny_llama, "text": TEXT, "attr": "1", "amethods": "value_zeroing,attention"})
    assert not app.exception and not app.error, [e.value for e in app.error]
    methods = next(m for m in app.multiselect if METHOD_LABELS["attention"] in m.options)
    assert METHOD_LABELS["value_zeroing"] in methods.options
    assert methods.value == ["value_zeroing", "attention"]
    expected = mc.token_attribution(mc.load_model(tiny_llama), TEXT, methods=("value_zeroing", "attention"))
    raw = np.array(decode(plotly_elements(app)["attr_tokens"]["data"][0]["customdata"]), dtype=float)
    np.testing.assert_allclose(raw[0], expected.method_scores("value_zeroing"), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(raw[1], expected.method_scores("attention"), rtol=1e-5, atol=1e-7)
