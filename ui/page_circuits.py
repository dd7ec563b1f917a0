"""The Circuits page's settings (``CircuitsSettings``, declared once: ``ui.page_settings``) and its logic: the
prompt pair a task or the visitor's own prompts make, and the part of the logit lens the page shows.
``pages/circuits.py`` draws them."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from mha_core.interventions.patching import PATCH_METHODS
from mha_core.interventions.path_patching import PATH_VIA
from mha_core.interventions.prompts import TASKS_BY_NAME
from mha_core.interventions.qkov import DEFAULT_TEXT
from ui.page_settings import PageSettings, setting

CUSTOM = "custom"
TASK_LABELS = {**{name: task.title for name, task in TASKS_BY_NAME.items()}, CUSTOM: "Your own prompt pair"}
METHOD_LABELS = {
    "attribution": "attribution patching (fast estimate, top heads exact)",
    "exact": "exact activation patching (every head)",
}
MODE_LABELS = {"k": "K-composition (keys)", "q": "Q-composition (queries)", "v": "V-composition (values)"}
VIA_LABELS = {"k": "keys (K)", "q": "queries (Q)", "v": "values (V)"}
LENS_POSITIONS = 16  # the logit lens shows the last this many positions
_IOI = TASKS_BY_NAME["ioi"]


@dataclass(frozen=True)
class CircuitsSettings(PageSettings):
    """Every setting of the Circuits page: a prompt pair (one of the tasks, or the visitor's own) and the
    patching method."""

    task: str = setting(
        "circuits_task", "task", "choice", next(iter(TASK_LABELS)), label="Prompt pair", options=TASK_LABELS
    )
    clean: str = setting("circuits_clean", "clean", "text", _IOI.clean, label="Clean prompt")
    corrupted: str = setting("circuits_corrupted", "corrupted", "text", _IOI.corrupted, label="Corrupted prompt")
    answer: str = setting("circuits_answer", "answer", "text", " Mary", label="Answer")
    foil: str = setting("circuits_foil", "foil", "text", " John", label="Foil")
    method: str = setting(
        "circuits_method",
        "method",
        "choice",
        PATCH_METHODS[::-1][0],
        label="Patching",
        options={name: METHOD_LABELS[name] for name in PATCH_METHODS[::-1]},
    )

    # How heads work together (ui/heads_circuits.py): the weight circuits (the composition shown and its least
    # strength, one head's OV and QK top tokens at some tokens) and path patching (the receivers, which follow
    # the model, and the input they are reached through), each behind a toggle.
    weights: bool = setting("qkov_show", "qkov", "flag", False, label="Show the heads' circuits from their weights")
    composition: str = setting("qkov_mode", "cmode", "choice", "k", label="Composition", options=MODE_LABELS)
    threshold: float = setting(
        "qkov_threshold",
        "cmin",
        "decimal",
        3.0,
        label="Show pairs at least this many times the random baseline",
        minimum=1.0,
        maximum=6.0,
    )
    circuit_layer: int = setting("qkov_layer", "qklayer", "number", 0, label="Layer", minimum=0)
    circuit_head: int = setting("qkov_head", "qkhead", "number", 0, label="Head", minimum=0)
    circuit_tokens: str = setting("qkov_tokens", "qktokens", "text", DEFAULT_TEXT, label="Tokens")
    paths: bool = setting("qkov_paths", "paths", "flag", False, label="Path-patch every sender into chosen receivers")
    receivers: str | None = setting(
        "qkov_receivers", "recv", "text", label="Receivers (layer-head, separated by commas)"
    )
    via: str = setting(
        "qkov_via", "via", "choice", "k", label="Through their", options={v: VIA_LABELS[v] for v in PATH_VIA}
    )

    def prompts(self) -> tuple[str, str, str, str]:
        """(clean prompt, corrupted prompt, answer, foil): the task's, or the visitor's own."""
        task = TASKS_BY_NAME.get(self.task)
        if task is not None:
            return task.clean, task.corrupted, task.answer, task.foil
        return self.clean, self.corrupted, self.answer, self.foil


@dataclass(frozen=True)
class LensView:
    """The logit lens as the page shows it: the last ``LENS_POSITIONS`` positions' top tokens, layer x position."""

    labels: list[str]
    shown: pd.DataFrame
    cut: bool  # fewer positions than the prompt has

    def grid(self, column: str):
        return self.shown.pivot(index="layer", columns="position", values=column).to_numpy()


def lens_view(table: pd.DataFrame) -> LensView:
    """The top token (rank 0) after each layer at the last ``LENS_POSITIONS`` positions of ``table`` (the logit
    lens), with each position labelled by its token."""
    top = table[table["rank"] == 0]
    every = sorted(top["position"].unique())
    positions = every[-LENS_POSITIONS:]
    labels = [f"{p}:{table.attrs['tokens'][p]}" for p in positions]
    return LensView(labels, top[top["position"].isin(positions)], len(every) > LENS_POSITIONS)
