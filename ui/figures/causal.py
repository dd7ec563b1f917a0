"""The Ablate page's figures: a clickable heads map of one score, losses per token before and after an
ablation, an experiment's conditions with their spread, and pruning curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from mha_core.views.palette import SIGNED_COLORSCALE
from ui.figures.common import (
    axis_title,
    base_layout,
    layer_head_axes,
    legend_above,
    plotly_text,
    with_axis_room,
    worded,
)

BEFORE_COLOR, AFTER_COLOR = "#adb5bd", "#e03131"
ORDER_COLORS = {"importance": "#2b3a9c", "reverse": "#e8590c", "random": "#868e96", "given": "#2f9e44"}
# The pruning figure's own words (``pruning_figure(words=...)``).
PRUNING_WORDS = (*(f"{order} order" for order in ORDER_COLORS), "(mean of {count} seeds)")


def head_score_map(
    values: np.ndarray,
    selected: Sequence[tuple[int, int]] = (),
    label: str = "score",
    title: str | None = None,
    signed: bool = False,
) -> go.Figure:
    """Layers x heads coloured by one per-head score ``[L, H]`` (ONE heatmap trace); above it one marker per
    head carries the hover and the click (``customdata[:2]`` = layer, head); selected heads are marked x.
    ``signed``: a diverging scale centred on 0 (red: positive, blue: negative). The hover's words are English: the
    app translates them (``ui.i18n.translate_figure``)."""
    values = np.asarray(values, dtype=np.float64)
    num_layers, num_heads = values.shape
    scale = {"colorscale": SIGNED_COLORSCALE, "zmid": 0.0} if signed else {"colorscale": "Viridis"}
    fig = go.Figure(
        go.Heatmap(
            z=values,
            x=list(range(num_heads)),
            y=list(range(num_layers)),
            hoverinfo="skip",
            **scale,
            xgap=2,
            ygap=2,
            colorbar=dict(title=dict(text=plotly_text(label)), thickness=14),
        )
    )
    layers, heads = np.repeat(np.arange(num_layers), num_heads), np.tile(np.arange(num_heads), num_layers)
    chosen = {(int(layer), int(head)) for layer, head in selected}
    fig.add_trace(
        go.Scatter(
            x=heads.tolist(),
            y=layers.tolist(),
            mode="markers+text",
            text=["x" if (int(l), int(h)) in chosen else "" for l, h in zip(layers, heads)],
            textfont=dict(size=13, color="#ffffff"),
            customdata=[[int(l), int(h), float(v)] for l, h, v in zip(layers, heads, values.reshape(-1))],
            marker=dict(size=10, symbol="square", color="rgba(0, 0, 0, 0)"),
            showlegend=False,
            hovertemplate="layer %{customdata[0]} head "
            "%{customdata[1]}<br>" + plotly_text(label) + " %{customdata[2]:.4g}<extra></extra>",
        )
    )
    layer_head_axes(fig, num_layers, num_heads)
    fig.update_layout(hoverdistance=-1, clickmode="event+select")
    base_layout(fig, int(min(900, max(260, 100 + 22 * num_layers))), title)
    return with_axis_room(fig)


def token_change_bars(
    tokens: Sequence[str],
    after: np.ndarray,
    before: np.ndarray | None = None,
    label: str = "loss",
    title=None,
    positions: Sequence[int] | None = None,
) -> go.Figure:
    """Bars under the tokens, each labelled ``position:token`` with its position in the run (``positions``, as
    the table beside it numbers them; default 0, 1, ...): ``before`` (grey) and ``after`` (red) per token, or one
    series when ``before`` is None (e.g. the output change). NaN (a token without a loss) leaves a gap."""
    positions = range(len(tokens)) if positions is None else positions
    categories = [f"{int(p)}:{plotly_text(t)}" for p, t in zip(positions, tokens)]
    fig = go.Figure()
    if before is not None:
        fig.add_trace(
            go.Bar(x=categories, y=np.asarray(before, dtype=np.float64), name="before", marker_color=BEFORE_COLOR)
        )
    fig.add_trace(
        go.Bar(
            x=categories,
            y=np.asarray(after, dtype=np.float64),
            name="after ablation" if before is not None else label,
            marker_color=AFTER_COLOR,
        )
    )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="token", tickangle=-45, type="category")
    fig.update_yaxes(title_text=axis_title(label))
    base_layout(fig, 340, title)
    return legend_above(with_axis_room(fig))


def condition_bars(
    summary,
    value: str = "loss_repeated_half",
    label: str = "loss",
    title=None,
    *,
    words: Mapping[str, str] | None = None,
) -> go.Figure:
    """One bar per condition (``summary``: condition, ``value``, sd, draws): the mean, with +-1 sd over draws.
    ``words``: each condition's name as shown (missing: as it is; the hover's words: ``ui.i18n.translate_figure``)."""
    say = worded(words)
    fig = go.Figure(
        go.Bar(
            x=[plotly_text(say(c)) for c in summary["condition"]],
            y=summary[value].to_numpy(dtype=np.float64),
            error_y=dict(type="data", array=summary["sd"].to_numpy(dtype=np.float64), visible=True),
            customdata=summary["draws"].to_numpy(),
            marker_color=[
                "#adb5bd" if c == "none" else "#e03131" if "random" not in c else "#868e96"
                for c in summary["condition"]
            ],
            hovertemplate="%{x}<br>mean %{y:.3f}<br>draws %{customdata}<extra></extra>",
        )
    )
    fig.update_yaxes(title_text=axis_title(label))
    base_layout(fig, 320, title)
    return with_axis_room(fig)


def pruning_figure(curves, label: str = "loss", title=None, *, words: Mapping[str, str] | None = None) -> go.Figure:
    """Loss against the fraction of heads removed: one line per order; random orders as their mean over seeds
    with a +-1 sd band. ``words``: the lines' names and the hover's words in the page's language, by their English
    (``PRUNING_WORDS``; missing: English)."""
    say = worded(words)
    fig = go.Figure()
    for order, part in curves.groupby("order", sort=False):
        color = ORDER_COLORS.get(order, "#495057")
        stats = part.groupby("fraction_removed")["loss"].agg(["mean", "std", "count"]).reset_index()
        x = stats["fraction_removed"].to_numpy(dtype=np.float64)
        mean = stats["mean"].to_numpy(dtype=np.float64)
        if (stats["count"] > 1).any():
            sd = stats["std"].fillna(0.0).to_numpy(dtype=np.float64)
            fig.add_trace(
                go.Scatter(
                    x=np.concatenate([x, x[::-1]]),
                    y=np.concatenate([mean + sd, (mean - sd)[::-1]]),
                    fill="toself",
                    fillcolor="rgba(134, 142, 150, 0.25)",
                    line=dict(width=0),
                    hoverinfo="skip",
                    showlegend=False,
                )
            )
        seeds = say("(mean of {count} seeds)").format(count=int(stats["count"].max()))
        name = say(f"{order} order") + (f" {seeds}" if (stats["count"] > 1).any() else "")
        fig.add_trace(
            go.Scatter(
                x=x,
                y=mean,
                mode="lines+markers",
                name=plotly_text(name),
                line=dict(color=color, width=2),
                hovertemplate="%{x:.0%} of heads removed<br>%{y:.3f}<extra></extra>",
            )
        )
    fig.update_xaxes(title_text="fraction of heads removed", tickformat=".0%")
    fig.update_yaxes(title_text=axis_title(label))
    base_layout(fig, 340, title)
    return legend_above(with_axis_room(fig))
