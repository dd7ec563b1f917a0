"""The lab's live figures: the loss with its phase change, and every head's role score over training steps."""

from __future__ import annotations

import plotly.graph_objects as go

from ui.figures.common import base_layout, legend_above, plotly_text, with_axis_room

LOSS_COLORS = {"loss": "#868e96", "repeated_loss": "#e8590c"}
LOSS_LABELS = {"loss": "loss (all positions)", "repeated_loss": "loss on the repeated positions"}
PHASE_COLOR = "#2f9e44"
HEAD_PALETTE = ["#3b5bdb", "#e8590c", "#2f9e44", "#ae3ec9", "#f08c00", "#1098ad", "#c2255c", "#5c940d"]


def loss_curve(
    history,
    phase_step: int | None = None,
    title: str = "Loss while training",
    phase_text: str = "phase change (step {step})",
) -> go.Figure:
    """Loss and repeated-position loss against the step, one point per scored step; a vertical line at
    ``phase_step`` (the phase change) when there is one, labelled ``phase_text`` (its ``{step}`` filled in).

    ``history`` is the lab's long table (one row per step, head and role); the losses are per step.
    """
    per_step = history.drop_duplicates("step").sort_values("step")
    fig = go.Figure()
    for column in ("loss", "repeated_loss"):
        fig.add_trace(
            go.Scatter(
                x=per_step["step"].to_numpy(),
                y=per_step[column].to_numpy(),
                mode="lines+markers",
                name=LOSS_LABELS[column],
                line=dict(color=LOSS_COLORS[column], width=2),
                marker=dict(size=4),
                hovertemplate="training step %{x}<br>" + LOSS_LABELS[column] + " %{y:.3f}<extra></extra>",
            )
        )
    if phase_step is not None:
        fig.add_vline(x=phase_step, line=dict(color=PHASE_COLOR, width=2, dash="dash"))
        fig.add_annotation(
            x=phase_step,
            y=1,
            yref="paper",
            text=phase_text.format(step=int(phase_step)),
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font=dict(color=PHASE_COLOR),
        )
    fig.update_xaxes(title_text="training step", rangemode="tozero")
    fig.update_yaxes(title_text="cross-entropy (nats)", rangemode="tozero")
    base_layout(fig, 360, title)
    return legend_above(with_axis_room(fig))


def score_curves(
    history, role: str, threshold: float | None = None, title: str | None = None, axis_title: str | None = None
) -> go.Figure:
    """One line per head (``L0H1``...) of its ``role`` score against the step; solid for the head that
    scores highest at the last step, and a dashed line at ``threshold``. ``title`` and ``axis_title`` (the
    score's axis): the role's name by default."""
    part = history[history["role"] == role].sort_values(["layer", "head", "step"])
    last_step = part["step"].max()
    last = part[part["step"] == last_step]
    best = tuple(last.loc[last["score"].idxmax(), ["layer", "head"]]) if len(last) else None
    fig = go.Figure()
    for index, ((layer, head), curve) in enumerate(part.groupby(["layer", "head"], sort=True)):
        leading = best == (layer, head)
        fig.add_trace(
            go.Scatter(
                x=curve["step"].to_numpy(),
                y=curve["score"].to_numpy(),
                mode="lines",
                name=f"L{layer}H{head}",
                line=dict(color=HEAD_PALETTE[index % len(HEAD_PALETTE)], width=3 if leading else 1.5),
                opacity=1.0 if leading else 0.6,
                hovertemplate=f"layer {layer} head {head}<br>training step %{{x}}<br>score %{{y:.3f}}<extra></extra>",
            )
        )
    if threshold is not None:
        fig.add_hline(y=threshold, line=dict(color="#adb5bd", width=1, dash="dot"))
    fig.update_xaxes(title_text="training step", rangemode="tozero")
    fig.update_yaxes(title_text=plotly_text(axis_title or f"{role.replace('_', ' ')} score"), range=[0, 1])
    base_layout(fig, 320, title or f"{role.replace('_', ' ')} score of every head")
    return with_axis_room(fig)
