"""A head table's view (``assets/tableview/``): any table with ``layer`` and ``head`` columns (``mc.head_metrics``,
``mc.head_roles``, importance) as a layer x head grid, coloured by one numeric column, each head's rows in words on a
click. A head with several rows (its roles) shows the largest value of a column, and every row in words."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from mha_core.views import packing, palette

DETAIL_DIGITS = 4  # significant digits of a number in a head's rows


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


def pack_table(table, column: str | None = None, layer: int = 0, head: int = 0) -> dict:
    """The view's data: each numeric column as a float32 ``[layers, heads]`` grid (NaN for a head without a row; a
    head's largest value where it has several rows), the column shown first, and each head's rows in words."""
    frame = pd.DataFrame(table)
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
        **palette.palette(),
    }


def decode_column(data: dict, column: str) -> np.ndarray:
    """A column's grid as the browser decodes it: float32 ``[layers, heads]``."""
    return packing.float32_decoded(data["values"][column], (data["num_layers"], data["num_heads"]))
