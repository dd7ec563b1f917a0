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

__all__ = [
    "COLOURS",
    "DEFAULT_REDUCE",
    "MODEL_SIZE",
    "TOKEN_LEVEL",
    "VIEWS",
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

    r0, r1, c0, c1 = data["region"]
    default = {"layer": data["layer"], "head": data["head"], "r0": r0, "r1": r1, "c0": c0, "c1": c1}
    default.update(reduce=data["reduce"], view=data["view"], colour=data["colour"])
    return _component()(key=key, data=data, default={"zoom": default}, on_zoom_change=zoomed)
