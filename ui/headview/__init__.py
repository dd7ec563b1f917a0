"""Explore's head view and model view drawn in the browser: attention heads as canvases, one Streamlit component.

The server sends a sentence's attention once (every layer, quantised to one byte a weight, base64)
with its tokens, the view and the selected layer and head (``mha_core.views.heads.pack``); the component's
JavaScript (``mha_core/views/assets/headview/`` with the view kit, the files ``VIEW_FILES`` lists, read from the
package folder: no CDN) draws the head view (the layer's heads as small canvases and the selected head enlarged) or the
model view (every layer x head), each weight in the app's one colour scale, and switches layers,
heads and views in the browser at once. A switch is also sent back as the component's state (``pick``),
so the server's selection and the link (``?layer=&head=&view=``) follow on a cheap rerun, but the
redraw never waits for it. Tokens are user text: the JavaScript only ever sets them as ``textContent``
or draws them on a canvas, never as HTML.

``pack``, ``unpack`` and ``parse_pick`` are the library's (``mha_core.views.heads``: a saved file and a notebook
send the same data to the same script); only ``show`` draws.
"""

from __future__ import annotations

import streamlit as st

from mha_core.views.heads import ALL_LAYERS_MAX_CELLS, SHAPES, VIEWS, pack, parse_pick, unpack
from mha_core.views.packing import LEVELS
from mha_core.views.standalone import RUN_TITLE
from ui import viewkit
from ui.i18n import view_words

__all__ = ["ALL_LAYERS_MAX_CELLS", "LEVELS", "SHAPES", "VIEWS", "pack", "parse_pick", "show", "unpack"]

_COMPONENT = None
# The words the view's script shows (headview.js ``tr``), sent in the page's language when it is not English.
VIEW_TEXTS = (
    "Head view",
    "Model view",
    "Attention view",
    "Layer",
    "Heatmap",
    "Lines",
    "Show the selected head as",
    "Its lines are drawn below.",
    "PNG of this head",
    "The selected head in words",
    "Every head of every layer at once. Click a head to open it in the head view.",
    "All {layers} layers x {heads} heads",
    "Layer {layer}: all {heads} heads",
    "Layer {layer}, head {head}",
    "Loading layer {layer}...",
    "Loading every layer...",
    # What a screen reader reads: the focused head's rows in words, the live region's announcements, the labels of
    # the heads, cells and tokens, and the model view's row and column headers.
    "query",
    "key",
    "target",
    "source",
    "query (attending)",
    "key (attended to)",
    "target token (attending)",
    "source token (attended to)",
    '{noun} {i} "{token}" attends most to {tops}',
    '{query} {i} "{token}" -> {key} {j} "{keyToken}"',
    "{where}: hidden by the causal mask",
    "Layer {layer}, head {head}: each {query} token and the {key} tokens it attends to most.",
    "({count} more {query} tokens not listed.)",
    "Layer {layer}, head {head} selected. Enter opens it; arrows then move between cells.",
    "Layer {layer}, head {head}.",
    "Layer {layer} head {head}",
    "Layer {layer} head {head}: Enter opens it in the head view",
    "layer {layer} head {head}: {cell}",
    "click to open it in the head view",
    "attention heatmap",
    "weight",
    "The selected head, {rows} {query} rows by {cols} {key} columns: arrow keys move between cells, "
    "Enter reads the row's top tokens and picks the cell, Escape goes back to the heads.",
    " (written by the model: click for the distribution it was drawn from)",
    " (click for the model's prediction at the position before it)",
    "Written token {i}, {token}: show the distribution it was drawn from",
    "Token {i}, {token}: show the model's prediction before it",
    '{query} {i} "{token}" picked: a distribution is shown below the view.',
    "layer {layer}",
    "head {head}",
    RUN_TITLE,  # the page's title when the view is saved as a file
)


def view_strings() -> dict[str, str]:
    """The view's words in the session's language (English: none, the script's own)."""
    return view_words(VIEW_TEXTS)


def _component():
    """The registered component (once per process)."""
    global _COMPONENT
    if _COMPONENT is None:
        _COMPONENT = viewkit.component("headscope_head_view", "headview", "hs-headview")
    return _COMPONENT


def show(data: dict, key: str, on_pick=None):
    """Mount the view; ``on_pick(pick)`` runs when the visitor switches in it (``parse_pick``'s dict)."""

    def picked() -> None:
        pick = parse_pick((st.session_state.get(key) or {}).get("pick"))
        if on_pick is not None and pick is not None:
            on_pick(pick)

    default = {"layer": data["layer"], "head": data["head"], "view": data["view"], "shape": data["shape"]}
    data = {**data, "strings": view_strings()}
    return _component()(key=key, data=data, default={"pick": default}, on_pick_change=picked)
