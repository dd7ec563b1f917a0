"""A profile as tables: one row per head (metrics, roles, best relation), written as ``.csv`` or ``.parquet``
atomically, and a few lines for the command line."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from ..analysis.roles import (
    DELIMITER_MIN_MASS,
    POSITIONAL_MIN_SHARE,
    POSITIONAL_OFFSETS,
    SINK_MIN_MASS,
    SYNTACTIC_MIN_COUNT,
    head_roles,
    primary_roles,
)
from ..analysis.syntax import best_dependency_heads
from ..errors import HeadscopeError
from .storage import atomic_file

if TYPE_CHECKING:
    from .profiling import ProfileResult

# The per-head table names syntactic roles only from relations with as many examples as a syntactic
# role needs: a relation seen 22 times (vocative in the UD dev split) beats its offset baseline by chance.
HEAD_TABLE_MIN_RELATION_COUNT = SYNTACTIC_MIN_COUNT


# ---- output ---------------------------------------------------------------------------------
def head_table(result: ProfileResult) -> pd.DataFrame:
    """One row per head: the averaged metrics, the head's roles, and (with trees) its best relation.

    ``best_relation`` is the relation and direction where the head beats the best fixed-offset baseline
    by the largest margin over the whole corpus, with its accuracy and baseline on the held-out half
    beside (``syntax.split_half``); roles and best relation use relations with at least
    ``HEAD_TABLE_MIN_RELATION_COUNT`` examples. A syntactic role is named on the held-out test of
    ``roles.syntactic_tests``.
    """
    table = result.metrics.copy()
    frequent = None
    if result.dependency is not None and len(result.dependency):
        frequent = result.dependency[result.dependency["count"] >= HEAD_TABLE_MIN_RELATION_COUNT]
    roles = head_roles(None, metrics=result.metrics, dependency=frequent)
    joined = roles.groupby(["layer", "head"])["role"].agg("; ".join).rename("roles").reset_index()
    primary = primary_roles(roles, int(table["layer"].max()) + 1, int(table["head"].max()) + 1)
    table = table.merge(
        primary[["layer", "head", "role"]].rename(columns={"role": "primary_role"}), on=["layer", "head"], how="left"
    )
    table = table.merge(joined, on=["layer", "head"], how="left")
    table["roles"] = table["roles"].fillna("")
    if frequent is None:
        return table
    best_columns = [
        "best_relation",
        "best_direction",
        "best_relation_accuracy",
        "best_relation_baseline",
        "best_relation_margin",
        "best_relation_heldout_accuracy",
        "best_relation_heldout_baseline",
    ]
    if not len(frequent):
        return table.assign(**{column: np.nan for column in best_columns})
    frequent = frequent.assign(margin=frequent["accuracy"] - frequent["baseline_accuracy"])
    best = frequent.loc[frequent.groupby(["layer", "head"])["margin"].idxmax()]
    best = best.rename(
        columns={
            "relation": "best_relation",
            "direction": "best_direction",
            "accuracy": "best_relation_accuracy",
            "baseline_accuracy": "best_relation_baseline",
            "margin": "best_relation_margin",
            "heldout_accuracy": "best_relation_heldout_accuracy",
            "heldout_baseline_accuracy": "best_relation_heldout_baseline",
        }
    )
    table = table.merge(best[["layer", "head", *best_columns]], on=["layer", "head"], how="left")
    return table


def table_format(path: str | Path) -> str:
    """``".csv"`` or ``".parquet"``, from the file name; anything else is an error."""
    suffix = Path(path).suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise HeadscopeError(f"--out must end in .csv or .parquet, got {Path(path).name!r}")
    return suffix


def write_table(table: pd.DataFrame, path: str | Path) -> Path:
    """Write a table as ``.csv`` or ``.parquet`` (by extension), atomically: never half a file at ``path``."""
    path = Path(path)
    suffix = table_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path) as temporary:
        if suffix == ".csv":
            table.to_csv(temporary, index=False, float_format="%.6g")
        else:
            table.to_parquet(temporary, index=False)
    return path


def profile_summary(result: ProfileResult, relations=("nsubj", "obj", "det", "amod", "case", "aux")) -> str:
    """A few lines for the command line: positional, sink and delimiter heads (the thresholds of their roles),
    the best head for common relations."""
    metrics = result.metrics
    lines = [
        f"{result.model_name}: {result.num_sentences} sentences, {len(metrics)} heads"
        + (" (from cache)" if result.from_cache else "")
    ]
    positional = metrics[
        (metrics["argmax_offset_share"] >= POSITIONAL_MIN_SHARE) & metrics["argmax_offset"].isin(POSITIONAL_OFFSETS)
    ]
    lines.append(
        f"positional heads (argmax at one offset >= {POSITIONAL_MIN_SHARE:.0%}): "
        + (
            ", ".join(
                f"{r.layer}-{r.head} ({int(r.argmax_offset):+d}, {r.argmax_offset_share:.0%})"
                for r in positional.itertuples()
            )
            or "none"
        )
    )
    sinks = int((metrics["sink_mass"] >= SINK_MIN_MASS).sum())
    delimiters = int((metrics["punctuation_mass"] >= DELIMITER_MIN_MASS).sum())
    lines.append(
        f"sink heads (>= {SINK_MIN_MASS:.0%} on special tokens and the first token): {sinks} of {len(metrics)}; "
        f"delimiter heads (>= {DELIMITER_MIN_MASS:.0%} on punctuation): {delimiters}"
    )
    if result.dependency is not None and len(result.dependency):
        best = best_dependency_heads(result.dependency[result.dependency["direction"] == "parent"])
        for r in best[best["relation"].isin(relations)].itertuples():
            lines.append(
                f"  {r.relation:<7} parent: head {r.layer}-{r.head} {r.accuracy:.1%} "
                f"(best offset {r.baseline_offset:+d}: {r.baseline_accuracy:.1%}, n={r.count})"
            )
    return "\n".join(lines)
