"""Charts that fit their box: axis ranges that end at the outer cells, titles apart from legends, axis titles
short enough not to be cut, column names never shown raw (each decided by a number in the figure's data)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mha_core.analysis.metrics import METRIC_DESCRIPTIONS
from ui import figures
from ui.figures.causal import head_score_map, pruning_figure, token_change_bars
from ui.figures.common import AXIS_TITLE_CHARS, LEGEND_ROOM, axis_title
from ui.figures.roles import role_map


def per_head_table(num_layers: int, num_heads: int, value: str, series: str | None = None) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    table = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(num_layers), num_heads),
            "head": np.tile(np.arange(num_heads), num_layers),
            value: rng.random(num_layers * num_heads),
        }
    )
    return table.assign(series=series) if series else table


@pytest.mark.parametrize("shape", [(30, 9), (6, 12)])
def test_layer_head_maps_end_at_their_outer_cells(shape):
    """SmolLM2's maps had an empty row -1 and 30 (markers over the cells padded the autorange)."""
    num_layers, num_heads = shape
    primary = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(num_layers), num_heads),
            "head": np.tile(np.arange(num_heads), num_layers),
            "group": "sink",
            "role": "sink",
            "source": "sentence",
            "evidence": "",
            "score": np.nan,
            "threshold": np.nan,
            "ci_low": np.nan,
            "ci_high": np.nan,
            "baseline": np.nan,
        }
    )
    for fig in (
        role_map(primary, num_layers, num_heads, ["sink", "none"]),
        head_score_map(np.zeros((num_layers, num_heads))),
    ):
        assert list(fig.layout.yaxis.range) == [num_layers - 0.5, -0.5]  # layer 0 on top, nothing beyond
        assert list(fig.layout.xaxis.range) == [-0.5, num_heads - 0.5]
        assert fig.layout.yaxis.autorange is False and fig.layout.xaxis.autorange is False


def test_per_layer_curves_keep_title_legend_and_axis_title_apart():
    label = METRIC_DESCRIPTIONS["normalized_entropy"]
    both = pd.concat(
        [per_head_table(6, 12, "normalized_entropy", "A"), per_head_table(30, 9, "normalized_entropy", "B")]
    )
    fig = figures.layer_curves(both, "normalized_entropy", series="series", label=label, title=f"Per layer: {label}")
    # Two series: the legend sits above the plot (y > 1), the title at the figure's top, with room for both.
    assert fig.layout.legend.y > 1 and fig.layout.legend.yanchor == "bottom" and fig.layout.margin.t == LEGEND_ROOM
    assert fig.layout.title.yref == "container" and fig.layout.title.y == 1 and fig.layout.title.yanchor == "top"
    assert [t.name for t in fig.data if t.showlegend is not False] == ["A", "B"]
    # The y title is the label's first clause on short lines (a 340 px chart cut the whole 80-character label).
    assert fig.layout.yaxis.title.text == "spread of attention"
    assert list(fig.layout.xaxis.range) == [-0.5, 29.5]  # the last layer and no empty layer 30
    # One series: no legend (the title names it).
    one = figures.layer_curves(per_head_table(6, 12, "sink_mass"), "sink_mass", label=METRIC_DESCRIPTIONS["sink_mass"])
    assert one.layout.showlegend is False and one.layout.title.text.startswith("attention on positions of no content")
    assert one.layout.yaxis.title.text == "attention on positions<br>of no content"
    # A column without a label in words is never shown with its underscores.
    raw = figures.layer_curves(per_head_table(6, 12, "distance_to_layer"), "distance_to_layer")
    for text in (raw.layout.title.text, raw.layout.yaxis.title.text, raw.data[0].hovertemplate):
        assert "distance_to_layer" not in text


@pytest.mark.parametrize("name", list(METRIC_DESCRIPTIONS))
def test_axis_titles_of_every_measurement_fit(name):
    lines = axis_title(METRIC_DESCRIPTIONS[name]).split("<br>")
    assert 1 <= len(lines) <= 3 and all(len(line) <= AXIS_TITLE_CHARS for line in lines), lines


def test_bar_and_pruning_legends_sit_apart_from_their_titles():
    bars = token_change_bars(["a", "b"], np.array([1.0, 2.0]), np.array([0.5, 1.0]), title="Loss per token")
    curves = pd.DataFrame({"order": ["importance"] * 2, "fraction_removed": [0.0, 0.5], "loss": [1.0, 2.0]})
    pruning = pruning_figure(curves, title="Pruning")
    for fig in (bars, pruning):
        assert fig.layout.legend.y > 1 and fig.layout.margin.t == LEGEND_ROOM and fig.layout.title.yref == "container"
