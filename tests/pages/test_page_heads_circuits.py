"""The Circuits page's weight circuits and path patching (``ui/heads_circuits.py``) under AppTest: the maps, the
composition graph and the path-patching map carry exactly the library's numbers; a bad receiver list gets a clear
message; every setting is in the page address."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import mha_core as mc
from mha_core.interventions.attribution import head_grid
from mha_core.interventions.readout import CircuitError
from mha_core.views import tables
from tests.mha_core.interventions.test_circuits import CLEAN, CORRUPTED, build_decoder, one_token_words
from tests.page_helpers import deferred_downloads, open_app, plotly_elements
from ui.heads_circuits import grid, head_pairs, strongest_edges

PAGE = "circuits"


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    return str(build_decoder(tmp_path_factory.mktemp("tiny-gpt2-heads"), "gpt2"))


def query(path: str, answer: str, foil: str, **extra) -> dict:
    base = {"model": path, "task": "custom", "clean": CLEAN, "corrupted": CORRUPTED, "answer": answer, "foil": foil}
    return {**base, "qkov": "1", "paths": "1", **extra}


def test_weight_maps_composition_graph_and_path_patching_are_the_librarys(tiny_gpt2):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    app = open_app(PAGE, query(tiny_gpt2, answer, foil, recv="1-1", via="v", cmode="q", cmin="1"))
    assert not app.error, [e.value for e in app.error]
    charts = plotly_elements(app)
    scores = mc.copying_scores(model)
    for key, column in (("qkov_copying", "copying"), ("qkov_previous", "previous_token")):
        np.testing.assert_allclose(
            charts[key]["data"][0]["z"], grid(scores, column, model.num_layers, model.num_heads), rtol=1e-6
        )
    composition = mc.composition(model)
    edges, _ = strongest_edges(composition, "q", 1.0)
    graph = charts["qkov_graph"]["data"]
    drawn = sum(len([x for x in trace["x"] if x is not None]) // 2 for trace in graph[:-1])
    assert drawn == len(edges) > 0
    assert [int(v) for v in graph[-1]["customdata"][model.num_heads + 2][:2]] == [1, 2]  # click targets
    table = mc.path_patch(model, CLEAN, CORRUPTED, answer, foil, receivers=[(1, 1)], via="v")
    np.testing.assert_allclose(
        charts["qkov_path_map"]["data"][0]["z"],
        grid(table, "score", model.num_layers, model.num_heads),
        rtol=1e-4,
        atol=1e-5,
    )
    markdown = " ".join(m.value for m in app.markdown)
    assert "what 0-0 writes" in markdown and "which keys 0-0 prefers" in markdown


def test_bad_receivers_get_a_message(tiny_gpt2):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    app = open_app(PAGE, query(tiny_gpt2, answer, foil, qkov="0", recv="9-0, <b>"))
    assert any("outside this model" in e.value for e in app.error), [e.value for e in app.error]
    assert "qkov_path_map" not in plotly_elements(app)


def test_head_pairs_parse_and_refuse():
    assert head_pairs("17-3, 18-6;17-3", 30, 9) == [(17, 3), (18, 6)]
    with pytest.raises(CircuitError, match="not a head"):
        head_pairs("17", 30, 9)
    with pytest.raises(CircuitError, match="outside"):
        head_pairs("30-0", 30, 9)


def page_data(page: bytes) -> dict:
    """A saved view's data, read back as its script reads it (JSON.parse of the data element's text)."""
    found = re.findall(r'<script type="application/json" id="hs-data">(.*?)</script>', page.decode(), flags=re.DOTALL)
    assert len(found) == 1
    return json.loads(found[0])


def test_the_maps_download_as_self_contained_pages_of_the_librarys_tables(tiny_gpt2, monkeypatch):
    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    fetch = deferred_downloads(monkeypatch)
    app = open_app(PAGE, query(tiny_gpt2, answer, foil, paths="0", cmode="v", cmin="1"))
    assert not app.error, [e.value for e in app.error]
    buttons = {button.key: button for button in app.get("download_button")}
    assert buttons["qkov_maps_html"].proto.label == "Download the maps as HTML (.html)"
    # Copying and previous-token scores: one file, each column a grid of the library's numbers.
    page = fetch(buttons["qkov_maps_html"])
    assert b"http://" not in page and b"https://" not in page
    data = page_data(page)
    scores = mc.copying_scores(model)
    for column in ("copying", "previous_token"):
        np.testing.assert_allclose(
            tables.decode_column(data, column), grid(scores, column, model.num_layers, model.num_heads), rtol=1e-6
        )
    # Composition: each receiver's strongest sender, the page's mode (V) shown first.
    data = page_data(fetch(buttons["qkov_composition_html"]))
    composition = mc.composition(model)
    strongest = composition.groupby(["receiver_layer", "receiver_head"])["v"].max()
    assert data["column"] == "v"
    for (layer, head), value in strongest.items():
        assert abs(tables.decode_column(data, "v")[layer, head] - value) <= 1e-6 * max(1.0, abs(value))
    # Attribution and patching: one head table, both maps' numbers.
    data = page_data(fetch(buttons["circuits_maps_html"]))
    attribution = mc.logit_attribution(model, CLEAN, answer, foil)
    patched = mc.patch(model, CLEAN, CORRUPTED, answer, foil, method="attribution", exact_top=10)
    np.testing.assert_allclose(
        tables.decode_column(data, "contribution"),
        head_grid(attribution, model.num_layers, model.num_heads),
        rtol=1e-4,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        tables.decode_column(data, "score"),
        head_grid(patched, model.num_layers, model.num_heads, "score"),
        rtol=1e-4,
        atol=1e-4,
    )
