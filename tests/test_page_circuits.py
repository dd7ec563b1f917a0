"""The Circuits page under AppTest: its maps and logit lens carry exactly the library's numbers; bad prompt pairs
get a clear message; every setting is in the page address."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from mha_core.interventions.attribution import head_grid
from tests.model_fixtures import build_tiny_bert
from tests.page_helpers import open_app, plotly_elements, rerun, widget
from tests.test_circuits import CLEAN, CORRUPTED, build_decoder, one_token_words

PAGE = "circuits"


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return str(build_decoder(tmp_path_factory.mktemp("tiny-gpt2-circuits"), "gpt2"))


def custom_query(path: str, answer: str, foil: str, **extra) -> dict:
    return {
        "model": path,
        "task": "custom",
        "clean": CLEAN,
        "corrupted": CORRUPTED,
        "answer": answer,
        "foil": foil,
        **extra,
    }


def test_page_maps_and_lens_are_the_librarys(tiny_gpt2):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    app = open_app(PAGE, custom_query(tiny_gpt2, answer, foil))
    assert [t.value for t in app.title] == ["Circuits"]
    assert not app.error, [e.value for e in app.error]
    assert any("Patching asks" in i.value for i in app.info)  # the words for a class
    charts = plotly_elements(app)
    attribution = mc.logit_attribution(model, CLEAN, answer, foil)
    np.testing.assert_allclose(
        charts["circuits_attribution_map"]["data"][0]["z"],
        head_grid(attribution, model.num_layers, model.num_heads),
        rtol=1e-5,
        atol=1e-5,
    )
    # The map's click targets carry [layer, head, value], as the other pages' maps.
    targets = charts["circuits_patching_map"]["data"][1]["customdata"]
    assert [int(v) for v in targets[model.num_heads + 1][:2]] == [1, 1]
    estimate = mc.patch(model, CLEAN, CORRUPTED, answer, foil, method="attribution", exact_top=10)
    np.testing.assert_allclose(
        charts["circuits_patching_map"]["data"][0]["z"],
        head_grid(estimate, model.num_layers, model.num_heads, "score"),
        rtol=1e-4,
        atol=1e-4,
    )
    exact_points = charts["circuits_estimate"]["data"][1]
    chosen = estimate[estimate["exact"].notna()]
    np.testing.assert_allclose(exact_points["y"], chosen["exact"], rtol=1e-4, atol=1e-4)
    # The logit lens: the top token after each layer at each position, its probability the colour.
    lens = mc.logit_lens(model, CLEAN, k=3)
    top = lens[lens["rank"] == 0]
    drawn = charts["circuits_lens"]["data"][0]
    np.testing.assert_allclose(
        drawn["z"], top.pivot(index="layer", columns="position", values="probability").to_numpy(), rtol=1e-5, atol=1e-6
    )
    expected_text = top.pivot(index="layer", columns="position", values="token").to_numpy()
    assert [[t for t in row] for row in drawn["customdata"]] == [
        [t.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") for t in row] for row in expected_text
    ]
    # Exact patching, chosen on the page, is in the address and fills the map with the exact scores.
    widget(app, "circuits_method").set_value("exact")
    rerun(app)
    assert app.query_params["method"] == "exact"
    exact = mc.patch(model, CLEAN, CORRUPTED, answer, foil)
    np.testing.assert_allclose(
        plotly_elements(app)["circuits_patching_map"]["data"][0]["z"],
        head_grid(exact, model.num_layers, model.num_heads, "score"),
        rtol=1e-4,
        atol=1e-4,
    )
    assert app.query_params["task"] == "custom" and app.query_params["answer"] == answer


@pytest.mark.parametrize(
    "change, message",
    [
        ({"answer": " cat dog mat"}, "not one"),
        ({"corrupted": "The cat sat on the mat and then the dog sat."}, "same number of tokens"),
        ({"clean": "   "}, "empty"),
        ({"clean": "word " * 200, "corrupted": "word " * 200}, "at most 64"),
        ({"foil": "ANSWER"}, None),  # the same token as the answer: set below
    ],
)
def test_bad_prompt_pairs_get_a_clear_message(tiny_gpt2, change, message):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    if message is None:
        change, message = {"foil": answer}, "same token"
    app = open_app(PAGE, {**custom_query(tiny_gpt2, answer, foil), **change})
    assert not app.exception
    errors = [e.value for e in app.error]
    assert len(errors) == 1 and message in errors[0], errors
    assert "Traceback" not in errors[0] and "/" not in errors[0].replace("w/", "")


def test_an_encoder_gets_a_notice_not_an_error(tmp_path):
    path = str(build_tiny_bert(tmp_path / "bert", head=True))
    app = open_app(PAGE, {"model": path})
    assert not app.error and not app.exception
    assert any("next-token prediction" in i.value for i in app.info)


def test_a_clicked_head_opens_in_explore_with_the_model_and_the_clean_prompt(tiny_gpt2):
    """The maps' click (its callback stores the head) switches to Explore as a link: this model, the clean
    prompt, that layer and head (Streamlit opens the other page with the sidebar's widgets at their defaults)."""
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    app = open_app(PAGE, custom_query(tiny_gpt2, answer, foil))
    app.session_state["_circuits_open_explore"] = (1, 2)
    rerun(app)
    assert [t.value for t in app.title] == ["Explore"]
    assert app.query_params["model"] == tiny_gpt2 and app.query_params["text"] == CLEAN
    assert (app.query_params["layer"], app.query_params["head"]) == ("1", "2")
    assert app.session_state["text"] == CLEAN and app.session_state["model_other"] == tiny_gpt2


def test_circuits_figures_carry_the_numbers_and_escape_tokens():
    from ui.figures.circuits import estimate_against_exact, logit_lens_table

    tokens = np.array([["<b>", "a&b"], ["x", " y"]], dtype=object)
    probabilities = np.array([[0.5, 0.25], [0.9, 0.1]])
    fig = logit_lens_table(["0:<s>", "1:cat"], tokens, probabilities, "t")
    np.testing.assert_array_equal(fig.data[0].z, probabilities)
    assert [list(row) for row in fig.data[0].customdata] == [["&lt;b&gt;", "a&amp;b"], ["x", " y"]]
    assert list(fig.layout.xaxis.ticktext) == ["0:&lt;s&gt;", "1:cat"]
    scatter = estimate_against_exact(["L1H2", "L3H4"], np.array([0.1, 0.6]), np.array([0.2, 0.5]), "s")
    np.testing.assert_array_equal(scatter.data[1].x, [0.1, 0.6])
    np.testing.assert_array_equal(scatter.data[1].y, [0.2, 0.5])
