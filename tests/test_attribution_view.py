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


@pytest.mark.slow
def test_explore_section_on_smollm2_shows_the_scores_the_library_computes():
    import mha_core as mc
    from tests.page_helpers import figure_spec, run_page

    text = "When Mary and John went to the store, John gave a drink to"
    app = run_page("explore", {"model": "smollm2", "text": text, "amethods": "occlusion,attention"})
    assert not app.exception
    assert any(s.value == "What does the prediction depend on?" for s in app.subheader)
    charts = [figure_spec(e) for e in app.get("plotly_chart")]
    scores = next(c for c in charts if c["data"][0].get("customdata") is not None and len(c["data"][0]["y"]) >= 2)
    model = mc.load_model("smollm2")
    expected = mc.token_attribution(model, text, methods=("occlusion", "attention"))
    raw = np.array(decode(scores["data"][0]["customdata"]), dtype=float)
    np.testing.assert_allclose(raw[0], expected.method_scores("occlusion"), rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(raw[1], expected.method_scores("attention"), rtol=1e-4, atol=1e-6)
