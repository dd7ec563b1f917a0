"""The statistics behind a role's claim: intervals, a ratio's standard error over clusters, one-sided tests
and Holm's correction for many tests. Plain numpy, every function vectorised; docs/metrics.md says
where each is used."""

from __future__ import annotations

import math

import numpy as np

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(share, n) -> tuple[np.ndarray, np.ndarray]:
    """95% Wilson interval of a proportion ``share`` observed in ``n`` trials (NaN where n = 0)."""
    share, n = np.asarray(share, dtype=float), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        denominator = 1 + Z_95**2 / n
        centre = (share + Z_95**2 / (2 * n)) / denominator
        half = Z_95 * np.sqrt(share * (1 - share) / n + Z_95**2 / (4 * n**2)) / denominator
    return np.where(n > 0, centre - half, np.nan), np.where(n > 0, centre + half, np.nan)


def mean_interval(mean, sd, n) -> tuple[np.ndarray, np.ndarray]:
    """95% normal interval of a mean of ``n`` values with standard deviation ``sd`` (NaN below two values)."""
    mean, sd, n = (np.asarray(v, dtype=float) for v in (mean, sd, n))
    with np.errstate(invalid="ignore", divide="ignore"):
        half = Z_95 * sd / np.sqrt(n)
    half = np.where(n > 1, half, np.nan)
    return mean - half, mean + half


def correlation_interval(r, n) -> tuple[np.ndarray, np.ndarray]:
    """95% interval of a Pearson correlation over ``n`` pairs (Fisher's z; NaN below four pairs)."""
    r, n = np.clip(np.asarray(r, dtype=float), -0.999999, 0.999999), np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        z, half = np.arctanh(r), Z_95 / np.sqrt(n - 3)
    return np.where(n > 3, np.tanh(z - half), np.nan), np.where(n > 3, np.tanh(z + half), np.nan)


def ratio_standard_error(total, squares, cross, count, count_squares, clusters) -> np.ndarray:
    """Standard error of the ratio ``R = sum_s y_s / sum_s m_s`` over independent clusters ``s`` (sentences).

    Cases inside one sentence are not independent draws (the same head reads the same words), so the
    variance is taken over sentences: the linearised (delta-method) estimator of a ratio, with the
    small-sample factor ``G / (G - 1)`` of ``G`` clusters (Cochran 1977, section 6; the CR1 correction of
    cluster-robust variances):

        Var(R) = G / (G - 1) * sum_s (y_s - R m_s)^2 / (sum_s m_s)^2

    From sums only, so it adds up over shards: ``total = sum y``, ``squares = sum y^2``, ``cross = sum y m``,
    ``count = sum m``, ``count_squares = sum m^2``, ``clusters = G`` (clusters with no case add nothing).
    NaN where ``G < 2`` or ``count = 0``.
    """
    total, squares, cross = (np.asarray(v, dtype=float) for v in (total, squares, cross))
    count, count_squares, clusters = (np.asarray(v, dtype=float) for v in (count, count_squares, clusters))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = total / count
        residual = np.maximum(squares - 2 * ratio * cross + ratio * ratio * count_squares, 0.0)
        variance = clusters / (clusters - 1) * residual / (count * count)
    return np.where((clusters >= 2) & (count > 0), np.sqrt(variance), np.nan)


def normal_upper_p(z) -> np.ndarray:
    """One-sided p-value ``P(Z >= z)`` of a standard normal (``z = +inf``: 0, NaN: 1, so no test is no claim)."""
    z = np.asarray(z, dtype=float)
    p = np.vectorize(lambda value: 0.5 * math.erfc(value / math.sqrt(2)), otypes=[float])(z)
    return np.where(np.isnan(z), 1.0, p)


def holm_adjusted(p_values, family_size: int | None = None) -> np.ndarray:
    """Holm's (1979) step-down adjusted p-values: reject where the adjusted value is at most alpha, and the
    chance of any false rejection in the family stays at most alpha, whatever the tests' dependence.

    ``family_size``: the number of hypotheses tried, when some of them were never tested (they count as
    p = 1, which sorts last and so leaves every tested value's adjustment as if it were in the list).
    NaN p-values count as 1.
    """
    p = np.nan_to_num(np.asarray(p_values, dtype=float).ravel(), nan=1.0)
    size = len(p) if family_size is None else int(family_size)
    if size < len(p):
        raise ValueError(f"a family of {size} hypotheses cannot hold {len(p)} p-values")
    order = np.argsort(p, kind="stable")
    factors = size - np.arange(len(p))  # m, m - 1, ... for the smallest, the next, ...
    stepped = np.minimum(1.0, np.maximum.accumulate(factors * p[order]))
    adjusted = np.empty_like(p)
    adjusted[order] = stepped
    return adjusted.reshape(np.shape(p_values))
