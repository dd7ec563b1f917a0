"""Head importance (Michel et al. 2019) and pruning curves: the loss of a fixed set of texts as heads are gated or
removed.

Importance gates multiply each head's output (its named point ``blocks.{l}.attn.hook_z``) by xi_h = 1, and |dL/dxi_h|
is read; the ablation method zeroes each head alone (``models.ablation``). Both in either engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from ..edits import scale_heads
from ..errors import HeadscopeError
from ..models.ablation import AblationError, ablation_hooks, check_heads, z_point
from ..models.forward import ForwardPass
from ..models.outputs import masked_token_losses, next_token_losses, output_change, padded
from ..progress import Progress, report
from ..run import per_head_frame

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

IMPORTANCE_METHODS = ("gradient", "ablation")


PRUNING_ORDERS = ("importance", "reverse", "random")


class LossProbe:
    """The loss of a fixed set of texts under any intervention: ``probe(hooks) -> float`` (``{name: function}``).

    Texts are encoded and batched once; for encoders without a head the unablated hidden states are
    kept, and the "loss" is the output change against them (0 without intervention).
    """

    def __init__(self, model: LoadedModel, texts: Sequence[str], engine: str = "transformers", batch_size: int = 16):
        if not texts:
            raise HeadscopeError("Give at least one text to measure the loss on.")
        self.model, self.engine = model, engine
        encoded = sorted((model.encode(text) for text in texts), key=len)
        self.batches = [padded(model, encoded[i : i + batch_size]) for i in range(0, len(encoded), batch_size)]
        self.encoded = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
        self.kind = model.lm_head_kind or "output_change"
        self.base = None
        if self.kind == "output_change":
            self.base = [model.hidden_states(batch, engine) for batch in self.batches]

    @property
    def measure(self) -> str:
        return {
            "causal": "next-token loss (nats)",
            "masked": "masked-token loss (nats)",
            "output_change": "output change (cosine distance)",
        }[self.kind]

    def per_text(self, hooks: dict | None = None) -> np.ndarray:
        values = []
        for index, (batch, items) in enumerate(zip(self.batches, self.encoded)):
            ids, mask, types = batch.input_ids, batch.attention_mask, batch.token_type_ids
            if self.kind == "masked":
                for row, item in enumerate(items):
                    row_types = None if types is None else types[row, : len(item)]
                    text = ForwardPass(torch.tensor(item.input_ids), token_type_ids=row_types, hooks=hooks)
                    losses = masked_token_losses(self.model, self.engine, text, item.special_mask)
                    values.append(float(np.nanmean(losses)) if np.isfinite(losses).any() else 0.0)
                continue
            hidden = self.model.hidden_states(batch.with_changes(hooks=hooks), self.engine)
            if self.kind == "causal":
                with torch.inference_mode():
                    losses = next_token_losses(self.model.logits(hidden), ids) * mask[:, 1:]
                values += (losses.sum(1) / mask[:, 1:].sum(1).clamp_min(1)).tolist()
            else:
                values += output_change(self.base[index], hidden, mask)[0].tolist()
        return np.asarray(values, dtype=np.float64)

    def __call__(self, hooks: dict | None = None) -> float:
        return float(self.per_text(hooks).mean())


# ---- head importance (Michel et al. 2019) ---------------------------------------------------------
def _gradient_importance(
    model: LoadedModel, texts, batch_size: int, progress: Progress | None, engine: str = "transformers"
) -> np.ndarray:
    """sum over texts of |dL_x/dxi_h| at xi = 1, for gates xi_h multiplied on each head's output.

    L_x is a text's mean token loss. The absolute value is taken per text, as in Michel et al.'s formula
    (I_h = E_x |dL(x)/dxi_h|): within a batch every text has its own gates (one row of ``gates`` per
    text), so one backward pass gives each text's own gradient and signs never cancel across texts.
    ``batch_size`` only sets how many texts share a forward pass.
    """
    if model.lm_head_kind not in ("causal", "masked"):
        raise AblationError("gradient importance needs a language-model head")
    if batch_size < 1:
        raise AblationError(f"batch_size must be at least 1, got {batch_size}")
    model.output_projections()  # fails clearly for a model whose heads cannot be edited
    num_layers, num_heads = model.num_layers, model.num_heads
    total = torch.zeros(num_layers, num_heads, dtype=torch.float64)
    encoded = [model.encode(text) for text in texts]
    if model.lm_head_kind == "causal":
        encoded = [item for item in encoded if len(item) >= 2]  # one token predicts nothing
        encoded.sort(key=len)  # similar lengths together: less padding
        batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    else:
        batches = [[item] for item in encoded]  # each text is already a batch of its masked copies
    done = 0
    for batch in batches:
        # One row of gates per text; a masked LM's rows are copies of one text, which share its gates.
        gates = torch.ones(len(batch), num_layers, num_heads, requires_grad=True)
        hooks = {z_point(layer): scale_heads(gates[:, layer]) for layer in range(num_layers)}
        with torch.enable_grad():
            loss = _batch_loss(model, batch, hooks, engine)
            done += len(batch)
            if loss is None:
                continue
            # The texts of a batch do not interact, so d(sum of losses)/d(text b's gates) = dL_b/dxi.
            (gradient,) = torch.autograd.grad(loss, gates)
        total += gradient.abs().double().sum(dim=0)
        report(progress, done, len(encoded), f"importance: text {done} of {len(encoded)}")
    return total.numpy()


def _batch_loss(model: LoadedModel, batch, hooks: dict, engine: str) -> torch.Tensor | None:
    """The sum of each text's mean token loss (causal head), or one text's mean masked-token loss (MLM head),
    with gradients through ``hooks`` (the gates)."""
    if model.lm_head_kind == "causal":
        forward = padded(model, batch)
        ids, mask = forward.input_ids, forward.attention_mask
        hidden = model.hidden_states(forward.with_changes(hooks=hooks, grad=True), engine)
        losses = next_token_losses(model.logits(hidden), ids) * mask[:, 1:]
        return (losses.sum(1) / mask[:, 1:].sum(1)).sum()
    (item,) = batch
    positions = [i for i, special in enumerate(item.special_mask) if not special]
    if not positions or model.tokenizer.mask_token_id is None:
        return None
    ids = torch.tensor([item.input_ids])
    copies = ids.repeat(len(positions), 1)
    rows, where = torch.arange(len(positions)), torch.tensor(positions)
    copies[rows, where] = model.tokenizer.mask_token_id
    types = None if item.token_type_ids is None else torch.tensor([item.token_type_ids]).repeat(len(positions), 1)
    hidden = model.hidden_states(ForwardPass(copies, token_type_ids=types, hooks=hooks, grad=True), engine)
    return F.cross_entropy(model.logits(hidden[rows, where]), ids[0, where])


def _ablation_importance(model: LoadedModel, texts, engine: str, progress: Progress | None) -> np.ndarray:
    """Loss with each head alone zero-ablated, minus the loss without ablation (summed over texts)."""
    probe = LossProbe(model, texts, engine)
    base = probe.per_text().sum()
    scores = np.zeros((model.num_layers, model.num_heads))
    count = model.num_layers * model.num_heads
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            scores[layer, head] = probe.per_text(ablation_hooks(model, [(layer, head)])).sum() - base
            done = layer * model.num_heads + head + 1
            report(progress, done, count, f"ablating head {done} of {count}")
    return scores


def head_importance(
    model: LoadedModel,
    texts: Sequence[str],
    method: str = "gradient",
    normalize: bool = True,
    engine: str = "transformers",
    progress: Progress | None = None,
    batch_size: int = 8,
) -> pd.DataFrame:
    """Importance of every head: a DataFrame ``layer, head, importance`` (+ ``raw``, unnormalised).

    ``method="gradient"``: Michel et al. 2019, I_h = sum over texts x of |dL_x/dxi_h| for a gate xi_h (= 1)
    on each head's output, L_x the text's mean token loss; |.| per text, as the paper's formula says (its
    released code takes it per batch, where gradients of opposite signs cancel); ``batch_size`` texts share a
    forward pass, each with its own gates, and do not change the result. With
    ``normalize`` each layer's scores are divided by their L2 norm over the layer's heads, as in the paper. Needs a language-model head: for encoders without one the loss is
    the output change, whose gradient at xi = 1 is 0 (it is at its minimum), so they use the ablation
    method and ``attrs["method"]`` says so.
    ``method="ablation"``: the loss change when each head alone is zeroed (L x H passes over the texts).
    """
    if method not in IMPORTANCE_METHODS:
        raise AblationError(f"Unknown importance method {method!r}: use one of {', '.join(IMPORTANCE_METHODS)}.")
    texts = [text for text in texts if str(text).strip()]
    if not texts:
        raise HeadscopeError("Give at least one text to measure head importance on.")
    used = method if (method == "ablation" or model.has_lm_head) else "ablation"
    if used == "gradient":
        raw = _gradient_importance(model, texts, batch_size, progress, engine)
    else:
        raw = _ablation_importance(model, texts, engine, progress)
    scores = raw.copy()
    if normalize:
        norms = np.linalg.norm(raw, axis=1, keepdims=True)
        scores = np.divide(raw, norms, out=np.zeros_like(raw), where=norms > 0)
    frame = per_head_frame(model.num_layers, model.num_heads, importance=scores, raw=raw)
    frame.attrs.update(
        method=used, requested_method=method, normalized=normalize, texts=len(texts), batch_size=batch_size
    )
    frame.attrs["loss"] = {"causal": "next-token loss", "masked": "masked-token loss"}.get(
        model.lm_head_kind, "output change"
    )
    return frame


# ---- pruning curves -------------------------------------------------------------------------------
def pruning_order(importance: pd.DataFrame, order: str = "importance", seed: int = 0) -> list[tuple[int, int]]:
    """Heads in the order they are removed: least important first ("importance", as in the paper), most
    important first ("reverse"), or a random permutation ("random", ``seed``)."""
    if order not in PRUNING_ORDERS:
        raise AblationError(f"Unknown pruning order {order!r}: use one of {', '.join(PRUNING_ORDERS)}.")
    heads = list(zip(importance["layer"].astype(int), importance["head"].astype(int)))
    values = importance["importance"].to_numpy()
    if order == "random":
        return [heads[i] for i in np.random.default_rng(seed).permutation(len(heads))]
    ranked = np.argsort(values, kind="stable")
    return [heads[i] for i in (ranked if order == "importance" else ranked[::-1])]


def pruning_curve(
    model: LoadedModel,
    texts: Sequence[str],
    order: str | Sequence = "importance",
    importance: pd.DataFrame | None = None,
    steps: int = 10,
    seeds: Sequence[int] = (0, 1, 2),
    engine: str = "transformers",
    progress: Progress | None = None,
) -> pd.DataFrame:
    """The loss (or output change) as heads are zero-ablated cumulatively, at ``steps + 1`` points from none
    to all heads removed: Michel et al.'s pruning figure.

    ``order``: "importance" (least important first), "reverse", "random" (one curve per seed), or an
    explicit list of (layer, head). ``importance`` defaults to ``head_importance(model, texts)``.
    Returns ``order, seed, heads_removed, fraction_removed, loss``.
    """
    if steps < 1:
        raise AblationError("steps must be at least 1")
    probe = LossProbe(model, texts, engine)
    if isinstance(order, str):
        if order in ("importance", "reverse") and importance is None:
            importance = head_importance(model, texts)
        if order == "random":
            orders = [
                (
                    order,
                    seed,
                    pruning_order(per_head_frame(model.num_layers, model.num_heads, importance=0.0), order, seed),
                )
                for seed in seeds
            ]
        else:
            orders = [(order, -1, pruning_order(importance, order))]
    else:
        orders = [("given", -1, check_heads(model, order))]
    total_heads = model.num_layers * model.num_heads
    rows = []
    jobs = len(orders) * (steps + 1)
    for index, (name, seed, heads) in enumerate(orders):
        counts = sorted({round(len(heads) * k / steps) for k in range(steps + 1)})
        for step, count in enumerate(counts):
            hooks = ablation_hooks(model, heads[:count])
            rows.append(
                dict(
                    order=name, seed=seed, heads_removed=count, fraction_removed=count / total_heads, loss=probe(hooks)
                )
            )
            report(progress, index * (steps + 1) + step + 1, jobs, f"{name} order: {count} heads removed")
    frame = pd.DataFrame(rows)
    frame.attrs["measure"] = probe.measure
    return frame
