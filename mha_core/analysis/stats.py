"""The statistics behind a role's claim: intervals, a ratio's standard error over clusters, one-sided tests
and Holm's correction for many tests. Plain numpy (Student's t from scipy), every function vectorised;
docs/metrics.md says where each is used."""

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


def t_upper_p(t, df) -> np.ndarray:
    """One-sided p-value ``P(T >= t)`` of Student's t with ``df`` degrees of freedom (``t = +inf``: 0; NaN in
    ``t``, or ``df < 1``: 1, so no test is no claim).

    A cluster-robust (CR1) standard error over ``G`` clusters has about ``G - 1`` degrees of freedom: with
    20-30 sentences a normal reference makes its tests too ready to reject (Cameron & Miller 2015, section
    VI.C recommend t(G - 1))."""
    import scipy.stats  # slow to import (about half a second): on first use

    t, df = np.broadcast_arrays(np.asarray(t, dtype=float), np.asarray(df, dtype=float))
    usable = ~np.isnan(t) & (df >= 1)
    p = np.ones(t.shape)
    p[usable] = scipy.stats.t.sf(t[usable], df[usable])
    return p


def t_quantile_95(df) -> np.ndarray:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom (NaN where ``df < 1``): the
    half-width of a 95% interval in standard errors."""
    import scipy.stats  # slow to import (about half a second): on first use

    df = np.asarray(df, dtype=float)
    usable = df >= 1
    quantile = np.full(df.shape, np.nan)
    quantile[usable] = scipy.stats.t.ppf(0.975, df[usable])
    return quantile


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


BOUNDARY_MARGIN = 0.10  # margin_test_size's simulated margin: the syntactic roles' threshold


def margin_test_size(clusters: int, simulations: int = 20_000, alpha: float = 0.05, seed: int = 0) -> dict[str, float]:
    """How often the held-out test rejects a margin that sits exactly on its threshold (the test's size, which
    should be at most ``alpha``), with each reference, on simulated halves of ``clusters`` sentences.

    Each sentence has ``1 + Poisson(2)`` cases; the head is right in each with the sentence's own rate
    ``Beta(2, 2)`` (mean 0.5) and the offset with ``Beta(1.6, 2.4)`` (mean 0.4), so cases of one sentence are
    correlated, as real ones are, and the ratio margin over sentences is exactly ``BOUNDARY_MARGIN`` in
    expectation. The test is the held-out test's (``roles.syntactic_tests``): t = (margin - ``BOUNDARY_MARGIN``)
    / its CR1 standard
    error over sentences, one-sided. Returns the rejection rate with Student's t (``clusters - 1`` degrees of
    freedom) and with the standard normal, and the Monte Carlo standard error of a rate of ``alpha``."""
    if clusters < 2 or simulations < 1:
        raise ValueError("the test needs at least two sentences and one simulation")
    rng = np.random.default_rng(seed)
    shape = (int(simulations), int(clusters))
    cases = 1 + rng.poisson(2.0, shape)
    head = rng.binomial(cases, rng.beta(2.0, 2.0, shape))
    offset = rng.binomial(cases, rng.beta(1.6, 2.4, shape))
    margin = head - offset  # y_s: the margin's right cases in each sentence
    error = ratio_standard_error(
        total=margin.sum(1),
        squares=(margin**2).sum(1),
        cross=(margin * cases).sum(1),
        count=cases.sum(1),
        count_squares=(cases**2).sum(1),
        clusters=clusters,
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        statistic = (margin.sum(1) / cases.sum(1) - BOUNDARY_MARGIN) / error
    return {
        "clusters": int(clusters),
        "simulations": int(simulations),
        "rate_t": float(np.mean(t_upper_p(statistic, clusters - 1) <= alpha)),
        "rate_normal": float(np.mean(normal_upper_p(statistic) <= alpha)),
        "monte_carlo_se": math.sqrt(alpha * (1 - alpha) / simulations),
    }


def median_interval(values) -> tuple[float, float, float]:
    """(median, low, high): the median of ``values`` (NaN left out) with its distribution-free 95% interval, the
    order statistics n/2 -+ 1.96 sqrt(n)/2 (the binomial's normal approximation); NaN for no values."""
    ordered = np.sort(np.asarray(values, dtype=float)[~np.isnan(np.asarray(values, dtype=float))])
    n = len(ordered)
    if n == 0:
        return math.nan, math.nan, math.nan
    half = Z_95 * math.sqrt(n) / 2
    low = max(0, math.floor(n / 2 - half))
    high = min(n - 1, math.ceil(n / 2 + half) - 1)
    return float(np.median(ordered)), float(ordered[low]), float(ordered[high])
