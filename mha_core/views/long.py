"""The long document's deep zoom (``assets/longview/``): what it is sent and what it sends back.

For one layer, every head's overview (pooled during the pass, quantised to a byte a cell relative to that head's
largest cell, which is sent too) and the zoomed region of the chosen head as exact pooled float32 values
(``LongRun.attention_overview``: max or mean of the exact weights in each cell) with the cells' token edges; at token
level (a region of at most ``TOKEN_LEVEL`` tokens a side) the cells are single tokens and their labels are sent too
(``pack_layer``); for the model view every head of every layer at overview level (``pack_model``). The browser sends
the wanted region back (``zoom``, checked by ``parse_zoom``) and is answered with that region pooled from exact
blocks: by the app's server (``ui.longview``) or by the notebook's kernel (``mha_core.views.standalone``). Plain
functions, tested on numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from mha_core.pooling import REDUCTIONS, bin_edges
from mha_core.views import packing, palette

ZOOM_SIZE = 128  # cells a side of the zoomed head
TOKEN_LEVEL = 64  # a region this narrow is shown one cell a token, with the tokens' labels
MODEL_SIZE = 32  # cells a side of each head in the model view
VIEWS = ("head", "model")
# A weight's colour: the app's one scale ("absolute": the head view's and the figures' colour of that weight), or
# each image stretched to its own largest value ("stretched", which the view says, with the factor).
COLOURS = ("absolute", "stretched")
# The view opens with max pooling: a cell shows the largest exact weight among its tokens, so one strong link stays
# visible at any zoom. The mean of a whole-document cell is about 1 / n (0.001 at 1,000 tokens), nearly white on
# the weights' scale.
DEFAULT_REDUCE = "max"


@dataclass(frozen=True)
class Zoom:
    """What the view shows: a layer, a head and its region ``[r0, r1) x [c0, c1)``, pooled by ``reduce``, its
    colours on the weights' scale or stretched (``colour``)."""

    layer: int
    head: int
    r0: int
    r1: int
    c0: int
    c1: int
    reduce: str = DEFAULT_REDUCE
    view: str = "head"
    colour: str = "absolute"

    def link(self) -> str:
        """The address form: ``layer.head.r0-r1.c0-c1``."""
        return f"{self.layer}.{self.head}.{self.r0}-{self.r1}.{self.c0}-{self.c1}"


def whole(layer: int, head: int, n: int, reduce: str = DEFAULT_REDUCE, view: str = "head") -> Zoom:
    return Zoom(layer, head, r0=0, r1=n, c0=0, c1=n, reduce=reduce, view=view)


def _span(start: int, stop: int, n: int) -> tuple[int, int]:
    """``[start, stop)`` inside ``[0, n)``, at least one token: cut at the document's ends; a span wholly outside
    the document (or empty) is the whole document."""
    start, stop = max(start, 0), min(stop, n)
    return (start, stop) if start < stop else (0, n)


def checked(zoom: Zoom, num_layers: int, num_heads: int, n: int) -> tuple[Zoom, list[str]]:
    """``zoom`` made one this run can show, and what was changed, in words (for a notice; empty when nothing was):
    the layer and head clamped, the rows and columns cut to the document (a span wholly past its end becomes the
    whole document), an unknown pooling, view or colour replaced by the default."""
    notes = []
    layer = min(max(zoom.layer, 0), num_layers - 1)
    head = min(max(zoom.head, 0), num_heads - 1)
    if layer != zoom.layer:
        notes.append(f"layer {zoom.layer} is not one of this model's (0 to {num_layers - 1}): showing layer {layer}")
    if head != zoom.head:
        notes.append(f"head {zoom.head} is not one of this model's (0 to {num_heads - 1}): showing head {head}")
    r0, r1 = _span(zoom.r0, zoom.r1, n)
    c0, c1 = _span(zoom.c0, zoom.c1, n)
    for what, asked, shown in (("queries", (zoom.r0, zoom.r1), (r0, r1)), ("keys", (zoom.c0, zoom.c1), (c0, c1))):
        if asked != shown:
            notes.append(
                f"{what} {asked[0]}-{asked[1] - 1} are not all in this document of {n:,} tokens (0 to {n - 1}): "
                f"showing {what} {shown[0]}-{shown[1] - 1}"
            )
    reduce = zoom.reduce if zoom.reduce in REDUCTIONS else DEFAULT_REDUCE
    view = zoom.view if zoom.view in VIEWS else "head"
    colour = zoom.colour if zoom.colour in COLOURS else "absolute"
    for what, asked, shown in (
        ("pooling", zoom.reduce, reduce),
        ("view", zoom.view, view),
        ("colour", zoom.colour, colour),
    ):
        if asked != shown:
            notes.append(f"there is no {what} {asked[:20]!r}: showing {shown}")
    return Zoom(layer, head, r0=r0, r1=r1, c0=c0, c1=c1, reduce=reduce, view=view, colour=colour), notes


def parse_link(raw: str) -> Zoom:
    """``Zoom.link``'s text back (``ValueError`` with what it takes otherwise; bounds are checked by ``checked``)."""
    try:
        layer, head, rows, cols = raw.split(".")
        r0, r1 = (int(v) for v in rows.split("-"))
        c0, c1 = (int(v) for v in cols.split("-"))
        return Zoom(int(layer), int(head), r0=r0, r1=r1, c0=c0, c1=c1)
    except (ValueError, AttributeError):
        raise ValueError("layer.head.first-last.first-last (e.g. 3.1.0-512.0-512)") from None


def parse_zoom(raw) -> Zoom | None:
    """The zoom the browser sent (the component's state), or None for anything malformed."""
    try:
        zoom = Zoom(
            int(raw["layer"]),
            int(raw["head"]),
            r0=int(raw["r0"]),
            r1=int(raw["r1"]),
            c0=int(raw["c0"]),
            c1=int(raw["c1"]),
            reduce=str(raw.get("reduce", DEFAULT_REDUCE)),
            view=str(raw.get("view", "head")),
            colour=str(raw.get("colour", "absolute")),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if zoom.reduce not in REDUCTIONS or zoom.view not in VIEWS or zoom.colour not in COLOURS:
        return None
    if zoom.r1 <= zoom.r0 or zoom.c1 <= zoom.c0:
        return None
    return zoom


def _sig(run) -> str:
    digest = hashlib.sha1(str((run.model_name, run.num_tokens, run.token_ids[:64], run.token_ids[-64:])).encode())
    return digest.hexdigest()[:16]


def _grid_data(run, zoom: Zoom, view: str, grid: tuple) -> dict:
    """What both views' data hold: the run's shape, the zoom, and the overview grid (``grid``: its packed bytes,
    each image's largest value, its cells a side)."""
    packed, tops, size = grid
    return {
        "sig": _sig(run),
        "view": view,
        "n": run.num_tokens,
        "num_layers": run.num_layers,
        "num_heads": run.num_heads,
        "causal": bool(run.is_causal),
        "layer": zoom.layer,
        "head": zoom.head,
        "reduce": zoom.reduce,
        "colour": zoom.colour,
        "region": [zoom.r0, zoom.r1, zoom.c0, zoom.c1],
        "grid": packed,
        "grid_size": size,
        "grid_edges": [int(v) for v in bin_edges(0, run.num_tokens, size)],
        "grid_tops": tops,
    }


def pack_layer(run, zoom: Zoom, text_scale: float = 1.0) -> dict:
    """The head view's data: every head's overview of ``zoom.layer`` and the zoomed region of ``zoom.head``
    (``zoom`` as ``checked`` makes it)."""
    n = run.num_tokens
    zoom, _ = checked(zoom, run.num_layers, run.num_heads, n)
    overviews = run.overview_mean if zoom.reduce == "mean" else run.overview_max
    grid, grid_tops = packing.scaled_bytes(overviews[zoom.layer])
    rows, cols = (zoom.r0, zoom.r1), (zoom.c0, zoom.c1)
    token_level = zoom.r1 - zoom.r0 <= TOKEN_LEVEL and zoom.c1 - zoom.c0 <= TOKEN_LEVEL
    if token_level:
        values = run.attention_block(zoom.layer, zoom.head, rows, cols)
        row_edges, col_edges = np.arange(zoom.r0, zoom.r1 + 1), np.arange(zoom.c0, zoom.c1 + 1)
    else:
        values = run.attention_overview(zoom.layer, zoom.head, ZOOM_SIZE, zoom.reduce, rows=rows, cols=cols)
        row_edges, col_edges = bin_edges_pair(rows, cols)
    return {
        **_grid_data(run, zoom, "head", (grid, grid_tops, int(overviews.shape[-1]))),
        "values": packing.float32_base64(values),
        "row_edges": [int(v) for v in row_edges],
        "col_edges": [int(v) for v in col_edges],
        "token_level": bool(token_level),
        "row_tokens": [run.tokens[i] for i in range(zoom.r0, zoom.r1)] if token_level else [],
        "col_tokens": [run.tokens[j] for j in range(zoom.c0, zoom.c1)] if token_level else [],
        "text_scale": float(text_scale),
        **palette.palette(),
    }


def bin_edges_pair(rows, cols) -> tuple[np.ndarray, np.ndarray]:
    return bin_edges(*rows, ZOOM_SIZE), bin_edges(*cols, ZOOM_SIZE)


def pack_model(run, zoom: Zoom) -> dict:
    """The model view's data: every head of every layer at ``MODEL_SIZE`` cells a side (exact, pooled)."""
    zoom, _ = checked(zoom, run.num_layers, run.num_heads, run.num_tokens)
    overviews = run.model_overview(MODEL_SIZE, zoom.reduce)
    layers, heads = overviews.shape[:2]
    grid, tops = packing.scaled_bytes(overviews.reshape(layers * heads, *overviews.shape[2:]))
    return {
        **_grid_data(run, zoom, "model", (grid, tops, int(overviews.shape[-1]))),
        "text_scale": 1.0,
        **palette.palette(),
    }


def decode_values(data: dict) -> np.ndarray:
    """The zoomed region's values as the browser decodes them: ``[rows, cols]`` float32."""
    return packing.float32_decoded(data["values"], (len(data["row_edges"]) - 1, len(data["col_edges"]) - 1))


def decode_grid(data: dict) -> np.ndarray:
    """The overviews as the browser decodes them: ``[images, size, size]`` float32 (byte / 255 * top)."""
    return packing.unscaled(data["grid"], data["grid_tops"], (data["grid_size"], data["grid_size"]))
