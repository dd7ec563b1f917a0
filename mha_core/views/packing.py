"""How a view's arrays travel to the browser (the app's components, a saved file, a notebook's widget): weights in
[0, 1] as one byte each, images scaled to their own largest value, exact float32; each with the decoder that gives
back what the browser decodes (``viewkit.js``'s ``decodeBytes`` / ``decodeFloats``)."""

from __future__ import annotations

import base64

import numpy as np

LEVELS = 255  # a weight w in [0, 1] is sent as round(w * 255): off by at most 0.5 / 255


def steps(values: np.ndarray) -> np.ndarray:
    """The colour scale's step of each value in [0, 1]: floor(v * 255 + 0.5) in float32 arithmetic, NaN as 0. The
    browser's ``levelOf`` computes the same (``Math.fround`` after each operation), so a weight sent as a byte (the
    head view) and a weight sent as a float (the long view) get one colour. In place on one float32 copy: 3 M
    weights (MiniLM's layer at 512 tokens) in about 60 ms on this machine."""
    work = np.array(values, dtype=np.float32)  # a copy, worked on in place
    np.nan_to_num(work, copy=False, nan=0.0)
    np.clip(work, 0.0, 1.0, out=work)
    work *= LEVELS
    work += 0.5
    np.floor(work, out=work)
    return work.astype(np.uint8)


def weight_base64(weights: np.ndarray) -> str:
    """Weights in [0, 1] (any shape) as one byte a weight (their ``steps``, C order), in base64."""
    return base64.b64encode(steps(weights).tobytes()).decode("ascii")


def weight_decoded(raw: str, shape: tuple[int, ...]) -> np.ndarray:
    """``weight_base64``'s weights back as the browser decodes them: step / 255, float32, of ``shape``."""
    data = np.frombuffer(base64.b64decode(raw), dtype=np.uint8).reshape(shape)
    return data.astype(np.float32) / np.float32(LEVELS)


def scaled_bytes(images: np.ndarray) -> tuple[str, list[float]]:
    """``[k, a, b]`` non-negative values as base64 bytes, each ``[a, b]`` image scaled to its own largest value
    (small values keep their precision), and those largest values: the browser gets back byte / 255 * top."""
    values = np.nan_to_num(np.asarray(images, dtype=np.float32), nan=0.0)
    tops = values.reshape(len(values), -1).max(axis=1)
    scaled = values / np.where(tops > 0, tops, 1.0)[:, None, None]
    return weight_base64(scaled), [float(t) for t in tops]


def unscaled(raw: str, tops: list[float], shape: tuple[int, int]) -> np.ndarray:
    """``scaled_bytes``' images back as the browser decodes them: ``[k, a, b]`` float32."""
    return weight_decoded(raw, (len(tops), *shape)) * np.asarray(tops, dtype=np.float32)[:, None, None]


def float32_base64(values: np.ndarray) -> str:
    """Values as little-endian float32, C order, in base64 (exact)."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")


def float32_decoded(raw: str, shape: tuple[int, ...]) -> np.ndarray:
    """``float32_base64``'s values back."""
    return np.frombuffer(base64.b64decode(raw), dtype="<f4").reshape(shape)
