"""The head view's pick as the browser sends it (``mha_core.views.heads.parse_pick``): a picked cell of the enlarged
head comes back as its (query, key); anything else about a cell is left out, never an error."""

from __future__ import annotations

import numpy as np
import pytest

from mha_core.views.heads import pack, parse_pick

HEAD = {"layer": 2, "head": 7, "view": "head", "shape": "heatmap"}


def test_a_picked_cell_comes_back_as_query_and_key():
    assert parse_pick({**HEAD, "query": 5, "key": 1, "n": 3}) == {**HEAD, "cell": (5, 1)}
    assert parse_pick({**HEAD, "query": "4", "key": 0}) == {**HEAD, "cell": (4, 0)}  # JSON numbers as text
    assert parse_pick(HEAD) == HEAD  # a head, a layer or a view switched: no cell


def test_a_cell_that_is_not_two_positions_is_left_out():
    for bad in ({"query": -1, "key": 2}, {"query": 1}, {"query": "x", "key": 2}, {"query": None, "key": 2}):
        assert parse_pick({**HEAD, **bad}) == HEAD, bad
    assert parse_pick({"query": 1, "key": 2}) is None  # no head: no pick at all


def test_a_picked_written_token_comes_back_as_its_row():
    assert parse_pick({**HEAD, "token": 6, "n": 2}) == {**HEAD, "token": 6}
    assert parse_pick({**HEAD, "token": "3"}) == {**HEAD, "token": 3}  # JSON numbers as text
    for bad in (-1, "x", None):
        assert parse_pick({**HEAD, "token": bad}) == HEAD, bad


def test_the_written_rows_are_sent_sorted_and_checked():
    attentions = np.full((1, 2, 4, 4), 0.25, dtype=np.float32)
    tokens = ["a", "b", "\u25b8c", "\u25b8d"]
    data = pack(attentions, tokens, 0, 0, causal=True, written=(3, 2, 3))
    assert data["written"] == [2, 3]
    assert pack(attentions, tokens, 0, 0, causal=True)["written"] == []
    assert data["sig"] != pack(attentions, tokens, 0, 0, causal=True)["sig"]  # the browser lays the labels out again
    with pytest.raises(ValueError, match="not rows"):
        pack(attentions, tokens, 0, 0, written=[4])
