"""The Circuits maps as views of the view kit (mha_core/views/tables.py): the copying and previous-token scores,
attribution's head rows and the composition of every pair of heads, each a layer x head grid whose decoded cells are
the table's numbers, in one self-contained page."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

import mha_core as mc
from mha_core.views import standalone, tables
from tests.conftest import ROOT
from tests.model_fixtures import build_tiny_llama


def page_data(page: str) -> dict:
    """The data a page carries, read back as its script reads it (JSON.parse of the data element's text)."""
    found = re.findall(r'<script type="application/json" id="hs-data">(.*?)</script>', page, flags=re.DOTALL)
    assert len(found) == 1
    return json.loads(found[0])


def in_words(pair) -> str:
    """A composition row as a receiver's line: its sender, then every score to four significant digits."""
    scores = ", ".join(
        f"{name} {getattr(pair, name):.4g}" for name in ("q", "q_excess", "k", "k_excess", "v", "v_excess")
    )
    return f"sender {int(pair.sender_layer)}-{int(pair.sender_head)}, {scores}"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return mc.load_model(str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-views"), head=True)))


def test_the_copying_and_previous_token_maps_are_the_tables_scores(tiny_llama):
    scores = mc.copying_scores(tiny_llama)
    page = standalone.html(scores)
    assert "https://" not in page and "http://" not in page
    data = page_data(page)
    assert data["columns"] == ["copying", "previous_token"] and data["column"] == "copying"
    for column in ("copying", "previous_token"):
        grid = tables.decode_column(data, column)
        assert grid.shape == (tiny_llama.num_layers, tiny_llama.num_heads)
        for row in scores.itertuples():
            assert grid[row.layer, row.head] == np.float32(getattr(row, column))


def test_a_composition_table_is_each_receivers_strongest_sender(tiny_llama):
    table = mc.composition(tiny_llama)
    view = standalone.view_of(table, column="k")
    data = view.data
    assert view.view == "tableview" and data["column"] == "k"
    assert data["columns"] == ["q", "q_excess", "k", "k_excess", "v", "v_excess"]
    layers, heads = tiny_llama.num_layers, tiny_llama.num_heads
    # Independently: the largest score over the senders of each receiver; layer 0 receives from no one (NaN).
    for column in ("q", "k", "v"):
        expected = np.full((layers, heads), np.nan, dtype=np.float32)
        for (layer, head), rows in table.groupby(["receiver_layer", "receiver_head"]):
            expected[layer, head] = np.float32(rows[column].max())
        np.testing.assert_array_equal(tables.decode_column(data, column), expected)
    # A receiver's senders in words, the strongest K-composition first.
    receiver = table[(table["receiver_layer"] == 1) & (table["receiver_head"] == 2)].sort_values("k", ascending=False)
    lines = data["details"][1 * heads + 2]
    assert len(lines) == min(len(receiver), tables.DETAIL_ROWS)
    best = receiver.iloc[0]
    assert lines[0] == in_words(best)
    assert data["details"][0] == []


def test_a_head_has_at_most_its_first_rows_in_words():
    count = tables.DETAIL_ROWS + 5
    frame = pd.DataFrame({"layer": [0] * count, "head": [0] * count, "score": np.arange(count, dtype=float)})
    lines = tables.pack_table(frame)["details"][0]
    assert lines[: tables.DETAIL_ROWS] == [f"score {value:.4g}" for value in range(tables.DETAIL_ROWS)]
    assert lines[-1] == "... and 5 more rows" and len(lines) == tables.DETAIL_ROWS + 1


def test_attributions_head_rows_are_its_map_and_other_components_are_left_out():
    frame = pd.DataFrame(
        {
            "component": ["embeddings", "head", "head", "mlp", "head"],
            "layer": [np.nan, 0, 1, 1, 1],
            "head": [np.nan, 1, 0, np.nan, 1],
            "contribution": [5.0, -0.25, 0.5, 9.0, 1.5],
        }
    )
    data = standalone.view_of(frame).data
    expected = np.array([[np.nan, -0.25], [0.5, 1.5]], dtype=np.float32)
    np.testing.assert_array_equal(tables.decode_column(data, "contribution"), expected)
    assert data["details"][3] == ["component head, contribution 1.5"]


def test_a_table_of_pairs_without_scores_is_refused_clearly():
    pairs = pd.DataFrame({"sender_layer": [0], "sender_head": [0], "receiver_layer": [1], "receiver_head": [0]})
    with pytest.raises(ValueError, match="no numeric column"):
        standalone.view_of(pairs)
    with pytest.raises(ValueError, match="pairs of heads"):
        tables.composition_heads(pd.DataFrame({"layer": [0], "head": [0]}))


def test_the_views_own_words_are_english_unless_it_is_given_others():
    """``strings``: the view's own words in another language (``VIEW_TEXTS``), sent with its data for its script
    and used for what the packing writes (the "more rows" line, the page's title); ``lang``: the page's language."""
    count = tables.DETAIL_ROWS + 5
    frame = pd.DataFrame({"layer": [0] * count, "head": [0] * count, "score": np.arange(count, dtype=float)})
    english = standalone.view_of(frame)
    assert english.data["strings"] == {} and english.title == f"1 layers x 1 heads: {count} rows"
    assert '<html lang="en">' in english.to_html()
    strings = {tables.MORE_ROWS: "(+{count})", tables.TABLE_TITLE: "{layers}/{heads}/{rows}", "(no row)": "(aucune)"}
    view = standalone.view_of(frame, strings=strings, lang="fr")
    assert view.data["strings"] == strings and view.data["details"][0][-1] == "(+5)"
    assert view.title == f"1/1/{count}" and '<html lang="fr">' in view.to_html()


def test_every_word_the_tables_script_shows_is_one_it_can_be_sent():
    """Each text the script passes through ``tr`` is in ``VIEW_TEXTS`` (what a caller translates), and the view's
    labels are not written past it."""
    script = (ROOT / "mha_core" / "views" / "assets" / "tableview" / "tableview.js").read_text(encoding="utf-8")
    used = set(re.findall(r'\btr\("([^"]*)"', script))
    assert used and used <= set(tables.VIEW_TEXTS)
    assert set(tables.VIEW_TEXTS) - used == {tables.MORE_ROWS, tables.TABLE_TITLE, tables.PAIRS_TITLE}  # Python's
    assert not re.search(r'el\("[^"]*", "[^"]*", "[A-Za-z]', script)  # no label written in English past tr
