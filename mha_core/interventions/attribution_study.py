"""Token attribution over many texts (docs/findings.md, issue 33): for each text, how well each method agrees with
integrated gradients and with occlusion (Spearman's rank correlation of |scores|), each method's deletion and
insertion AOPC, and each head's agreement with both references; then medians with distribution-free intervals
(``analysis.stats.median_interval``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from ..analysis.stats import median_interval
from ..progress import Progress, report
from .faithfulness import DEFAULT_SEEDS, faithfulness, head_agreement, method_agreement
from .token_attribution import DEFAULT_STEPS, METHODS, token_attribution

REFERENCES = ("integrated_gradients", "occlusion")


def attribution_study(
    model,
    items: Sequence[tuple[str, str | int | None]],
    steps: int = DEFAULT_STEPS,
    seeds: int = DEFAULT_SEEDS,
    progress: Progress | None = None,
    methods: Sequence[str] = METHODS,
) -> tuple[pd.DataFrame, np.ndarray]:
    """``methods`` (default every one) on every ``(text, target)`` of ``items``: (one row per text and method, and
    ``"random"`` when ``seeds`` > 0: ``text``, ``method``, ``tokens``, ``vs_integrated_gradients``, ``vs_occlusion``,
    ``deletion_aopc``, ``insertion_aopc``; the heads' agreement with each reference averaged over the texts, float
    ``[2, L, H]`` in ``REFERENCES``' order). The references are computed whatever ``methods`` are; the curves are
    drawn for ``methods`` only (a method added to a study costs its own curves, not every method's again)."""
    methods = tuple(m for m in METHODS if m in methods)
    rows, heads = [], []
    for index, (text, target) in enumerate(items):
        computed = tuple(m for m in METHODS if m in methods or m in REFERENCES)
        attribution = token_attribution(model, text, target, computed, steps=steps)
        agreement = method_agreement(attribution)
        drawn = replace(attribution, methods=methods)
        aopc = faithfulness(model, text, drawn, seeds=seeds).aopc.set_index("method")
        for method in (*methods, "random") if seeds > 0 else methods:
            rows.append(
                dict(
                    text=index,
                    method=method,
                    tokens=len(attribution.ordinary),
                    vs_integrated_gradients=np.nan if method == "random" else agreement.loc[method, REFERENCES[0]],
                    vs_occlusion=np.nan if method == "random" else agreement.loc[method, REFERENCES[1]],
                    deletion_aopc=aopc.loc[method, "deletion_aopc"],
                    insertion_aopc=aopc.loc[method, "insertion_aopc"],
                )
            )
        heads.append([head_agreement(attribution, reference) for reference in REFERENCES])
        report(progress, index + 1, len(items), "texts")
    return pd.DataFrame(rows), np.nanmean(np.array(heads, dtype=np.float64), axis=0)


def study_summary(per_text: pd.DataFrame) -> pd.DataFrame:
    """One row per method: the median of each column of ``attribution_study``'s table with its 95% interval
    (``_low``, ``_high``) and the number of texts."""
    records = []
    for method, group in per_text.groupby("method", sort=False):
        record = {"method": method, "texts": len(group)}
        for column in ("vs_integrated_gradients", "vs_occlusion", "deletion_aopc", "insertion_aopc"):
            median, low, high = median_interval(group[column].to_numpy(dtype=np.float64))
            record |= {column: median, f"{column}_low": low, f"{column}_high": high}
        records.append(record)
    return pd.DataFrame(records)
