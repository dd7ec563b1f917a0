"""The joint query-key figure (ui/figures/joint_qk.py): points, shapes by kind, colours by kind, position or POS tag,
and each point's customdata (its row first), checked on the figure's data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from ui.figures.joint_qk import KIND_COLOURS, NO_TAG, POS_COLOURS, SYMBOLS, joint_qk_figure

TABLE = pd.DataFrame(
    {
        "kind": ["query", "query", "query", "key", "key", "key"],
        "sentence": [0, 0, 1, 0, 0, 1],
        "position": [0, 1, 0, 0, 1, 0],
        "token": ["[CLS]", "<b>cat", "dog", "[CLS]", "<b>cat", "dog"],
        "pos": ["", "NOUN", "NOUN", "", "NOUN", "NOUN"],
        "x": [0.5, -1.0, 2.0, 0.25, -0.75, 1.5],
        "y": [1.0, 0.0, -2.0, 0.5, 0.1, -1.0],
    }
)


def points(fig) -> dict[int, tuple]:
    """Every drawn point by its row: (x, y, symbol, colour, trace name)."""
    found = {}
    for trace in fig.data:
        colours = trace.marker.color
        for index, (row, x, y) in enumerate(zip(np.asarray(trace.customdata)[:, 0], trace.x, trace.y)):
            colour = colours[index] if isinstance(colours, (list, tuple, np.ndarray)) else colours
            found[int(row)] = (x, y, trace.marker.symbol[index], colour, trace.name)
    return found


def test_by_kind_two_traces_and_two_shapes():
    fig = joint_qk_figure(TABLE, "kind", ("PC 1", "PC 2"), title="t")
    assert [trace.name for trace in fig.data] == ["queries", "keys"]
    drawn = points(fig)
    assert sorted(drawn) == list(range(6))  # every point once
    for row, (x, y, symbol, colour, _) in drawn.items():
        kind = TABLE["kind"][row]
        assert (x, y) == (TABLE["x"][row], TABLE["y"][row])
        assert symbol == SYMBOLS[kind] and colour == KIND_COLOURS[kind]
    assert SYMBOLS["query"] != SYMBOLS["key"]  # the kind reads without colour
    assert fig.layout.xaxis.title.text == "PC 1" and fig.layout.yaxis.title.text == "PC 2"
    customdata = np.asarray(fig.data[0].customdata)
    assert customdata.tolist() == [[0, 0, 0], [1, 0, 1], [2, 1, 0]]  # row, sentence, position
    assert fig.data[0].text[1] == "&lt;b&gt;cat"  # tokens shown literally
    # The hover's words are in each point's template (the app translates them), the token and numbers in fields.
    assert list(fig.data[0].hovertemplate) == [
        "query %{text}<br>sentence %{customdata[1]}, position %{customdata[2]}<extra></extra>",
        "query %{text} (NOUN)<br>sentence %{customdata[1]}, position %{customdata[2]}<extra></extra>",
        "query %{text} (NOUN)<br>sentence %{customdata[1]}, position %{customdata[2]}<extra></extra>",
    ]


def test_by_position_one_colour_scale():
    fig = joint_qk_figure(TABLE, "position")
    drawn = points(fig)
    for row, (_, _, symbol, colour, _) in drawn.items():
        assert colour == TABLE["position"][row] and symbol == SYMBOLS[TABLE["kind"][row]]
    assert all((trace.marker.cmin, trace.marker.cmax) == (0, 1) for trace in fig.data)
    assert fig.data[0].marker.colorbar.title.text == "position"


def test_by_pos_tag_one_trace_per_tag_shapes_by_kind():
    fig = joint_qk_figure(TABLE, "pos")
    assert [trace.name for trace in fig.data] == ["NOUN", NO_TAG]
    assert fig.layout.legend.orientation == "v" and fig.layout.legend.x > 1  # many tags: a column beside the plot
    drawn = points(fig)
    for row, (_, _, symbol, colour, name) in drawn.items():
        assert symbol == SYMBOLS[TABLE["kind"][row]]
        assert name == (TABLE["pos"][row] or NO_TAG)
        if TABLE["pos"][row]:
            assert colour == POS_COLOURS[TABLE["pos"][row]]


def test_an_unknown_colouring_is_refused():
    with pytest.raises(ValueError, match="colour_by"):
        joint_qk_figure(TABLE, "layer")
