"""A head table's view (``assets/tableview/``): any table with ``layer`` and ``head`` columns (``mc.head_metrics``,
``mc.head_roles``, importance) as a layer x head grid, coloured by one numeric column, each head's rows in words on a
click. A head with several rows (its roles) shows the largest value of a column, and its rows in words (the first
``DETAIL_ROWS``). The Circuits maps are head tables too: the copying and previous-token scores (``mc.copying_scores``),
attribution and patching (their head rows), and the composition of every pair of heads (``mc.composition``: each
receiver head's strongest sender, its senders in words, ``composition_heads``)."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from mha_core.views import packing, palette

DETAIL_DIGITS = 4  # significant digits of a number in a head's rows
DETAIL_ROWS = 12  # a head's rows in words at most (a composition table has a row per sender)
PAIR_COLUMNS = ("sender_layer", "sender_head", "receiver_layer", "receiver_head")
# The view's own words (its script's, ``tableview.js`` ``tr``, and what is packed here), English: a caller may send
# them in another language (``strings``: each English text, ``{name}`` fields kept, -> its translation).
MORE_ROWS = "... and {count} more rows"
TABLE_TITLE = "{layers} layers x {heads} heads: {rows} rows"
PAIRS_TITLE = "{count} pairs of heads: each receiver's strongest sender ({column})"
VIEW_TEXTS = (
    "Column ",
    "Column shown",
    "head →",
    "layer ↓",
    "{column} (blue < 0 < red)",
    "Layer {layer}, head {head}",
    "(no row)",
    MORE_ROWS,
    TABLE_TITLE,
    PAIRS_TITLE,
)


def worded(strings: dict | None, text: str, **values) -> str:
    """``text`` (one of ``VIEW_TEXTS``) in the language of ``strings`` (none: English), its ``{fields}`` filled."""
    return (strings or {}).get(text, text).format(**values)


def numeric_columns(frame: pd.DataFrame) -> list[str]:
    """The columns a grid can be coloured by: numbers (not flags), besides ``layer`` and ``head``."""
    return [
        name
        for name in frame.columns
        if name not in ("layer", "head")
        and pd.api.types.is_numeric_dtype(frame[name])
        and not pd.api.types.is_bool_dtype(frame[name])
    ]


def _words(value) -> str:
    if isinstance(value, (float, np.floating)):
        return "" if np.isnan(value) else f"{value:.{DETAIL_DIGITS}g}"
    return str(value)


def is_pair_table(frame) -> bool:
    """A table of pairs of heads (``mc.composition``: a sender and a receiver each row)."""
    return hasattr(frame, "columns") and set(PAIR_COLUMNS) <= set(frame.columns)


def composition_heads(table, column: str | None = None) -> pd.DataFrame:
    """A table of pairs of heads as a head table of the receivers: each row's receiver as ``layer``, ``head``, its
    sender in words (``sender``: "layer-head"), the rows strongest first by ``column`` (the first score by default),
    so that a receiver's cell shows its strongest sender's score and its strongest senders are listed first."""
    frame = pd.DataFrame(table)
    if not is_pair_table(frame):
        raise ValueError(f"a table of pairs of heads has columns {', '.join(PAIR_COLUMNS)} (mc.composition)")
    scores = [name for name in numeric_columns(frame) if name not in PAIR_COLUMNS]
    if not scores:
        raise ValueError("the table has no numeric column to colour its heads by")
    order = column if column in scores else scores[0]
    frame = frame.sort_values(order, ascending=False, kind="stable")
    heads = pd.DataFrame(
        {
            "layer": frame["receiver_layer"].to_numpy(int),
            "head": frame["receiver_head"].to_numpy(int),
            "sender": [f"{layer}-{head}" for layer, head in zip(frame["sender_layer"], frame["sender_head"])],
        }
    )
    for name in scores:
        heads[name] = frame[name].to_numpy()
    return heads


def pack_table(table, column: str | None = None, layer: int = 0, head: int = 0, *, strings: dict | None = None) -> dict:
    """The view's data: each numeric column as a float32 ``[layers, heads]`` grid (NaN for a head without a row; a
    head's largest value where it has several rows), the column shown first, and each head's rows in words.
    ``strings``: the view's own words in another language (``VIEW_TEXTS``; none: English), sent with the data."""
    frame = pd.DataFrame(table)
    if {"layer", "head"} <= set(frame.columns):  # rows that are not a head's (attribution's MLPs, embeddings)
        frame = frame[frame["layer"].notna() & frame["head"].notna()]
    if not {"layer", "head"} <= set(frame.columns) or frame.empty:
        raise ValueError("a head table has a row per head with columns layer and head (mc.head_metrics, mc.head_roles)")
    layers, heads = int(frame["layer"].max()) + 1, int(frame["head"].max()) + 1
    columns = numeric_columns(frame)
    if not columns:
        raise ValueError("the table has no numeric column to colour its heads by")
    if column is None:
        column = columns[0]
    if column not in columns:
        raise ValueError(f"there is no numeric column {column!r}: the table's are {', '.join(columns)}")
    where = (frame["layer"].to_numpy(int), frame["head"].to_numpy(int))
    values = {}
    for name in columns:
        grid = np.full((layers, heads), -np.inf)
        np.maximum.at(grid, where, frame[name].to_numpy(dtype=float, na_value=np.nan))
        grid[np.isneginf(grid)] = np.nan
        values[name] = packing.float32_base64(grid)
    details: list[list[str]] = [[] for _ in range(layers * heads)]
    others = [name for name in frame.columns if name not in ("layer", "head")]
    for record in frame.to_dict("records"):
        text = ", ".join(f"{name} {_words(record[name])}" for name in others)
        details[int(record["layer"]) * heads + int(record["head"])].append(text)
    for index, lines in enumerate(details):
        if len(lines) > DETAIL_ROWS:
            details[index] = lines[:DETAIL_ROWS] + [worded(strings, MORE_ROWS, count=f"{len(lines) - DETAIL_ROWS:,}")]
    digest = hashlib.sha1(str((layers, heads, columns, list(values.values()), details)).encode())
    return {
        "sig": digest.hexdigest()[:16],
        "num_layers": layers,
        "num_heads": heads,
        "columns": columns,
        "column": column,
        "values": values,
        "details": details,
        "layer": int(min(max(layer, 0), layers - 1)),
        "head": int(min(max(head, 0), heads - 1)),
        "strings": dict(strings or {}),
        **palette.palette(),
    }


def decode_column(data: dict, column: str) -> np.ndarray:
    """A column's grid as the browser decodes it: float32 ``[layers, heads]``."""
    return packing.float32_decoded(data["values"][column], (data["num_layers"], data["num_heads"]))
