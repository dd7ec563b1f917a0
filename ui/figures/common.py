"""What every figure shares: colours, the base layout, and escaping of user text for Plotly.

Figure builders in ``ui.figures`` are plain functions of arrays and labels returning ``go.Figure``:
they never compute a metric, never touch a model, and import nothing of Streamlit; the same arrays
in give the same figure out. Token labels are user text, so every label goes through ``plotly_text``
(Plotly renders a few HTML tags inside text; escaping ``<``, ``>`` and ``&`` shows them literally).
"""

from __future__ import annotations

import plotly.graph_objects as go

# White at zero so empty attention stays quiet; dark blue at one; most of the range spent below 0.3,
# where most attention weights are.
ATTENTION_COLORSCALE = [
    [0.0, "#ffffff"],
    [0.05, "#dbe4ff"],
    [0.15, "#91a7ff"],
    [0.35, "#4263eb"],
    [0.6, "#2b3a9c"],
    [1.0, "#0b1445"],
]

# Differences of two attention weights: red where the first (left) is larger, blue where the second is.
DIFFERENCE_COLORSCALE = [[0.0, "#1c7ed6"], [0.35, "#a5d8ff"], [0.5, "#ffffff"], [0.65, "#ffc9c9"], [1.0, "#e03131"]]
# A difference map's colours span -1..1, the widest two weights can differ: one colour is one difference on
# every map (a scale fitted to the largest difference painted float32 rounding, 4e-7, as loudly as 0.9).
DIFFERENCE_SCALE = 1.0
MASKED_COLOR = "#e9ecef"  # cells a causal mask hides: grey, clearly unlike a zero weight

SEGMENT_COLOR = "#e8590c"  # the boundary between the first and the second sentence

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
