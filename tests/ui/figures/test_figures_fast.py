"""The attention figures are built in one unvalidated constructor (fast): every one of them must still be
a figure Plotly accepts with full validation, and carry the numbers it was given."""

from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from ui import figures
from ui.figures.common import COLORBAR_ABOVE_ROOM


def _attention(heads: int, n: int, seed: int = 0) -> np.ndarray:
    weights = np.random.default_rng(seed).random((heads, n, n)).astype(np.float32)
    return weights / weights.sum(-1, keepdims=True)


TOKENS = [f"t<{i}>&" for i in range(20)]  # markup characters: labels are escaped, never markup
PAIR = np.array([0] * 8 + [1] * 12)
BUILDERS = {
    "grid": lambda: figures.head_grid(_attention(12, 20), TOKENS, title="Layer 0: all 12 heads"),
    "grid without colour bar": lambda: figures.head_grid(_attention(12, 20), TOKENS, colorbar=False),
    "grid causal pair": lambda: figures.head_grid(_attention(9, 20), TOKENS, causal=True, segment_ids=PAIR),
    "difference": lambda: figures.difference_map(_attention(12, 20) - _attention(12, 20, 1), TOKENS, title="d"),
    "difference of head averages": lambda: figures.difference_map(
        _attention(1, 20) - _attention(1, 20, 1), TOKENS, title="d", head_averaged=True, causal=True
    ),
    "one head": lambda: figures.head_heatmap(_attention(1, 20)[0], TOKENS, TOKENS, causal=True, segment_ids=PAIR),
    "model": lambda: figures.model_grid(_attention(72, 20).reshape(6, 12, 20, 20), TOKENS, title="All"),
    "model across": lambda: figures.model_grid(_attention(90, 20).reshape(30, 3, 20, 20), TOKENS, causal=True),
    "lines": lambda: figures.attention_lines(_attention(1, 20)[0], TOKENS),
    "lines focus": lambda: figures.attention_lines(_attention(1, 20)[0], TOKENS, focus=3, segment_ids=PAIR),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_attention_figure_passes_plotly_validation_unchanged(name):
    fig = BUILDERS[name]()
    validated = go.Figure(fig.to_dict())  # raises on any property Plotly does not know or accept
    assert json.loads(pio.to_json(validated, engine="json")) == json.loads(pio.to_json(fig, validate=False))


def test_grid_and_one_head_hold_the_weights_and_escaped_labels():
    attention = _attention(12, 20)
    grid = figures.head_grid(attention, TOKENS, columns=4)
    step_y, step_x = 20 + 3, 20 + figures.tile_gap(20)  # head_grid's taller row gaps hold the head labels
    z = np.asarray(grid.data[0].z)
    assert z.shape == (3 * step_y - 3, 4 * step_x - figures.tile_gap(20))
    for head in range(12):
        row, col = divmod(head, 4)
        tile = z[row * step_y : row * step_y + 20, col * step_x : col * step_x + 20]
        np.testing.assert_array_equal(tile, attention[head])
    assert [a.text for a in grid.layout.annotations] == [f"head {h}" for h in range(12)]
    one = figures.head_heatmap(attention[4], TOKENS, TOKENS)
    np.testing.assert_array_equal(np.asarray(one.data[0].z), attention[4])
    assert one.layout.xaxis.title.text == "key (attended to)"
    assert one.layout.yaxis.title.text == "query (attending)"
    assert list(one.layout.xaxis.ticktext) == [f"t&lt;{i}&gt;&amp;" for i in range(20)]


def test_lines_draw_each_querys_two_strongest_keys():
    attention = _attention(1, 20)[0]
    fig = figures.attention_lines(attention, TOKENS)
    pairs = set()
    for trace in fig.data:
        if trace.mode == "lines":
            xs, ys = list(trace.x), list(trace.y)
            pairs |= {(-ys[k], -ys[k + 1]) for k in range(0, len(xs), 3)}
    expected = {(i, int(j)) for i in range(20) for j in np.argsort(-attention[i])[:2] if attention[i, j] >= 0.02}
    assert pairs == expected


def test_the_lines_hover_names_each_token_and_the_focused_querys_weight():
    """The lines view's hovers: words in their templates (translated by the app), the token as the point's text, its
    position and (for keys, with a query in focus) its weight from that query as ``customdata``."""
    attention = _attention(1, 20)[0]
    queries, keys = figures.attention_lines(attention, TOKENS, focus=3).data[-2:]
    assert queries.hovertemplate == "query %{customdata[0]} %{text}<extra></extra>"
    assert keys.hovertemplate == "key %{customdata[0]} %{text}<br>weight (query 3): %{customdata[1]:.4f}<extra></extra>"
    assert list(keys.text) == [f"t&lt;{i}&gt;&amp;" for i in range(20)]
    np.testing.assert_allclose([row[1] for row in keys.customdata], attention[3], rtol=1e-6)
    assert [row[0] for row in keys.customdata] == list(range(20))
    unfocused = figures.attention_lines(attention, TOKENS).data[-1]
    assert unfocused.hovertemplate == "key %{customdata[0]} %{text}<extra></extra>"


def test_colour_bars_sit_in_a_fixed_margin_and_the_grid_can_leave_its_out():
    """A colour bar in a fixed right margin at the figure's edge: Plotly would otherwise widen the margin
    after drawing it (``margin.autoexpand``), a second layout and draw of the chart on every draw."""
    attention = _attention(12, 20)
    fig = figures.head_grid(attention, TOKENS)
    bar = fig.data[0].colorbar
    assert fig.data[0].showscale in (None, True)
    assert (bar.xref, bar.x, bar.xanchor, bar.title.text) == ("container", 1.0, "right", "weight")
    assert fig.layout.margin.autoexpand is False and fig.layout.margin.r == 90
    # One square map is narrower than its chart: its bar lies above the plot from its left edge, in a fixed top
    # margin (no room kept at the right).
    one = figures.head_heatmap(attention[0], TOKENS, TOKENS)
    bar = one.data[0].colorbar
    assert (bar.orientation, bar.xref, bar.x, bar.xanchor, bar.yref, bar.y, bar.yanchor) == (
        "h",
        "paper",
        0.0,
        "left",
        "paper",
        1.0,
        "bottom",
    )
    assert bar.title.text == "weight" and (bar.lenmode, bar.len) == ("pixels", 220)
    assert one.layout.margin.autoexpand is False and one.layout.margin.r == 10
    assert one.layout.margin.t == 30 + COLORBAR_ABOVE_ROOM
    bare = figures.head_grid(attention, TOKENS, colorbar=False)
    assert bare.data[0].showscale is False
    assert bare.layout.margin.autoexpand is False and bare.layout.margin.r == 10
    np.testing.assert_array_equal(
        np.asarray(bare.data[0].z), np.asarray(figures.head_grid(attention, TOKENS).data[0].z)
    )
    # Presentation mode: the bar's text grows, and so does its margin.
    big = figures.enlarge_text(figures.head_grid(attention, TOKENS), 1.6)
    assert big.layout.margin.r == 144 and big.data[0].colorbar.tickfont.size == 19
    big = figures.enlarge_text(figures.head_heatmap(attention[0], TOKENS, TOKENS), 1.6)
    assert big.layout.margin.t == round((30 + COLORBAR_ABOVE_ROOM) * 1.6) and big.data[0].colorbar.tickfont.size == 19


# ---- the canvas head view's data (ui/headview/) -----------------------------------------------------
def test_head_view_data_decodes_to_the_weights_within_half_a_step():
    from ui import headview

    attentions = np.stack([_attention(12, 20, seed) for seed in range(6)])  # [layers, heads, n, n]
    attentions[0, 0, 0, :3] = [0.0, 1.0, 1 / 255 * 0.49]  # both ends and a weight just under half a step
    data = headview.pack(attentions, TOKENS, layer=2, head=7)
    assert json.loads(json.dumps(data)) == data  # plain JSON for the component
    weights = headview.unpack(data)
    assert sorted(weights) == list(range(6)) and data["layers_sent"] == list(range(6))
    for layer in range(6):
        assert weights[layer].shape == (12, 20, 20)
        np.testing.assert_allclose(weights[layer], attentions[layer], rtol=0, atol=0.5 / 255 + 1e-7)
    assert weights[0][0, 0, :3].tolist() == [0.0, 1.0, 0.0]
    assert len(base64.b64decode(data["weights"])) == 6 * 12 * 20 * 20  # one byte a weight
    assert (data["layer"], data["head"], data["tokens"]) == (2, 7, TOKENS)  # tokens as text, unescaped
    assert data["colorscale"] == figures.ATTENTION_COLORSCALE and data["boundary"] is None
    # The signature names the sentence's data: the selection does not change it, another sentence does.
    assert headview.pack(attentions, TOKENS, layer=0, head=0)["sig"] == data["sig"]
    assert headview.pack(attentions[::-1], TOKENS, layer=2, head=7)["sig"] != data["sig"]
    assert headview.pack(attentions, [*TOKENS[:-1], "x"], layer=2, head=7)["sig"] != data["sig"]


def test_head_view_data_sends_one_layer_beyond_its_budget_and_marks_a_pair():
    from ui import headview

    attentions = np.stack([_attention(12, 20, seed) for seed in range(6)])
    data = headview.pack(attentions, TOKENS, layer=4, head=1, causal=True, segment_ids=PAIR, max_cells=12 * 400)
    assert data["layers_sent"] == [4] and list(headview.unpack(data)) == [4]
    np.testing.assert_allclose(headview.unpack(data)[4], attentions[4], rtol=0, atol=0.5 / 255 + 1e-7)
    assert data["causal"] is True and data["boundary"] == 8  # the first token of the second sentence
    # Out-of-range weights (NaN for masked cells in some runs, rounding above 1) stay in the byte range.
    odd = attentions.copy()
    odd[0, 0, 0, :3] = [np.nan, 1.0000001, -1e-9]
    assert headview.unpack(headview.pack(odd, TOKENS, 0, 0))[0][0, 0, :3].tolist() == [0.0, 1.0, 0.0]


def test_a_pick_from_the_browser_is_checked():
    from ui import headview

    good = {"layer": 2, "head": 7, "view": "model", "shape": "lines"}
    assert headview.parse_pick(good) == good
    assert headview.parse_pick({**good, "layer": "3"})["layer"] == 3  # JSON numbers may come back as text
    for bad in (None, {}, "x", {**good, "view": "table"}, {**good, "shape": "<b>"}, {**good, "head": -1}):
        assert headview.parse_pick(bad) is None, bad
    data = headview.pack(np.stack([_attention(12, 20, 0)] * 2), TOKENS, layer=1, head=3, view="model")
    assert data["view"] == "model" and data["layers_sent"] == [0, 1] and data["shape"] == "heatmap"
    with pytest.raises(ValueError):
        headview.pack(np.stack([_attention(12, 20, 0)] * 2), TOKENS, layer=1, head=3, view="table")


def test_difference_maps_use_one_fixed_scale_whatever_their_largest_difference():
    """A rounding-size difference stays white: the scale is -1..1 (the widest two weights can differ), never
    fitted to the largest difference (which painted 4e-7 of float32 rounding as loudly as 0.9)."""
    tiny = (_attention(12, 20) - _attention(12, 20, 1)) * 1e-6
    grid = figures.difference_map(tiny, TOKENS, title="rounding")
    heatmap = grid.data[0]
    assert (heatmap.zmin, heatmap.zmax) == (-1.0, 1.0) and heatmap.colorbar.title.text == "left − right"
    step_y = 20 + 3  # head_grid's row gap: head 4 opens the second row
    np.testing.assert_array_equal(np.asarray(heatmap.z)[step_y : step_y + 20, :20], tiny[4])
    averaged = _attention(1, 20) - _attention(1, 20, 1)
    one = figures.difference_map(averaged, TOKENS, title="models", head_averaged=True)
    assert (one.data[0].zmin, one.data[0].zmax) == (-1.0, 1.0) and len(one.data) == 1  # one tile, no head targets
    np.testing.assert_array_equal(np.asarray(one.data[0].z), averaged[0])
    assert one.layout.xaxis.title.text == "key (attended to)" and one.layout.yaxis.title.text == "query (attending)"


def test_role_colours_are_distinct_for_colour_blind_viewers_and_cells_name_their_group():
    """Every two role groups differ by at least 15 (CIE76 Delta E in Lab; Okabe and Ito's own closest pair is 16
    apart under tritanopia) in normal vision and under simulated protanopia, deuteranopia and tritanopia
    (Machado, Oliveira and Fernandes 2009, severity 1); sink and delimiter, once two greys 25 apart (the same hue, told apart by lightness alone), by far more. And a cell writes its group's name: colour is never
    the only cue."""
    from ui.figures.roles import ROLE_GROUP_COLORS, ROLE_GROUP_LABELS, role_map

    machado = {
        "normal": np.eye(3),
        "protanopia": np.array(
            [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
        ),
        "deuteranopia": np.array(
            [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
        ),
        "tritanopia": np.array(
            [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]]
        ),
    }

    def lab(hex_color, matrix):
        srgb = np.array([int(hex_color[i : i + 2], 16) / 255 for i in (1, 3, 5)])
        linear = np.where(srgb <= 0.04045, srgb / 12.92, ((srgb + 0.055) / 1.055) ** 2.4)
        linear = np.clip(matrix @ linear, 0, 1)
        xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
        xyz /= np.array([0.95047, 1.0, 1.08883])
        f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
        return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])

    groups = list(ROLE_GROUP_COLORS)
    for name, matrix in machado.items():
        points = {group: lab(ROLE_GROUP_COLORS[group], matrix) for group in groups}
        for i, a in enumerate(groups):
            for b in groups[i + 1 :]:
                assert np.linalg.norm(points[a] - points[b]) >= 15, (name, a, b)
    assert (
        np.linalg.norm(lab(ROLE_GROUP_COLORS["sink"], np.eye(3)) - lab(ROLE_GROUP_COLORS["delimiter"], np.eye(3))) > 40
    )
    primary = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1],
            "head": [0, 1, 0, 1],
            "role": ["sink", "delimiter", "syntactic:det:parent", "none"],
            "group": ["sink", "delimiter", "syntactic", "none"],
            "score": [0.8, 0.6, 0.7, np.nan],
            "threshold": [0.5, 0.5, 0.6, np.nan],
            "baseline": [0.1, 0.1, 0.5, np.nan],
            "ci_low": [0.7, 0.5, 0.65, np.nan],
            "ci_high": [0.9, 0.7, 0.75, np.nan],
            "source": ["sentence", "sentence", "corpus", ""],
            "evidence": ["a", "b", "c", ""],
        }
    )
    fig = role_map(primary, 2, 2, ("syntactic", "delimiter", "sink", "none"))
    assert list(fig.data[1].text) == ["sink", "delim", "syn", ""] == [ROLE_GROUP_LABELS[g] for g in primary["group"]]
    # The corpus role alone gets a corner mark, a triangle, in its own cell.
    assert list(fig.data[2].marker.symbol) == ["triangle-up"] and [list(c) for c in fig.data[2].customdata] == [[1, 0]]
