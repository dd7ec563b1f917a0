"""Figures of the teaching pages (Positions, Classroom): waves, similarities, small matrices with their numbers.

The numbers come from ``mha_core.positional`` and ``mha_core.walkthrough``; these functions only lay them out.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ui.figures.common import ATTENTION_COLORSCALE, base_layout, plotly_text, with_axis_room

DIVERGING = "RdBu"

MAX_FLOAT64_CELLS = 65_536  # heatmaps with more cells are sent as float32

MAX_WRITTEN_CELLS = 400  # matrices up to this many cells show their numbers in the cells

SCORE_LABELS = {"dot": "dot product", "scaled": "scaled dot product", "cosine": "cosine similarity"}

SCORE_COLORS = {"dot": "#e8590c", "scaled": "#2b3a9c", "cosine": "#2f9e44"}

SCORE_FORMULAS = {
    "dot": r"\mathrm{score}(Q_i, K_i) = Q_i K_i^\top",
    "scaled": r"\mathrm{score}(Q_i, K_i) = \frac{Q_i K_i^\top}{\sqrt{d_k}}",
    "cosine": r"\mathrm{score}(q, k) = \frac{q \cdot k}{\lVert q \rVert \, \lVert k \rVert}",
}


def _payload(values: np.ndarray) -> np.ndarray:
    """Large heatmaps travel as float32 (half the bytes; the hover shows 4 digits anyway)."""
    return values.astype(np.float32) if values.size > MAX_FLOAT64_CELLS else values


def _layout(fig: go.Figure, height: int, title: str) -> go.Figure:
    """The shared layout, with room for axis titles and tick labels (these figures have both)."""
    return with_axis_room(base_layout(fig, height, title))


WAVE_NAME = "dim {channel} ({kind}, period {period})"


def waves_figure(pe: np.ndarray, channels: list[int], wavelengths: np.ndarray, name: str = WAVE_NAME) -> go.Figure:
    """One line per chosen channel: its value over positions (even channels sin, odd channels cos); ``name``: a
    line's legend, its ``{channel}``, ``{kind}`` and ``{period}`` filled in (the app passes it in the page's
    language)."""
    fig = go.Figure()
    positions = np.arange(pe.shape[0])
    for channel in channels:
        kind = "sin" if channel % 2 == 0 else "cos"
        fig.add_trace(
            go.Scatter(
                x=positions,
                y=pe[:, channel],
                mode="lines",
                name=name.format(channel=channel, kind=kind, period=f"{wavelengths[channel]:.3g}"),
                hovertemplate=f"dim {channel}<br>position %{{x}}<br>value %{{y:.4f}}<extra></extra>",
            )
        )
    fig.update_xaxes(title="position")
    fig.update_yaxes(title="PE value", range=[-1.1, 1.1])
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return _layout(fig, 380, "Each dimension is a sine or cosine wave over positions")


def encoding_heatmap(pe: np.ndarray, title: str = "PE[position, dimension]") -> go.Figure:
    """Positions down, dimensions across: fast stripes on the left, slow ones on the right."""
    fig = go.Figure(
        go.Heatmap(
            z=_payload(pe),
            colorscale=DIVERGING,
            zmin=-1,
            zmax=1,
            reversescale=True,
            hovertemplate="position %{y}<br>dimension %{x}<br>value %{z:.4f}<extra></extra>",
        )
    )
    fig.update_xaxes(title="dimension")
    fig.update_yaxes(title="position", autorange="reversed")
    return _layout(fig, 420, title)


def similarity_heatmap(similarity: np.ndarray, title: str, clip_percent: float | None = None) -> go.Figure:
    """Positions x positions coloured by similarity, on square axes fitted to the positions. ``clip_percent``:
    the colour scale spans the ``clip_percent``-th to ``(100 - clip_percent)``-th percentile of the cells off the
    diagonal (a position with itself, its squared length, left out), cells beyond drawn at the ends; the colour
    bar's title says so. None: the whole range."""
    similarity = np.asarray(similarity, dtype=np.float64)
    n = similarity.shape[0]
    scale, label = {}, "similarity"
    if clip_percent is not None and n > 1:
        off_diagonal = similarity[~np.eye(n, dtype=bool)]
        low, high = np.percentile(off_diagonal, [clip_percent, 100 - clip_percent])
        if high > low:
            scale = {"zmin": float(low), "zmax": float(high)}
            label = f"{clip_percent:g}-{100 - clip_percent:g}% of<br>off-diagonal"
    fig = go.Figure(
        go.Heatmap(
            z=_payload(similarity),
            colorscale="Viridis",
            **scale,
            colorbar=dict(title=dict(text=label), thickness=12),
            hovertemplate="position %{y} vs %{x}<br>similarity %{z:.4f}<extra></extra>",
        )
    )
    fig.update_xaxes(title="position", range=[-0.5, n - 0.5], constrain="domain")
    fig.update_yaxes(title="position", range=[n - 0.5, -0.5], scaleanchor="x", constrain="domain")
    return _layout(fig, 380, title)


def similarity_curve(table, title: str, metric: str) -> go.Figure:
    """Mean similarity of two positions against their distance, with the min-max band over pairs."""
    fig = go.Figure(
        [
            go.Scatter(
                x=table["distance"],
                y=table["max"],
                mode="lines",
                line=dict(width=0),
                showlegend=False,
                hoverinfo="skip",
            ),
            go.Scatter(
                x=table["distance"],
                y=table["min"],
                mode="lines",
                line=dict(width=0),
                fill="tonexty",
                fillcolor="rgba(66, 99, 235, 0.15)",
                name="min to max over pairs",
                hoverinfo="skip",
            ),
            go.Scatter(
                x=table["distance"],
                y=table["mean"],
                mode="lines",
                name="mean",
                line=dict(color="#2b3a9c"),
                hovertemplate="distance %{x}<br>mean similarity %{y:.4f}<extra></extra>",
            ),
        ]
    )
    fig.update_xaxes(title="distance |p - q|")
    fig.update_yaxes(title=f"{metric} similarity")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return _layout(fig, 340, title)


def shift_figure(target: np.ndarray, shifted: np.ndarray, p: int, k: int, title: str | None = None) -> go.Figure:
    """PE[p + k] (bars) and PE[p] @ M_k (markers): they coincide. ``title``: default, in English, the two named."""
    dims = np.arange(target.shape[0])
    fig = go.Figure(
        [
            go.Bar(
                x=dims,
                y=target,
                name=f"PE[{p + k}]",
                marker_color="#91a7ff",
                hovertemplate="dimension %{x}<br>%{y:.6f}<extra>PE[p+k]</extra>",
            ),
            go.Scatter(
                x=dims,
                y=shifted,
                mode="markers",
                name=f"PE[{p}] @ M_{k}",
                marker=dict(color="#e8590c", size=7),
                hovertemplate="dimension %{x}<br>%{y:.6f}<extra>PE[p] M_k</extra>",
            ),
        ]
    )
    fig.update_xaxes(title="dimension")
    fig.update_layout(legend=dict(orientation="h", y=-0.25))
    return _layout(fig, 320, title or f"PE[{p} + {k}] and PE[{p}] @ M_{k}, dimension by dimension")


def matrix_figure(
    matrix: np.ndarray,
    title: str,
    row_label: str = "token",
    col_label: str = "dim",
    colorscale=DIVERGING,
    zmid: float | None = 0.0,
    digits: int = 2,
    masked: np.ndarray | None = None,
    row_names: list[str] | None = None,
    col_names: list[str] | None = None,
):
    """A small matrix as a heatmap with its numbers written in the cells (a class can read them).
    Rows and columns are "token 1", "dim 2", ... unless ``row_names`` / ``col_names`` name them (words)."""
    rows, cols = matrix.shape
    text = None
    if rows * cols <= MAX_WRITTEN_CELLS:  # beyond that the numbers are unreadable and only cost payload
        text = np.vectorize(lambda v: f"{v:.{digits}f}")(matrix).astype(object)
        if masked is not None:
            text[masked] = "masked"
    fig = go.Figure(
        go.Heatmap(
            # Large matrices travel as float32 (half the payload); small ones keep every digit a class may check.
            z=matrix if text is not None else matrix.astype(np.float32),
            x=_names(col_names, col_label, cols),
            y=_names(row_names, row_label, rows),
            text=text,
            texttemplate="%{text}" if text is not None else None,
            colorscale=colorscale,
            zmid=zmid,
            showscale=False,
            hovertemplate="%{y}, %{x}: %{z:.6g}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, min(max(180, 34 * rows + 70), 520), title)


def _names(names: list[str] | None, label: str, count: int) -> list[str]:
    """Axis names: the given ones (made unique and shown literally), else "label 1", "label 2", ..."""
    if names is None:
        return [f"{label} {index + 1}" for index in range(count)]
    return [f"{plotly_text(name)}{chr(0x200B) * index}" for index, name in enumerate(names)]


def weights_figure(weights: np.ndarray, keep_mask: np.ndarray, names: list[str] | None = None) -> go.Figure:
    """Every head's softmax weights side by side, one heatmap trace per head; masked cells say so."""
    heads, n, _ = weights.shape
    fig = make_subplots(
        rows=1, cols=heads, subplot_titles=[f"head {h + 1}" for h in range(heads)], horizontal_spacing=0.04
    )
    labels = _names(names, "token", n)
    for h in range(heads):
        text = np.vectorize(lambda v: f"{v:.2f}")(weights[h]).astype(object)
        text[~keep_mask] = ""
        fig.add_trace(
            go.Heatmap(
                z=weights[h],
                x=labels,
                y=labels,
                zmin=0,
                zmax=1,
                colorscale=ATTENTION_COLORSCALE,
                showscale=h == 0,
                text=text,
                texttemplate="%{text}" if n <= 12 else None,
                name=f"head {h + 1}",
                hovertemplate=f"head {h + 1}<br>query %{{y}}<br>key %{{x}}<br>weight %{{z:.6f}}<extra></extra>",
            ),
            row=1,
            col=h + 1,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=h + 1, showticklabels=h == 0)
    return _layout(fig, max(260, 30 * n + 110), "Attention weights A_i = softmax(scores): each row sums to 1")


SATURATION_TOP = 95  # px above the plots: the figure's title, then each subplot's two-line title
SATURATION_TITLES = ["largest weight in a row<br>(1 = one-hot)", "entropy / log(n)<br>(1 = uniform, 0 = one-hot)"]


def saturation_figure(table, n_keys: int) -> go.Figure:
    """Max weight and normalised entropy of softmax against d_k, one line per score function."""
    fig = make_subplots(
        rows=1,
        cols=2,
        # Two short lines each: at a projector's text size one line of each would run past its half of the figure.
        subplot_titles=SATURATION_TITLES,
    )
    for score, group in table.groupby("score", sort=False):
        for col, value in ((1, "max_weight"), (2, "entropy_fraction")):
            fig.add_trace(
                go.Scatter(
                    x=group["d_k"],
                    y=group[value],
                    mode="lines+markers",
                    name=SCORE_LABELS[score],
                    legendgroup=score,
                    showlegend=col == 1,
                    line=dict(color=SCORE_COLORS[score]),
                    hovertemplate=f"{SCORE_LABELS[score]}<br>d_k %{{x}}<br>{value} %{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=col,
            )
    fig.update_xaxes(type="log", title="d_k (dimensions per head)")
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(legend=dict(orientation="h", y=-0.3))
    _layout(fig, 400, f"How peaked softmax gets as d_k grows ({n_keys} keys, random unit-variance q and k)")
    # The title pinned to the top, the subplots' two-line titles below it: room for both, also at 1.6 x text.
    fig.update_layout(margin=dict(t=SATURATION_TOP), title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=8)))
    return fig


def latex_subscript_name(name: str, fallback: str) -> str:
    """A token's name as a LaTeX subscript (``\\text{sat}``), or ``fallback`` (its number) for a name with
    characters LaTeX would read as commands."""
    name = str(name)
    plain = 0 < len(name) <= 24 and all(c.isascii() and (c.isalnum() or c in " .'-") for c in name)
    return rf"\text{{{name}}}" if plain else fallback


def score_cell_latex(
    q_row: np.ndarray,
    k_row: np.ndarray,
    score: str,
    value: float,
    max_terms: int = 6,
    *,
    query: str = "1",
    key: str = "1",
) -> str:
    """One score written out with its numbers: q_query . k_key (over sqrt(d_k)) = value; ``query`` and ``key``
    name the two tokens (LaTeX subscripts: ``latex_subscript_name``)."""
    terms = [rf"({q:.4g})({k:.4g})" for q, k in zip(q_row[:max_terms], k_row[:max_terms])]
    if len(q_row) > max_terms:
        terms.append(r"\dots")
    product = " + ".join(terms)
    q, k = f"q_{{{query}}}", f"k_{{{key}}}"
    if score == "dot":
        return rf"{q} \cdot {k} = {product} = {value:.6g}"
    if score == "scaled":
        root = rf"\sqrt{{{len(q_row)}}}"
        return rf"\frac{{{q} \cdot {k}}}{{{root}}} = \frac{{{product}}}{{{root}}} = {value:.6g}"
    norms = rf"\lVert {q} \rVert \lVert {k} \rVert"
    return rf"\frac{{{q} \cdot {k}}}{{{norms}}} = \frac{{{product}}}{{{norms}}} = {value:.6g}"


def matmul_total_latex(counts, total: int) -> str:
    """The matrix-product counts as a sum, e.g. ``768 + 128 + 128 + 256 = 1280``."""
    terms = " + ".join(str(int(c)) for c in counts.loc[counts["kind"] == "matmul", "multiplications"])
    return rf"\text{{matrix products: }} {terms} = {total}"
