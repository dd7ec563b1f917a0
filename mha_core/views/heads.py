"""The head view's data (the head view, the model view and cross-attention, ``assets/headview/``): a sentence's
attention packed once, every layer at one byte a weight, with its tokens, the view and the selected layer and head;
and what the browser sends back (``pick``). Plain functions of arrays, tested on numbers; the app's component
(``ui.headview``), the saved files and the notebook widgets (``mha_core.views.standalone``) send this same data to the
same script."""

from __future__ import annotations

import hashlib

import numpy as np

from mha_core.views import packing, palette
from mha_core.views.packing import LEVELS

# Every layer is sent when the whole sentence fits in this many cells (bytes); beyond, only the shown
# layer (the in-browser layer slider then asks the server for the next one). MiniLM at 128 tokens is
# 1.18 M cells (1.6 MB of base64), about what the Plotly head view of one layer sent.
ALL_LAYERS_MAX_CELLS = 1_300_000
VIEWS = ("head", "model")
SHAPES = ("heatmap", "lines")


def pack(
    attentions: np.ndarray,
    tokens: list[str],
    layer: int,
    head: int,
    *,
    causal: bool = False,
    segment_ids: np.ndarray | None = None,
    shape: str = "heatmap",
    text_scale: float = 1.0,
    max_cells: int = ALL_LAYERS_MAX_CELLS,
    view: str = "head",
    switchable: bool = False,
    key_tokens: list[str] | None = None,
    written: list[int] | tuple[int, ...] = (),
    token_picks: bool = False,
) -> dict:
    """The component's data: ``attentions`` ``[layers, heads, n, n]`` of one sentence, quantised.

    ``key_tokens``: the keys are another text's tokens (cross-attention, ``[layers, heads, n_target, n_source]``:
    ``tokens`` are the target's, drawn down the side, and ``key_tokens`` the source's, along the top).

    ``layers_sent`` lists the layers in ``weights`` (all of them, or for the head view only ``layer`` when
    they would not fit in ``max_cells``; the model view always has them all); ``sig`` names the sentence's
    data, so the browser decodes a sentence once. ``view`` is "head" or "model"; ``switchable`` says the
    other view would show these same tokens, so the browser may switch to it without the server. ``shape`` is
    how the head view shows its selected head: "heatmap" (enlarged, in the component) or "lines" (a chart the
    page draws below it). ``written``: the query rows of tokens the model wrote (generation); their labels are
    marked and a click on one comes back in the pick as ``"token"`` (``parse_pick``); ``token_picks``: every other
    row's label after the first can be picked too (a decoder's prompt token: the prediction at the position before).
    """
    if view not in VIEWS or shape not in SHAPES:
        raise ValueError(f"view must be one of {VIEWS} and shape one of {SHAPES}, not {view!r} and {shape!r}")
    attentions = np.asarray(attentions)
    num_layers, num_heads = attentions.shape[:2]
    every = view == "model" or attentions.size <= max_cells
    sent = list(range(num_layers)) if every else [int(layer)]
    weights = packing.weight_base64(attentions[sent])
    tokens = [str(t) for t in tokens]
    keys = None if key_tokens is None else [str(t) for t in key_tokens]
    if attentions.shape[2:] != (len(tokens), len(tokens if keys is None else keys)):
        raise ValueError(
            f"attentions of shape {attentions.shape} do not fit {len(tokens)} x {len(keys or tokens)} tokens"
        )
    boundary = None
    if segment_ids is not None and np.any(np.asarray(segment_ids) != np.asarray(segment_ids)[0]):
        boundary = int(np.argmax(np.asarray(segment_ids) != np.asarray(segment_ids)[0]))
    written = sorted({int(i) for i in written})
    if written and not 0 <= written[0] <= written[-1] < len(tokens):
        raise ValueError(f"written rows {written} are not rows of the {len(tokens)} tokens")
    described = "\x00".join(tokens) + ("" if keys is None else "\x01" + "\x00".join(keys))
    digest = hashlib.sha1(
        weights.encode() + described.encode() + str((causal, boundary, sent, written, bool(token_picks))).encode()
    )
    return {
        "sig": digest.hexdigest()[:16],
        "tokens": tokens,
        "key_tokens": keys,
        "num_layers": int(num_layers),
        "num_heads": int(num_heads),
        "layers_sent": sent,
        "weights": weights,
        "levels": LEVELS,
        "view": view,
        "switchable": bool(switchable and every),
        "layer": int(layer),
        "head": int(head),
        "causal": bool(causal),
        "boundary": boundary,
        "shape": shape,
        "text_scale": float(text_scale),
        "written": written,
        "token_picks": bool(token_picks),
        **palette.palette(),
    }


def unpack(data: dict) -> dict[int, np.ndarray]:
    """The weights of ``pack``'s data as floats, ``{layer: [heads, n, n]}`` (``[heads, n_target, n_source]`` for
    cross-attention): what the browser decodes."""
    rows, heads = len(data["tokens"]), data["num_heads"]
    columns = rows if data.get("key_tokens") is None else len(data["key_tokens"])
    weights = packing.weight_decoded(data["weights"], (len(data["layers_sent"]), heads, rows, columns))
    return {layer: weights[index] for index, layer in enumerate(data["layers_sent"])}


def parse_pick(raw) -> dict | None:
    """The visitor's pick as the browser sent it (the component's state), checked: ``{"layer": int, "head":
    int, "view": one of VIEWS, "shape": one of SHAPES}``, with ``"cell": (query, key)`` when the visitor picked a
    cell of the enlarged head (a click, or Enter on the keyboard's cell), with ``"token": row`` when the visitor
    picked a written token's label (``pack``'s ``written``), or None for anything else (a cell that is not two
    non-negative integers, or a token row that is not one, is left out)."""
    try:
        pick = {"layer": int(raw["layer"]), "head": int(raw["head"]), "view": raw["view"], "shape": raw["shape"]}
    except (KeyError, TypeError, ValueError):
        return None
    if pick["layer"] < 0 or pick["head"] < 0 or pick["view"] not in VIEWS or pick["shape"] not in SHAPES:
        return None
    cell = picked_cell(raw)
    if cell is not None:
        return {**pick, "cell": cell}
    token = picked_token(raw)
    return pick if token is None else {**pick, "token": token}


def picked_token(raw: dict) -> int | None:
    """The written token's row of a pick, or None when it has none (or not a non-negative integer)."""
    try:
        row = int(raw["token"])
    except (KeyError, TypeError, ValueError):
        return None
    return row if row >= 0 else None


def picked_cell(raw: dict) -> tuple[int, int] | None:
    """The ``(query, key)`` of a pick, or None when it has none (or not two non-negative integers)."""
    try:
        query, key = int(raw["query"]), int(raw["key"])  # JSON numbers may come back as text, as the layer's
    except (KeyError, TypeError, ValueError):
        return None
    return (query, key) if query >= 0 and key >= 0 else None
