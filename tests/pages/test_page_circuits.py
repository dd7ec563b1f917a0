"""The Circuits page under AppTest: its maps and logit lens carry exactly the library's numbers; bad prompt pairs
get a clear message; every setting is in the page address."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from mha_core.interventions.attribution import head_grid
from tests.mha_core.interventions.test_circuits import CLEAN, CORRUPTED, build_decoder, one_token_words
from tests.model_fixtures import build_tiny_bert
from tests.page_helpers import open_app, plotly_elements, rerun, widget

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


def assert_attribution_map_is_the_librarys(charts, model, answer: str, foil: str):
    """The page's attribution map is ``mc.logit_attribution`` of the clean prompt, head by head."""
    attribution = mc.logit_attribution(model, CLEAN, answer, foil)
    np.testing.assert_allclose(
        charts["circuits_attribution_map"]["data"][0]["z"],
        head_grid(attribution, model.num_layers, model.num_heads),
        rtol=1e-5,
        atol=1e-5,
    )


def test_page_maps_and_lens_are_the_librarys(tiny_gpt2):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    app = open_app(PAGE, custom_query(tiny_gpt2, answer, foil))
    assert [t.value for t in app.title] == ["Circuits"]
    assert not app.error, [e.value for e in app.error]
    assert any("Patching asks" in i.value for i in app.info)  # the words for a class
    charts = plotly_elements(app)
    assert_attribution_map_is_the_librarys(charts, model, answer, foil)
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

    # Each cell shows the token as the head view does (model.display: never an empty cell, never an escape such
    # as \xa0), and its hover quotes the token's exact text.
    def escaped(text):
        return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    shown = top.pivot(index="layer", columns="position", values="shown").to_numpy()
    ids = top.pivot(index="layer", columns="position", values="token_id").to_numpy()
    assert [list(row) for row in shown] == [
        [model.display(raw) for raw in model.tokenizer.convert_ids_to_tokens(row.tolist())] for row in ids
    ]
    assert [list(row) for row in drawn["text"]] == [[escaped(t) for t in row] for row in shown]
    assert all(cell.strip() for row in drawn["text"] for cell in row)
    expected_text = top.pivot(index="layer", columns="position", values="token").to_numpy()
    assert [list(row) for row in drawn["customdata"]] == [[escaped(repr(t)) for t in row] for row in expected_text]
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


def test_prompts_of_different_lengths_keep_attribution_and_the_lens_and_list_both_prompts_tokens(tiny_gpt2):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    longer = CORRUPTED + " and then the dog sat"
    app = open_app(PAGE, {**custom_query(tiny_gpt2, answer, foil), "corrupted": longer})
    assert not app.exception and not app.error, [e.value for e in app.error]
    clean_tokens = model.display.display(model.tokenizer.convert_ids_to_tokens(model.encode(CLEAN).input_ids))
    corrupted_tokens = model.display.display(model.tokenizer.convert_ids_to_tokens(model.encode(longer).input_ids))
    assert len(clean_tokens) != len(corrupted_tokens)
    (warning,) = [w.value for w in app.warning if "patching replaces activations" in w.value]
    assert f"{len(clean_tokens)} tokens and the corrupted one {len(corrupted_tokens)}" in warning
    listed = next(frame.value for frame in app.dataframe if "corrupted" in frame.value.columns)
    assert listed["clean"].tolist()[: len(clean_tokens)] == clean_tokens
    assert listed["corrupted"].tolist() == corrupted_tokens and len(listed) == len(corrupted_tokens)
    assert listed["differs"].tolist() == [
        a != b for a, b in zip(clean_tokens + [""] * len(corrupted_tokens), corrupted_tokens)
    ]
    charts = plotly_elements(app)
    # Attribution and the lens read the clean prompt alone: both are drawn, with the library's numbers.
    assert_attribution_map_is_the_librarys(charts, model, answer, foil)
    lens = mc.logit_lens(model, CLEAN, k=3)
    top = lens[lens["rank"] == 0]
    np.testing.assert_allclose(
        charts["circuits_lens"]["data"][0]["z"],
        top.pivot(index="layer", columns="position", values="probability").to_numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    assert "circuits_patching_map" not in charts and "circuits_estimate" not in charts


def test_the_failures_of_smollm2_show_for_smollm2_only(tiny_gpt2):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    app = open_app(PAGE, custom_query(tiny_gpt2, answer, foil))
    assert not app.exception
    assert all("Where SmolLM2 fails" not in expander.label for expander in app.expander)


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

    decoded = np.array([["<b>", "a&b"], ["\xa0", " y"]], dtype=object)
    shown = np.array([["<b>", "a&b"], ["⍽", "y"]], dtype=object)
    probabilities = np.array([[0.5, 0.25], [0.9, 0.1]])
    fig = logit_lens_table(["0:<s>", "1:cat"], shown, probabilities, "t", decoded=decoded)
    np.testing.assert_array_equal(fig.data[0].z, probabilities)
    assert [list(row) for row in fig.data[0].text] == [["&lt;b&gt;", "a&amp;b"], ["⍽", "y"]]
    assert [list(row) for row in fig.data[0].customdata] == [["'&lt;b&gt;'", "'a&amp;b'"], ["'\\xa0'", "' y'"]]
    assert list(fig.layout.xaxis.ticktext) == ["0:&lt;s&gt;", "1:cat"]
    scatter = estimate_against_exact(["L1H2", "L3H4"], np.array([0.1, 0.6]), np.array([0.2, 0.5]), "s")
    np.testing.assert_array_equal(scatter.data[1].x, [0.1, 0.6])
    np.testing.assert_array_equal(scatter.data[1].y, [0.2, 0.5])
    assert [(a.text, a.x, a.y) for a in scatter.layout.annotations] == [("L1H2", 0.1, 0.2), ("L3H4", 0.6, 0.5)]


def test_the_estimate_scatter_labels_overlap_neither_each_other_nor_a_point():
    """Ten heads, six of them within 0.03 of the origin (the usual picture: few heads carry the difference):
    every label is placed where, in the plot area the figure assumes, it covers no other label and no marker."""
    from ui.figures.circuits import LABEL_CLEARANCE, estimate_against_exact, label_boxes, scatter_pixels

    rng = np.random.default_rng(0)
    estimate = np.r_[0.61, 0.11, 0.07, 0.28, rng.normal(0, 0.015, 6)]
    exact = np.r_[0.57, 0.34, 0.29, 0.28, rng.normal(0, 0.015, 6)]
    names = [f"L{20 + i}H{i % 9}" for i in range(10)]
    fig = estimate_against_exact(names, estimate, exact, "t")
    annotations = fig.layout.annotations
    assert [a.text for a in annotations] == names
    low, high = fig.layout.xaxis.range
    assert tuple(fig.layout.yaxis.range) == (low, high) and low < min(estimate.min(), exact.min())
    points = scatter_pixels(estimate, exact, low, high)
    boxes = label_boxes(points, np.array([[a.ax, a.ay] for a in annotations]), names)
    for i in range(len(names)):
        for j in range(len(names)):
            left, top, right, bottom = boxes[i]
            px, py = points[j]
            assert not (
                left < px + LABEL_CLEARANCE
                and px - LABEL_CLEARANCE < right
                and top < py + LABEL_CLEARANCE
                and py - LABEL_CLEARANCE < bottom
            ), (names[i], "covers the point of", names[j])
            if i < j:
                other = boxes[j]
                overlaps = left < other[2] and other[0] < right and top < other[3] and other[1] < bottom
                assert not overlaps, (names[i], names[j])
