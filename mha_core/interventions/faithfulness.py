"""How far token scores can be trusted (issue 33): faithfulness by deletion and insertion, and agreement.

Faithfulness (DeYoung et al. 2020, "ERASER"): remove the text's ordinary tokens in a method's order, most
important first (the highest signed score: the token that raised the prediction most), and measure the prediction
f (``token_attribution``: the target's log-probability, or the similarity) after each removal; insertion starts from
the special tokens alone and adds the tokens in the same order. A removed token is dropped from the sequence (the
sequence gets shorter), never replaced by a pad, mask or unknown token. The areas:

* deletion AOPC = mean over k = 1..m of f(all) - f(without the top k): higher is more faithful;
* insertion AOPC = mean over k = 1..m of f(only the top k) - f(none): higher is more faithful;

each against the same curves in random orders (``seeds`` of them, averaged). Every sequence of every curve is
computed once, in a few padded passes of mixed lengths (``token_attribution.Prediction.of_sequences``).

Agreement: Spearman's rank correlation between two methods' magnitudes (|score|: attention has no sign) over the
ordinary tokens, and between each head's attention row at the target and each method (a layers x heads map).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..models.tokens import EncodedText
from ..progress import Progress, report
from .readout import encoded_prompt
from .token_attribution import DEFAULT_STEPS, METHODS, Prediction, TokenAttribution, token_attribution

DEFAULT_SEEDS = 3
RANDOM = "random"


@dataclass
class Faithfulness:
    """``curves``: one row per order, seed, curve and step (``order``, ``seed``, ``curve`` ``"deletion"`` or
    ``"insertion"``, ``k`` tokens removed or added, ``fraction`` k / m, ``value`` f); ``aopc``: one row per order
    (the methods, then ``"random"`` averaged over seeds) with ``deletion_aopc``, ``insertion_aopc``."""

    curves: pd.DataFrame
    aopc: pd.DataFrame
    removal: str = "drop"


def method_order(scores: np.ndarray) -> np.ndarray:
    """Indices of ``scores`` from the highest to the lowest (ties: the earlier position first); NaN last."""
    values = np.where(np.isnan(scores), -np.inf, scores)
    return np.lexsort((np.arange(len(values)), -values))


def _kept(ids: list[int], special: np.ndarray, ordinary: np.ndarray, chosen, curve: str) -> tuple[int, ...]:
    """The sequence without the ``chosen`` ordinary positions (deletion) or with only them (insertion)."""
    chosen = set(int(p) for p in chosen)
    if curve == "deletion":
        keep = [p for p in range(len(ids)) if p not in chosen]
    else:
        keep = [p for p in range(len(ids)) if special[p] or p in chosen]
    return tuple(ids[p] for p in keep)


def faithfulness(
    model,
    text: str | EncodedText,
    attribution: TokenAttribution,
    seeds: int = DEFAULT_SEEDS,
    progress: Progress | None = None,
) -> Faithfulness:
    """The deletion and insertion curves of every method of ``attribution`` (computed for ``text`` on ``model``)
    and of ``seeds`` random orders, with their AOPC (module docstring)."""
    encoded = encoded_prompt(model, text, "text")
    target = attribution.metadata.get("target_id")
    prediction = Prediction(model, encoded, attribution.target if target is None else target)
    ids = list(encoded.input_ids)
    special = np.asarray(encoded.special_mask, dtype=bool)
    ordinary = attribution.ordinary
    m = len(ordinary)
    orders = [(method, 0, ordinary[method_order(attribution.method_scores(method))]) for method in attribution.methods]
    for seed in range(seeds):
        orders.append((RANDOM, seed, ordinary[np.random.default_rng(seed).permutation(m)]))
    rows, sequences = [], {}
    for order, seed, positions in orders:
        for curve in ("deletion", "insertion"):
            for k in range(m + 1):
                sequence = _kept(ids, special, ordinary, positions[:k], curve)
                sequences.setdefault(sequence, len(sequences))
                rows.append((order, seed, curve, k, k / max(m, 1), sequence))
    report(progress, 0, 1, "deletion and insertion curves")
    values = prediction.of_sequences(list(sequences))
    report(progress, 1, 1, "deletion and insertion curves")
    curves = pd.DataFrame(
        [(o, s, c, k, f, values[sequences[seq]]) for o, s, c, k, f, seq in rows],
        columns=["order", "seed", "curve", "k", "fraction", "value"],
    )
    return Faithfulness(curves, aopc_table(curves))


def aopc_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Deletion and insertion AOPC per order (random: the mean of its seeds' AOPC), from ``curves``."""
    records = []
    for (order, seed), group in curves.groupby(["order", "seed"], sort=False):
        deletion = group[group["curve"] == "deletion"].sort_values("k")["value"].to_numpy()
        insertion = group[group["curve"] == "insertion"].sort_values("k")["value"].to_numpy()
        records.append(
            dict(
                order=order,
                seed=seed,
                deletion_aopc=float(np.mean(deletion[0] - deletion[1:])) if len(deletion) > 1 else np.nan,
                insertion_aopc=float(np.mean(insertion[1:] - insertion[0])) if len(insertion) > 1 else np.nan,
            )
        )
    table = pd.DataFrame(records)
    means = table.groupby("order", sort=False)[["deletion_aopc", "insertion_aopc"]].mean().reset_index()
    return means.rename(columns={"order": "method"})


def mean_curves(curves: pd.DataFrame, curve: str = "deletion") -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{order: (fractions, values)}`` of one curve (``"deletion"`` or ``"insertion"``) of ``faithfulness``'s
    ``curves``, each order's seeds averaged (the random orders' mean under ``"random"``)."""
    chosen = curves[curves["curve"] == curve]
    lines = {}
    for order, group in chosen.groupby("order", sort=False):
        mean = group.groupby("fraction", sort=True)["value"].mean()
        lines[order] = (mean.index.to_numpy(dtype=np.float64), mean.to_numpy(dtype=np.float64))
    return lines


# ---- agreement ------------------------------------------------------------------------------------------
def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); NaN when either side is constant."""
    ranks_a = pd.Series(a).rank().to_numpy()
    ranks_b = pd.Series(b).rank().to_numpy()
    if len(a) < 2 or np.ptp(ranks_a) == 0 or np.ptp(ranks_b) == 0:
        return float("nan")
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def method_agreement(attribution: TokenAttribution) -> pd.DataFrame:
    """Spearman's rank correlation of every pair of methods' |scores| over the ordinary tokens: a square table."""
    methods = list(attribution.methods)
    magnitudes = {m: np.abs(attribution.method_scores(m)) for m in methods}
    table = [[spearman(magnitudes[a], magnitudes[b]) for b in methods] for a in methods]
    return pd.DataFrame(table, index=methods, columns=methods)


def head_agreement(attribution: TokenAttribution, method: str) -> np.ndarray:
    """Spearman's rank correlation of each head's attention row at the target with ``method``'s |scores|, over
    the ordinary tokens: float ``[L, H]``."""
    if method not in attribution.methods:
        raise ValueError(f"{method!r} is not among the attribution's methods ({', '.join(attribution.methods)}).")
    reference = np.abs(attribution.method_scores(method))
    rows = attribution.head_rows[..., attribution.ordinary]
    layers, heads = rows.shape[:2]
    return np.array([[spearman(rows[layer, head], reference) for head in range(heads)] for layer in range(layers)])


# ---- everything the app shows for one prediction -------------------------------------------------------
@dataclass
class Explanation:
    """One prediction explained: the token scores, their faithfulness (None with no seeds asked for) and the
    methods' agreement."""

    attribution: TokenAttribution
    faithfulness: Faithfulness | None
    agreement: pd.DataFrame


def explain(
    model,
    text: str | EncodedText,
    target: str | int | None = None,
    methods=METHODS,
    steps: int | None = None,
    seeds: int = DEFAULT_SEEDS,
    progress: Progress | None = None,
) -> Explanation:
    """``token_attribution`` of ``text``, then (``seeds`` > 0) its ``faithfulness`` and ``method_agreement``."""
    steps = DEFAULT_STEPS if steps is None else steps
    attribution = token_attribution(model, text, target, methods, steps=steps, progress=progress)
    measured = faithfulness(model, text, attribution, seeds=seeds, progress=progress) if seeds > 0 else None
    return Explanation(attribution, measured, method_agreement(attribution))
