"""The Circuits page's figures: the logit lens as a table of tokens by layer, and attribution patching's estimate
against the exact scores. The layers x heads maps are ``ui.figures.causal.head_score_map``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import axis_title, base_layout, plotly_text, with_axis_room


def logit_lens_table(
    positions: Sequence[str], top_tokens: np.ndarray, probabilities: np.ndarray, title: str | None = None
) -> go.Figure:
    """Layers (rows, the last on top) x positions (columns): each cell the top next token after that layer,
    coloured by its probability. ``top_tokens``/``probabilities``: ``[layers, positions]``; ``positions``:
    each column's label (the input token there)."""
    probabilities = np.asarray(probabilities, dtype=np.float64)
    num_layers, num_positions = probabilities.shape
    fig = go.Figure(
        go.Heatmap(
            z=probabilities,
            x=list(range(num_positions)),
            y=list(range(num_layers)),
            text=[[plotly_text(repr(token)[1:-1]) for token in row] for row in top_tokens],
            texttemplate="%{text}",
            textfont=dict(size=11),
            customdata=[[plotly_text(token) for token in row] for row in top_tokens],
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


def estimate_against_exact(names: Sequence[str], estimate: np.ndarray, exact: np.ndarray, title: str | None = None):
    """Attribution patching's linear estimate (x) against the exact patched score (y) of the same heads: on the
    diagonal where the estimate holds."""
    estimate, exact = np.asarray(estimate, dtype=np.float64), np.asarray(exact, dtype=np.float64)
    low = float(min(0.0, np.nanmin(estimate, initial=0.0), np.nanmin(exact, initial=0.0)))
    high = float(max(1.0, np.nanmax(estimate, initial=1.0), np.nanmax(exact, initial=1.0)))
    fig = go.Figure(
        [
            go.Scatter(
                x=[low, high], y=[low, high], mode="lines", line=dict(color="#adb5bd", dash="dot"), hoverinfo="skip"
            ),
            go.Scatter(
                x=estimate,
                y=exact,
                mode="markers+text",
                text=[plotly_text(name) for name in names],
                textposition="top center",
                marker=dict(size=9, color="#2b3a9c"),
                hovertemplate="%{text}: estimate %{x:.3f}, exact %{y:.3f}<extra></extra>",
            ),
        ]
    )
    fig.update_layout(showlegend=False)
    fig.update_xaxes(title=axis_title("attribution patching (estimate)"))
    fig.update_yaxes(title=axis_title("activation patching (exact)"))
    base_layout(fig, 360, title)
    return with_axis_room(fig)
