"""How heads work together, drawn: the composition graph (heads as nodes at their layer and head, one edge per
pair of heads whose composition score passes a threshold). Pure Plotly: arrays in, figure out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import base_layout, layer_head_axes, with_axis_room

EDGE_COLOR = "rgba(232, 89, 12, 0.55)"
NODE_COLOR = "#4263eb"


def composition_graph(
    edges: np.ndarray,
    strengths: np.ndarray,
    num_layers: int,
    num_heads: int,
    title: str | None = None,
) -> go.Figure:
    """``edges`` ``[m, 4]`` (sender layer, sender head, receiver layer, receiver head) with ``strengths`` ``[m]``:
    one line trace for the edges (width by strength, in three bands so that one trace a band carries them), and one
    marker trace of every head (``customdata[:2]`` = layer, head: a click opens it), the heads on an edge larger."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 4)
    strengths = np.asarray(strengths, dtype=np.float64).reshape(-1)
    fig = go.Figure()
    if len(edges):
        bands = np.quantile(strengths, [1 / 3, 2 / 3]) if len(edges) >= 3 else [strengths.min()] * 2
        for band, width in enumerate((1.0, 2.5, 4.5)):
            low = -np.inf if band == 0 else bands[band - 1]
            high = np.inf if band == 2 else bands[band]
            chosen = edges[(strengths > low) & (strengths <= high)] if band else edges[strengths <= high]
            xs: list = []
            ys: list = []
            for sender_layer, sender_head, receiver_layer, receiver_head in chosen.tolist():
                xs += [sender_head, receiver_head, None]
                ys += [sender_layer, receiver_layer, None]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    line=dict(color=EDGE_COLOR, width=width),
                    hoverinfo="skip",
                    showlegend=False,
                )
            )
    on_edge = {(int(a), int(b)) for a, b in edges[:, :2].tolist()} | {
        (int(a), int(b)) for a, b in edges[:, 2:].tolist()
    }
    layers, heads = np.repeat(np.arange(num_layers), num_heads), np.tile(np.arange(num_heads), num_layers)
    degree = {}
    for sender_layer, sender_head, receiver_layer, receiver_head in edges.tolist():
        for node in ((sender_layer, sender_head), (receiver_layer, receiver_head)):
            degree[node] = degree.get(node, 0) + 1
    fig.add_trace(
        go.Scatter(
            x=heads.tolist(),
            y=layers.tolist(),
            mode="markers",
            marker=dict(
                size=[11 if (int(l), int(h)) in on_edge else 5 for l, h in zip(layers, heads)],
                color=[NODE_COLOR if (int(l), int(h)) in on_edge else "#ced4da" for l, h in zip(layers, heads)],
            ),
            customdata=[[int(l), int(h), degree.get((int(l), int(h)), 0)] for l, h in zip(layers, heads)],
            hovertemplate="layer %{customdata[0]} head %{customdata[1]}<br>%{customdata[2]} edges<extra></extra>",
            showlegend=False,
        )
    )
    layer_head_axes(fig, num_layers, num_heads)
    fig.update_layout(hoverdistance=-1, clickmode="event+select")
    base_layout(fig, int(min(900, max(300, 100 + 22 * num_layers))), title)
    return with_axis_room(fig)


def edge_list(rows: Sequence[tuple[int, int, int, int]]) -> np.ndarray:
    """Rows of (sender layer, sender head, receiver layer, receiver head) as the ``[m, 4]`` array the graph takes."""
    return np.asarray(list(rows), dtype=np.int64).reshape(-1, 4)
