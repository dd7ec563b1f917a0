"""The class's answers to one question, beside the model's (pure Plotly: counts and labels in, a figure out)."""

from __future__ import annotations

import plotly.graph_objects as go

from ui.figures.common import base_layout, legend_above, plotly_text, with_axis_room

CLASS_COLOR = "#4c78a8"
MODEL_COLOR = "#f58518"
CORRECT_COLOR = "#54a24b"


def answers_figure(
    options,
    counts,
    correct: int | None = None,
    model_values=None,
    mine: int | None = None,
    height: int = 300,
) -> go.Figure:
    """One bar per answer: the share of the class that chose it (its count as text). With ``model_values``
    (e.g. the head's attention weights on the tokens offered) a second bar per answer shows the model's value
    on the same 0-1 scale; with ``correct`` (after the reveal) that answer's class bar is green. ``mine``: the
    answer of the student looking, marked in its label."""
    counts = [int(count) for count in counts]
    total = sum(counts)
    labels = [plotly_text(option) + (" (you)" if index == mine else "") for index, option in enumerate(options)]
    # Two answers may read the same (a token twice in a sentence): the axis keeps them apart by position.
    positions = list(range(len(labels)))
    shares = [count / total if total else 0.0 for count in counts]
    colors = [CORRECT_COLOR if index == correct else CLASS_COLOR for index in positions]
    fig = go.Figure(
        go.Bar(
            x=positions,
            y=shares,
            text=[str(count) for count in counts],
            textposition="outside",
            marker_color=colors,
            name=f"class ({total} answer{'s' if total != 1 else ''})",
            hovertemplate="%{customdata}<br>answers: %{text}<extra></extra>",
            customdata=labels,
        )
    )
    if model_values is not None:
        fig.add_bar(
            x=positions,
            y=[float(value) for value in model_values],
            marker_color=MODEL_COLOR,
            name="model (attention weight)",
            hovertemplate="%{customdata}: %{y:.2f}<extra></extra>",
            customdata=labels,
        )
    base_layout(fig, height, None)
    fig.update_xaxes(tickmode="array", tickvals=positions, ticktext=labels)
    fig.update_yaxes(range=[0, 1.15], title_text="share", tickformat=".0%")
    if model_values is None:  # one kind of bar, named by the caption beside it: no legend, no room kept for one
        fig.update_layout(showlegend=False)
        return with_axis_room(fig)
    fig.update_layout(barmode="group", showlegend=True)
    return legend_above(with_axis_room(fig))
