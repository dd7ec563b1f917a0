"""The Circuits page's figures: the logit lens as a table of tokens by layer, and attribution patching's estimate
against the exact scores. The layers x heads maps are ``ui.figures.causal.head_score_map``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import axis_title, base_layout, plotly_text, with_axis_room


def logit_lens_table(
    positions: Sequence[str],
    shown: np.ndarray,
    probabilities: np.ndarray,
    title: str | None = None,
    decoded: np.ndarray | None = None,
) -> go.Figure:
    """Layers (rows, the last on top) x positions (columns): each cell the top next token after that layer,
    coloured by its probability. ``shown``/``probabilities``: ``[layers, positions]``, the tokens as the head
    view shows them (white space as symbols: a cell is never empty); ``decoded``: the tokens' text, quoted in
    the hover (so " Paris" shows its space); ``positions``: each column's label (the input token there)."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    num_layers, num_positions = probabilities.shape
    decoded = shown if decoded is None else decoded
    fig = go.Figure(
        go.Heatmap(
            z=probabilities,
            x=list(range(num_positions)),
            y=list(range(num_layers)),
            text=[[plotly_text(token) for token in row] for row in shown],
            texttemplate="%{text}",
            textfont=dict(size=11),
            customdata=[[plotly_text(repr(str(token))) for token in row] for row in decoded],
            colorscale="Blues",
            zmin=0.0,
            zmax=1.0,
            xgap=1,
            ygap=1,
            colorbar=dict(title=dict(text="p(top token)"), thickness=12),
            hovertemplate="after layer %{y}, predicting after token %{x}:<br>%{customdata} p = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(range(num_positions)),
        ticktext=[plotly_text(label) for label in positions],
        tickangle=-45,
        title=axis_title("input token (the cell is the next token predicted after it)"),
    )
    fig.update_yaxes(title=axis_title("after layer"), dtick=max(1, num_layers // 15))
    base_layout(fig, int(min(1100, max(320, 120 + 24 * num_layers))), title)
    return with_axis_room(fig)


# Where estimate_against_exact puts its labels: in a plot area at least this many pixels a side (the chart's
# height less its margins; its width in a half-page column of the wide layout, at least), a label of
# LABEL_CHAR_WIDTH pixels a character and LABEL_HEIGHT tall, kept LABEL_CLEARANCE from every marker.
SCATTER_HEIGHT = 400
PLOT_SIZE = (420, 300)
LABEL_CHAR_WIDTH, LABEL_HEIGHT, LABEL_CLEARANCE = 7.0, 14.0, 6.0
LABEL_DISTANCES = (14, 24, 36, 50, 66, 84, 104, 126)  # pixels from the point, tried nearest first
LABEL_ANGLES = np.deg2rad([90, 270, 0, 180, 45, 135, 315, 225, 20, 160, 340, 200, 67, 113, 247, 293])


def label_boxes(points: np.ndarray, offsets: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """``[n, 4]`` (left, top, right, bottom) of each label in pixels: centred at its point plus its offset."""
    half_width = np.array([LABEL_CHAR_WIDTH * len(name) / 2 + 2 for name in names])
    centres = points + offsets
    return np.stack(
        [
            centres[:, 0] - half_width,
            centres[:, 1] - LABEL_HEIGHT / 2,
            centres[:, 0] + half_width,
            centres[:, 1] + LABEL_HEIGHT / 2,
        ],
        axis=1,
    )


def _overlap(box: np.ndarray, boxes: np.ndarray) -> float:
    if not len(boxes):
        return 0.0
    width = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    height = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    return float((width * height).sum())


def scatter_pixels(x: np.ndarray, y: np.ndarray, low: float, high: float) -> np.ndarray:
    """``[n, 2]`` pixel positions (y down) of data points on square axes ``low..high`` in a ``PLOT_SIZE`` area."""
    span = (high - low) or 1.0
    width, height = PLOT_SIZE
    return np.stack([(x - low) / span * width, (1 - (y - low) / span) * height], axis=1)


def label_offsets(points: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """``[n, 2]`` pixel offsets (x right, y down) of each point's label from the point: for each point in turn,
    the nearest place (``LABEL_DISTANCES`` x ``LABEL_ANGLES``) where its label overlaps no label placed before
    it, no marker and stays in the plot; where none is free, the place of least overlap."""
    width, height = PLOT_SIZE
    markers = np.concatenate([points - LABEL_CLEARANCE, points + LABEL_CLEARANCE], axis=1)
    offsets = np.zeros((len(points), 2))
    placed: list[np.ndarray] = []
    candidates = np.array([[d * np.cos(a), -d * np.sin(a)] for d in LABEL_DISTANCES for a in LABEL_ANGLES])
    for index in range(len(points)):
        best, best_cost = candidates[0], np.inf
        for offset in candidates:
            box = label_boxes(points[index : index + 1], offset[None], [names[index]])[0]
            outside = max(0.0, -box[0]) + max(0.0, box[2] - width) + max(0.0, -box[1]) + max(0.0, box[3] - height)
            cost = _overlap(box, np.array(placed).reshape(-1, 4)) + _overlap(box, markers) + 100 * outside
            if cost < best_cost:
                best, best_cost = offset, cost
            if cost == 0:
                break
        offsets[index] = best
        placed.append(label_boxes(points[index : index + 1], best[None], [names[index]])[0])
    return offsets


def estimate_against_exact(names: Sequence[str], estimate: np.ndarray, exact: np.ndarray, title: str | None = None):
    """Attribution patching's linear estimate (x) against the exact patched score (y) of the same heads: on the
    diagonal where the estimate holds. Each head's name is a label joined to its point by a line, placed where it
    overlaps no other label and no point (``label_offsets``), in the order of the largest exact score first."""
    estimate, exact = np.asarray(estimate, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    low = float(min(0.0, np.nanmin(estimate, initial=0.0), np.nanmin(exact, initial=0.0)))
    high = float(max(1.0, np.nanmax(estimate, initial=1.0), np.nanmax(exact, initial=1.0)))
    pad = 0.05 * (high - low)
    low, high = low - pad, high + pad
    order = np.argsort(-np.abs(np.nan_to_num(exact)), kind="stable")
    offsets = np.zeros((len(names), 2))
    if len(names):
        offsets[order] = label_offsets(
            scatter_pixels(estimate[order], exact[order], low, high), [names[i] for i in order]
        )
    fig = go.Figure(
        [
            go.Scatter(
                x=[low, high], y=[low, high], mode="lines", line=dict(color="#adb5bd", dash="dot"), hoverinfo="skip"
            ),
            go.Scatter(
                x=estimate,
                y=exact,
                mode="markers",
                customdata=[plotly_text(name) for name in names],
                marker=dict(size=9, color="#2b3a9c"),
                hovertemplate="%{customdata}: estimate %{x:.3f}, exact %{y:.3f}<extra></extra>",
            ),
        ]
    )
    for name, x, y, (dx, dy) in zip(names, estimate, exact, offsets):
        fig.add_annotation(
            x=x,
            y=y,
            ax=float(dx),
            ay=float(dy),
            text=plotly_text(name),
            showarrow=True,
            arrowhead=0,
            arrowwidth=1,
            arrowcolor="#868e96",
            standoff=5,
            font=dict(size=11, color="#212529"),
        )
    fig.update_layout(showlegend=False)
    fig.update_xaxes(title=axis_title("attribution patching (estimate)"), range=[low, high], constrain="domain")
    fig.update_yaxes(title=axis_title("activation patching (exact)"), range=[low, high])
    base_layout(fig, SCATTER_HEIGHT, title)
    return with_axis_room(fig)
