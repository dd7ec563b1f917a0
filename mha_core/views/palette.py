"""The colours of attention, one home for every view: the app's Plotly figures (``ui/figures``), the views drawn in
the browser (``mha_core/views/assets``) and the files and notebook views written from the library. A weight in
[0, 1] is one colour everywhere."""

from __future__ import annotations

# The weights' colour scale, white (0) to dark blue (1), as Plotly's ``colorscale`` stops.
ATTENTION_COLORSCALE = [
    [0.0, "#ffffff"],
    [0.05, "#dbe4ff"],
    [0.15, "#91a7ff"],
    [0.35, "#4263eb"],
    [0.6, "#2b3a9c"],
    [1.0, "#0b1445"],
]

# A signed score (patching and attribution effects, a logit difference): blue below zero, white at zero, red above
# (ColorBrewer's RdBu reversed, Plotly's "RdBu" with ``reversescale``), as Plotly's stops on [-m, m].
SIGNED_COLORSCALE = [
    [0.0, "#053061"],
    [0.1, "#2166ac"],
    [0.2, "#4393c3"],
    [0.3, "#92c5de"],
    [0.4, "#d1e5f0"],
    [0.5, "#f7f7f7"],
    [0.6, "#fddbc7"],
    [0.7, "#f4a582"],
    [0.8, "#d6604d"],
    [0.9, "#b2182b"],
    [1.0, "#67001f"],
]

MASKED_COLOR = "#e9ecef"  # cells a causal mask hides: grey, clearly unlike a zero weight

SEGMENT_COLOR = "#e8590c"  # the boundary between the first and the second sentence


def palette() -> dict:
    """The colours every view paints with, as its data carries them: the weights' colour scale, signed scores' scale,
    the colour of cells a causal mask hides, a sentence pair's boundary."""
    return {
        "colorscale": ATTENTION_COLORSCALE,
        "signed_colorscale": SIGNED_COLORSCALE,
        "masked_color": MASKED_COLOR,
        "segment_color": SEGMENT_COLOR,
    }
