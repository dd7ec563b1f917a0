"""A head's measured causal effects, for its card (``head_effects(layer, head, measured)``).

A card's roles and contexts come from the corpus profile; what removing or patching the head does is measured by
other computations, each over its own task:

* head importance (``mha_core.head_importance``, the Ablate page): with ``method="ablation"`` the loss change when
  the head alone is zeroed (the table's ``raw``: summed over its texts; a card shows the mean per text), with
  ``method="gradient"`` Michel et al.'s importance (the table's ``importance``, normalised per layer when asked);
* activation patching over heads (``mha_core.patch``, the Circuits page): the share of the clean-corrupted logit
  difference the head's clean output brings back (``score``; for ``method="attribution"`` the exact score where
  the table has it, else the linear estimate, and the card says which);
* path patching (``mha_core.path_patch``): the head as a sender, its effect reaching the table's receivers
  through their ``via`` input (``score``; NaN when it cannot reach them: no effect is shown then).

``measured`` maps a task's name in words (what the numbers were measured on: "UD EWT dev, 20 sentences", "indirect
object") to one of these tables. A head no table measures has no effect: a card says "not measured", never a number
made up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from ..errors import HeadscopeError

EFFECT_KINDS = ("ablation", "importance", "patching", "path patching")


class CardEffectsError(HeadscopeError, ValueError):
    """A table that is none of the measurements a card reads."""


@dataclass(frozen=True)
class HeadEffect:
    """One measured effect of a head: ``kind`` (``EFFECT_KINDS``), the ``task`` it was measured on (words), what the
    number is (``measure``, words) and the number (``value``)."""

    kind: str
    task: str
    measure: str
    value: float


def _row(table: pd.DataFrame, layer: int, head: int):
    rows = table[(table["layer"] == layer) & (table["head"] == head)]
    return None if rows.empty else rows.iloc[0]


def _importance(table: pd.DataFrame, row, task: str) -> HeadEffect:
    attrs = table.attrs
    if attrs.get("method") == "ablation":
        texts = int(attrs.get("texts") or 0)
        if texts < 1:
            raise CardEffectsError("an ablation importance table must say over how many texts (attrs['texts'])")
        loss = attrs.get("loss", "loss")
        measure = f"{loss} change when the head alone is zeroed (mean over {texts} texts)"
        return HeadEffect("ablation", task, measure, float(row["raw"]) / texts)
    scaled = " normalised per layer" if attrs.get("normalized", True) else ""
    return HeadEffect(
        "importance", task, f"importance (Michel et al. 2019, gradient){scaled}", float(row["importance"])
    )


def _patching(table: pd.DataFrame, row, task: str) -> HeadEffect | None:
    attrs = table.attrs
    pair = f"{attrs.get('answer')!r} against {attrs.get('foil')!r}"
    if "via" in attrs:
        if math.isnan(float(row["score"])):
            return None  # it is no earlier than any receiver: no path to measure
        receivers = ", ".join(f"{layer}-{head}" for layer, head in attrs.get("receivers", ()))
        measure = f"path into {receivers} through their {attrs['via']}: share of the logit difference ({pair})"
        return HeadEffect("path patching", task, measure, float(row["score"]))
    if "exact" in table and not math.isnan(float(row["exact"])):
        return HeadEffect(
            "patching", task, f"share of the logit difference restored, exact ({pair})", float(row["exact"])
        )
    how = "attribution estimate" if attrs.get("method") == "attribution" else "exact"
    measure = f"share of the logit difference restored, {how} ({pair})"
    return HeadEffect("patching", task, measure, float(row["score"]))


def head_effects(layer: int, head: int, measured: Mapping[str, pd.DataFrame]) -> tuple[HeadEffect, ...]:
    """Head ``layer``-``head``'s effects in the ``measured`` tables (task name -> a table of ``head_importance``,
    ``patch(..., over="heads")`` or ``path_patch``), in the mapping's order; a table without the head adds
    nothing. ``CardEffectsError`` for a table that is none of these."""
    effects = []
    for task, table in measured.items():
        if not isinstance(table, pd.DataFrame) or not {"layer", "head"} <= set(table.columns):
            raise CardEffectsError(f"{task!r}: a card reads a per-head table (layer, head, ...), not {type(table)}")
        row = _row(table, int(layer), int(head))
        if row is None:
            continue
        if "importance" in table and "raw" in table:
            effects.append(_importance(table, row, str(task)))
        elif "score" in table and (table.attrs.get("over") == "heads" or "via" in table.attrs):
            effect = _patching(table, row, str(task))
            if effect is not None:
                effects.append(effect)
        else:
            raise CardEffectsError(
                f"{task!r}: not a head importance, patching over heads or path patching table "
                f"(columns {', '.join(map(str, table.columns))})"
            )
    return tuple(effects)
