"""The Ablate page's settings (``AblateSettings``, declared once: ``ui.page_settings``) and its logic: which heads
are picked, what the heads map is coloured by, the effect of ablating them on the sentence, and the experiments
a session ran. ``pages/ablate.py`` draws what these return."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mha_core.analysis.roles import DECODER_SCORES
from mha_core.interventions.experiments import summarize_experiment
from mha_core.interventions.importance import IMPORTANCE_METHODS
from mha_core.models.ablation import parse_heads
from mha_core.models.outputs import loss_table
from ui import computations, page_state
from ui.i18n import t
from ui.page_roles import shown_by_templates
from ui.page_settings import PageSettings, setting

ABLATION_LABELS = {"zero": "zero (the head's output set to 0)", "mean": "mean (its average over reference sentences)"}
# The scores the heads map can be coloured by: their words (importance once computed; decoder scores for decoders).
SCORE_LABELS = {
    "sink_mass": "sink mass (this sentence)",
    "normalized_entropy": "normalised entropy (this sentence)",
    **{name: f"{name.replace('_', ' ')} score (repeated random tokens)" for name in DECODER_SCORES},
    "importance": "importance (Michel et al.)",
}
PICK_TOP = 5  # how many heads "Pick the strongest" and the induction experiment take unless asked
PRUNING_STEPS = 10  # points of the pruning curve


@dataclass(frozen=True)
class AblateSettings(PageSettings):
    """Every setting of the Ablate page. The bounds that follow the model (how many heads, its layers, the
    server's profile size) are given where the widget is drawn."""

    colour: str = setting(
        "ablate_colour", "colour", "choice", "sink_mass", label="Colour the map by (and pick by)", options=SCORE_LABELS
    )
    top_k: int = setting("ablate_top_k", "top", "number", PICK_TOP, label="How many", minimum=1)
    heads: Sequence[str] = setting("ablate_heads", "heads", "heads", [], label="Heads to ablate")
    ablation: str = setting("ablate_kind", "ablation", "choice", "zero", label="Ablation", options=ABLATION_LABELS)
    later_layer: int = setting("ablate_layer", "later_layer", "number", None, label="Attention of a later layer")
    role: str = setting(
        "ablate_role", "role", "choice", "induction", label="Role score", options={s: s for s in DECODER_SCORES}
    )
    k: int = setting("ablate_k", "k", "number", PICK_TOP, label="k heads", minimum=1)
    draws: int = setting("ablate_draws", "draws", "number", 4, label="Random draws", minimum=2, maximum=20)
    sentences: int = setting("ablate_sentences", "sentences", "number", 20, label="UD EWT dev sentences", minimum=2)
    method: str = setting(
        "ablate_method", "method", "choice", "gradient", label="Method", options={m: m for m in IMPORTANCE_METHODS}
    )
    orders: int = setting("ablate_seeds", "orders", "number", 3, label="Random orders", minimum=1, maximum=10)

    @property
    def chosen(self) -> list[tuple[int, int]]:
        """The heads to ablate as (layer, head)."""
        return [parse_heads(name)[0] for name in self.heads]


def head_name(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def head_names(num_layers: int, num_heads: int) -> list[str]:
    """Every head of a model, layer by layer, by name (as the address writes them)."""
    return [head_name(layer, head) for layer in range(num_layers) for head in range(num_heads)]


def toggled(chosen: list[str], name: str) -> list[str]:
    """The heads chosen after a click on ``name``: removed if it was chosen, else added last."""
    return [h for h in chosen if h != name] if name in chosen else [*chosen, name]


def strongest(values: np.ndarray, names: list[str], count: int) -> list[str]:
    """The ``count`` heads of the largest ``values`` (layer x head), ties in head order."""
    order = np.argsort(-np.asarray(values).reshape(-1), kind="stable")[: int(count)]
    return [names[i] for i in order]


def map_scores(run, model_name: str) -> dict[str, tuple[str, np.ndarray]]:
    """The scores the heads map can be coloured by, by name (as in the link): their words and values (layer x
    head). This sentence's measurements, decoder scores on repeated random tokens (decoders), and importance
    once this session computed it."""
    metrics = computations.metrics_for(run)
    values = {name: metrics[name].to_numpy() for name in ("sink_mass", "normalized_entropy")}
    if run.is_causal:
        decoder = computations.decoder_scores(model_name)
        values.update({name: decoder[name].to_numpy() for name in DECODER_SCORES})
    importance = page_state.of_model(page_state.ABLATE_IMPORTANCE, model_name)
    if importance is not None:
        values["importance"] = importance["importance"].to_numpy()
    shape = (run.num_layers, run.num_heads)
    return {name: (SCORE_LABELS[name], scores.reshape(shape)) for name, scores in values.items()}


@dataclass(frozen=True)
class Effect:
    """What ablating the chosen heads did to the sentence: the runs before and after, the per-token table
    (``loss_table``), and the mean losses (None for a model without a language-model head)."""

    before: object
    after: object
    table: pd.DataFrame
    mean_before: float | None
    mean_after: float | None


def mean_losses(before, after) -> tuple[float, float]:
    """The mean loss before and after, over the tokens that have one in the ablated run."""
    finite = np.isfinite(after.token_losses)
    return float(np.mean(before.token_losses[finite])), float(np.mean(after.token_losses[finite]))


def effect(values: AblateSettings, selection, run) -> Effect:
    """The sentence's runs with and without the chosen heads (cached), and what changed."""
    after = computations.get_ablated_run(
        selection.model,
        run.engine,
        selection.text,
        run.text_pair,
        selection.bos,
        heads=tuple(values.chosen),
        ablation=values.ablation,
    )
    before = run  # plain runs carry no losses: the unablated run with them, cached like the ablated one
    if after.token_losses is not None:
        before = computations.get_ablated_run(
            selection.model,
            run.engine,
            selection.text,
            run.text_pair,
            selection.bos,
            heads=(),
            ablation=values.ablation,
        )
    means = mean_losses(before, after) if after.token_losses is not None else (None, None)
    return Effect(before, after, loss_table(before, after), *means)


def later_layers(chosen: list[tuple[int, int]], num_layers: int) -> tuple[int, int] | None:
    """The layers whose attention the ablation can change (after the first ablated one), or None."""
    first = min(layer for layer, _ in chosen)
    return (first + 1, num_layers - 1) if first + 1 < num_layers else None


def run_induction(model_name: str, values: AblateSettings) -> None:
    """The induction experiment's Run: this session asks for it with these settings."""
    page_state.remember(
        page_state.ABLATE_INDUCTION, model_name, (int(values.k), int(values.draws), values.role, values.ablation)
    )


def induction(model_name: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(every condition, its summary) of the induction experiment this session ran, or None."""
    asked = page_state.of_model(page_state.ABLATE_INDUCTION, model_name)
    if not asked:
        return None
    frame = computations.induction_table(model_name, *asked)
    return frame, summarize_experiment(frame)


def compute_importance(model_name: str, values: AblateSettings) -> None:
    """The importance ranking's Compute: this session asks for it with these settings."""
    asked = (int(values.sentences), values.method, int(values.orders))
    page_state.remember(page_state.ABLATE_IMPORTANCE_ASKED, model_name, asked)


def importance(model_name: str) -> tuple[pd.DataFrame, pd.DataFrame] | None:
    """(importance, pruning curves) this session asked for, or None; the heads map may be coloured by it then."""
    asked = page_state.of_model(page_state.ABLATE_IMPORTANCE_ASKED, model_name)
    if not asked:
        return None
    table, curves = computations.importance_and_pruning(model_name, *asked, PRUNING_STEPS)
    page_state.remember(page_state.ABLATE_IMPORTANCE, model_name, table)
    return table, curves


def columns_shown(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its columns named in the session's language (its values as they are)."""
    return table.rename(columns={column: t(column) for column in table.columns})


# The induction experiment's conditions as ``mha_core.interventions.experiments`` names them (``shown_by_templates``).
CONDITION_TEMPLATES = ("top {k} {role}", "{k} random")


def condition_shown(condition: str) -> str:
    """An induction experiment's condition ("top 5 induction", "5 random", "none") in the session's language."""
    return shown_by_templates(condition, CONDITION_TEMPLATES, (*DECODER_SCORES, "none"))


def conditions_shown(table: pd.DataFrame) -> pd.DataFrame:
    """The experiment's table (every condition, or its summary) with its conditions and columns in the session's
    language."""
    return columns_shown(table.assign(condition=[condition_shown(c) for c in table["condition"]]))
