"""What every figure shares: colours, the base layout, and escaping of user text for Plotly.

Figure builders in ``ui.figures`` are plain functions of arrays and labels returning ``go.Figure``:
they never compute a metric, never touch a model, and import nothing of Streamlit; the same arrays
in give the same figure out. Token labels are user text, so every label goes through ``plotly_text``
(Plotly renders a few HTML tags inside text; escaping ``<``, ``>`` and ``&`` shows them literally).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import plotly.graph_objects as go

# The weights' colours (white at zero so empty attention stays quiet; dark blue at one; most of the range spent
# below 0.3, where most attention weights are), the masked cells' and a pair's boundary: one home with the views
# drawn in the browser and the files the library writes.
from mha_core.views.palette import ATTENTION_COLORSCALE, MASKED_COLOR, SEGMENT_COLOR  # noqa: F401 (re-exported)

# Differences of two attention weights: red where the first (left) is larger, blue where the second is.
# On the fixed scale -1..1 most of the colour is spent near zero (as with the weights): a difference of 0.1
# is pale but visible, 0.4 clear, while float32 rounding (1e-6) stays white.
DIFFERENCE_COLORSCALE = [
    [0.0, "#1864ab"],
    [0.3, "#339af0"],
    [0.45, "#d0ebff"],
    [0.5, "#ffffff"],
    [0.55, "#ffe3e3"],
    [0.7, "#ff6b6b"],
    [1.0, "#c92a2a"],
]
# A difference map's colours span -1..1, the widest two weights can differ: one colour is one difference on
# every map (a scale fitted to the largest difference painted float32 rounding, 4e-7, as loudly as 0.9).
DIFFERENCE_SCALE = 1.0

TOKEN_TICK_LIMIT = 48  # beyond this many tokens per tile, tick labels become unreadable

# A colour bar pinned to the figure's right edge, in a right margin kept free for it. Left to itself,
# Plotly places a colour bar just right of the plot area and then widens the margin to fit it
# (``margin.autoexpand``): a second layout and draw of the whole chart, every time the chart is drawn.
# 90 px hold the bar (12 px), its tick labels and a title of up to about 12 characters above it.
COLORBAR_MARGIN = {"r": 90, "autoexpand": False}


def colorbar_at_right(title: str, thickness: int = 12) -> dict:
    """A vertical colour bar at the figure's right edge (in ``COLORBAR_MARGIN``), 60 % of the plot tall."""
    return dict(
        title=dict(text=plotly_text(title)), thickness=thickness, len=0.6, xref="container", x=1.0, xanchor="right"
    )


# A colour bar above one map, starting at the plot's left edge: a map with square cells is narrower than its chart,
# so a bar pinned to the chart's right edge (``colorbar_at_right``) could sit far from it; the plot's left edge is
# where the map starts, whatever the chart's width. Room above the plot for it (and a title above that).
COLORBAR_ABOVE_ROOM = 58


def colorbar_above(title: str, length: int = 220) -> dict:
    """A horizontal colour bar ``length`` pixels long just above the plot, from its left edge, ticks on top."""
    return dict(
        title=dict(text=plotly_text(title), side="right"),
        orientation="h",
        thickness=10,
        lenmode="pixels",
        len=length,
        x=0.0,
        xref="paper",
        xanchor="left",
        y=1.0,
        yref="paper",
        yanchor="bottom",
        ypad=6,
        ticklabelposition="outside top",
    )


_MINIMAL_TEMPLATE = go.layout.Template(layout={"font": {"family": "sans-serif", "size": 12}})


def plotly_text(text: str) -> str:
    """``text`` as Plotly shows it literally (no tags, no entities interpreted)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def base_layout_dict(height: int, title: str | None) -> dict:
    """The layout every figure starts from, as a plain dict (for builders that make their figure in one go)."""
    layout = dict(
        template=_MINIMAL_TEMPLATE,
        height=height,
        margin=dict(l=10, r=10, t=40 if title else 20, b=10),
        plot_bgcolor="#ffffff",
        paper_bgcolor="#ffffff",
    )
    if title:
        layout["title"] = dict(text=plotly_text(title), x=0.0, font=dict(size=14))
    return layout


def base_layout(fig: go.Figure, height: int, title: str | None) -> go.Figure:
    fig.update_layout(**base_layout_dict(height, title))
    return fig


def with_axis_room(fig: go.Figure) -> go.Figure:
    """Margins wide enough for tick labels and axis titles (the base layout keeps them tight)."""
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    fig.update_layout(margin=dict(l=60, b=50))
    return fig


# Room above the plot for a title's line and a legend's line, each on its own: a legend at y=1.02 inside the
# base layout's 40 px top margin is drawn over the title.
LEGEND_ROOM = 75


def legend_above(fig: go.Figure) -> go.Figure:
    """A horizontal legend between the title (pinned to the figure's top) and the plot. Call after
    ``base_layout`` (which sets the top margin)."""
    fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), margin=dict(t=LEGEND_ROOM))
    if fig.layout.title and fig.layout.title.text:
        fig.update_layout(title=dict(yref="container", y=1.0, yanchor="top", pad=dict(t=10)))
    return fig


AXIS_TITLE_CHARS = 24  # a vertical axis title's line: fits a 340 px chart's plot height, also at 1.6 x text


def axis_title(text: str, width: int = AXIS_TITLE_CHARS, max_lines: int = 3) -> str:
    """``text`` for an axis title: its first clause (up to a comma, colon or parenthesis, in English or Chinese), broken into lines of
    about ``width`` characters (at most ``max_lines``, the last one cut with "…"), escaped for Plotly. A long
    title on one line is cut off at the chart's edge; the chart's own title carries the whole description."""
    text = str(text)
    marks = (",", ":", " (", "，", "：", "（")  # the last three: a Chinese text's comma, colon and parenthesis
    cut = min((i for i in (text.find(mark) for mark in marks) if i > 0), default=len(text))
    short = text[:cut].strip() or text
    lines: list[str] = []
    for word in short.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    if len(lines) > max_lines:
        lines = lines[: max_lines - 1] + [lines[max_lines - 1][: width - 1] + "…"]
    return "<br>".join(plotly_text(line) for line in lines)


def layer_head_axes(fig: go.Figure, num_layers: int, num_heads: int) -> go.Figure:
    """Axes of a layers x heads map: one tick per head and per layer, layer 0 at the top, and ranges that end
    at the outer cells (markers laid over the cells would otherwise pad the ranges with an empty row and column,
    -1 and L, on every side)."""
    fig.update_xaxes(
        title_text="head", dtick=1, range=[-0.5, num_heads - 0.5], showgrid=False, zeroline=False, autorange=False
    )
    fig.update_yaxes(
        title_text="layer", dtick=1, range=[num_layers - 0.5, -0.5], showgrid=False, zeroline=False, autorange=False
    )
    return fig


HIGH_CONTRAST_INK = "#000000"  # the projector theme's text and lines: black on white (21:1)


def high_contrast(fig: go.Figure) -> go.Figure:
    """The projector theme: every text black and bold enough for a washed-out projector, axes drawn in black, grid
    lines dark grey; colours of the data (the one colour scale) are left as they are."""
    fig.update_layout(font=dict(color=HIGH_CONTRAST_INK), title_font=dict(color=HIGH_CONTRAST_INK))
    axis = dict(
        linecolor=HIGH_CONTRAST_INK,
        showline=True,
        linewidth=2,
        tickfont=dict(color=HIGH_CONTRAST_INK),
        title_font=dict(color=HIGH_CONTRAST_INK),
        gridcolor="#6c757d",
    )
    fig.for_each_xaxis(lambda a: a.update(**axis))
    fig.for_each_yaxis(lambda a: a.update(**axis))
    fig.for_each_annotation(lambda note: note.update(font=dict(color=HIGH_CONTRAST_INK)))
    return fig


def enlarge_text(fig: go.Figure, scale: float) -> go.Figure:
    """Every text of a figure ``scale`` times larger (titles, ticks, hover, annotations, colour bars),
    for a projector; sizes a figure left to the default count as 12 px."""
    if scale == 1:
        return fig

    def bigger(font) -> dict:
        return {"size": round((getattr(font, "size", None) or 12) * scale)}

    fig.update_layout(font=bigger(fig.layout.font), hoverlabel=dict(font=dict(size=round(13 * scale))))
    if fig.layout.title and fig.layout.title.text:
        fig.update_layout(title_font=bigger(fig.layout.title.font))
    fig.for_each_xaxis(lambda axis: axis.update(tickfont=bigger(axis.tickfont), title_font=bigger(axis.title.font)))
    fig.for_each_yaxis(lambda axis: axis.update(tickfont=bigger(axis.tickfont), title_font=bigger(axis.title.font)))
    fig.for_each_annotation(lambda note: note.update(font=bigger(note.font)))
    for trace in fig.data:
        colorbar = getattr(trace, "colorbar", None)
        if colorbar is not None and trace.showscale is not False:
            trace.update(colorbar=dict(tickfont=bigger(colorbar.tickfont)))
        textfont = getattr(trace, "textfont", None)
        if textfont is not None and getattr(textfont, "size", None):
            trace.update(textfont=dict(size=round(textfont.size * scale)))
    margin = fig.layout.margin
    fig.update_layout(
        margin=dict(
            l=round((margin.l or 10) * scale),
            r=round((margin.r or 10) * scale),  # a colour bar's room (COLORBAR_MARGIN) grows with its text
            b=round((margin.b or 10) * scale),
            t=round((margin.t or 20) * scale),
        ),
        height=round((fig.layout.height or 400) * min(scale, 1.3)),
    )
    return fig


def worded(words: Mapping[str, str] | None) -> Callable[[str], str]:
    """A figure's fixed word as shown: its entry in ``words`` (the page's language, by the English), else as it is.
    The figures stay pure Plotly: the page gives them their words translated."""
    return lambda word: (words or {}).get(word, word)
