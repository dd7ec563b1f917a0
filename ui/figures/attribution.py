"""What a prediction depends on (issue 33): the input tokens coloured by each method side by side, the methods'
agreement, and the deletion and insertion curves. Arrays and labels in, figure out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import axis_title, base_layout, legend_above, plotly_text, with_axis_room

RANDOM_COLOR = "#7f7f7f"


def row_scaled(values: np.ndarray) -> np.ndarray:
    """A row divided by its largest magnitude (so each method's strongest token is +-1); NaN stays NaN; a row
    of zeros stays zeros."""
    values = np.asarray(values, dtype=np.float64)
    largest = np.nanmax(np.abs(values)) if np.isfinite(values).any() else 0.0
    return values / largest if largest > 0 else np.where(np.isnan(values), np.nan, 0.0)


def token_scores(tokens: Sequence[str], rows: Mapping[str, np.ndarray], title: str | None = None) -> go.Figure:
    """One row per method (or head), one column per input token, each cell coloured by the method's score divided
    by its largest magnitude (red: raises the prediction, blue: lowers it; attention is never negative); the
    token is written in the cell and the raw score is in the hover. ONE heatmap trace; the first row on top."""
    labels = list(rows)
    raw = np.array([np.asarray(rows[label], dtype=np.float64) for label in labels])
    scaled = np.array([row_scaled(row) for row in raw])
    fig = go.Figure(
        go.Heatmap(
            z=scaled,
            x=list(range(len(tokens))),
            y=list(range(len(labels))),
            text=[[plotly_text(token) for token in tokens] for _ in labels],
            texttemplate="%{text}",
            textfont=dict(size=11),
            customdata=raw,
            colorscale="RdBu",
            reversescale=True,
            zmin=-1.0,
            zmax=1.0,
            xgap=2,
            ygap=2,
            colorbar=dict(title=dict(text="score / largest"), thickness=12),
            hovertemplate="%{text}: score %{customdata:.4g} (%{z:.2f} of the row's largest)<extra></extra>",
        )
    )
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(tokens))),
        ticktext=[plotly_text(token) for token in tokens],
        tickangle=-45,
        title=axis_title("input token"),
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(labels))),
        ticktext=[plotly_text(label) for label in labels],
        autorange="reversed",
    )
    base_layout(fig, int(min(900, 140 + 42 * len(labels))), title)
    return with_axis_room(fig)


def agreement_matrix(names: Sequence[str], values: np.ndarray, title: str | None = None) -> go.Figure:
    """Spearman's rank correlation of every pair of methods ``values`` ``[m, m]`` (``names`` their labels), written
    in its cells, on a fixed scale from -1 to 1."""
    names = [plotly_text(name) for name in names]
    values = np.asarray(values, dtype=np.float64)
    fig = go.Figure(
        go.Heatmap(
            z=values,
            x=names,
            y=names,
            text=[["" if np.isnan(v) else f"{v:.2f}" for v in row] for row in values],
            texttemplate="%{text}",
            colorscale="RdBu",
            reversescale=True,
            zmin=-1.0,
            zmax=1.0,
            xgap=2,
            ygap=2,
            colorbar=dict(title=dict(text="Spearman"), thickness=12),
            hovertemplate="%{y} against %{x}: %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(tickangle=-30)
    base_layout(fig, int(min(700, 160 + 46 * len(names))), title)
    return with_axis_room(fig)


def removal_curves(
    lines: Mapping[str, tuple[np.ndarray, np.ndarray]],
    random_label: str | None = None,
    curve: str = "deletion",
    prediction_label: str = "prediction",
    title: str | None = None,
) -> go.Figure:
    """The prediction as tokens are removed (``curve="deletion"``) or added (``"insertion"``) in each method's order:
    ``lines`` ``{label: (share of the tokens, prediction)}``, one line each; the line ``random_label`` (the random
    orders' mean) grey and dashed."""
    fig = go.Figure()
    for label, (shares, values) in lines.items():
        is_random = label == random_label
        fig.add_trace(
            go.Scatter(
                x=np.asarray(shares, dtype=np.float64),
                y=np.asarray(values, dtype=np.float64),
                mode="lines+markers",
                name=plotly_text(label),
                line=dict(dash="dash", color=RANDOM_COLOR) if is_random else None,
                hovertemplate=f"{plotly_text(label)}: %{{x:.0%}} of the tokens, %{{y:.3f}}<extra></extra>",
            )
        )
    verb = "removed" if curve == "deletion" else "added"
    fig.update_xaxes(title=axis_title(f"share of the text's tokens {verb}"), tickformat=".0%", range=[0, 1])
    fig.update_yaxes(title=axis_title(prediction_label))
    base_layout(fig, 380, title)
    return with_axis_room(legend_above(fig))
