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

MASKED_COLOR = "#e9ecef"  # cells a causal mask hides: grey, clearly unlike a zero weight

SEGMENT_COLOR = "#e8590c"  # the boundary between the first and the second sentence


def palette() -> dict:
    """The colours every view paints with, as its data carries them: the weights' colour scale, the colour of cells a
    causal mask hides, a sentence pair's boundary."""
    return {"colorscale": ATTENTION_COLORSCALE, "masked_color": MASKED_COLOR, "segment_color": SEGMENT_COLOR}
