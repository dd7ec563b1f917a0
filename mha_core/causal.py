"""Causal evidence: ablate heads, measure what the model loses, rank heads by importance.

Attention weights are correlations; ablation is an intervention. Head h of layer l contributes
Concat(head_1, ..., head_H) W^O through its slice ``[h * d_k, (h + 1) * d_k)`` of the output
projection's input (``o_proj`` / ``attention.output.dense`` / ``c_proj``, named per family in
``mha_core.families``). Every intervention here is a function of that input (an "edit"):

- zero ablation: the slice is set to 0;
- mean ablation: the slice is replaced by its mean over a reference set of texts (``head_means``);
- importance gates (Michel et al. 2019): the slice is multiplied by xi_h = 1, and |dL/dxi_h| is read.

The transformers engine applies edits with forward pre-hooks on the output projections; the
from-scratch engine applies the same functions inside its own attention (``engine.py``).

Losses: models with a causal LM head, the mean of -log p(token[i+1] | tokens[:i+1]); models with a
masked-LM head, the mean loss of each non-special token masked in turn; sentence encoders without a
head, the output change: the cosine distance between the mean-pooled final hidden states with and
without the intervention (0 when nothing changes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from .errors import HeadscopeError
from .progress import Progress, report
from .run import per_head_frame

if TYPE_CHECKING:
    import pandas as pd

    from .models import LoadedModel
    from .tokens import EncodedText

ABLATIONS = ("zero", "mean")
IMPORTANCE_METHODS = ("gradient", "ablation")
PRUNING_ORDERS = ("importance", "reverse", "random")
# Mean ablation replaces a head's output by its mean over these texts: the first sentences of the shipped
# UD English EWT dev split (a stated, fixed reference, so two runs ablate with the same values).
MEAN_REFERENCE_SENTENCES = 32


class AblationError(HeadscopeError, ValueError):
    """A bad ablation request: a head that does not exist, an unknown ablation kind."""


# ---- which heads, and the edits that ablate them ----------------------------------------------------
def check_heads(model: LoadedModel, heads) -> list[tuple[int, int]]:
    """``[(layer, head), ...]`` validated against the model, duplicates removed, in the given order."""
    checked: list[tuple[int, int]] = []
    for item in heads or ():
        try:
            layer, head = (int(v) for v in item)
        except (TypeError, ValueError):
            raise AblationError(f"Name each head as (layer, head), got {item!r}.") from None
        if not (0 <= layer < model.num_layers and 0 <= head < model.num_heads):
            raise AblationError(
                f"Head ({layer}, {head}) does not exist: {model.name!r} has layers 0-{model.num_layers - 1} "
                f"and heads 0-{model.num_heads - 1}."
            )
        if (layer, head) not in checked:
            checked.append((layer, head))
    return checked


def reference_texts(count: int = MEAN_REFERENCE_SENTENCES) -> list[str]:
    """The texts mean ablation averages over (``MEAN_REFERENCE_SENTENCES`` UD EWT dev sentences)."""
    from .syntax import ud_ewt_dev

    return [" ".join(sentence.words) for sentence in ud_ewt_dev(count)]


def head_means(model: LoadedModel, texts: Sequence[str] | None = None, batch_size: int = 16) -> torch.Tensor:
    """Each layer's Concat(heads) averaged over every real token of ``texts``: float32 ``[layers, width]``.

    ``texts`` default to ``reference_texts()``. Cached on the model per reference set.
    """
    texts = tuple(reference_texts() if texts is None else texts)
    if not texts:
        raise AblationError("Mean ablation needs at least one reference text.")
    cached = model._head_means.get(texts)
    if cached is not None:
        return cached
    projections = model.output_projections()
    sums: list[torch.Tensor | None] = [None] * len(projections)
    count = 0
    mask_holder: dict = {}

    def recorder(layer: int):
        def hook(module, args):
            concat = args[0].float()
            weights = mask_holder["mask"][..., None].to(concat.dtype)
            total = (concat * weights).sum(dim=(0, 1))
            sums[layer] = total if sums[layer] is None else sums[layer] + total

        return hook

    encoded = [model.encode(text) for text in texts]
    with model._forward_lock:
        handles = [p.register_forward_pre_hook(recorder(i)) for i, p in enumerate(projections)]
        try:
            for start in range(0, len(encoded), batch_size):
                ids, mask, types = padded(model, encoded[start : start + batch_size])
                mask_holder["mask"] = mask
                count += int(mask.sum())
                with torch.inference_mode():
                    model.hf_model(**model._inputs(ids, mask, types))
        finally:
            for handle in handles:
                handle.remove()
    means = torch.stack([total / count for total in sums])
    model._head_means[texts] = means
    return means


def head_edits(
    model: LoadedModel, heads, ablation: str = "zero", reference: Sequence[str] | None = None
) -> dict | None:
    """``{layer: edit}`` that ablate ``heads`` (zero or mean), for either engine; None when there are none."""
    if ablation not in ABLATIONS:
        raise AblationError(f"Unknown ablation {ablation!r}: use one of {', '.join(ABLATIONS)}.")
    heads = check_heads(model, heads)
    if not heads:
        return None
    projections = model.output_projections()
    means = head_means(model, reference) if ablation == "mean" else None
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    edits = {}
    for layer, layer_heads in by_layer.items():
        width = _concat_width(projections[layer])
        head_dim = width // model.num_heads
        keep = torch.ones(width, dtype=torch.bool)
        for head in layer_heads:
            keep[head * head_dim : (head + 1) * head_dim] = False
        replacement = torch.zeros(width) if means is None else means[layer]
        edits[layer] = _replace(keep, replacement)
    return edits


def _replace(keep: torch.Tensor, replacement: torch.Tensor):
    def edit(concat: torch.Tensor) -> torch.Tensor:
        return torch.where(keep.to(concat.device), concat, replacement.to(concat.device, concat.dtype))

    return edit


def _concat_width(projection) -> int:
    """The input width of an output projection: ``nn.Linear.in_features`` or a GPT-2 ``Conv1D``'s rows."""
    width = getattr(projection, "in_features", None)
    return int(width) if width is not None else int(projection.weight.shape[0])


# ---- losses ---------------------------------------------------------------------------------------
def padded(model: LoadedModel, encoded: Sequence[EncodedText]):
    """``(input_ids, attention_mask, token_type_ids or None)``, right-padded to the longest text."""
    width = max(len(item) for item in encoded)
    ids = torch.full((len(encoded), width), model.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    types = torch.zeros((len(encoded), width), dtype=torch.long) if model._uses_token_types else None
    for row, item in enumerate(encoded):
        ids[row, : len(item)] = torch.tensor(item.input_ids)
        mask[row, : len(item)] = 1
        if types is not None:
            types[row, : len(item)] = torch.tensor(item.token_type_ids)
    return ids, mask, types


def next_token_losses(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``-log p(token[i+1] | tokens[:i+1])``: float32 ``[..., n - 1]`` from logits ``[..., n, vocab]``."""
    return F.cross_entropy(
        logits[..., :-1, :].reshape(-1, logits.shape[-1]).float(), input_ids[..., 1:].reshape(-1), reduction="none"
    ).reshape(input_ids[..., 1:].shape)


def chunked_next_token_losses(
    model: LoadedModel, hidden: torch.Tensor, ids: torch.Tensor, chunk: int = 64
) -> np.ndarray:
    """``next_token_losses`` of one text ``hidden [n, d]``, ``ids [n]``, with logits for ``chunk`` positions at a
    time (a whole text's logits, n x vocabulary, would be 100 MB for SmolLM2 at 512 tokens)."""
    losses = []
    with torch.inference_mode():
        for start in range(0, max(len(ids) - 1, 0), chunk):
            stop = min(start + chunk, len(ids) - 1)
            logits = model.logits(hidden[start:stop])
            losses.append(F.cross_entropy(logits, ids[start + 1 : stop + 1], reduction="none"))
    return torch.cat(losses).numpy().copy() if losses else np.zeros(0, dtype=np.float32)


def masked_token_losses(
    model: LoadedModel, engine: str, input_ids, token_type_ids, special_mask, edits=None
) -> np.ndarray:
    """Each non-special token's loss with that token replaced by the mask token: float32 ``[n]``, NaN at specials.

    One batch of k copies of the text, copy j with its j-th non-special token masked (k forward passes' work).
    """
    ids = torch.as_tensor(input_ids).reshape(-1)
    losses = np.full(len(ids), np.nan, dtype=np.float32)
    positions = [i for i, special in enumerate(special_mask) if not special]
    mask_id = model.tokenizer.mask_token_id
    if not positions or mask_id is None:
        return losses
    copies = ids.repeat(len(positions), 1)
    rows = torch.arange(len(positions))
    where = torch.tensor(positions)
    copies[rows, where] = mask_id
    types = None if token_type_ids is None else torch.as_tensor(token_type_ids).reshape(1, -1).repeat(len(positions), 1)
    with torch.inference_mode():
        hidden = model.final_hidden(engine, copies, None, types, edits)[rows, where]
        per_token = F.cross_entropy(model.logits(hidden), ids[where], reduction="none")
    losses[positions] = per_token.numpy()
    return losses


def output_change(base_hidden: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None = None):
    """``(sentence [B], tokens [B, n])`` cosine distances (1 - cos) of mean-pooled and per-token hidden states."""
    if mask is None:
        mask = torch.ones(hidden.shape[:2])
    weights = mask[..., None].to(hidden.dtype)

    def pooled(states):
        return (states * weights).sum(1) / weights.sum(1).clamp_min(1.0)

    sentence = 1.0 - F.cosine_similarity(pooled(base_hidden), pooled(hidden), dim=-1)
    tokens = (1.0 - F.cosine_similarity(base_hidden, hidden, dim=-1)) * mask.to(hidden.dtype)
    return sentence, tokens


def losses_wanted(model: LoadedModel, losses: bool | None, edits: dict | None) -> bool:
    """Whether a run reports ``run_outputs`` (which needs the pass's final hidden states): ``losses`` True or
    False, or None: for ablated runs only. Masked-LM losses cost one forward pass per token, causal ones
    the LM head over every position (+20% on SmolLM2), so plain runs do not pay for them."""
    wanted = bool(edits) if losses is None else bool(losses)
    return wanted and (model.lm_head_kind is not None or bool(edits))


def run_outputs(
    model: LoadedModel,
    engine: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    hidden: torch.Tensor | None,
    encoded: Sequence[EncodedText],
    edits: dict | None,
) -> list[dict]:
    """What each run of a batch reports besides attention, when it was asked for (``losses_wanted``):
    ``token_losses`` (models with a head) or, for ablated runs of encoders without one, ``output_change`` and
    ``token_output_change``. ``hidden``: the pass's final hidden states (None when nothing is reported)."""
    rows: list[dict] = [{} for _ in encoded]
    if hidden is None:
        return rows
    if model.lm_head_kind == "causal":
        for row, item in enumerate(encoded):
            rows[row]["token_losses"] = chunked_next_token_losses(
                model, hidden[row, : len(item)], input_ids[row, : len(item)]
            )
    elif model.lm_head_kind == "masked":
        for row, item in enumerate(encoded):
            types = None if token_type_ids is None else token_type_ids[row, : len(item)]
            rows[row]["token_losses"] = masked_token_losses(
                model, engine, item.input_ids, types, item.special_mask, edits
            )
    elif edits:
        base = model.final_hidden(engine, input_ids, attention_mask, token_type_ids)
        sentence, tokens = output_change(base, hidden, attention_mask)
        for row, item in enumerate(encoded):
            rows[row]["output_change"] = float(sentence[row])
            rows[row]["token_output_change"] = tokens[row, : len(item)].numpy().copy()
    return rows


class LossProbe:
    """The loss of a fixed set of texts under any intervention: ``probe(edits) -> float``.

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
            self.base = [model.final_hidden(engine, *batch) for batch in self.batches]

    @property
    def measure(self) -> str:
        return {
            "causal": "next-token loss (nats)",
            "masked": "masked-token loss (nats)",
            "output_change": "output change (cosine distance)",
        }[self.kind]

    def per_text(self, edits: dict | None = None) -> np.ndarray:
        values = []
        for index, ((ids, mask, types), items) in enumerate(zip(self.batches, self.encoded)):
            if self.kind == "masked":
                for row, item in enumerate(items):
                    row_types = None if types is None else types[row, : len(item)]
                    losses = masked_token_losses(
                        self.model, self.engine, item.input_ids, row_types, item.special_mask, edits
                    )
                    values.append(float(np.nanmean(losses)) if np.isfinite(losses).any() else 0.0)
                continue
            hidden = self.model.final_hidden(self.engine, ids, mask, types, edits)
            if self.kind == "causal":
                with torch.inference_mode():
                    losses = next_token_losses(self.model.logits(hidden), ids) * mask[:, 1:]
                values += (losses.sum(1) / mask[:, 1:].sum(1).clamp_min(1)).tolist()
            else:
                values += output_change(self.base[index], hidden, mask)[0].tolist()
        return np.asarray(values, dtype=np.float64)

    def __call__(self, edits: dict | None = None) -> float:
        return float(self.per_text(edits).mean())


# ---- head importance (Michel et al. 2019) ---------------------------------------------------------
def _gradient_importance(model: LoadedModel, texts, batch_size: int, progress: Progress | None) -> np.ndarray:
    """sum over texts of |dL_x/dxi_h| at xi = 1, for gates xi_h multiplied on each head's output slice.

    L_x is a text's mean token loss. The absolute value is taken per text, as in Michel et al.'s formula
    (I_h = E_x |dL(x)/dxi_h|): within a batch every text has its own gates (one row of ``gates`` per
    text), so one backward pass gives each text's own gradient and signs never cancel across texts.
    ``batch_size`` only sets how many texts share a forward pass.
    """
    if model.lm_head_kind not in ("causal", "masked"):
        raise AblationError("gradient importance needs a language-model head")
    if batch_size < 1:
        raise AblationError(f"batch_size must be at least 1, got {batch_size}")
    projections = model.output_projections()
    num_layers, num_heads = model.num_layers, model.num_heads
    total = torch.zeros(num_layers, num_heads, dtype=torch.float64)
    current: dict[str, torch.Tensor] = {}  # this batch's gates [texts, L, H]

    def gate(layer: int):
        def hook(module, args):
            concat = args[0]  # [rows, n, H * d]; a masked LM's rows are copies of one text, which share its gates
            head_dim = concat.shape[-1] // num_heads
            scale = current["gates"][:, layer].repeat_interleave(head_dim, dim=-1)[:, None, :]
            return (concat * scale.to(concat.dtype), *args[1:])

        return hook

    encoded = [model.encode(text) for text in texts]
    if model.lm_head_kind == "causal":
        encoded = [item for item in encoded if len(item) >= 2]  # one token predicts nothing
        encoded.sort(key=len)  # similar lengths together: less padding
        batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    else:
        batches = [[item] for item in encoded]  # each text is already a batch of its masked copies
    with model._forward_lock:
        handles = [p.register_forward_pre_hook(gate(i)) for i, p in enumerate(projections)]
        try:
            with torch.enable_grad():
                done = 0
                for batch in batches:
                    gates = torch.ones(len(batch), num_layers, num_heads, requires_grad=True)
                    current["gates"] = gates
                    loss = _batch_loss(model, batch)
                    done += len(batch)
                    if loss is None:
                        continue
                    # The texts of a batch do not interact, so d(sum of losses)/d(text b's gates) = dL_b/dxi.
                    (gradient,) = torch.autograd.grad(loss, gates)
                    total += gradient.abs().double().sum(dim=0)
                    report(progress, done, len(encoded), f"importance: text {done} of {len(encoded)}")
        finally:
            current.clear()
            for handle in handles:
                handle.remove()
    return total.numpy()


def _batch_loss(model: LoadedModel, batch) -> torch.Tensor | None:
    """The sum of each text's mean token loss (causal head), or one text's mean masked-token loss (MLM head)."""
    if model.lm_head_kind == "causal":
        ids, mask, types = padded(model, batch)
        hidden = model.hf_model(**model._inputs(ids, mask, types)).last_hidden_state
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
    hidden = model.hf_model(**model._inputs(copies, None, types)).last_hidden_state
    return F.cross_entropy(model.logits(hidden[rows, where]), ids[0, where])


def _ablation_importance(model: LoadedModel, texts, engine: str, progress: Progress | None) -> np.ndarray:
    """Loss with each head alone zero-ablated, minus the loss without ablation (summed over texts)."""
    probe = LossProbe(model, texts, engine)
    base = probe.per_text().sum()
    scores = np.zeros((model.num_layers, model.num_heads))
    count = model.num_layers * model.num_heads
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            scores[layer, head] = probe.per_text(head_edits(model, [(layer, head)])).sum() - base
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
        raw = _gradient_importance(model, texts, batch_size, progress)
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
    import pandas as pd

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
            edits = head_edits(model, heads[:count])
            rows.append(
                dict(
                    order=name, seed=seed, heads_removed=count, fraction_removed=count / total_heads, loss=probe(edits)
                )
            )
            report(progress, index * (steps + 1) + step + 1, jobs, f"{name} order: {count} heads removed")
    frame = pd.DataFrame(rows)
    frame.attrs["measure"] = probe.measure
    return frame


# ---- the induction experiment ---------------------------------------------------------------------
def induction_experiment(
    model: LoadedModel,
    top_k: int = 5,
    role: str = "induction",
    random_draws: int = 4,
    seq_len: int = 50,
    batch: int = 8,
    seed: int = 0,
    scores: pd.DataFrame | None = None,
    ablation: str = "zero",
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Repeated random tokens (TransformerLens's test): the loss on the repeated half with no head ablated,
    with the ``top_k`` heads of ``role`` ablated, and with ``top_k`` random heads ablated (``random_draws``
    draws: the control). ``batch`` sequences of BOS + ``seq_len`` tokens + the same ``seq_len`` again.

    Returns one row per condition: ``condition, draw, heads, loss_first_half, loss_repeated_half``.
    Decoders with a causal LM head only.
    """
    import pandas as pd

    from .roles import DECODER_SCORES, decoder_head_scores, repeated_random_tokens

    if model.lm_head_kind != "causal":
        raise AblationError(
            f"The induction experiment measures next-token loss: {model.name!r} has {model.head_description}."
        )
    if role not in DECODER_SCORES:
        raise AblationError(f"Unknown role score {role!r}: use one of {', '.join(DECODER_SCORES)}.")
    total_heads = model.num_layers * model.num_heads
    if not 1 <= top_k <= total_heads:
        raise AblationError(f"top_k must be between 1 and {total_heads}, got {top_k}")
    if scores is None:
        scores = decoder_head_scores(model)
    ranked = scores.sort_values(role, ascending=False, kind="stable")
    top = list(zip(ranked["layer"].astype(int)[:top_k], ranked["head"].astype(int)[:top_k]))
    rng = np.random.default_rng(seed)
    conditions = [("none", 0, []), (f"top {top_k} {role}", 0, top)]
    for draw in range(random_draws):
        picks = rng.choice(total_heads, size=top_k, replace=False)
        conditions.append(
            (f"{top_k} random", draw, [(int(p) // model.num_heads, int(p) % model.num_heads) for p in picks])
        )
    tokenizer = model.tokenizer
    ids = torch.as_tensor(
        repeated_random_tokens(
            len(tokenizer), seq_len, 2, batch, seed, tokenizer.all_special_ids, model.encoder.bos_token_id
        )
    )
    offset = ids.shape[1] - 2 * seq_len  # 1 with a BOS
    rows = []
    for index, (name, draw, heads) in enumerate(conditions):
        hidden = model.final_hidden("transformers", ids, None, None, head_edits(model, heads, ablation))
        with torch.inference_mode():
            losses = next_token_losses(model.logits(hidden), ids)  # loss i predicts token i + 1
        first = losses[:, offset : offset + seq_len - 1].mean()
        repeated = losses[:, offset + seq_len - 1 :].mean()
        rows.append(
            dict(
                condition=name,
                draw=draw,
                heads=" ".join(f"L{layer}H{head}" for layer, head in heads) or "-",
                loss_first_half=float(first),
                loss_repeated_half=float(repeated),
            )
        )
        report(progress, index + 1, len(conditions), f"condition {index + 1} of {len(conditions)}: {name}")
    frame = pd.DataFrame(rows)
    frame.attrs.update(role=role, top_k=top_k, ablation=ablation, sequences=batch, seq_len=seq_len)
    return frame


def summarize_experiment(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per condition kind: mean and spread (sd over draws) of the repeated-half loss."""
    grouped = frame.groupby("condition", sort=False)["loss_repeated_half"]
    summary = grouped.agg(["mean", "std", "count"]).reset_index()
    summary["std"] = summary["std"].fillna(0.0)
    return summary.rename(columns={"mean": "loss_repeated_half", "std": "sd", "count": "draws"})


# ---- small helpers shared by the command line and the app -----------------------------------------
def parse_heads(spec: str) -> list[tuple[int, int]]:
    """``"3.2, 20.5"`` or ``"L3H2 L20H5"`` -> ``[(3, 2), (20, 5)]``."""
    import re

    heads = []
    for item in re.split(r"[\s,;]+", spec.strip()):
        if not item:
            continue
        match = re.fullmatch(r"(?:[Ll](\d+)[Hh](\d+))|(?:(\d+)[.:/](\d+))", item)
        if match is None:
            raise AblationError(f"Name heads as layer.head (3.2) or L3H2, got {item!r}.")
        numbers = [int(g) for g in match.groups() if g is not None]
        heads.append((numbers[0], numbers[1]))
    return heads


def corpus_texts(sentences) -> list[str]:
    """Plain texts of a corpus (``read_corpus``): trees become their words joined by spaces."""
    return [" ".join(s.words) if hasattr(s, "words") else str(s) for s in sentences]


def loss_table(before, after) -> pd.DataFrame:
    """Per token, before and after an ablation: ``position, token, loss_before, loss_after, change`` (models with
    a head; a causal head's row i is the loss of predicting token i from the tokens before it), or
    ``position, token, output_change`` (encoders without a head)."""
    import pandas as pd

    if after.token_losses is None:
        change = after.token_output_change if after.token_output_change is not None else np.zeros(after.num_tokens)
        return pd.DataFrame({"position": np.arange(after.num_tokens), "token": after.tokens, "output_change": change})
    if before.token_losses is None:
        raise HeadscopeError(
            "The run before the ablation carries no losses (plain runs skip them): make it with "
            "model.run(..., losses=True)."
        )
    offset = 1 if after.is_causal and len(after.token_losses) == after.num_tokens - 1 else 0
    positions = np.arange(offset, offset + len(after.token_losses))
    return pd.DataFrame(
        {
            "position": positions,
            "token": [after.tokens[i] for i in positions],
            "loss_before": before.token_losses,
            "loss_after": after.token_losses,
            "change": after.token_losses - before.token_losses,
        }
    )


def family_ablation(model: LoadedModel, text: str, primary: pd.DataFrame, ablation: str = "zero") -> pd.DataFrame:
    """For each role family in ``primary`` (``mha_core.primary_roles``: layer, head, family): the loss (or
    output change) of ``text`` with all heads of that family ablated at once, against no ablation.

    Returns ``family, heads, measure, before, after, change``, the largest change first.
    """
    import pandas as pd

    probe = LossProbe(model, [text])
    before = probe()
    rows = []
    for family, part in primary.groupby("family", sort=False):
        if family == "none":
            continue
        heads = list(zip(part["layer"].astype(int), part["head"].astype(int)))
        after = probe(head_edits(model, heads, ablation))
        rows.append(dict(family=family, heads=len(heads), measure=probe.measure, before=before, after=after))
    frame = pd.DataFrame(rows, columns=["family", "heads", "measure", "before", "after"])
    frame["change"] = frame["after"] - frame["before"]
    return frame.sort_values("change", ascending=False, kind="stable").reset_index(drop=True)


# ---- which roles are causal: named groups of heads against random groups of the same size -------------
def head_groups(
    table: pd.DataFrame, role_column: str | None = None, score_columns: Sequence[str] = (), top_k: int = 5
) -> dict[str, list[tuple[int, int]]]:
    """Named groups of heads from a per-head table (``layer, head, ...``): every value of ``role_column``
    (e.g. a profile's ``primary_role``; "none" and empty skipped), and the ``top_k`` heads of each score column."""
    groups: dict[str, list[tuple[int, int]]] = {}
    if role_column is not None:
        if role_column not in table.columns:
            raise HeadscopeError(f"the table has no column {role_column!r}")
        for role, part in table.groupby(role_column, sort=True):
            if str(role) in ("none", "nan", ""):
                continue
            groups[str(role)] = list(zip(part["layer"].astype(int), part["head"].astype(int)))
    for column in score_columns:
        if column not in table.columns:
            raise HeadscopeError(f"the table has no column {column!r}")
        ranked = table.sort_values(column, ascending=False, kind="stable").head(top_k)
        groups[f"top {top_k} {column}"] = list(zip(ranked["layer"].astype(int), ranked["head"].astype(int)))
    return groups


def group_ablation(
    model: LoadedModel,
    texts: Sequence[str],
    groups: dict[str, Sequence[tuple[int, int]]],
    draws: int = 4,
    seed: int = 0,
    ablation: str = "zero",
    progress: Progress | None = None,
) -> pd.DataFrame:
    """Each named group of heads ablated at once, against ``draws`` random groups of the same size (the
    control): ``group, heads, measure, before, after, random_mean, random_sd, excess`` where excess =
    (after - before) / (random_mean - before), the group's effect in units of a random group's effect."""
    import pandas as pd

    probe = LossProbe(model, texts)
    before = probe()
    rng = np.random.default_rng(seed)
    total = model.num_layers * model.num_heads
    rows = []
    for index, (name, heads) in enumerate(groups.items()):
        heads = check_heads(model, heads)
        after = probe(head_edits(model, heads, ablation))
        randoms = []
        for _ in range(draws):
            picks = rng.choice(total, size=len(heads), replace=False)
            randoms.append(
                probe(
                    head_edits(model, [(int(p) // model.num_heads, int(p) % model.num_heads) for p in picks], ablation)
                )
            )
        random_mean = float(np.mean(randoms)) if randoms else float("nan")
        rows.append(
            dict(
                group=name,
                heads=len(heads),
                measure=probe.measure,
                before=before,
                after=after,
                random_mean=random_mean,
                random_sd=float(np.std(randoms, ddof=1)) if len(randoms) > 1 else float("nan"),
                excess=(after - before) / (random_mean - before) if random_mean != before else float("nan"),
                head_list=" ".join(f"L{layer}H{head}" for layer, head in heads),
            )
        )
        report(progress, index + 1, len(groups), f"group {index + 1} of {len(groups)}: {name}")
    return pd.DataFrame(rows)
