"""Figures of the Deeper page: rollout / flow, weights beside norms, and the neuron view (pure Plotly)."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.figures.common import ATTENTION_COLORSCALE, DIFFERENCE_COLORSCALE, base_layout, plotly_text, with_axis_room


def _labels(tokens) -> list[str]:
    # Positions keep repeated tokens apart on a categorical axis.
    return [f"{i}:{plotly_text(t)}" for i, t in enumerate(tokens)]


def token_matrix(matrix: np.ndarray, tokens, title: str, colorbar: str = "share") -> go.Figure:
    """One ``[n, n]`` matrix, rows = tokens after a layer (or queries), columns = input tokens (or keys)."""
    labels = _labels(tokens)
    fig = go.Figure(
        go.Heatmap(
            z=np.asarray(matrix, dtype=np.float64),
            x=labels,
            y=labels,
            colorscale=ATTENTION_COLORSCALE,
            zmin=0.0,
            colorbar=dict(title=colorbar),
            hovertemplate="%{y} draws on %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    return with_axis_room(base_layout(fig, 460, title))


def weights_and_norms(weights: np.ndarray, norms: np.ndarray, tokens, title: str) -> go.Figure:
    """One head's attention weights (left) beside its norm-based attention ||alpha f(x)|| (right),
    each row scaled to sum to 1 so the two read on the same scale."""
    labels = _labels(tokens)

    def row_shares(matrix):
        matrix = np.asarray(matrix, dtype=np.float64)
        totals = matrix.sum(axis=-1, keepdims=True)
        return np.divide(matrix, totals, out=np.zeros_like(matrix), where=totals > 0)

    fig = make_subplots(rows=1, cols=2, subplot_titles=("weight α", "norm ‖α f(x)‖ (row share)"))
    for col, matrix in ((1, row_shares(weights)), (2, row_shares(norms))):
        fig.add_trace(
            go.Heatmap(
                z=matrix,
                x=labels,
                y=labels,
                colorscale=ATTENTION_COLORSCALE,
                zmin=0.0,
                zmax=1.0,
                showscale=col == 2,
                hovertemplate="%{y} → %{x}: %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_yaxes(autorange="reversed")
    return with_axis_room(base_layout(fig, 460, title))


def neuron_products(tokens, products: np.ndarray, visible: np.ndarray, title: str) -> go.Figure:
    """q * k elementwise, one row per key token, one column per dimension of the head (red +, blue -)."""
    products = np.asarray(products, dtype=np.float64)
    shown = np.where(np.asarray(visible)[:, None], products, np.nan)  # keys the query cannot see: blank
    limit = float(np.nanmax(np.abs(shown))) if np.isfinite(shown).any() else 1.0
    fig = go.Figure(
        go.Heatmap(
            z=shown,
            x=[str(d) for d in range(products.shape[1])],
            y=_labels(tokens),
            colorscale=DIFFERENCE_COLORSCALE[::-1],
            zmin=-limit,
            zmax=limit,
            colorbar=dict(title="q·k term"),
            hovertemplate="key %{y}, dimension %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="dimension of the head")
    return with_axis_room(base_layout(fig, 420, title))


def neuron_scores(tokens, scores: np.ndarray, weights: np.ndarray, visible: np.ndarray, title: str) -> go.Figure:
    """Each key's score (bars, left axis) and its softmax weight (markers, right axis)."""
    labels = _labels(tokens)
    visible = np.asarray(visible, dtype=bool)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(
        go.Bar(x=labels, y=np.where(visible, scores, np.nan), name="score", marker_color="#91a7ff"),
        secondary_y=False,
    )
    fig.add_trace(
        go.Scatter(x=labels, y=np.asarray(weights, dtype=np.float64), name="softmax weight", mode="markers+lines"),
        secondary_y=True,
    )
    fig.update_yaxes(title_text="score", secondary_y=False)
    fig.update_yaxes(title_text="weight", range=[0, 1], tickmode="linear", dtick=0.25, secondary_y=True)
    return with_axis_room(base_layout(fig, 360, title))
