"""The score decomposition's figure: query-side sources (rows) x key-side sources (columns), each cell that pair's
part of one head's score (``mha_core.ScoreDecomposition.grouped``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

from ui.figures.common import (
    DIFFERENCE_COLORSCALE,
    axis_title,
    base_layout,
    plotly_text,
    with_axis_room,
)


def decomposition_heatmap(
    matrix: np.ndarray, query_sources: Sequence[str], key_sources: Sequence[str], title: str | None = None
) -> go.Figure:
    """``matrix[i, j]``: the part of the score from query source ``i`` meeting key source ``j``. Red adds to the
    score, blue takes from it, on a scale symmetric about 0 fitted to the largest part (the parts of one score are
    compared with each other, not with other scores); every cell's number is written in it."""
    matrix = np.asarray(matrix, dtype=np.float64)
    largest = float(np.abs(matrix).max()) if matrix.size else 0.0
    largest = largest if largest > 0 else 1.0
    rows, columns = [plotly_text(label) for label in query_sources], [plotly_text(label) for label in key_sources]
    fig = go.Figure(
        go.Heatmap(
            z=matrix,
            x=list(range(len(columns))),
            y=list(range(len(rows))),
            text=[[f"{value:+.2f}" for value in row] for row in matrix],
            texttemplate="%{text}",
            textfont=dict(size=10),
            customdata=[[[row, column] for column in columns] for row in rows],
            colorscale=DIFFERENCE_COLORSCALE,
            zmin=-largest,
            zmax=largest,
            xgap=1,
            ygap=1,
            colorbar=dict(title=dict(text="part of the score"), thickness=12),
            hovertemplate="query side: %{customdata[0]}<br>key side: %{customdata[1]}<br>part: %{z:+.3f}<extra></extra>",
        )
    )
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(columns))),
        ticktext=columns,
        tickangle=-45,
        title=axis_title("key-side source", width=60),
    )
    fig.update_yaxes(
        tickmode="array",
        tickvals=list(range(len(rows))),
        ticktext=rows,
        autorange="reversed",
        # No axis title: beside the sources' names (of different lengths) Plotly draws it over the longest ones;
        # the chart's title names the rows (query sources) and the columns (key sources).
    )
    base_layout(fig, int(min(950, max(380, 220 + 30 * len(rows)))), title)
    return with_axis_room(fig)  # room for the sources' names (automatic margins)
