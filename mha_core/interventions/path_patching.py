"""Path patching (Wang et al. 2023; Goldowsky-Dill et al. 2023): a head's effect that reaches other heads through
one of their inputs only.

The sender's output on the corrupted prompt is patched into the clean run, and it may reach the logits only
through the receivers' queries, keys or values (``via``):

1. The clean prompt runs with every head's output (``blocks.{l}.attn.hook_z``) and every MLP's output
   (``blocks.{l}.hook_mlp_out``) frozen at their clean values, except the sender's, which takes its corrupted value.
   The residual stream each receiver reads is then the clean one plus the sender's change (through the
   norm before the receiver, recomputed), and the receivers' ``via`` input (``attn.hook_q``, ``hook_k`` or
   ``hook_v``) is recorded.
2. The clean prompt runs again with only the receivers' ``via`` input replaced by what step 1 recorded; the
   metric (the answer's logit minus the foil's at the last position) is read.

The score is ``(patched - clean) / (clean - corrupted)``: 0 when nothing of the sender's effect goes that way,
-1 when the whole difference between the prompts does. Keys and values of grouped-query models (Llama,
SmolLM2) are per KV head: patching a receiver's key or value patches its KV head, which the other query heads of
its group read as well (the table's ``attrs["kv_heads"]`` names them). Many senders run at once, one batch row
each; both steps are hook functions on named points, in either engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..errors import quoted
from ..models.loaded import ENGINES
from ..progress import Progress, report
from .patching import MIN_METRIC_GAP, logit_difference
from .readout import CircuitError, decoder_parts, layer_points, lm_pass, same_length_pair, token_id, token_text

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

PATH_VIA = ("q", "k", "v")
DEFAULT_PATH_BATCH = 16


def _head_list(model: LoadedModel, heads, what: str) -> list[tuple[int, int]]:
    """``[(layer, head), ...]`` checked against the model's range."""
    try:
        pairs = [(int(layer), int(head)) for layer, head in heads]
    except (TypeError, ValueError) as error:
        raise CircuitError(f"The {what} must be (layer, head) pairs.") from error
    for layer, head in pairs:
        if not (0 <= layer < model.num_layers and 0 <= head < model.num_heads):
            raise CircuitError(
                f"{what.capitalize()} {layer}-{head} is outside this model's {model.num_layers} layers x "
                f"{model.num_heads} heads."
            )
    return list(dict.fromkeys(pairs))


class PathPatchRun:
    """Both prompts' recorded head and MLP outputs, their metrics, and the receivers of one input (``via``)."""

    def __init__(self, model: LoadedModel, clean, corrupted, answer, foil, engine: str = "transformers"):
        decoder_parts(model)  # a CircuitError for a model without a next-token head
        if engine not in ENGINES:
            raise CircuitError(f"Unknown engine {quoted(engine)}: use one of {', '.join(ENGINES)}.")
        self.model, self.engine = model, engine
        clean_ids, corrupted_ids = same_length_pair(model, clean, corrupted)
        self.clean_ids, self.corrupted_ids = torch.tensor([clean_ids]), torch.tensor([corrupted_ids])
        self.answer_id, self.foil_id = token_id(model, answer, "answer"), token_id(model, foil, "foil")
        if self.answer_id == self.foil_id:
            raise CircuitError("The answer and the foil are the same token: the logit difference would be 0.")
        self.metric = logit_difference(self.answer_id, self.foil_id)
        self.z_names = layer_points(model.num_layers, "attn.hook_z")
        self.mlp_names = layer_points(model.num_layers, "hook_mlp_out")
        logits, cache = lm_pass(model, self.clean_ids, engine, keep=self.z_names + self.mlp_names)
        self.clean_metric = float(self.metric(logits)[0])
        self.clean_z = [cache[name][0] for name in self.z_names]
        self.clean_mlp = [cache[name][0] for name in self.mlp_names]
        logits, cache = lm_pass(model, self.corrupted_ids, engine, keep=self.z_names)
        self.corrupted_metric = float(self.metric(logits)[0])
        self.corrupted_z = [cache[name][0] for name in self.z_names]
        if abs(self.clean_metric - self.corrupted_metric) < MIN_METRIC_GAP:
            raise CircuitError(
                f"The metric is {self.clean_metric:.4g} on both prompts: there is nothing for path patching to "
                "explain. Choose a corrupted prompt that changes the answer."
            )

    def _frozen_z(self, layer: int, senders: list[tuple[int, int]]):
        """Layer ``layer``'s head outputs for a batch of ``senders``: every row the clean outputs, row r's sender
        (when it is of this layer) its corrupted output."""
        clean, corrupted = self.clean_z[layer], self.corrupted_z[layer]

        def edit(z: torch.Tensor) -> torch.Tensor:
            frozen = clean.to(z.dtype).expand_as(z).clone()
            for row, (sender_layer, head) in enumerate(senders):
                if sender_layer == layer:
                    frozen[row, :, head] = corrupted[:, head].to(z.dtype)
            return frozen

        return edit

    def _frozen_mlp(self, layer: int):
        clean = self.clean_mlp[layer]
        return lambda out: clean.to(out.dtype).expand_as(out)

    def patched(self, senders: list[tuple[int, int]], receivers: list[tuple[int, int]], via: str) -> np.ndarray:
        """The metric of the clean prompt with each sender's path into the receivers' ``via`` patched (a row each)."""
        rows = len(senders)
        ids = self.clean_ids.expand(rows, -1)
        point = f"attn.hook_{via}"
        receiver_layers = sorted({layer for layer, _ in receivers})
        names = {layer: layer_points(self.model.num_layers, point)[layer] for layer in receiver_layers}
        hooks = {name: self._frozen_z(layer, senders) for layer, name in enumerate(self.z_names)}
        hooks.update({name: self._frozen_mlp(layer) for layer, name in enumerate(self.mlp_names)})
        _, cache = lm_pass(self.model, ids, self.engine, hooks=hooks, keep=list(names.values()))
        patches = {}
        for layer in receiver_layers:
            recorded = cache[names[layer]]  # [rows, n, heads or KV heads, e]
            group = self.model.num_heads // recorded.shape[2]
            indices = sorted({head // group for receiver_layer, head in receivers if receiver_layer == layer})
            patches[names[layer]] = _replace_heads(recorded, indices)
        logits, _ = lm_pass(self.model, ids, self.engine, hooks=patches)
        return self.metric(logits).double().numpy()

    def normalised(self, values: np.ndarray) -> np.ndarray:
        return (np.asarray(values, dtype=np.float64) - self.clean_metric) / (self.clean_metric - self.corrupted_metric)


def _replace_heads(values: torch.Tensor, heads: list[int]):
    """A hook function on ``[batch, n, heads, e]`` that takes ``values``' slices at ``heads``, row by row."""

    def edit(x: torch.Tensor) -> torch.Tensor:
        x = x.clone()
        x[:, :, heads] = values[:, :, heads].to(x.dtype)
        return x

    return edit


def path_patch(
    model: LoadedModel,
    clean: str,
    corrupted: str,
    answer: str | int,
    foil: str | int,
    sender: tuple[int, int] | None = None,
    receivers=(),
    via: str = "q",
    engine: str = "transformers",
    batch_size: int = DEFAULT_PATH_BATCH,
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Path patching from ``sender`` (a head ``(layer, head)``; None: a sweep of every head) into ``receivers``
    (heads) through their ``via`` input ("q", "k" or "v"), module docstring. One row per sender: layer, head,
    metric (the patched logit difference), score (``(metric - clean) / (clean - corrupted)``: -1 the whole
    effect, 0 none); a sender in no layer before a receiver's gets NaN (it cannot reach it). ``attrs``: both
    prompts' metric, the receivers, via, the KV heads patched."""
    if via not in PATH_VIA:
        raise CircuitError(f"Path patching goes through one of {', '.join(PATH_VIA)}, not {quoted(str(via), 10)}.")
    if batch_size < 1:
        raise CircuitError("batch_size must be at least 1.")
    receivers = _head_list(model, receivers, "receiver")
    if not receivers:
        raise CircuitError("Name at least one receiver head, e.g. receivers=[(18, 6)].")
    senders = (
        [(layer, head) for layer in range(model.num_layers) for head in range(model.num_heads)]
        if sender is None
        else _head_list(model, [sender], "sender")
    )
    report(progress, 0, 1, "running both prompts")
    run = PathPatchRun(model, clean, corrupted, answer, foil, engine=engine)
    last = max(layer for layer, _ in receivers)
    reachable = [pair for pair in senders if pair[0] < last]
    metrics = dict.fromkeys(senders, np.nan)
    for start in range(0, len(reachable), batch_size):
        batch = reachable[start : start + batch_size]
        report(progress, start, len(reachable), f"path patching senders {start + 1}-{start + len(batch)}")
        # A receiver no earlier than the sender reads none of its output: only the later receivers are patched,
        # so each batch holds senders with the same set of later receivers.
        for group in _same_receivers(batch, receivers):
            later = [pair for pair in receivers if pair[0] > group[0][0]]
            metrics.update(zip(group, run.patched(group, later, via), strict=True))
    report(progress, len(reachable), max(len(reachable), 1), "done")
    table = pd.DataFrame(senders, columns=["layer", "head"])
    table["metric"] = [metrics[pair] for pair in senders]
    table["score"] = run.normalised(table["metric"].to_numpy())
    kv = model.hf_model.config
    group = model.num_heads // int(getattr(kv, "num_key_value_heads", None) or model.num_heads)
    table.attrs.update(
        clean_metric=run.clean_metric,
        corrupted_metric=run.corrupted_metric,
        receivers=receivers,
        via=via,
        kv_heads=sorted({(layer, head // group) for layer, head in receivers}) if via != "q" else [],
        answer=token_text(model, run.answer_id),
        foil=token_text(model, run.foil_id),
        model=model.name,
        engine=engine,
    )
    return table


def _same_receivers(batch: list[tuple[int, int]], receivers: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """``batch`` split into runs of senders that precede the same receivers."""
    groups: dict[tuple, list] = {}
    for pair in batch:
        groups.setdefault(tuple(r for r in receivers if r[0] > pair[0]), []).append(pair)
    return list(groups.values())
