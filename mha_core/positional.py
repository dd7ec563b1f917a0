"""Sinusoidal positional encoding (course notes 001) and its relative-shift property.

    PE[pos, 2i]     = sin(pos / 10000^(2i / d_model))
    PE[pos, 2i + 1] = cos(pos / 10000^(2i / d_model))

Channel pair i turns at angular frequency w_i = 10000^(-2i / d_model): the first pairs turn fastest
(wavelength 2*pi positions), the last ones slowest (wavelength up to 10000 * 2*pi positions).

Because sin(a + b) and cos(a + b) are linear in sin(a) and cos(a), moving k positions is one fixed
linear map: PE[p + k] = PE[p] @ M_k, with M_k block-diagonal in 2x2 rotations by k * w_i.

Arrays are float64 numpy: at positions in the hundreds, float32 sines are only good to ~1e-5.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

BASE = 10000.0
SIMILARITY_METRICS = ("dot", "cosine")


def _check_count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def sinusoidal_frequencies(d_model: int) -> np.ndarray:
    """Angular frequency w_i = 10000^(-2i / d_model) of channel pair i, for the ceil(d_model / 2) pairs."""
    d_model = _check_count(d_model, "d_model", 1)
    pair_index = np.arange((d_model + 1) // 2, dtype=np.float64)
    return BASE ** (-2.0 * pair_index / d_model)


def channel_frequencies(d_model: int) -> np.ndarray:
    """Angular frequency of every channel (sin channel 2i and cos channel 2i + 1 share w_i), ``[d_model]``."""
    return np.repeat(sinusoidal_frequencies(d_model), 2)[:d_model]


def channel_wavelengths(d_model: int) -> np.ndarray:
    """Period in positions of every channel, 2 pi / w_i: ~6.28 for the first pair, growing along the channels."""
    return 2.0 * np.pi / channel_frequencies(d_model)


def sinusoidal_encoding(num_positions: int, d_model: int) -> np.ndarray:
    """``[num_positions, d_model]`` float64: sin on even channels, cos on odd channels (course notes 001).

    With an odd ``d_model`` the last channel is the sine of the last pair; its cosine partner is
    simply dropped, so every channel keeps the formula above.
    """
    num_positions = _check_count(num_positions, "num_positions", 1)
    d_model = _check_count(d_model, "d_model", 1)
    angles = np.arange(num_positions, dtype=np.float64)[:, None] * sinusoidal_frequencies(d_model)[None, :]
    pe = np.empty((num_positions, d_model), dtype=np.float64)
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles[:, : d_model // 2])
    return pe


def relative_shift_matrix(k: int, d_model: int) -> np.ndarray:
    """M_k, ``[d_model, d_model]``, with PE[p + k] = PE[p] @ M_k for every position p (k may be negative).

    Each (sin, cos) channel pair is rotated by the angle k * w_i:
    [sin(a), cos(a)] @ [[cos b, -sin b], [sin b, cos b]] = [sin(a + b), cos(a + b)].
    The map needs both halves of every pair, so ``d_model`` must be even.
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"the offset k must be an integer, got {k!r}")
    d_model = _check_count(d_model, "d_model", 2)
    if d_model % 2:
        raise ValueError(
            f"d_model must be even for a relative-shift matrix, got {d_model}: the last sine channel has no "
            "cosine partner, so no linear map moves it"
        )
    angle = int(k) * sinusoidal_frequencies(d_model)
    cos, sin = np.cos(angle), np.sin(angle)
    shift = np.zeros((d_model, d_model), dtype=np.float64)
    even = np.arange(0, d_model, 2)
    shift[even, even] = cos
    shift[even, even + 1] = -sin
    shift[even + 1, even] = sin
    shift[even + 1, even + 1] = cos
    return shift


def relative_shift_check(p: int, k: int, d_model: int, num_positions: int | None = None) -> dict:
    """PE[p + k] next to PE[p] @ M_k and their largest absolute difference (what the Positions page shows)."""
    p = _check_count(p, "p", 0)
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise ValueError(f"the offset k must be an integer, got {k!r}")
    if p + k < 0:
        raise ValueError(f"p + k must be a position (>= 0), got p={p}, k={k}")
    pe = sinusoidal_encoding(max(p, p + k) + 1 if num_positions is None else num_positions, d_model)
    if max(p, p + k) >= pe.shape[0]:
        raise ValueError(f"p and p + k must be below num_positions={pe.shape[0]}, got p={p}, p + k={p + k}")
    shifted = pe[p] @ relative_shift_matrix(k, d_model)
    return {
        "pe_p": pe[p],
        "pe_p_plus_k": pe[p + k],
        "pe_p_times_m_k": shifted,
        "max_abs_diff": float(np.max(np.abs(shifted - pe[p + k]))),
    }


def position_similarity(embeddings: np.ndarray, metric: str = "dot") -> np.ndarray:
    """``[n, n]`` similarity of every position with every other: dot product or cosine of their vectors."""
    vectors = np.asarray(embeddings, dtype=np.float64)
    if vectors.ndim != 2 or vectors.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty [positions, dims] array, got shape {vectors.shape}")
    if metric not in SIMILARITY_METRICS:
        raise ValueError(f"metric must be one of {SIMILARITY_METRICS}, got {metric!r}")
    if metric == "cosine":
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.where(norms == 0.0, 1.0, norms)
    return vectors @ vectors.T


def similarity_by_distance(
    embeddings: np.ndarray, metric: str = "dot", max_distance: int | None = None
) -> pd.DataFrame:
    """Similarity of two positions as a function of their distance |p - q|.

    One row per distance with the mean, min and max over all pairs at that distance (for the
    sinusoidal encoding with even d_model every pair at distance k has the same dot product,
    sum_i cos(k w_i), so min == max); columns ``distance, mean, min, max, pairs``.
    """
    similarity = position_similarity(embeddings, metric)
    n = similarity.shape[0]
    limit = n - 1 if max_distance is None else min(_check_count(max_distance, "max_distance", 0), n - 1)
    rows = []
    for distance in range(limit + 1):
        # Both diagonals hold the same values (the matrix is symmetric); one is enough.
        values = np.diagonal(similarity, offset=distance)
        rows.append((distance, values.mean(), values.min(), values.max(), values.size))
    return pd.DataFrame(rows, columns=["distance", "mean", "min", "max", "pairs"])
