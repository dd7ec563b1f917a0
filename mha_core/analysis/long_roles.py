"""Roles that only show at length: retrieval heads, sink heads by distance, local heads with their window.

Each reads the per-row statistics a long pass streams (``mha_core.analysis.streamed.RowStatistics``: every
row's argmax key, its mass on the first ``SINK_TOKENS`` positions, the narrowest window of offsets holding
``LOCAL_WINDOW_MASS`` of it) and gives role rows in the columns of ``mha_core.analysis.roles`` (score,
threshold, n, baseline, 95% interval, evidence). docs/metrics.md gives the rules and their sources.

- Retrieval (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality"): the model answers
  a question about a needle hidden in a long text, greedily, token by token; for each token it writes that is in
  the needle (``generated_copies``), a head copies it when its argmax attention, at the position that writes the
  token, lands on a needle token equal to it. A head's retrieval score is the share of those tokens it copies.
  Scoring a teacher-forced answer that repeats the needle (``needle_copies``) is, after its first token, an
  induction task: the heads it finds are the induction heads (docs/findings.md, section 8).
- Sink (Xiao et al. 2024, StreamingLLM): the mean mass a query puts on the first ``SINK_TOKENS`` positions,
  measured by distance from them (``sink_by_distance``); a sink head keeps most of its mass there far away.
- Local: the span ``|i - j| <= w`` that holds 90% of a row's mass; a local head keeps that window within
  ``LOCAL_MAX_WINDOW`` tokens for most queries that see much further (``local_windows`` gives it by head).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..run import per_head_frame
from .roles import ROLE_COLUMNS, interval_text, role_rows
from .stats import mean_interval, wilson_interval
from .streamed import LOCAL_WINDOW_MASS, SINK_TOKENS

RETRIEVAL_MIN_SCORE = 0.1  # Wu et al. 2024 call heads above a retrieval score of 0.1 retrieval heads
SINK_MIN_MASS = 0.5  # as roles.SINK_MIN_MASS: most of a query's mass on the sinks
SINK_MIN_DISTANCE = 64  # a sink at length: queries at least this far from the first tokens
LOCAL_MAX_WINDOW = 16  # a local head's 90% window stays within 16 tokens ...
LOCAL_MIN_SHARE = 0.5  # ... for most of the queries that see at least LOCAL_MIN_CONTEXT keys
LOCAL_MIN_CONTEXT = 4 * LOCAL_MAX_WINDOW


def needle_copies(token_ids: Sequence[int], needle_start: int, answer_start: int, length: int) -> list[tuple[int, int]]:
    """``[(query position, needle position)]`` of a teacher-forced copy: the token at ``answer_start + t``
    repeats the needle token at ``needle_start + t`` and is produced at the position before it."""
    ids = list(token_ids)
    if needle_start < 0 or answer_start < 1 or answer_start + length > len(ids) or needle_start + length > answer_start:
        raise ValueError("the needle must come before its copy, and both lie inside the tokens")
    return [
        (answer_start + t - 1, needle_start + t)
        for t in range(length)
        if ids[answer_start + t] == ids[needle_start + t]
    ]


def generated_copies(
    token_ids: Sequence[int], needle_start: int, needle_length: int, answer_start: int
) -> list[tuple[int, int]]:
    """``[(query position, needle position)]`` of an answer the model wrote (``token_ids[answer_start:]``): for
    each answer token that occurs in the needle, one pair per needle position holding it (a head copies the token
    when its argmax at the query, the position before the token, is any of them; Wu et al. 2024)."""
    ids = list(token_ids)
    if needle_start < 0 or needle_length < 1 or needle_start + needle_length > answer_start or answer_start < 1:
        raise ValueError("the needle must come before the answer, inside the tokens")
    needle = ids[needle_start : needle_start + needle_length]
    return [
        (position - 1, needle_start + offset)
        for position in range(answer_start, len(ids))
        for offset, token in enumerate(needle)
        if token == ids[position]
    ]


def retrieval_scores(argmax: np.ndarray, copies: Sequence[tuple[int, int]], is_causal: bool = True) -> pd.DataFrame:
    """Per head: ``score`` (share of copied tokens whose argmax, at the query that writes the token, lands on one of
    its needle positions), ``n`` copied tokens (distinct queries), ``chance`` (what a random visible key would
    give) and the Wilson interval. ``argmax [layers, heads, n]``; ``copies``: (query, needle position) pairs, one or
    more per query (``needle_copies``, ``generated_copies``)."""
    num_layers, num_heads, n = argmax.shape
    if not copies:
        raise ValueError("retrieval scores need at least one copied token")
    pairs = np.array(copies, dtype=np.int64)
    queries, index = np.unique(pairs[:, 0], return_inverse=True)
    hit_pairs = argmax[:, :, pairs[:, 0]] == pairs[:, 1]  # [L, H, pairs]
    hit = np.zeros((num_layers, num_heads, len(queries)), dtype=bool)
    np.logical_or.at(hit.transpose(2, 0, 1), index, hit_pairs.transpose(2, 0, 1))
    hits = hit.mean(axis=-1)
    count = len(queries)
    targets = np.bincount(index, minlength=count)  # needle positions a query may land on
    low, high = wilson_interval(hits, count)
    chance = float(np.mean(targets / (queries + 1 if is_causal else np.full(count, n))))
    return per_head_frame(num_layers, num_heads, score=hits, n=count, chance=chance, ci_low=low, ci_high=high)


def sink_by_distance(first_tokens: np.ndarray, total: np.ndarray, edges: Sequence[int]) -> pd.DataFrame:
    """Mean share of a query's mass on the first ``SINK_TOKENS`` positions, for queries whose position lies in
    ``[edges[k], edges[k + 1])``: one row per (layer, head, band). ``first_tokens``, ``total``: ``[L, H, n]``."""
    num_layers, num_heads, n = total.shape
    share = first_tokens / np.where(total > 0, total, 1.0)
    frames = []
    for start, stop in itertools.pairwise(edges):
        stop = min(stop, n)
        if start >= stop:
            continue
        frame = per_head_frame(num_layers, num_heads, mass=share[:, :, start:stop].mean(axis=-1))
        frames.append(frame.assign(distance_from=int(start), distance_to=int(stop)))
    return pd.concat(frames, ignore_index=True)


def local_windows(window: np.ndarray, is_causal: bool = True) -> pd.DataFrame:
    """Per head: the median and 90th percentile of the 90%-mass window over queries that see at least
    ``LOCAL_MIN_CONTEXT`` keys, and the share of them within ``LOCAL_MAX_WINDOW``. ``window [L, H, n]``."""
    num_layers, num_heads, n = window.shape
    seen = np.arange(n) + 1 if is_causal else np.full(n, n)
    far = seen >= LOCAL_MIN_CONTEXT
    if not far.any():
        far = np.ones(n, dtype=bool)  # a short text: every query
    part = window[:, :, far].astype(float)
    return per_head_frame(
        num_layers,
        num_heads,
        median_window=np.median(part, axis=-1),
        window_p90=np.percentile(part, 90, axis=-1),
        share_within=(part <= LOCAL_MAX_WINDOW).mean(axis=-1),
        n=int(far.sum()),
    )


def long_roles(statistics, copies: Sequence[tuple[int, int]] | None = None) -> pd.DataFrame:
    """Retrieval (when ``copies`` are given), sink and local roles from a long run's row statistics
    (``RowStatistics``), in ``roles.ROLE_COLUMNS``."""
    rows = statistics.rows
    causal = statistics.is_causal
    n = statistics.n
    found = []
    if copies:
        retrieval = retrieval_scores(rows["argmax"], copies, causal)
        found.append(
            role_rows(
                frame=retrieval,
                passed=retrieval["score"] >= RETRIEVAL_MIN_SCORE,
                role="retrieval",
                group="long",
                score=retrieval["score"],
                threshold=RETRIEVAL_MIN_SCORE,
                evidence=lambda r: (
                    f"argmax on the copied needle token for {r['score']:.0%} of copies ({interval_text(r, unit='copies')})"
                ),
                n=retrieval["n"],
                baseline=retrieval["chance"],
                ci=(retrieval["ci_low"], retrieval["ci_high"]),
                source="needle",
            )
        )
    total = rows["total"]
    positions = np.arange(n)
    far = positions >= min(SINK_MIN_DISTANCE, max(n - 1, 0))
    share = (rows["first_tokens"] / np.where(total > 0, total, 1.0))[:, :, far]
    mass, spread, count = share.mean(axis=-1), share.std(axis=-1, ddof=1) if far.sum() > 1 else np.nan, int(far.sum())
    low, high = mean_interval(mass, spread, count)
    seen = positions[far] + 1 if causal else np.full(count, n)
    uniform = float(np.mean(np.minimum(SINK_TOKENS, seen) / seen))
    sink = per_head_frame(statistics.rows["total"].shape[0], statistics.rows["total"].shape[1], score=mass)
    found.append(
        role_rows(
            frame=sink,
            passed=(mass >= SINK_MIN_MASS).reshape(-1),
            role="sink at length",
            group="long",
            score=mass.reshape(-1),
            threshold=SINK_MIN_MASS,
            evidence=lambda r: (
                f"{r['score']:.0%} of the mass on the first {SINK_TOKENS} tokens, queries >= "
                f"{SINK_MIN_DISTANCE} tokens away ({interval_text(r, unit='queries')})"
            ),
            n=count,
            baseline=uniform,
            ci=(low.reshape(-1), high.reshape(-1)),
            source="sentence",
        )
    )
    windows = local_windows(rows["window"], causal)
    share_within = windows["share_within"].to_numpy()
    low, high = wilson_interval(share_within, windows["n"].to_numpy())
    found.append(
        role_rows(
            frame=windows,
            passed=share_within >= LOCAL_MIN_SHARE,
            role=lambda r: f"local (window {int(r['median_window'])})",
            group="long",
            score=share_within,
            threshold=LOCAL_MIN_SHARE,
            evidence=lambda r: (
                f"{LOCAL_WINDOW_MASS:.0%} of the mass within {int(r['median_window'])} tokens (median; 90th "
                f"percentile {int(r['window_p90'])}) for {r['score']:.0%} of queries ({interval_text(r, unit='queries')})"
            ),
            n=windows["n"],
            baseline=0.0,  # attention spread evenly over >= 64 keys never fits in 16 tokens
            ci=(low, high),
            source="sentence",
        )
    )
    found = [frame for frame in found if not frame.empty]
    if not found:
        return pd.DataFrame(columns=ROLE_COLUMNS)
    return pd.concat(found, ignore_index=True)
