"""The Deeper page under AppTest, and its figures on numbers: what the browser gets equals mha_core."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from tests.conftest import ATTENTION_ATOL, ENGINE_ATOL
from tests.model_fixtures import build_tiny_bert, build_tiny_llama
from tests.page_helpers import plotly_elements, rerun, run_page, widget
from ui.figures import deeper as figures

PAGE = "deeper"
TEXT = "The cat sat on the mat."


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def test_figures_carry_the_numbers():
    tokens = ["<a>", "b", "b"]
    matrix = np.array([[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    fig = figures.token_matrix(matrix, tokens, "t")
    np.testing.assert_array_equal(fig.data[0].z, matrix)
    assert list(fig.data[0].x) == ["0:&lt;a&gt;", "1:b", "2:b"]  # user text escaped, repeats kept apart
    norms = matrix * np.array([0.1, 2.0, 1.0])
    pair = figures.weights_and_norms(matrix, norms, tokens, "h")
    np.testing.assert_allclose(pair.data[0].z, matrix)
    np.testing.assert_allclose(pair.data[1].z, norms / norms.sum(-1, keepdims=True))
    products = np.arange(6.0).reshape(3, 2) - 2
    neuron = figures.neuron_products(tokens, products, np.array([True, True, False]), "n")
    np.testing.assert_array_equal(neuron.data[0].z[:2], products[:2])
    assert np.all(np.isnan(neuron.data[0].z[2]))  # a key the query cannot see stays blank
    scores = figures.neuron_scores(tokens, np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.2, 0.7]), np.ones(3, bool), "s")
    np.testing.assert_array_equal(scores.data[0].y, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(scores.data[1].y, [0.1, 0.2, 0.7])


def test_page_shows_rollout_norms_and_neuron_view(tiny_bert):
    app = run_page(PAGE, {"model": tiny_bert, "text": TEXT})
    charts = plotly_elements(app)
    model = mc.load_model(tiny_bert)
    run = model.run(TEXT, norms=True)
    last = run.num_layers - 1
    np.testing.assert_allclose(charts["deeper_rollout"]["data"][0]["z"], mc.attention_rollout(run)[last], atol=1e-5)
    weights, norms = charts["deeper_norms"]["data"][:2]
    np.testing.assert_allclose(weights["z"], run.attentions[last, 0], atol=ATTENTION_ATOL)
    shares = run.norms[last, 0] / run.norms[last, 0].sum(-1, keepdims=True)
    np.testing.assert_allclose(norms["z"], shares, atol=1e-5)
    # The neuron view's softmax is the head's attention row of query 1.
    scores = charts["deeper_neuron_scores"]["data"]
    np.testing.assert_allclose(scores[1]["y"], run.attentions[last, 0, 1], atol=ENGINE_ATOL)
    assert not app.info or not any("rotary" in i.value for i in app.info)

    # Another head and query, then flow: the figures follow.
    widget(app, "deeper_head").set_value(2)
    rerun(app)
    widget(app, "deeper_query").set_value(3)
    rerun(app)
    app.toggle(key="deeper_flow").set_value(True)
    rerun(app)
    charts = plotly_elements(app)
    np.testing.assert_allclose(
        charts["deeper_neuron_scores"]["data"][1]["y"], run.attentions[last, 2, 3], atol=ENGINE_ATOL
    )
    np.testing.assert_allclose(charts["deeper_flow_chart"]["data"][0]["z"], mc.attention_flow(run), atol=1e-5)


def test_rotary_model_says_vectors_are_rotated(tiny_llama):
    app = run_page(PAGE, {"model": tiny_llama, "text": TEXT})
    assert any("after the rotation" in info.value for info in app.info)
    assert "deeper_neuron_products" in plotly_elements(app)


def test_corpus_search_lists_the_nearest_tokens(tiny_bert):
    from mha_core.analysis import syntax
    from mha_core.interventions import search

    app = run_page(PAGE, {"model": tiny_bert, "text": TEXT}, deeper_search_kind="attention", deeper_search_size=50)
    app.toggle(key="deeper_search").set_value(True)
    rerun(app)
    table = app.dataframe[-1].value
    model = mc.load_model(tiny_bert)
    last = model.num_layers - 1
    index = search.build_corpus_index(model, [s.words for s in syntax.ud_ewt_dev(50)], last, 0, "attention")
    vector = search.query_vector(model, model.encode(TEXT).input_ids, 1, last, 0, "attention")
    expected = index.search(vector, k=10)
    np.testing.assert_allclose(table["distance"], expected["distance"], atol=1e-4)
    nearest = expected[expected["distance"] <= expected["distance"].iloc[0] + 1e-4]["token"]
    assert table["token"].iloc[0] in set(nearest)
    assert set(table["token"]) <= set(index.search(vector, k=20)["token"])  # ties may swap near-equal rows
