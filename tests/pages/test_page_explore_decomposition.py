"""Explore's "Why does this head look there?" under AppTest: the sentence, the heatmap and the ranked list carry
exactly the library's decomposition of the chosen cell; the query and the key are in the address; a decoder offers
only the keys its query sees; a cell picked on the head view (the component's pick) opens the section on that cell;
the sentence for a class carries the ranked list's numbers; the head's OV/QK summary is the library's."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from streamlit.proto.WidgetStates_pb2 import WidgetState

import mha_core as mc
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2
from tests.page_helpers import open_app, plotly_elements, rerun, widget
from ui.widgets.decomposition import OV_TOP, RANKED_ROWS, TOP_SOURCES

TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert-decomposition"), randomised=True))


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return str(build_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2-decomposition"), randomised=True))


def page_text(app) -> str:
    return "\n".join(element.value for element in app.markdown)


def test_the_section_shows_the_librarys_decomposition(tiny_bert):
    query = {"model": tiny_bert, "text": TEXT, "layer": "1", "head": "2", "decompose": "1"}
    app = open_app("explore", {**query, "score_query": "5", "score_key": "2"})
    assert not app.error, [e.value for e in app.error]
    parts = mc.score_decomposition(mc.load_model(tiny_bert), TEXT, 1, 2, 5, 2)
    text = page_text(app).replace("\\", "")  # the sentences are escaped for markdown (ui/widgets/messages.py)
    assert parts.why() in text
    for sentence in parts.summary():
        assert sentence in text
    matrix, rows, columns = parts.grouped(TOP_SOURCES)
    drawn = plotly_elements(app)["decomposition_map"]["data"][0]
    np.testing.assert_allclose(np.asarray(drawn["z"], dtype=np.float64), matrix, rtol=1e-9, atol=1e-12)
    layout = plotly_elements(app)["decomposition_map"]["layout"]
    assert list(layout["yaxis"]["ticktext"]) == rows and list(layout["xaxis"]["ticktext"]) == columns
    table = app.dataframe[0].value
    expected = parts.table().head(RANKED_ROWS)
    assert list(table["query side"]) == list(expected["query_source"])
    np.testing.assert_allclose(table["part of the score"], expected["contribution"], rtol=1e-12)
    assert any("frozen" in caption.value for caption in app.caption)
    # Another key: the address follows the selector.
    widget(app, "decompose_key").set_value(4)
    rerun(app)
    assert app.query_params["score_key"] in ("4", ["4"])
    moved = mc.score_decomposition(mc.load_model(tiny_bert), TEXT, 1, 2, 5, 4)
    drawn = plotly_elements(app)["decomposition_map"]["data"][0]
    np.testing.assert_allclose(np.asarray(drawn["z"], dtype=np.float64), moved.grouped(TOP_SOURCES)[0], rtol=1e-9)


def test_off_by_default_and_a_decoder_offers_only_earlier_keys(tiny_gpt2):
    app = open_app("explore", {"model": tiny_gpt2, "text": TEXT, "layer": "1", "head": "0"})
    assert not app.error, [e.value for e in app.error]
    assert "decomposition_map" not in plotly_elements(app)
    assert any(subheader.value == "Why does this head look there?" for subheader in app.subheader)
    widget(app, "decompose_on").set_value(True)
    rerun(app)
    widget(app, "decompose_query").set_value(3)
    rerun(app)
    assert len(widget(app, "decompose_key").options) == 4  # keys 0-3: the query 3 sees no later key
    assert "decomposition_map" in plotly_elements(app)
    assert "it raises the logits of " in page_text(app)  # a decoder's OV circuit ends in its unembedding
    assert not app.error, [e.value for e in app.error]


def pick_in_the_view(app, monkeypatch, pick: dict) -> None:
    """What the browser sends when the visitor picks in Explore's head view: the component's state (``{"pick":
    ...}``, as headview.js's ``setStateValue``) beside every other widget's, then the rerun. AppTest sends no state
    for a custom component of its own accord, so the state is added to the run's widget states here."""
    view = [e for e in app.get("bidi_component") if e.proto.component_name == "headscope_head_view"]
    assert len(view) == 1
    tree = app.main.root
    states = tree.get_widget_states

    def with_the_pick():
        sent = states()
        sent.widgets.append(WidgetState(id=view[0].proto.id, json_value=json.dumps({"pick": pick})))
        return sent

    monkeypatch.setattr(tree, "get_widget_states", with_the_pick)
    rerun(app)


def address(app, name: str) -> str:
    value = app.query_params[name]
    return value[0] if isinstance(value, list) else value


def test_a_picked_cell_opens_its_decomposition(tiny_bert, monkeypatch):
    app = open_app("explore", {"model": tiny_bert, "text": TEXT, "layer": "1", "head": "2"})
    assert not app.error, [e.value for e in app.error]
    assert "decomposition_map" not in plotly_elements(app)  # the section starts switched off
    # The visitor clicks the cell (query 5, key 2) of the enlarged head 1-2 (or presses Enter on it).
    pick_in_the_view(
        app, monkeypatch, {"layer": 1, "head": 2, "view": "head", "shape": "heatmap", "query": 5, "key": 2}
    )
    assert not app.error, [e.value for e in app.error]
    assert app.session_state["decompose_on"] is True
    assert (app.session_state["decompose_query"], app.session_state["decompose_key"]) == (5, 2)
    assert (address(app, "decompose"), address(app, "score_query"), address(app, "score_key")) == ("1", "5", "2")
    assert widget(app, "decompose_query").value == 5 and widget(app, "decompose_key").value == 2
    parts = mc.score_decomposition(mc.load_model(tiny_bert), TEXT, 1, 2, 5, 2)
    drawn = plotly_elements(app)["decomposition_map"]["data"][0]
    np.testing.assert_allclose(np.asarray(drawn["z"], dtype=np.float64), parts.grouped(TOP_SOURCES)[0], rtol=1e-9)
    assert parts.question().replace("'", "") in page_text(app).replace("\\", "").replace("'", "")


def test_a_cell_picked_without_the_special_tokens_is_the_runs_own(tiny_bert, monkeypatch):
    # Hidden special tokens: the view's row 4 and column 1 are the run's tokens 5 and 2 ([CLS] is the run's 0).
    model = mc.load_model(tiny_bert)
    run = model.run(TEXT)
    assert run.special_mask[0] and not run.special_mask[1:-1].any() and run.special_mask[-1]
    app = open_app("explore", {"model": tiny_bert, "text": TEXT, "layer": "0", "head": "1", "hide": "1"})
    pick_in_the_view(
        app, monkeypatch, {"layer": 0, "head": 1, "view": "head", "shape": "heatmap", "query": 4, "key": 1}
    )
    assert (app.session_state["decompose_query"], app.session_state["decompose_key"]) == (5, 2)
    parts = mc.score_decomposition(model, TEXT, 0, 1, 5, 2)
    drawn = plotly_elements(app)["decomposition_map"]["data"][0]
    np.testing.assert_allclose(np.asarray(drawn["z"], dtype=np.float64), parts.grouped(TOP_SOURCES)[0], rtol=1e-9)
    # A pick of the head alone (a tile, the layer slider) leaves the decomposition where it was.
    pick_in_the_view(app, monkeypatch, {"layer": 0, "head": 3, "view": "head", "shape": "heatmap"})
    assert (app.session_state["decompose_query"], app.session_state["decompose_key"]) == (5, 2)
    assert app.session_state["head"] == 3


def test_the_sentence_for_a_class_carries_the_ranked_lists_numbers(tiny_bert):
    app = open_app(
        "explore",
        {
            "model": tiny_bert,
            "text": TEXT,
            "layer": "1",
            "head": "0",
            "decompose": "1",
            "score_query": "3",
            "score_key": "1",
        },
    )
    assert not app.error, [e.value for e in app.error]
    parts = mc.score_decomposition(mc.load_model(tiny_bert), TEXT, 1, 0, 3, 1)
    sentence = next(line for line in page_text(app).replace("\\", "").split("\n") if "the largest part is" in line)
    # The two largest pairs, found here from the matrix itself (largest magnitude first).
    flat = parts.matrix.reshape(-1)
    first, second = np.argsort(-np.abs(flat), kind="stable")[:2]
    count = len(parts.labels)
    top = [(parts.labels[i // count], parts.labels[i % count], flat[i]) for i in (first, second)]
    found = re.search(
        r"of its score (-?\d+\.\d\d), the largest part is .* \(([+-]\d+\.\d\d)\), the next .* \(([+-]\d+\.\d\d)\)\.$",
        sentence,
    )
    assert found, sentence
    assert float(found.group(1)) == pytest.approx(parts.score, abs=0.005)
    assert float(found.group(2)) == pytest.approx(top[0][2], abs=0.005)
    assert float(found.group(3)) == pytest.approx(top[1][2], abs=0.005)
    # The same two pairs head the ranked list on the page, with the same parts.
    table = app.dataframe[0].value
    shown = list(zip(table["query side"][:2], table["key side"][:2], table["part of the score"][:2], strict=True))
    for (query_source, key_source, value), (got_query, got_key, got_value) in zip(top, shown, strict=True):
        assert (got_query, got_key) == (query_source, key_source)
        assert got_value == pytest.approx(value, rel=1e-9)
        assert f"{value:+.2f}" in sentence
    # The head's OV/QK summary: the library's copying and previous-token scores, its OV circuit at the key's token.
    model = mc.load_model(tiny_bert)
    scores = mc.copying_scores(model).set_index(["layer", "head"]).loc[(1, 0)]
    token_id = int(model.encode(TEXT).input_ids[1])
    outputs = mc.ov_circuit(model, 1, 0, k=OV_TOP, tokens=[token_id])["output_token"]
    text = page_text(app).replace("\\", "")
    # An encoder's OV circuit ends in its embedding matrix, not in logits.
    assert "writes most along the embeddings of " + ", ".join(repr(t).replace("\\", "") for t in outputs) in text
    # The copying scores (every head's at once) come on a click, unless the server has them already.
    buttons = [button for button in app.button if button.key == "decompose_copying"]
    if buttons:
        assert "copying score is" not in text
        buttons[0].click()
        rerun(app)
        text = page_text(app).replace("\\", "")
    assert f"copying score is {scores['copying']:+.2f}" in text
    assert f"puts {scores['previous_token']:.0%} of its attention on the previous position" in text
