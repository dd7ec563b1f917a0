"""Head roles: what each head does, with a score, the threshold it passed and the evidence.

``head_roles`` turns measurements into named roles; every rule, threshold and source is in
``docs/metrics.md``. The decoder scores (previous-token, duplicate-token, induction, prefix
matching) are pure functions of an attention tensor and token ids, so they can be checked on
hand-built patterns; ``decoder_head_scores`` only feeds them a model's attention on sequences of
repeated random tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ..errors import HeadscopeError
from ..run import AttentionRun, per_head_frame
from .metrics import head_metrics
from .stats import (
    correlation_interval,
    holm_adjusted,
    mean_interval,
    normal_upper_p,
    t_quantile_95,
    t_upper_p,
    wilson_interval,
)
from .syntax import DEPENDENCY_COLUMNS, TYPE_CONTROL_COLUMNS, DependencyAccumulator, Sentence, shuffled_heads

# ---- thresholds (docs/metrics.md) ---------------------------------------------------------
POSITIONAL_OFFSETS = {-1: "previous", 0: "self", 1: "next"}
POSITIONAL_MIN_SHARE = 0.9  # Voita et al. 2019: argmax at one fixed offset in >= 90% of queries
SINK_MIN_MASS = 0.5  # most mass on positions of no content: special tokens and the first token
DELIMITER_MIN_MASS = 0.5  # most mass on punctuation
BROAD_MIN_ENTROPY = 0.9  # normalised entropy
DECODER_MIN_SCORE = 0.4  # previous-token and prefix-matching scores
# TransformerLens's duplicate-token and induction scores divide by ALL attention, including the
# queries of the first copy, which have no target: with `repeats` copies they cannot exceed
# (repeats - 1) / repeats. Their cut-off is DECODER_MIN_SCORE scaled by that ceiling.
DECODER_CAPPED_SCORES = ("duplicate_token", "induction")
# head accuracy - best fixed-offset baseline accuracy, on the held-out half; and the same margin over the best
# word-type rule (syntax.TYPE_RULES, the word-type control) when the table has its columns
SYNTACTIC_MIN_MARGIN = 0.10
SYNTACTIC_MIN_COUNT = 100  # examples of the relation in the corpus: rarer relations are not tried
# The held-out test refers its t statistic to Student's t with (held-out sentences - 1) degrees of freedom, and is
# not run on fewer held-out sentences than this: below it the test rejects a margin on its threshold more than 6%
# of the time at alpha 5% (stats.margin_test_size; docs/metrics.md).
SYNTACTIC_MIN_SENTENCES = 20
# A syntactic role is named when the held-out margin is above SYNTACTIC_MIN_MARGIN at this level, after
# Holm's correction over every (head, relation, direction) tried: at most a 5% chance of any false role.
SYNTACTIC_ALPHA = 0.05
COREFERENCE_MIN_ACCURACY = 0.5
COREFERENCE_MIN_MARGIN = 0.10  # candidate_accuracy - baseline_accuracy, when the table has both
COREFERENCE_MIN_COUNT = 10
SEMANTIC_MIN_CORRELATION = 0.3  # Pearson r
SEMANTIC_MIN_SENTENCES = 20  # one sentence's correlation is a measurement, not a role

# n: how many observations the score rests on; baseline: what chance or a trivial rule gives (NaN where
# none applies); ci_low / ci_high: its 95% interval; source: "sentence", "corpus" or "random tokens".
ROLE_COLUMNS = [
    "layer",
    "head",
    "role",
    "group",
    "score",
    "threshold",
    "n",
    "baseline",
    "ci_low",
    "ci_high",
    "source",
    "evidence",
]
DECODER_SCORES = ("previous_token", "duplicate_token", "induction", "prefix_matching")
NO_ROLE = "none"
# A head's map colour: the most specific evidence first (a corpus measurement beats a one-sentence pattern).
ROLE_GROUP_PRIORITY = ("syntactic", "coreference", "decoder", "semantic", "positional", "delimiter", "sink", "broad")
ROLE_GROUPS = (*ROLE_GROUP_PRIORITY, NO_ROLE)  # every group a head's primary role can be in, "none" last


# ---- detection patterns (TransformerLens head_detector) and scores ------------------------
def offset_pattern(num_tokens: int, offset: int) -> np.ndarray:
    """``[n, n]`` ones at (i, i + offset): a positional head at a fixed offset (-1 = the previous token)."""
    return np.eye(num_tokens, k=offset)


def previous_token_pattern(num_tokens: int) -> np.ndarray:
    """``[n, n]`` ones at (i, i - 1)."""
    return offset_pattern(num_tokens, -1)


def duplicate_token_pattern(token_ids) -> np.ndarray:
    """``[n, n]`` ones at (i, j) for j < i with token j == token i."""
    ids = np.asarray(token_ids)
    return np.tril(ids[:, None] == ids[None, :], k=-1).astype(np.float64)


def induction_pattern(token_ids) -> np.ndarray:
    """``[n, n]`` the duplicate pattern moved one key to the right: query i attends to the token
    after an earlier copy of token i (kept lower triangular, column 0 empty, as in TransformerLens)."""
    duplicate = duplicate_token_pattern(token_ids)
    shifted = np.zeros_like(duplicate)
    shifted[:, 1:] = duplicate[:, :-1]
    return np.tril(shifted)


def detection_score(
    attentions: np.ndarray, pattern: np.ndarray, exclude_bos: bool = False, exclude_current_token: bool = False
) -> np.ndarray:
    """TransformerLens's default ("mul") score: sum(A * P) / sum(A) over each head's ``[n, n]``.

    ``attentions`` is ``[..., n, n]``; returns ``[...]``.
    """
    attentions = np.asarray(attentions, dtype=np.float64)
    if exclude_bos or exclude_current_token:
        attentions = attentions.copy()
        if exclude_bos:
            attentions[..., :, 0] = 0.0
        if exclude_current_token:
            diagonal = np.arange(attentions.shape[-1])
            attentions[..., diagonal, diagonal] = 0.0
    total = attentions.sum(axis=(-2, -1))
    matched = (attentions * pattern).sum(axis=(-2, -1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, matched / np.where(total > 0, total, 1.0), np.nan)


def copy_target_pattern(token_ids, target_ids) -> np.ndarray:
    """``[n, n]`` ones at (i, j) for j <= i where token j is the token query i must output
    (``target_ids[i]``; a negative target means none): the keys a copying head should read."""
    ids, targets = np.asarray(token_ids), np.asarray(target_ids)
    return np.tril((ids[None, :] == targets[:, None]) & (targets[:, None] >= 0)).astype(np.float64)


def query_mass_score(attentions: np.ndarray, target: np.ndarray) -> np.ndarray:
    """For each query with at least one target key in ``target [n, n]``, the attention mass on its
    targets; averaged over those queries (NaN when no query has a target). ``[..., n, n] -> [...]``."""
    has_target = target.sum(axis=-1) > 0
    if not has_target.any():
        return np.full(np.asarray(attentions).shape[:-2], np.nan)
    per_query = (np.asarray(attentions, dtype=np.float64) * target).sum(axis=-1)  # [..., n]
    return per_query[..., has_target].mean(axis=-1)


def prefix_matching_score(attentions: np.ndarray, token_ids) -> np.ndarray:
    """Olsson et al. 2022: for each query whose token occurred before, the attention it pays to the
    tokens that followed the earlier occurrences; averaged over those queries. ``[..., n, n] -> [...]``."""
    return query_mass_score(attentions, induction_pattern(token_ids))


def decoder_scores_from_attention(attentions: np.ndarray, token_ids) -> dict[str, np.ndarray]:
    """All four decoder scores for one sequence, each ``[L, H]``."""
    n = attentions.shape[-1]
    return {
        "previous_token": detection_score(attentions, previous_token_pattern(n)),
        "duplicate_token": detection_score(attentions, duplicate_token_pattern(token_ids)),
        "induction": detection_score(attentions, induction_pattern(token_ids)),
        "prefix_matching": prefix_matching_score(attentions, token_ids),
    }


def repeated_random_tokens(
    vocab_size: int, seq_len: int, repeats: int, batch: int, seed: int, excluded_ids=(), bos_id: int | None = None
) -> np.ndarray:
    """``[batch, repeats * seq_len (+1 with BOS)]``: ``batch`` random sequences, each repeated."""
    rng = np.random.default_rng(seed)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(list(excluded_ids), dtype=np.int64))
    if len(allowed) < seq_len:
        raise HeadscopeError(f"the vocabulary has only {len(allowed)} ordinary tokens; need {seq_len}")
    # Without replacement inside a sequence, so only the repeat creates duplicates.
    block = np.stack([rng.choice(allowed, size=seq_len, replace=False) for _ in range(batch)])
    sequences = np.tile(block, (1, repeats))
    if bos_id is not None:
        sequences = np.concatenate([np.full((batch, 1), bos_id, dtype=sequences.dtype), sequences], axis=1)
    return sequences


# ---- statistics of a role (the formulas: mha_core.analysis.stats) -------------------------------------
def interval_text(row, percent: bool = True, unit: str = "") -> str:
    """ "95% CI 61% to 83%, n = 13 queries" (as much of it as the row knows)."""
    value = (lambda v: f"{v:.0%}") if percent else (lambda v: f"{v:.2f}")
    count = f"n = {int(row['n'])}{' ' + unit if unit else ''}" if np.isfinite(row["n"]) else ""
    if not np.isfinite(row["ci_low"]):
        return count or "no interval"
    return f"95% CI {value(row['ci_low'])} to {value(row['ci_high'])}" + (f", {count}" if count else "")


# ---- roles --------------------------------------------------------------------------------
def role_rows(
    frame: pd.DataFrame,
    passed,
    role,
    group: str,
    score,
    threshold,
    evidence,
    *,
    n,
    baseline,
    ci,
    source: str,
    tested: bool = False,
) -> pd.DataFrame:
    """Role rows for the heads whose ``score`` passes and whose interval clears the baseline.

    ``role`` and ``evidence`` are strings or callables of a row (the row holds the frame's columns and
    ``score``, ``threshold``, ``n``, ``baseline``, ``ci_low``, ``ci_high``). A head is named only when
    ``passed`` and, where a baseline applies, the lower end of its 95% interval is above that baseline:
    a score chance could give is no role. ``tested``: ``passed`` already is a test against the threshold
    (stricter than clearing the baseline), and decides alone.
    """
    size = len(frame)
    table = frame.assign(
        score=np.broadcast_to(np.asarray(score, dtype=float), size),
        threshold=np.broadcast_to(np.asarray(threshold, dtype=float), size),
        n=np.broadcast_to(np.asarray(n, dtype=float), size),
        baseline=np.broadcast_to(np.asarray(baseline, dtype=float), size),
        ci_low=np.broadcast_to(np.asarray(ci[0], dtype=float), size),
        ci_high=np.broadcast_to(np.asarray(ci[1], dtype=float), size),
    )
    clears = (
        tested | np.isnan(table["baseline"].to_numpy()) | (table["ci_low"].to_numpy() > table["baseline"].to_numpy())
    )
    chosen = table[np.asarray(passed, dtype=bool) & clears]
    if chosen.empty:
        return pd.DataFrame(columns=ROLE_COLUMNS)
    records = chosen.to_dict("records")
    return pd.DataFrame(
        {
            "layer": chosen["layer"].astype(int).to_numpy(),
            "head": chosen["head"].astype(int).to_numpy(),
            "role": [role(r) if callable(role) else role for r in records],
            "group": group,
            **{
                column: chosen[column].astype(float).to_numpy()
                for column in ("score", "threshold", "n", "baseline", "ci_low", "ci_high")
            },
            "source": source,
            "evidence": [evidence(r) for r in records],
        }
    )


def _metric_roles(metrics: pd.DataFrame) -> list[pd.DataFrame]:
    """Positional, sink, delimiter and broad heads from ``head_metrics`` of one sentence, or from a corpus
    profile (which has ``num_sentences``: its spreads and counts are then over sentences)."""
    corpus = "num_sentences" in metrics.columns
    source = "corpus" if corpus else "sentence"

    def column(name, default=np.nan):
        return metrics[name].to_numpy(float) if name in metrics.columns else np.full(len(metrics), default)

    queries = column("num_sentences") if corpus else column("num_queries")
    offset = metrics["argmax_offset"].to_numpy()
    share = metrics["argmax_offset_share"].fillna(0).to_numpy()
    offset_n = column("num_sentences") if corpus else column("argmax_offset_queries")
    offset_ci = (
        mean_interval(share, column("argmax_offset_share_sd"), offset_n) if corpus else wilson_interval(share, offset_n)
    )
    sink, delimiter = column("sink_mass", 0.0), column("punctuation_mass", 0.0)
    entropy = metrics["normalized_entropy"].fillna(0).to_numpy()
    per = "sentences" if corpus else "queries"
    return [
        role_rows(
            frame=metrics,
            passed=np.isin(offset, list(POSITIONAL_OFFSETS)) & (share >= POSITIONAL_MIN_SHARE),
            role=lambda r: f"positional:{POSITIONAL_OFFSETS[int(r['argmax_offset'])]}",
            group="positional",
            score=share,
            threshold=POSITIONAL_MIN_SHARE,
            evidence=lambda r: (
                f"argmax at offset {int(r['argmax_offset']):+d} in {r['score']:.0%} of {per} "
                f"({interval_text(r, unit=per)}); a random argmax: {r['baseline']:.0%}; "
                f"needs >= {POSITIONAL_MIN_SHARE:.0%}"
            ),
            n=offset_n,
            baseline=column("argmax_offset_chance"),
            ci=offset_ci,
            source=source,
        ),
        role_rows(
            frame=metrics,
            passed=sink >= SINK_MIN_MASS,
            role="sink",
            group="sink",
            score=sink,
            threshold=SINK_MIN_MASS,
            evidence=lambda r: (
                f"{r['score']:.0%} of attention on positions of no content ([CLS], [SEP], BOS or the "
                f"first token; {interval_text(r, unit=per)}); even attention: {r['baseline']:.0%}. A no-op "
                f"or attention sink; needs >= {SINK_MIN_MASS:.0%}"
            ),
            n=queries,
            baseline=column("sink_mass_uniform"),
            ci=mean_interval(sink, column("sink_mass_sd"), queries),
            source=source,
        ),
        role_rows(
            frame=metrics,
            passed=delimiter >= DELIMITER_MIN_MASS,
            role="delimiter",
            group="delimiter",
            score=delimiter,
            threshold=DELIMITER_MIN_MASS,
            evidence=lambda r: (
                f"{r['score']:.0%} of attention on punctuation ({interval_text(r, unit=per)}); even "
                f"attention: {r['baseline']:.0%}; needs >= {DELIMITER_MIN_MASS:.0%}"
            ),
            n=queries,
            baseline=column("punctuation_mass_uniform"),
            ci=mean_interval(delimiter, column("punctuation_mass_sd"), queries),
            source=source,
        ),
        role_rows(
            frame=metrics,
            passed=entropy >= BROAD_MIN_ENTROPY,
            role="broad",
            group="broad",
            score=entropy,
            threshold=BROAD_MIN_ENTROPY,
            evidence=lambda r: (
                f"normalised entropy {r['score']:.2f} (1 = even over the visible keys; "
                f"{interval_text(r, percent=False, unit=per)}); needs >= {BROAD_MIN_ENTROPY}"
            ),
            n=queries,
            baseline=np.nan,
            ci=mean_interval(entropy, column("normalized_entropy_sd"), queries),
            source=source,
        ),
    ]


def decoder_min_score(name: str, repeats: int = 2) -> float:
    """The cut-off for one decoder score (see DECODER_CAPPED_SCORES)."""
    if name in DECODER_CAPPED_SCORES:
        return DECODER_MIN_SCORE * (repeats - 1) / repeats
    return DECODER_MIN_SCORE


def _decoder_roles(decoder: pd.DataFrame) -> list[pd.DataFrame]:
    out = []
    repeats = int(decoder.attrs.get("repeats", 2))
    sequences = decoder["num_sequences"].to_numpy(float) if "num_sequences" in decoder else np.nan
    for name in DECODER_SCORES:
        if name not in decoder:
            continue
        score = decoder[name].fillna(0).to_numpy()
        label = name.replace("_", "-")
        cutoff = decoder_min_score(name, repeats)
        sd = decoder[f"{name}_sd"].to_numpy(float) if f"{name}_sd" in decoder else np.nan
        baseline = decoder[f"{name}_uniform"].to_numpy(float) if f"{name}_uniform" in decoder else np.nan
        out.append(
            role_rows(
                frame=decoder,
                passed=score >= cutoff,
                role=f"decoder:{name}",
                group="decoder",
                score=score,
                threshold=cutoff,
                evidence=lambda r, label=label, cutoff=cutoff: (
                    f"{label} score {r['score']:.2f} on repeated random tokens "
                    f"({interval_text(r, percent=False, unit='sequences')}); even attention: "
                    f"{r['baseline']:.2f}; needs >= {cutoff:.2f}"
                ),
                n=sequences,
                baseline=baseline,
                ci=mean_interval(score, sd, sequences),
                source="random tokens",
            )
        )
    return out


# What a syntactic role rests on: each half's columns of a dependency table (the held-out half's offset and the
# selection half's offset scored there are reported when the table has them).
# The word-type control's columns (TYPE_CONTROL_COLUMNS) are used when present: tables written before it lack them.
REPORTED_ONLY = ("heldout_baseline_offset", "heldout_selected_baseline_accuracy", *TYPE_CONTROL_COLUMNS)
HELDOUT_COLUMNS = tuple(
    column
    for column in DEPENDENCY_COLUMNS
    if column.startswith(("selection_", "heldout_")) and column not in REPORTED_ONLY
)


TEST_REFERENCES = ("t", "normal")  # the held-out test's reference distribution (roles: "t"; "normal" to compare)


def syntactic_tests(
    dependency: pd.DataFrame, min_count: int = SYNTACTIC_MIN_COUNT, reference: str = "t"
) -> pd.DataFrame:
    """Every row of a dependency table (``syntax.dependency_scores``, ``profile(...).dependency``) with the
    held-out test of its syntactic role:

    tried          the relation has at least ``min_count`` cases in the corpus (roles: ``SYNTACTIC_MIN_COUNT``;
                   a lower count shows what the test does with rarer relations)
    selection_margin / heldout_margin   accuracy - baseline accuracy on each half (the held-out baseline
                   is the best offset on the held-out half itself: chosen with hindsight there, it can only
                   favour the baseline; ``heldout_selected_baseline_accuracy``, the selection half's offset
                   scored there, is reported beside it)
    type_selection_margin / type_heldout_margin   the word-type control: accuracy - the best word-type rule's
                   accuracy (``syntax.TYPE_RULES``: "the nearest NOUN to the left"...), chosen on each half as the
                   offset is; NaN when the table has no control columns (then the offsets alone are tested)
    tested         tried, the selection half's margins (both, with the control) are at least
                   ``SYNTACTIC_MIN_MARGIN`` and the held-out half has at least ``SYNTACTIC_MIN_SENTENCES``
                   sentences with a case
    p_value        one-sided test of H0: held-out margin <= ``SYNTACTIC_MIN_MARGIN``: t = (margin - threshold)
                   / its standard error over sentences (CR1), against Student's t with (held-out sentences - 1)
                   degrees of freedom (NaN where not tested). With the control, the larger of this p and the
                   same test's p on the word-type margin (an intersection-union test: the head must beat the
                   offsets and the word types, each by the margin).
                   ``reference="normal"``: a standard normal instead, as before; only to measure the
                   difference (``shuffled_tree_tests``)
    holm_p_value   Holm-adjusted over every row tried (untested rows count as p = 1)
    named          tested and ``holm_p_value <= SYNTACTIC_ALPHA``: the head gets the role
    """
    if reference not in TEST_REFERENCES:
        raise ValueError(f"reference must be one of {TEST_REFERENCES}, got {reference!r}")
    missing = [column for column in HELDOUT_COLUMNS if column not in dependency.columns]
    if missing:
        raise HeadscopeError(
            "a dependency table needs its held-out columns (from dependency_scores or profile) to name "
            f"syntactic roles; it lacks {', '.join(missing)}"
        )

    def column(name):
        return dependency[name].to_numpy(float)

    selection_margin = column("selection_accuracy") - column("selection_baseline_accuracy")
    heldout_margin = column("heldout_accuracy") - column("heldout_baseline_accuracy")
    controlled = set(TYPE_CONTROL_COLUMNS) <= set(dependency.columns)
    nothing = np.full(len(dependency), np.nan)
    type_selection_margin = (
        column("selection_accuracy") - column("selection_type_baseline_accuracy") if controlled else nothing
    )
    type_heldout_margin = (
        column("heldout_accuracy") - column("heldout_type_baseline_accuracy") if controlled else nothing
    )
    tried = column("count") >= min_count
    tested = (
        tried
        & (np.nan_to_num(selection_margin, nan=-np.inf) >= SYNTACTIC_MIN_MARGIN)
        & (np.nan_to_num(column("heldout_sentences")) >= SYNTACTIC_MIN_SENTENCES)
    )
    if controlled:
        tested &= np.nan_to_num(type_selection_margin, nan=-np.inf) >= SYNTACTIC_MIN_MARGIN

    def upper_p(margin, error):
        excess = margin - SYNTACTIC_MIN_MARGIN
        with np.errstate(invalid="ignore", divide="ignore"):
            # A zero standard error (every sentence exactly on the margin) makes the sign of the excess decisive.
            z = np.where(error > 0, excess / error, np.where(excess > 0, np.inf, -np.inf))
        z = np.where(np.isnan(error) | np.isnan(excess), np.nan, z)
        return t_upper_p(z, column("heldout_sentences") - 1) if reference == "t" else normal_upper_p(z)

    upper = upper_p(heldout_margin, column("heldout_margin_se"))
    if controlled:
        upper = np.fmax(upper, upper_p(type_heldout_margin, column("heldout_type_margin_se")))
    p_value = np.where(tested, upper, np.nan)
    holm = np.full(len(dependency), np.nan)
    holm[tried] = holm_adjusted(p_value[tried])
    return dependency.assign(
        selection_margin=selection_margin,
        heldout_margin=heldout_margin,
        type_selection_margin=type_selection_margin,
        type_heldout_margin=type_heldout_margin,
        tried=tried,
        tested=tested,
        p_value=p_value,
        holm_p_value=holm,
        named=tested & (np.nan_to_num(holm, nan=1.0) <= SYNTACTIC_ALPHA),
    )


def best_heldout_heads(
    dependency: pd.DataFrame, min_count: int = 1, tried_from: int = SYNTACTIC_MIN_COUNT
) -> pd.DataFrame:
    """For each (relation, direction) with at least ``min_count`` cases: the head that is best on the selection
    half (ties: the lowest layer, then head), with its numbers on both halves and its held-out test
    (``syntactic_tests`` with ``min_count=tried_from``). ``heldout_rank``: 1 when it is still the best head on
    the held-out half; ``heldout_margin_low`` / ``_high``: the held-out margin's 95% interval over sentences
    (Student's t with held-out sentences - 1 degrees of freedom, as the test).
    Most frequent relations first."""
    tests = syntactic_tests(dependency, min_count=tried_from)
    frequent = tests[(tests["count"] >= min_count) & (tests["selection_count"] > 0)]
    if frequent.empty:
        return frequent.assign(
            heldout_margin_low=pd.Series(dtype=float),
            heldout_margin_high=pd.Series(dtype=float),
            heldout_rank=pd.Series(dtype=int),
        )
    ordered = frequent.sort_values(["relation", "direction", "layer", "head"], kind="stable")
    best = ordered.loc[ordered.groupby(["relation", "direction"], sort=False)["selection_accuracy"].idxmax()]
    held = ordered.groupby(["relation", "direction"])["heldout_accuracy"]
    rank = best.apply(
        lambda row: 1 + int((held.get_group((row["relation"], row["direction"])) > row["heldout_accuracy"]).sum()),
        axis=1,
    )
    half = t_quantile_95(best["heldout_sentences"].to_numpy(float) - 1) * best["heldout_margin_se"].to_numpy(float)
    best = best.assign(
        heldout_margin_low=best["heldout_margin"] - half,
        heldout_margin_high=best["heldout_margin"] + half,
        heldout_rank=rank.astype(int),
    )
    return best.sort_values(["count", "relation", "direction"], ascending=[False, True, True]).reset_index(drop=True)


def shuffled_tree_tests(
    predictions: Sequence[np.ndarray],
    has_words: Sequence[np.ndarray],
    sentences: Sequence[Sentence],
    shuffles: int = 100,
    seed: int = 0,
    min_count: int = SYNTACTIC_MIN_COUNT,
    how: str = "permuted",
) -> pd.DataFrame:
    """The held-out test on trees no head can read: each sentence's gold tree shuffled (``syntax.shuffled_heads``,
    ``how``) ``shuffles`` times, the heads' own word-level argmax (``predictions [L, H, W]`` and ``has_words``, as
    ``syntax.word_argmax`` gives them) kept. One row per shuffle: ``tried``, ``tested``,
    the roles ``named`` with the t reference (the roles' test) and ``named_normal`` with the normal one, and
    the smallest Holm-adjusted p of each; ``tested_offsets`` and ``named_offsets``: the test on the offsets
    alone (without the word-type control, t reference), to tell the null's part from the control's. ``(table["named"] > 0).mean()`` is the family-wise false-positive rate,
    which the test keeps at most ``SYNTACTIC_ALPHA``."""
    rng = np.random.default_rng(seed)
    rows = []
    for shuffle in range(int(shuffles)):
        accumulator = DependencyAccumulator()
        trees = [shuffled_heads(sentence, rng, how) for sentence in sentences]
        accumulator.add_predictions(list(predictions), list(has_words), trees)
        table = accumulator.result()
        row = {"shuffle": shuffle}
        for reference, suffix in (("t", ""), ("normal", "_normal")):
            tests = syntactic_tests(table, min_count=min_count, reference=reference)
            row.update(
                {
                    "tried": int(tests["tried"].sum()),
                    "tested": int(tests["tested"].sum()),
                    f"named{suffix}": int(tests["named"].sum()),
                    f"min_holm_p{suffix}": float(np.nanmin(tests["holm_p_value"], initial=1.0)),
                }
            )
        offsets = syntactic_tests(table.drop(columns=list(TYPE_CONTROL_COLUMNS)), min_count=min_count)
        row.update(tested_offsets=int(offsets["tested"].sum()), named_offsets=int(offsets["named"].sum()))
        rows.append(row)
    return pd.DataFrame(rows)


def _syntactic_roles(dependency: pd.DataFrame) -> list[pd.DataFrame]:
    tests = syntactic_tests(dependency)
    accuracy, error = tests["heldout_accuracy"].to_numpy(float), tests["heldout_accuracy_se"].to_numpy(float)
    baseline = tests["heldout_baseline_accuracy"].to_numpy(float)
    if "heldout_type_baseline_accuracy" in tests:  # the word-type control: the head beats the stronger of the two
        baseline = np.fmax(baseline, tests["heldout_type_baseline_accuracy"].to_numpy(float))
    half = t_quantile_95(tests["heldout_sentences"].to_numpy(float) - 1) * error
    hypotheses_tried = int(tests["tried"].sum())

    def evidence(r) -> str:
        interval = (
            f"95% CI {r['ci_low']:.0%} to {r['ci_high']:.0%} over {int(r['heldout_sentences'])} sentences"
            if np.isfinite(r["ci_low"])
            else "no interval"
        )
        offset = (
            f" {int(r['heldout_baseline_offset']):+d}" if np.isfinite(r.get("heldout_baseline_offset", np.nan)) else ""
        )
        selected = r.get("heldout_selected_baseline_accuracy", np.nan)
        chosen = (
            f"; the selection half's offset {int(r['selection_baseline_offset']):+d} scores {selected:.0%} there"
            if np.isfinite(selected)
            else ""
        )
        control = (
            f"; word-type control: the best rule on the held-out half ({r['heldout_type_baseline'] or 'none'}) "
            f"scores {r['heldout_type_baseline_accuracy']:.0%}, margin {r['type_heldout_margin']:+.1%}"
            if np.isfinite(r.get("type_heldout_margin", np.nan))
            else ""
        )
        return (
            f"finds the {r['direction']} of '{r['relation']}' in {r['score']:.0%} of {int(r['n'])} held-out cases "
            f"({interval}) vs {r['baseline']:.0%} for the best offset{offset} on the held-out half{chosen}; "
            f"margin {r['heldout_margin']:+.1%}, needs >= {SYNTACTIC_MIN_MARGIN:+.0%}{control}: one-sided "
            f"p = {r['p_value']:.2g} (t, {int(r['heldout_sentences']) - 1} df), Holm-adjusted over "
            f"{hypotheses_tried} heads x relations x directions tried = {r['holm_p_value']:.2g} (needs <= "
            f"{SYNTACTIC_ALPHA}). Selection half: {r['selection_accuracy']:.0%} of {int(r['selection_count'])} "
            f"cases vs {r['selection_baseline_accuracy']:.0%}"
        )

    return [
        role_rows(
            frame=tests,
            passed=tests["named"].to_numpy(bool),
            role=lambda r: f"syntactic:{r['relation']}:{r['direction']}",
            group="syntactic",
            score=accuracy,
            threshold=baseline + SYNTACTIC_MIN_MARGIN,
            evidence=evidence,
            n=tests["heldout_count"].to_numpy(float),
            baseline=baseline,
            ci=(accuracy - half, accuracy + half),
            source="corpus",
            tested=True,
        )
    ]


def _coreference_roles(coreference: pd.DataFrame) -> list[pd.DataFrame]:
    accuracy = coreference["accuracy"].fillna(0).to_numpy()
    count = coreference["count"].to_numpy(float)
    passed = (accuracy >= COREFERENCE_MIN_ACCURACY) & (count >= COREFERENCE_MIN_COUNT)
    # With a two-candidate test (antecedent vs distractor) the role rests on it: the head must beat the
    # better of "first candidate" and "nearest candidate" by a margin, beyond its interval.
    paired = {"candidate_accuracy", "baseline_accuracy"} <= set(coreference.columns)
    score, baseline, threshold = accuracy, np.nan, COREFERENCE_MIN_ACCURACY
    if paired:
        score = coreference["candidate_accuracy"].fillna(0).to_numpy()
        baseline = coreference["baseline_accuracy"].to_numpy(float)
        threshold = baseline + COREFERENCE_MIN_MARGIN
        passed &= score >= threshold

    def evidence(r):
        text = (
            f"argmax from the pronoun lands on its antecedent in {r['accuracy']:.0%} of {int(r['n'])} "
            f"pronouns (needs >= {COREFERENCE_MIN_ACCURACY:.0%}, >= {COREFERENCE_MIN_COUNT} pronouns)"
        )
        if paired:
            text += (
                f"; prefers the antecedent to the distractor in {r['score']:.0%} ({interval_text(r)}) vs "
                f"{r['baseline']:.0%} for the better of first/nearest candidate (needs a margin >= "
                f"{COREFERENCE_MIN_MARGIN:+.0%})"
            )
        return text

    return [
        role_rows(
            frame=coreference,
            passed=passed,
            role="coreference",
            group="coreference",
            score=score,
            threshold=threshold,
            evidence=evidence,
            n=count,
            baseline=baseline,
            ci=wilson_interval(score, count),
            source="corpus",
        )
    ]


def _semantic_roles(semantic: pd.DataFrame) -> list[pd.DataFrame]:
    sentences = semantic["num_sentences"].to_numpy(float) if "num_sentences" in semantic else np.ones(len(semantic))
    correlation = semantic["semantic_correlation"].fillna(0).to_numpy()
    pairs = semantic["num_pairs"].to_numpy(float) if "num_pairs" in semantic else np.nan
    passed = (correlation >= SEMANTIC_MIN_CORRELATION) & (sentences >= SEMANTIC_MIN_SENTENCES)
    return [
        role_rows(
            frame=semantic,
            passed=passed,
            role="semantic",
            group="semantic",
            score=correlation,
            threshold=SEMANTIC_MIN_CORRELATION,
            evidence=lambda r: (
                f"Pearson r = {r['score']:.2f} (95% CI {r['ci_low']:.2f} to {r['ci_high']:.2f}, "
                f"{int(r['n'])} pairs) between its weights and the cosine similarity of the tokens' "
                f"input embeddings; needs >= {SEMANTIC_MIN_CORRELATION} over >= "
                f"{SEMANTIC_MIN_SENTENCES} sentences"
            ),
            n=pairs,
            baseline=0.0,
            ci=correlation_interval(correlation, pairs),
            source="corpus",
        )
    ]


def head_roles(
    run: AttentionRun | None,
    metrics: pd.DataFrame | None = None,
    dependency: pd.DataFrame | None = None,
    coreference: pd.DataFrame | None = None,
    decoder: pd.DataFrame | None = None,
    semantic: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Every role every head passes: ``layer, head, role, group, score, threshold, evidence``.

    ``metrics`` defaults to ``head_metrics(run)``; the other tables add their roles when given
    (``run`` may then be None if ``metrics`` is given). A head may hold several roles; heads with none
    have no row (``primary_roles`` gives every head exactly one).
    """
    if metrics is None:
        if run is None:
            raise HeadscopeError("head_roles needs a run or a metrics table")
        metrics = head_metrics(run)
    parts = _metric_roles(metrics)
    if decoder is not None:
        parts += _decoder_roles(decoder)
    if dependency is not None and len(dependency):
        parts += _syntactic_roles(dependency)
    if coreference is not None and len(coreference):
        parts += _coreference_roles(coreference)
    if semantic is not None and len(semantic):
        parts += _semantic_roles(semantic)
    parts = [part for part in parts if len(part)]
    if not parts:
        return pd.DataFrame(columns=ROLE_COLUMNS).astype(
            {
                "layer": int,
                "head": int,
                **{c: float for c in ("score", "threshold", "n", "baseline", "ci_low", "ci_high")},
            }
        )
    roles = pd.concat(parts, ignore_index=True)
    return roles.sort_values(["layer", "head", "group", "role"], kind="stable").reset_index(drop=True)


def primary_roles(roles: pd.DataFrame, num_layers: int, num_heads: int) -> pd.DataFrame:
    """One row per head: its most specific role (``ROLE_GROUP_PRIORITY``), and within a role group the one
    whose score clears its threshold by the largest factor; ``"none"`` for heads without a role."""
    grid = per_head_frame(num_layers, num_heads)
    if len(roles):
        priority = {group: rank for rank, group in enumerate(ROLE_GROUP_PRIORITY)}
        ranked = roles.assign(
            rank=roles["group"].map(priority).fillna(len(priority)),
            strength=roles["score"] / roles["threshold"].where(roles["threshold"] > 0, 1.0),
        )
        best = (
            ranked.sort_values(
                ["layer", "head", "rank", "strength"], ascending=[True, True, True, False], kind="stable"
            )
            .drop_duplicates(["layer", "head"])
            .drop(columns=["rank", "strength"])
        )
        grid = grid.merge(best, on=["layer", "head"], how="left")
    else:
        grid = grid.assign(**{c: np.nan for c in ROLE_COLUMNS[2:]})
    # Text columns that hold no value yet (no role at all: a run too short for any test) are float NaN.
    grid = grid.astype({"role": "str", "group": "str", "evidence": "str"})
    missing = grid["role"].isna()
    grid.loc[missing, ["role", "group"]] = NO_ROLE
    grid.loc[missing, "evidence"] = "no role passes its threshold"
    return grid[ROLE_COLUMNS]
