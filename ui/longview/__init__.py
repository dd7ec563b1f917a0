"""The deep-zoom view of a long run: every head of a layer as an overview, one head zoomed down to single tokens.

The server sends, for one layer, every head's overview (pooled during the pass, quantised to a byte a cell
relative to that head's largest cell) and the zoomed region of the chosen head as exact pooled float32
values (``LongRun.attention_overview``: mean or max of the exact weights in each cell) with the cells' token
edges; at token level (a region of at most ``TOKEN_LEVEL`` tokens a side) the cells are single tokens and
their labels are sent too. The browser (``longview.js``, read from this folder: no CDN) draws them; a drag on
the zoomed head, a click on another head, the pan and zoom-out buttons send the wanted region back as the
component's state (``zoom``), and the server answers with that region pooled from exact blocks. The model
view draws every head of every layer at overview level. Tokens are user text: the JavaScript sets them only as
``textContent`` or canvas text, never HTML.

``pack_layer``, ``pack_model`` and ``parse_zoom`` are plain functions (tested on numbers); only ``show`` needs
Streamlit.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mha_core.pooling import REDUCTIONS, bin_edges

HERE = Path(__file__).resolve().parent
LEVELS = 255
ZOOM_SIZE = 128  # cells a side of the zoomed head
TOKEN_LEVEL = 64  # a region this narrow is shown one cell a token, with the tokens' labels
MODEL_SIZE = 32  # cells a side of each head in the model view
VIEWS = ("head", "model")


@dataclass(frozen=True)
class Zoom:
    """What the view shows: a layer, a head and its region ``[r0, r1) x [c0, c1)``, pooled by ``reduce``."""

    layer: int
    head: int
    r0: int
    r1: int
    c0: int
    c1: int
    reduce: str = "mean"
    view: str = "head"

    def link(self) -> str:
        """The address form: ``layer.head.r0-r1.c0-c1``."""
        return f"{self.layer}.{self.head}.{self.r0}-{self.r1}.{self.c0}-{self.c1}"


def whole(layer: int, head: int, n: int, reduce: str = "mean", view: str = "head") -> Zoom:
    return Zoom(layer, head, r0=0, r1=n, c0=0, c1=n, reduce=reduce, view=view)


def checked(zoom: Zoom, num_layers: int, num_heads: int, n: int) -> Zoom:
    """``zoom`` within the run: the layer and head clamped, the region clamped and at least one token wide."""
    layer = min(max(zoom.layer, 0), num_layers - 1)
    head = min(max(zoom.head, 0), num_heads - 1)
    r0 = min(max(zoom.r0, 0), n - 1)
    c0 = min(max(zoom.c0, 0), n - 1)
    r1 = min(max(zoom.r1, r0 + 1), n)
    c1 = min(max(zoom.c1, c0 + 1), n)
    reduce = zoom.reduce if zoom.reduce in REDUCTIONS else "mean"
    view = zoom.view if zoom.view in VIEWS else "head"
    return Zoom(layer, head, r0=r0, r1=r1, c0=c0, c1=c1, reduce=reduce, view=view)


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
            reduce=str(raw.get("reduce", "mean")),
            view=str(raw.get("view", "head")),
        )
    except (KeyError, TypeError, ValueError):
        return None
    if zoom.reduce not in REDUCTIONS or zoom.view not in VIEWS or zoom.r1 <= zoom.r0 or zoom.c1 <= zoom.c0:
        return None
    return zoom


def quantised(values: np.ndarray) -> tuple[str, list[float]]:
    """``[k, a, b]`` non-negative values as base64 bytes, each ``[a, b]`` scaled to its own largest value; and
    those largest values (the browser's colour scale is per image: long rows have tiny weights)."""
    values = np.nan_to_num(np.asarray(values, dtype=np.float32), nan=0.0)
    tops = values.reshape(len(values), -1).max(axis=1)
    scaled = values / np.where(tops > 0, tops, 1.0)[:, None, None]
    raw = np.rint(np.clip(scaled, 0.0, 1.0) * LEVELS).astype(np.uint8).tobytes()
    return base64.b64encode(raw).decode("ascii"), [float(t) for t in tops]


def _sig(run) -> str:
    digest = hashlib.sha1(str((run.model_name, run.num_tokens, run.token_ids[:64], run.token_ids[-64:])).encode())
    return digest.hexdigest()[:16]


def pack_layer(run, zoom: Zoom, text_scale: float = 1.0) -> dict:
    """The head view's data: every head's overview of ``zoom.layer`` and the zoomed region of ``zoom.head``."""
    n = run.num_tokens
    zoom = checked(zoom, run.num_layers, run.num_heads, n)
    overviews = run.overview_mean if zoom.reduce == "mean" else run.overview_max
    grid, grid_tops = quantised(overviews[zoom.layer])
    rows, cols = (zoom.r0, zoom.r1), (zoom.c0, zoom.c1)
    token_level = zoom.r1 - zoom.r0 <= TOKEN_LEVEL and zoom.c1 - zoom.c0 <= TOKEN_LEVEL
    if token_level:
        values = run.attention_block(zoom.layer, zoom.head, rows, cols)
        row_edges, col_edges = np.arange(zoom.r0, zoom.r1 + 1), np.arange(zoom.c0, zoom.c1 + 1)
    else:
        values = run.attention_overview(zoom.layer, zoom.head, ZOOM_SIZE, zoom.reduce, rows=rows, cols=cols)
        row_edges, col_edges = bin_edges_pair(rows, cols)
    return {
        "sig": _sig(run),
        "view": "head",
        "n": n,
        "num_layers": run.num_layers,
        "num_heads": run.num_heads,
        "causal": bool(run.is_causal),
        "layer": zoom.layer,
        "head": zoom.head,
        "reduce": zoom.reduce,
        "region": [zoom.r0, zoom.r1, zoom.c0, zoom.c1],
        "grid": grid,
        "grid_size": int(overviews.shape[-1]),
        "grid_tops": grid_tops,
        "values": base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii"),
        "row_edges": [int(v) for v in row_edges],
        "col_edges": [int(v) for v in col_edges],
        "token_level": bool(token_level),
        "row_tokens": [run.tokens[i] for i in range(zoom.r0, zoom.r1)] if token_level else [],
        "col_tokens": [run.tokens[j] for j in range(zoom.c0, zoom.c1)] if token_level else [],
        "text_scale": float(text_scale),
    }


def bin_edges_pair(rows, cols) -> tuple[np.ndarray, np.ndarray]:
    return bin_edges(*rows, ZOOM_SIZE), bin_edges(*cols, ZOOM_SIZE)


def pack_model(run, zoom: Zoom) -> dict:
    """The model view's data: every head of every layer at ``MODEL_SIZE`` cells a side (exact, pooled)."""
    overviews = run.model_overview(MODEL_SIZE, zoom.reduce)
    layers, heads = overviews.shape[:2]
    grid, tops = quantised(overviews.reshape(layers * heads, *overviews.shape[2:]))
    return {
        "sig": _sig(run),
        "view": "model",
        "n": run.num_tokens,
        "num_layers": layers,
        "num_heads": heads,
        "layer": zoom.layer,
        "head": zoom.head,
        "reduce": zoom.reduce,
        "region": [zoom.r0, zoom.r1, zoom.c0, zoom.c1],
        "grid": grid,
        "grid_size": int(overviews.shape[-1]),
        "grid_tops": tops,
    }


def decode_values(data: dict) -> np.ndarray:
    """The zoomed region's values as the browser decodes them: ``[rows, cols]`` float32."""
    raw = np.frombuffer(base64.b64decode(data["values"]), dtype="<f4")
    return raw.reshape(len(data["row_edges"]) - 1, len(data["col_edges"]) - 1)


_COMPONENT = None


def _component():
    """The registered component (once per process): its HTML, CSS and JS read from this folder."""
    global _COMPONENT
    if _COMPONENT is None:
        import streamlit as st  # streamlit: the view's data packing imports without it

        _COMPONENT = st.components.v2.component(
            "headscope_long_view",
            html='<div class="hs-longview"></div>',
            css=(HERE / "longview.css").read_text(encoding="utf-8"),
            js=(HERE / "longview.js").read_text(encoding="utf-8"),
            isolate_styles=False,  # plain DOM: the browser test reads its data attributes
        )
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
    default.update(reduce=data["reduce"], view=data["view"])
    return _component()(key=key, data=data, default={"zoom": default}, on_zoom_change=zoomed)
