"""The joint query-key view of one head (``mha_core.joint_qk``): its queries and keys as points of one plane.

Queries and keys have two marker shapes (a circle, a diamond), so the kind reads without colour; the colour is the
kind, the token's position or its POS tag (``COLOUR_BY``). Each point's ``customdata`` is ``[row, sentence,
position]``: its row in the view's table first, so that a click finds it.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import base_layout, legend_above, plotly_text, with_axis_room

COLOUR_BY = ("kind", "position", "pos")
SYMBOLS = {"query": "circle", "key": "diamond"}
KIND_NAMES = {"query": "queries", "key": "keys"}
KIND_COLOURS = {"query": "#1b6ca8", "key": "#d95f02"}
# Universal POS tags in a fixed order and colours (a tag the list does not name is grey).
POS_COLOURS = {
    "NOUN": "#1f77b4",
    "PROPN": "#17becf",
    "PRON": "#9467bd",
    "VERB": "#d62728",
    "AUX": "#ff7f0e",
    "ADJ": "#2ca02c",
    "ADV": "#bcbd22",
    "ADP": "#8c564b",
    "DET": "#e377c2",
    "CCONJ": "#7f7f7f",
    "SCONJ": "#aec7e8",
    "PART": "#ffbb78",
    "NUM": "#98df8a",
    "PUNCT": "#c5b0d5",
    "INTJ": "#8c6d31",
    "SYM": "#637939",
    "X": "#393b79",
}
NO_TAG = "special / untagged"
UNTAGGED_COLOUR = "#adb5bd"


def point_data(table) -> np.ndarray:
    """``[row, sentence, position]`` of each point of ``table``."""
    return np.column_stack([np.arange(len(table)), table["sentence"], table["position"]]).astype(int)


def _hover(part) -> list[str]:
    """Each point's hover template: its kind and POS tag in words, its token (``text``), sentence and position
    (``customdata``) as fields, so that the app can translate the words (``ui.i18n.translate_figure``)."""
    return [
        f"{kind} %{{text}}" + (f" ({plotly_text(tag)})" if tag else "")
        + "<br>sentence %{customdata[1]}, position %{customdata[2]}<extra></extra>"
        for kind, tag in zip(part["kind"], part["pos"], strict=True)
    ]  # fmt: skip


def joint_qk_figure(
    table, colour_by: str = "kind", axis_titles: tuple[str, str] = ("1", "2"), title: str | None = None
) -> go.Figure:
    """Queries and keys of ``table`` (kind, sentence, position, token, pos, x, y) in one scatter plot, coloured by
    ``colour_by`` (``COLOUR_BY``): by kind, one trace per kind; by position, one trace per kind on one colour
    scale; by POS tag, one trace per tag, the kind in each point's shape."""
    if colour_by not in COLOUR_BY:
        raise ValueError(f"colour_by must be one of {COLOUR_BY}, got {colour_by!r}")
    data = point_data(table)
    fig = go.Figure()
    marker_line = dict(width=0.5, color="#343a40")
    if colour_by == "pos":
        tags = table["pos"].replace("", NO_TAG)
        order = [tag for tag in POS_COLOURS if (tags == tag).any()]
        order += sorted(set(tags) - set(order) - {NO_TAG}) + ([NO_TAG] if (tags == NO_TAG).any() else [])
        groups = [(tag, tags == tag, POS_COLOURS.get(tag, UNTAGGED_COLOUR)) for tag in order]
    else:
        groups = [(KIND_NAMES[kind], table["kind"] == kind, KIND_COLOURS[kind]) for kind in SYMBOLS]
    for name, chosen, colour in groups:
        part = table[chosen.to_numpy()]
        if part.empty:
            continue
        marker = dict(size=8, symbol=[SYMBOLS[kind] for kind in part["kind"]], color=colour, line=marker_line)
        if colour_by == "position":
            marker.update(
                color=part["position"].to_numpy(),
                colorscale="Viridis",
                cmin=0,
                cmax=int(table["position"].max()),
                colorbar=dict(title=dict(text="position"), thickness=12) if name == KIND_NAMES["query"] else None,
            )
        fig.add_trace(
            go.Scatter(
                x=part["x"],
                y=part["y"],
                mode="markers",
                name=plotly_text(name),
                text=[plotly_text(token) for token in part["token"]],
                customdata=data[chosen.to_numpy()],
                hovertemplate=_hover(part),
                marker=marker,
            )
        )
    fig.update_xaxes(title_text=axis_titles[0], zeroline=False)
    fig.update_yaxes(title_text=axis_titles[1], zeroline=False)
    base_layout(fig, 520, title)
    if colour_by == "pos":  # up to 18 tags: a column at the right (rows above the plot would cover the title)
        fig.update_layout(legend=dict(orientation="v", x=1.02, xanchor="left", y=1, yanchor="top"))
        return with_axis_room(fig)
    return legend_above(with_axis_room(fig))
