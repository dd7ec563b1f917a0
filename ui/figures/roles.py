"""The Roles page's figures: the layer x head map coloured by role, and the MDS map of heads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import base_layout, layer_head_axes, plotly_text, with_axis_room, worded

# One colour per role group, from Okabe and Ito's palette for colour-blind viewers (sink a neutral grey, "none"
# pale so the heads that do something stand out); the map also writes each group's name in its cells, so nothing
# rests on colour alone.
ROLE_GROUP_COLORS = {
    "syntactic": "#009E73",
    "coreference": "#CC79A7",
    "decoder": "#D55E00",
    "semantic": "#F0E442",
    "positional": "#0072B2",
    "delimiter": "#E69F00",
    "sink": "#5F5F5F",
    "broad": "#56B4E9",
    "none": "#f1f3f5",
}
OTHER_COLOR = "#adb5bd"  # a role group this table does not know yet
# The word a cell shows for its group (short enough for a cell of a 16-head map).
ROLE_GROUP_LABELS = {
    "syntactic": "syn",
    "coreference": "coref",
    "decoder": "dec",
    "semantic": "sem",
    "positional": "pos",
    "delimiter": "delim",
    "sink": "sink",
    "broad": "broad",
    "none": "",
}


def role_group_codes(primary, num_layers: int, num_heads: int, groups: Sequence[str]) -> np.ndarray:
    """``[L, H]`` index into ``groups`` (the last one is "no role") of each head's primary role group."""
    none = len(groups) - 1
    codes = np.full((num_layers, num_heads), none, dtype=np.int64)
    codes[primary["layer"].to_numpy(int), primary["head"].to_numpy(int)] = [
        groups.index(f) if f in groups else none for f in primary["group"]
    ]
    return codes


def discrete_colorscale(colors: list[str]) -> list[list]:
    """Plotly colorscale giving each integer 0..k-1 (with zmin -0.5, zmax k-0.5) one flat colour."""
    k = len(colors)
    scale = []
    for index, color in enumerate(colors):
        scale += [[index / k, color], [(index + 1) / k, color]]
    return scale


def role_map(
    primary,
    num_layers: int,
    num_heads: int,
    groups: Sequence[str],
    title: str | None = None,
    *,
    words: Mapping[str, str] | None = None,
) -> go.Figure:
    """Layers x heads coloured by each head's primary role group (``groups``, most specific first, "no
    role" last), as ONE heatmap trace; above it one invisible marker per head carries the hover (role,
    score with its interval, where the evidence comes from, the evidence) and makes the head clickable
    (``customdata[:2]`` = layer, head) and writes its group's name in the cell (``ROLE_GROUP_LABELS``), so no
    group is told by colour alone. A shape in the cell's corner marks evidence from the corpus profile or from
    random tokens (``SOURCE_SYMBOLS``; none: this sentence). ``words``: the fixed words shown (the groups, the
    cells' names, the hover's) in the page's language, by their English (``HOVER_WORDS``); missing: English."""
    say = worded(words)
    codes = role_group_codes(primary, num_layers, num_heads, groups)
    fig = go.Figure(
        go.Heatmap(
            z=codes,
            x=list(range(num_heads)),
            y=list(range(num_layers)),
            hoverinfo="skip",
            colorscale=discrete_colorscale([ROLE_GROUP_COLORS.get(f, OTHER_COLOR) for f in groups]),
            zmin=-0.5,
            zmax=len(groups) - 0.5,
            xgap=2,
            ygap=2,
            colorbar=dict(
                title=dict(text="role"),
                tickvals=list(range(len(groups))),
                ticktext=[say(group) for group in groups],
                thickness=14,
            ),
        )
    )
    rows = list(primary.itertuples(index=False))
    colors = [ROLE_GROUP_COLORS.get(row.group, OTHER_COLOR) for row in rows]
    fig.add_trace(
        go.Scatter(
            x=[int(row.head) for row in rows],
            y=[int(row.layer) for row in rows],
            mode="markers+text",
            text=[say(ROLE_GROUP_LABELS.get(row.group, str(row.group)[:5])) for row in rows],
            textfont=dict(size=10, color=[text_color(color) for color in colors]),
            customdata=[
                [
                    int(row.layer),
                    int(row.head),
                    plotly_text(row.role),
                    _score_text(row, say),
                    say(SOURCE_WORDS.get(row.source, "")),
                    plotly_text(row.evidence),
                ]
                for row in rows
            ],
            marker=dict(size=8, symbol="square", color="rgba(0, 0, 0, 0)"),
            showlegend=False,
            hovertemplate="layer %{customdata[0]} head %{customdata[1]}<br>"
            "<b>%{customdata[2]}</b><br>%{customdata[3]}<br>%{customdata[4]}<br>%{customdata[5]}<extra></extra>",
        )
    )
    # Where the evidence comes from, as a shape in the cell's corner (a letter read as a role: "s" for sink).
    marked = [row for row in rows if row.source in SOURCE_SYMBOLS]
    fig.add_trace(
        go.Scatter(
            x=[int(row.head) + 0.33 for row in marked],
            y=[int(row.layer) - 0.28 for row in marked],
            mode="markers",
            marker=dict(
                size=7,
                symbol=[SOURCE_SYMBOLS[row.source] for row in marked],
                color="#ffffff",
                line=dict(width=1, color="#212529"),
            ),
            customdata=[[int(row.layer), int(row.head)] for row in marked],
            hoverinfo="none",
            showlegend=False,
        )
    )
    layer_head_axes(fig, num_layers, num_heads)
    fig.update_layout(hoverdistance=-1, clickmode="event+select")
    base_layout(fig, int(min(900, max(260, 100 + 26 * num_layers))), title)
    return with_axis_room(fig)


# Where a role's evidence comes from: a shape in its cell's corner (none for one sentence), words in its hover.
SOURCE_SYMBOLS = {"corpus": "triangle-up", "random tokens": "diamond"}
SOURCE_KEY = "▲ the corpus profile · ◆ repeated random tokens · no mark: this sentence only"
SOURCE_WORDS = {
    "sentence": "from this sentence only",
    "corpus": "from the corpus profile",
    "random tokens": "from repeated random tokens",
}


def text_color(background: str) -> str:
    """Dark text on a light cell, white on a dark one (WCAG relative luminance of the ``#rrggbb`` colour)."""
    channels = [int(background[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    luminance = 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
    return "#212529" if luminance > 0.18 else "#ffffff"


# The fixed words of the roles figures (besides the groups and the cells' names), for ``words``.
HOVER_WORDS = ("score", "threshold", "95% CI", "to", "chance")  # besides the template's: ui.i18n translates those


def _score_text(row, say=None) -> str:
    say = say or worded(None)
    if not np.isfinite(float(row.score)):
        return ""
    text = f"{say('score')} {row.score:.3f} ({say('threshold')} {row.threshold:.3g})"
    if np.isfinite(float(row.ci_low)):
        text += f", {say('95% CI')} {row.ci_low:.3f} {say('to')} {row.ci_high:.3f}"
    if np.isfinite(float(row.baseline)):
        text += f", {say('chance')} {row.baseline:.3f}"
    return text


def head_layout_map(
    table,
    groups: Sequence[str],
    color_by: str = "layer",
    title: str | None = None,
    *,
    words: Mapping[str, str] | None = None,
) -> go.Figure:
    """The classical-MDS map of heads (one point each; ``table``: layer, head, x, y, role, group); coloured
    by layer (one trace) or by role group (one trace per group, so the legend names them).
    ``customdata`` = (layer, head). ``words``: as ``role_map``'s."""
    say = worded(words)
    hover = "layer %{customdata[0]} head %{customdata[1]}<br>%{text}<extra></extra>"
    fig = go.Figure()
    if color_by == "role":
        for group in groups:
            part = table[table["group"] == group]
            if part.empty:
                continue
            fig.add_trace(
                go.Scatter(
                    x=part["x"],
                    y=part["y"],
                    mode="markers",
                    name=say(group),
                    text=[plotly_text(r) for r in part["role"]],
                    customdata=part[["layer", "head"]].to_numpy(),
                    hovertemplate=hover,
                    marker=dict(
                        size=10, color=ROLE_GROUP_COLORS.get(group, OTHER_COLOR), line=dict(width=0.5, color="#343a40")
                    ),
                )
            )
    else:
        fig.add_trace(
            go.Scatter(
                x=table["x"],
                y=table["y"],
                mode="markers",
                text=[plotly_text(r) for r in table["role"]],
                customdata=table[["layer", "head"]].to_numpy(),
                hovertemplate=hover,
                showlegend=False,
                marker=dict(
                    size=10,
                    color=table["layer"],
                    colorscale="Viridis",
                    line=dict(width=0.5, color="#343a40"),
                    colorbar=dict(title=dict(text="layer"), thickness=12),
                ),
            )
        )
    fig.update_xaxes(title_text="MDS 1", zeroline=False)
    fig.update_yaxes(title_text="MDS 2", zeroline=False, scaleanchor="x")
    base_layout(fig, 460, title)
    return with_axis_room(fig)
