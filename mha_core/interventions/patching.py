"""Activation patching (Meng et al. 2022; Wang et al. 2023) and attribution patching (Nanda 2023; Syed et al. 2023).

Patching asks: if this one component computed what it computes on the clean prompt, while everything else runs on
the corrupted one, how much of the clean behaviour comes back? The metric (the logit of the answer minus the
foil's, at the last position) is normalised so that 0 is the corrupted run and 1 the clean run.

Components: a head (its output z before the output projection, at every position: ``edits.replace_heads_per_row``
at ``blocks.{l}.attn.hook_z``), a layer's attention (every head of it) or MLP output (``edits.replace_positions`` at
``blocks.{l}.hook_mlp_out``), or the residual stream after a layer at one position (at ``blocks.{l}.hook_resid_post``):
hook functions on named points, the same in both engines. Exact patching runs the corrupted prompt once per
component, many components to a batch (one row each). Attribution patching takes one forward
and one backward pass of the corrupted prompt: ``(clean - corrupted) . dmetric/dactivation`` is a linear
estimate of every component's patched metric at once; its top components are then patched exactly beside it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..edits import gradient_probe, replace_heads_per_row, replace_positions
from ..errors import quoted
from ..models.loaded import ENGINES
from ..progress import Progress, progress_part, report
from .readout import (
    CircuitError,
    decoder_parts,
    layer_points,
    lm_pass,
    same_length_pair,
    token_id,
    token_text,
)

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

PATCH_OVER = ("heads", "layers", "positions")
PATCH_METHODS = ("exact", "attribution")
DEFAULT_BATCH_SIZE = 32
DEFAULT_EXACT_TOP = 10
# |clean - corrupted| metric below this: the prompts do not differ in the behaviour, nothing to normalise by.
MIN_METRIC_GAP = 1e-4

# What each run keeps of every layer: the heads' outputs, the MLP's output, the residual stream after the layer.
RECORDED = {"z": "attn.hook_z", "mlp": "hook_mlp_out", "block": "hook_resid_post"}
Metric = Callable[[torch.Tensor], torch.Tensor]  # last-position logits [batch, vocab] -> [batch]


def logit_difference(answer_id: int, foil_id: int) -> Metric:
    """The default metric: logit of the answer minus the foil's, per batch row."""

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, answer_id] - logits[:, foil_id]

    return metric


@dataclass(frozen=True)
class Component:
    """One thing patched: ``kind`` "head" (layer, head), "attn" or "mlp" (layer) or "resid" (layer, position)."""

    kind: str
    layer: int
    index: int | None = None  # the head, or the position


def components(model: LoadedModel, over: str, length: int) -> list[Component]:
    if over == "heads":
        return [Component("head", layer, head) for layer in range(model.num_layers) for head in range(model.num_heads)]
    if over == "layers":
        return [Component(kind, layer) for layer in range(model.num_layers) for kind in ("attn", "mlp")]
    return [Component("resid", layer, position) for layer in range(model.num_layers) for position in range(length)]


class PatchRun:
    """The clean and corrupted prompts, what the clean run computed, and both runs' metric."""

    def __init__(
        self,
        model: LoadedModel,
        clean: str,
        corrupted: str,
        answer,
        foil,
        metric: Metric | None,
        gradients=False,
        engine: str = "transformers",
    ):
        """``gradients``: the corrupted pass also keeps the metric's gradient with respect to every head's output,
        MLP output and block output (one backward pass; attribution patching). ``engine``: whose passes (the
        same named points in both)."""
        self.model = model
        self.engine = engine
        decoder_parts(model)  # a CircuitError for a model whose residual stream cannot be read
        clean_ids, corrupted_ids = same_length_pair(model, clean, corrupted)
        self.length = len(clean_ids)
        self.clean_ids, self.corrupted_ids = torch.tensor([clean_ids]), torch.tensor([corrupted_ids])
        self.answer_id = token_id(model, answer, "answer")
        self.foil_id = token_id(model, foil, "foil")
        if self.answer_id == self.foil_id:
            raise CircuitError("The answer and the foil are the same token: the logit difference would be 0.")
        self.metric = metric or logit_difference(self.answer_id, self.foil_id)
        self.names = {kind: layer_points(model.num_layers, point) for kind, point in RECORDED.items()}
        self.gradients: dict[str, list] | None = None
        clean_logits, self.clean = self._recorded(self.clean_ids)
        self.clean_metric = float(self.metric(clean_logits)[0])
        if gradients:
            self.corrupted_metric = self._pass_with_gradients()
        else:
            corrupted_logits, self.corrupted = self._recorded(self.corrupted_ids)
            self.corrupted_metric = float(self.metric(corrupted_logits)[0])
        if abs(self.clean_metric - self.corrupted_metric) < MIN_METRIC_GAP:
            raise CircuitError(
                f"The metric is {self.clean_metric:.4g} on both prompts: there is no difference for patching to "
                "explain. Choose a corrupted prompt that changes the answer."
            )

    def _by_kind(self, cache: dict) -> dict[str, list]:
        return {kind: [cache[name].float() for name in names] for kind, names in self.names.items()}

    def _recorded(self, input_ids: torch.Tensor, hooks: dict | None = None, grad: bool = False):
        """One pass keeping every recorded point: (last-position logits ``[batch, vocab]``, ``{kind: [per layer]}``)."""
        keep = [name for names in self.names.values() for name in names]
        logits, cache = lm_pass(self.model, input_ids, self.engine, hooks=hooks, keep=keep, grad=grad)
        return logits, self._by_kind(cache)

    def _pass_with_gradients(self) -> float:
        """The corrupted pass, recording like ``_recorded`` and keeping d(metric)/d(each recorded output):
        a zero that requires a gradient is added at each point (``edits.gradient_probe``), and
        ``torch.autograd.grad`` takes the gradient with respect to those zeros only (no weight gradients)."""
        probes = {name: [] for names in self.names.values() for name in names}
        hooks = {name: gradient_probe(store) for name, store in probes.items()}
        logits, self.corrupted = self._recorded(self.corrupted_ids, hooks, grad=True)
        value = self.metric(logits.float()).sum()
        flat = [probes[name][-1] for names in self.names.values() for name in names]
        grads = iter(torch.autograd.grad(value, flat))
        self.gradients = {kind: [next(grads) for _ in names] for kind, names in self.names.items()}
        return float(value.detach())

    def normalised(self, values) -> np.ndarray:
        """Metric values as 0 = corrupted, 1 = clean."""
        return (np.asarray(values, dtype=np.float64) - self.corrupted_metric) / (
            self.clean_metric - self.corrupted_metric
        )

    def patched_metrics(self, chosen: list[Component]) -> torch.Tensor:
        """The metric of the corrupted prompt with each of ``chosen`` patched alone, one batch row each."""
        rows = len(chosen)
        model, clean = self.model, self.clean
        heads_by_layer: dict[int, torch.Tensor] = {}
        mlp_rows: dict[int, torch.Tensor] = {}
        resid_positions: dict[int, torch.Tensor] = {}
        for row, component in enumerate(chosen):
            if component.kind in ("head", "attn"):
                mask = heads_by_layer.setdefault(component.layer, torch.zeros(rows, model.num_heads, dtype=torch.bool))
                mask[row, slice(None) if component.kind == "attn" else component.index] = True
            elif component.kind == "mlp":
                mlp_rows.setdefault(component.layer, torch.zeros(rows, dtype=torch.bool))[row] = True
            else:
                where = resid_positions.setdefault(component.layer, torch.zeros(rows, self.length, dtype=torch.bool))
                where[row, component.index] = True
        hooks = {
            self.names["z"][layer]: replace_heads_per_row(mask, clean["z"][layer][0])
            for layer, mask in heads_by_layer.items()
        }
        for layer, mask in mlp_rows.items():
            hooks[self.names["mlp"][layer]] = replace_positions(clean["mlp"][layer][0], rows=mask)
        for layer, where in resid_positions.items():
            hooks[self.names["block"][layer]] = replace_positions(clean["block"][layer][0], positions=where)
        logits, _ = lm_pass(model, self.corrupted_ids.expand(rows, -1), self.engine, hooks=hooks)
        return self.metric(logits)

    def exact(self, chosen: list[Component], batch_size: int, progress: Progress | None = None) -> np.ndarray:
        """Each component's normalised score, patched alone (exact patching, batched)."""
        values = []
        for start in range(0, len(chosen), batch_size):
            report(progress, start, len(chosen), f"patching {start + 1}-{min(start + batch_size, len(chosen))}")
            values.extend(self.patched_metrics(chosen[start : start + batch_size]).tolist())
        report(progress, len(chosen), len(chosen), "done")
        return self.normalised(values)

    def attribution(self, chosen: list[Component]) -> np.ndarray:
        """Each component's normalised score estimated to first order from the corrupted pass's gradients:
        ``(clean - corrupted) . dmetric/dactivation`` (attribution patching; needs ``gradients=True``)."""
        if self.gradients is None:
            raise ValueError("attribution patching needs the PatchRun made with gradients=True")
        scores = []
        for component in chosen:
            name = {"head": "z", "attn": "z", "mlp": "mlp", "resid": "block"}[component.kind]
            change = self.clean[name][component.layer] - self.corrupted[name][component.layer]
            gradient = self.gradients[name][component.layer]
            if component.kind == "head":
                change, gradient = change[..., component.index, :], gradient[..., component.index, :]
            elif component.kind == "resid":
                change, gradient = change[:, component.index], gradient[:, component.index]
            scores.append(float((change * gradient).sum()))
        # A linear estimate of the patched metric minus the corrupted one, normalised like the exact scores.
        return np.asarray(scores) / (self.clean_metric - self.corrupted_metric)


def patch(
    model: LoadedModel,
    clean: str,
    corrupted: str,
    answer: str | int,
    foil: str | int,
    over: str = "heads",
    metric: Metric | None = None,
    method: str = "exact",
    batch_size: int = DEFAULT_BATCH_SIZE,
    exact_top: int = DEFAULT_EXACT_TOP,
    progress: Progress | None = None,
    engine: str = "transformers",
) -> pd.DataFrame:
    """Activation patching of every component of ``over`` from the ``clean`` prompt into the ``corrupted`` one.

    ``over``: ``"heads"`` (each head's output at every position; columns ``layer``, ``head``), ``"layers"``
    (each layer's attention output and MLP output at every position: ``layer``, ``component`` "attn"/"mlp") or
    ``"positions"`` (the residual stream after each layer at each position: ``layer``, ``position``, ``token``).
    ``score``: the metric with that component patched, 0 = the corrupted run, 1 = the clean run. ``metric``:
    a function of the last position's logits ``[batch, vocab]`` -> ``[batch]`` (default: the logit of ``answer``
    minus ``foil``'s). The prompts must have the same number of tokens.

    ``method="exact"``: one patched run per component, ``batch_size`` to a pass. ``method="attribution"``: the
    linear estimate of every score from one forward and one backward pass (Nanda 2023), with the exact score of
    the ``exact_top`` components of largest estimate in the column ``exact`` (NaN for the others), so the
    table shows where the estimate holds. ``table.attrs`` has both runs' metric. ``engine``: whose passes, the
    transformers checkpoint's or the from-scratch engine's (the same hook functions on the same named points).
    """
    if over not in PATCH_OVER:
        raise CircuitError(f"Patch over one of {', '.join(PATCH_OVER)}, not {quoted(over)}.")
    if method not in PATCH_METHODS:
        raise CircuitError(f"Patching method must be one of {', '.join(PATCH_METHODS)}, not {quoted(method)}.")
    if engine not in ENGINES:
        raise CircuitError(f"Unknown engine {quoted(engine)}: use one of {', '.join(ENGINES)}.")
    if batch_size < 1 or exact_top < 0:
        raise CircuitError("batch_size must be at least 1 and exact_top at least 0.")
    report(progress, 0, 1, "running both prompts")
    run = PatchRun(
        model, clean, corrupted, answer, foil, metric=metric, gradients=method == "attribution", engine=engine
    )
    chosen = components(model, over, run.length)
    if method == "exact":
        scores = run.exact(chosen, batch_size, progress_part(progress, 0, 1))
        exact = None
    else:
        report(progress, 0, 2, "attribution patching: one forward and one backward pass")
        scores = run.attribution(chosen)
        top = np.argsort(-np.abs(scores), kind="stable")[:exact_top]
        exact = np.full(len(chosen), np.nan)
        if len(top):
            exact[top] = run.exact([chosen[i] for i in top], batch_size, progress_part(progress, 1, 2))
    table = component_table(model, chosen, run, over)
    table["score"] = scores
    if exact is not None:
        table["exact"] = exact
    table.attrs.update(
        clean_metric=run.clean_metric,
        corrupted_metric=run.corrupted_metric,
        method=method,
        over=over,
        answer=token_text(model, run.answer_id),
        foil=token_text(model, run.foil_id),
        model=model.name,
        engine=engine,
    )
    return table


def component_table(model: LoadedModel, chosen: list[Component], run: PatchRun, over: str) -> pd.DataFrame:
    layers = [component.layer for component in chosen]
    if over == "heads":
        return pd.DataFrame({"layer": layers, "head": [component.index for component in chosen]})
    if over == "layers":
        return pd.DataFrame({"layer": layers, "component": [component.kind for component in chosen]})
    tokens = model.display.display(model.tokenizer.convert_ids_to_tokens(run.corrupted_ids[0].tolist()))
    return pd.DataFrame(
        {
            "layer": layers,
            "position": [component.index for component in chosen],
            "token": [tokens[component.index] for component in chosen],
        }
    )
