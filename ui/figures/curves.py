"""Per-layer curves of one measurement: the layer mean as a line, every head as a dot."""

from __future__ import annotations

import plotly.graph_objects as go

from ui.figures.common import axis_title, base_layout, legend_above, plotly_text, with_axis_room


def layer_curves(
    table, value: str, *, series: str | None = None, title: str | None = None, label: str | None = None
) -> go.Figure:
    """One measurement per layer: the layer mean as a line, each head as a dot.

    ``table`` has one row per (layer, head) (as ``mha_core.head_metrics`` returns), with an optional
    ``series`` column (e.g. the model) giving one line each; ``label`` names the measurement in words (else
    the column's name, its underscores as spaces). The title carries the whole label, the y axis its first
    clause; a legend (only for two or more series) has a line of its own under the title.
    """
    label = label or value.replace("_", " ")
    fig = go.Figure()
    groups = [(None, table)] if series is None else list(table.groupby(series, sort=False))
    palette = ["#3b5bdb", "#e8590c", "#2f9e44", "#ae3ec9"]
    for k, (name, part) in enumerate(groups):
        color = palette[k % len(palette)]
        line_name = plotly_text(name) if name is not None else plotly_text(label)
        per_layer = part.groupby("layer")[value].mean()
        fig.add_trace(
            go.Scatter(
                x=part["layer"],
                y=part[value],
                mode="markers",
                name=f"{line_name} (heads)",
                marker=dict(color=color, size=5, opacity=0.35),
                showlegend=False,
                customdata=part["head"],
                hovertemplate="layer %{x} head %{customdata}<br>"
                + f"{axis_title(label, width=200, max_lines=1)} "
                + "%{y:.3f}<extra></extra>",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=per_layer.index,
                y=per_layer.values,
                mode="lines+markers",
                name=line_name,
                line=dict(color=color, width=2),
                hovertemplate="layer %{x} mean %{y:.3f}<extra></extra>",
            )
        )
    # The range ends half a layer past the first and last layers (autorange pads a 30-layer axis to -1..30).
    fig.update_xaxes(title_text="layer", dtick=1, range=[-0.5, float(table["layer"].max()) + 0.5], zeroline=False)
    fig.update_yaxes(title_text=axis_title(label), tickformat=".2~f")
    base_layout(fig, 340, title or label)
    with_axis_room(fig)
    if len(groups) > 1:
        return legend_above(fig)
    fig.update_layout(showlegend=False)  # one line: the title names it
    return fig
