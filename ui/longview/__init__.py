"""The deep-zoom view of a long run: every head of a layer as an overview, one head zoomed down to single tokens.

The server sends, for one layer, every head's overview (pooled during the pass, quantised to a byte a cell
relative to that head's largest cell, which is sent too) and the zoomed region of the chosen head as exact pooled
float32 values (``LongRun.attention_overview``: max or mean of the exact weights in each cell) with the cells' token
edges; at token level (a region of at most ``TOKEN_LEVEL`` tokens a side) the cells are single tokens and
their labels are sent too. The browser (``mha_core/views/assets/longview/`` with the view kit, read from the package
folder: no CDN) draws them in the app's one colour scale (a weight is the colour the head view and the figures give
it; "Stretch colours" paints each image against its own largest value, and says by how much); a drag on
the zoomed head, a click on another head, the pan and zoom-out buttons send the wanted region back as the
component's state (``zoom``), and the server answers with that region pooled from exact blocks. The model
view draws every head of every layer at overview level. Tokens are user text: the JavaScript sets them only as
``textContent`` or canvas text, never HTML.

``pack_layer``, ``pack_model``, ``checked`` and ``parse_zoom`` are the library's (``mha_core.views.long``: a notebook
sends the same data to the same script); only ``show`` needs Streamlit.
"""

from __future__ import annotations

from mha_core.views.long import (
    COLOURS,
    DEFAULT_REDUCE,
    MODEL_SIZE,
    TOKEN_LEVEL,
    VIEWS,
    ZOOM_SIZE,
    Zoom,
    checked,
    decode_grid,
    decode_values,
    pack_layer,
    pack_model,
    parse_link,
    parse_zoom,
    whole,
)
from ui import viewkit
from ui.i18n import view_words

__all__ = [
    "COLOURS",
    "DEFAULT_REDUCE",
    "MODEL_SIZE",
    "TOKEN_LEVEL",
    "VIEWS",
    "VIEW_TEXTS",
    "ZOOM_SIZE",
    "Zoom",
    "checked",
    "decode_grid",
    "decode_values",
    "pack_layer",
    "pack_model",
    "parse_link",
    "parse_zoom",
    "show",
    "whole",
]

_COMPONENT = None
# The words the view's script shows (longview.js ``s.tr``), sent in the page's language when it is not English.
VIEW_TEXTS = (
    "Model view",
    "Head view",
    "Every head of every layer at overview level",
    "Mean pooling",
    "Max pooling",
    "Pool each cell by the mean of its weights instead of the largest",
    "Stretch colours",
    "Weights' colours",
    "Paint each image against its own largest value",
    "Layer -",
    "The layer before",
    "Layer +",
    "The next layer",
    "Pan to earlier keys",
    "Pan to later keys",
    "Pan to earlier queries",
    "Pan to later queries",
    "Zoom out",
    "Twice the region",
    "Whole head",
    "The whole head",
    "Pooling the exact weights of that region...",
    "zoomed attention head",
    "The zoomed head: arrow keys move between cells, Enter zooms into the cell (at single tokens: reads the row's top "
    "keys), Escape zooms out.",
    "max",
    "mean",
    "weight",
    "cell",
    "query",
    '{noun} {i} "{token}" attends most to {tops}',
    "hidden by the causal mask",
    'query {i} "{token}" -> key {j} "{keyToken}": {shown}',
    "queries {rows}, keys {cols}: {shown}",
    "Single tokens: each cell is one exact weight.",
    "Each cell: the {reduce} of the exact weights of up to {rows} x {cols} tokens.",
    " Colours stretched x{factor}: the darkest is {top}, this view's largest {what}, not 1 (the colour bar's ticks are "
    "the values).",
    " Colours: the weights' one scale, as in the head view (white 0, dark blue 1).",
    " Drag to zoom.",
    "largest cell {top}",
    "; colours stretched x{factor}",
    "head {head}",
    "Layer {layer}, head {head}: the whole head ({about})",
    "Layer {layer}, head {head} (shown): the whole head",
    "Layer {layer}, head {head}: the whole head",
    "Each whole head ({reduce} pooling), its colours stretched to its own largest cell.",
    "Each whole head ({reduce} pooling), on the weights' scale.",
    "Layer {layer}, head {head}: queries {r0}-{r1}, keys {c0}-{c1} of {n} tokens",
    "Layer {layer}, head {head} ({about}): click to zoom",
    "Layer {layer}, head {head}: Enter zooms into it",
    "each head's colours stretched to its own largest cell (hover a head for how much)",
    "on the weights' scale",
    "share of its largest",
    "Every head at overview level ({reduce} of exact weights, {size} x {size} cells, {colours}); click a head to zoom",
)


def _component():
    """The registered component (once per process): its HTML, CSS and JS read from this folder."""
    global _COMPONENT
    if _COMPONENT is None:
        _COMPONENT = viewkit.component("headscope_long_view", "longview", "hs-longview")
    return _COMPONENT


def show(data: dict, key: str, on_zoom=None):
    """Mount the view; ``on_zoom(zoom)`` runs when the visitor zooms, pans or picks a head in it."""

    def zoomed() -> None:
        import streamlit as st  # streamlit: the view's data packing imports without it

        zoom = parse_zoom((st.session_state.get(key) or {}).get("zoom"))
        if on_zoom is not None and zoom is not None:
            on_zoom(zoom)

    data = {**data, "strings": view_words(VIEW_TEXTS)}
    r0, r1, c0, c1 = data["region"]
    default = {"layer": data["layer"], "head": data["head"], "r0": r0, "r1": r1, "c0": c0, "c1": c1}
    default.update(reduce=data["reduce"], view=data["view"], colour=data["colour"])
    return _component()(key=key, data=data, default={"zoom": default}, on_zoom_change=zoomed)
