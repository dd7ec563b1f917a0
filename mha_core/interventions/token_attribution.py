"""Which input tokens one prediction depends on (issue 33): one score per input token and method.

The prediction, ``f``, is one number computed from the tokens:

* a decoder with its next-token head (SmolLM2, GPT-2): the log-probability of the ``target`` token (default the
  model's own top prediction) at the last position;
* a sentence encoder (MiniLM, MPNet): the cosine similarity of the text's embedding with the ``target`` sentence's,
  each mean pooled over its tokens (special tokens included) as sentence-transformers does; the target sentence
  is held fixed and the text's tokens are scored.

The methods (``METHODS``):

* ``integrated_gradients`` (Sundararajan et al. 2017): (x - x') . mean of grad f along the straight path from the
  baseline x' to the token vectors x (point ``hook_embed``), by the midpoint Riemann sum of ``steps`` points. The
  baseline is the zero vector at ordinary tokens and the token's own vector at special tokens (BOS, CLS, SEP), which
  therefore score 0. Completeness: the scores sum to f(x) - f(x'); ``completeness_error`` is the difference.
* ``gradient_x_input``: x . grad f(x), at the token vectors.
* ``occlusion``: f(x) - f(x without token i); the token is dropped (the sequence gets one shorter), not replaced,
  so no pad or mask token's own meaning enters. One batched pass of n - 1 rows.
* ``value_zeroing`` (Mohebbi et al. 2023, ``interventions/value_zeroing.py``): each layer's context mixing (the
  cosine distance of token i's layer output when token j's values are zeroed, rows normalised), aggregated over
  the layers by rollout, at the target's row. n + 1 sequence-passes.
* ``attention_norms`` (Kobayashi et al. 2020): ||alpha_ij f_h(x_j)|| of the last layer summed over heads, at the
  target's row.
* ``rollout`` (Abnar and Zuidema 2020): the last layer's attention rollout at the target's row.
* ``attention``: the last layer's attention averaged over heads, at the target's row.

The target's row is the last position's (decoders: the position that predicts) or the mean of every position's
row (encoders: mean pooling reads every position). Special tokens keep their scores, but rankings, agreement and
faithfulness (``interventions/faithfulness.py``) read the ordinary tokens only: the BOS token is where attention
sinks, not a word of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from ..analysis.flow import attention_rollout
from ..errors import HeadscopeError, quoted
from ..models.forward import ForwardPass
from ..models.tokens import EncodedText, check_text
from ..progress import Progress, report
from .readout import encoded_prompt, lm_pass, token_id, token_text
from .value_zeroing import context_mixing, value_zeroing_rollout

GRADIENT_METHODS = ("integrated_gradients", "gradient_x_input")
ATTENTION_METHODS = ("attention_norms", "rollout", "attention")
METHODS = (*GRADIENT_METHODS, "occlusion", "value_zeroing", *ATTENTION_METHODS)
METHOD_LABELS = {
    "integrated_gradients": "Integrated gradients",
    "gradient_x_input": "Gradient x input",
    "occlusion": "Occlusion (leave one out)",
    "value_zeroing": "Value zeroing (rollout)",
    "attention_norms": "Attention norms (last layer)",
    "rollout": "Attention rollout",
    "attention": "Attention (last layer, mean of heads)",
}
DEFAULT_STEPS = 32
STEP_TOKENS = 512  # integrated gradients' points per backward pass x tokens: SmolLM2's activations ~0.7 GB
BATCH_TOKENS = 2048  # a decoder's batch of sequences of mixed lengths (curves, occlusion), padded, without autograd
PASS_TOKENS = 64  # what one more pass costs, in tokens of a batch (SmolLM2 at one thread: ~0.2 s, ~3 ms a token)


class AttributionError(HeadscopeError, ValueError):
    """A request token attribution cannot answer: an unknown method, a model without a prediction to explain,
    a missing target sentence."""


@dataclass
class TokenAttribution:
    """One prediction's token scores: ``scores`` (one row per input token: ``position``, ``token``, ``special``,
    then one column per method), what was explained (``target``, ``kind``: ``"next token"`` or ``"similarity"``),
    f on the whole input (``prediction``) and on the IG baseline (``baseline_prediction``), IG's
    ``completeness_error`` (sum of its scores minus the difference of the two; None without IG), and each head's
    attention at the target's row, ``head_rows`` float32 ``[L, H, n]``."""

    tokens: list[str]
    scores: pd.DataFrame
    target: str
    kind: str
    prediction: float
    methods: tuple[str, ...]
    head_rows: np.ndarray
    baseline_prediction: float | None = None
    completeness_error: float | None = None
    metadata: dict = field(default_factory=dict)

    @property
    def ordinary(self) -> np.ndarray:
        """Positions of the ordinary (not special) tokens, which rankings read."""
        return np.flatnonzero(~self.scores["special"].to_numpy(bool))

    def method_scores(self, method: str) -> np.ndarray:
        """A method's scores at the ordinary tokens, float64."""
        return self.scores[method].to_numpy(np.float64)[self.ordinary]


# ---- the prediction explained ------------------------------------------------------------------------
class Prediction:
    """f of a batch of token sequences: the target token's log-probability at the last position
    (decoder) or the cosine similarity of the mean-pooled embedding with the target sentence's (encoder)."""

    def __init__(self, model, encoded: EncodedText, target):
        self.model = model
        self.encoded = encoded
        self.ids = list(encoded.input_ids)
        self._full: float | None = None
        if model.lm_head_kind == "causal":
            self.kind = "next token"
            self.target_id = self._next_token(target)
            self.target = token_text(model, self.target_id)
            self.reference = None
        elif not model.is_causal:
            if not isinstance(target, str):
                raise AttributionError(
                    "A sentence encoder's prediction is the similarity of two sentences: give the second sentence "
                    "as the target."
                )
            self.kind = "similarity"
            self.target = target
            other = encoded_prompt(model, target, "target sentence")
            with torch.inference_mode():
                self.reference = self.embedding(torch.tensor([other.input_ids]), None, grad=False)[0]
        else:
            raise AttributionError(
                f"{model.name!r} has {model.head_description}: token attribution explains a decoder's next token "
                "or a sentence encoder's similarity of two sentences."
            )

    def _next_token(self, target) -> int:
        """The target's id (None: the top prediction, with f on the whole input from the same pass; a named target's
        f on the whole input is computed when first read)."""
        if target is not None:
            return token_id(self.model, target, "target")
        with torch.inference_mode():
            logits, _ = lm_pass(self.model, torch.tensor([self.ids]))
        chosen = int(logits[0].argmax())
        self._full = float(torch.log_softmax(logits[0].double(), dim=-1)[chosen])
        return chosen

    @property
    def full(self) -> float:
        """f on the whole input."""
        if self._full is None:
            self._full = float(self(torch.tensor([self.ids]))[0])
        return self._full

    def embedding(self, ids: torch.Tensor, hooks, grad: bool, lengths=None) -> torch.Tensor:
        """The mean-pooled last hidden states of ``ids`` ``[B, n]``: ``[B, d]``. ``lengths``: each row's real
        tokens, long ``[B]`` (rows padded on the right, the padding masked out of attention and of the mean)."""
        if lengths is None:
            forward = ForwardPass(ids, hooks=hooks, keep_hidden=True, attentions=False, grad=grad)
            return self.model.run_pass(forward).hidden.mean(dim=1)
        mask = (torch.arange(ids.shape[1])[None] < lengths[:, None]).long()
        forward = ForwardPass(ids, attention_mask=mask, hooks=hooks, keep_hidden=True, attentions=False, grad=grad)
        hidden = self.model.run_pass(forward).hidden
        return (hidden * mask[..., None].to(hidden.dtype)).sum(dim=1) / lengths[:, None].to(hidden.dtype)

    def __call__(self, ids: torch.Tensor, hooks=None, grad: bool = False, lengths=None) -> torch.Tensor:
        """f of every row of ``ids`` ``[B, n]``, float ``[B]`` (with autograd when ``grad``). ``lengths``: each
        row's real tokens, long ``[B]`` (rows padded on the right; None: no padding)."""
        if self.kind == "next token":
            if lengths is None:
                logits, _ = lm_pass(self.model, ids, hooks=hooks, grad=grad)
            else:  # a causal model: no position reads a later one, so the padding after a row's last changes nothing
                forward = ForwardPass(ids, hooks=hooks, keep_hidden=True, attentions=False, grad=grad)
                hidden = self.model.run_pass(forward).hidden
                with torch.enable_grad() if grad else torch.inference_mode():
                    logits = self.model.logits(hidden[torch.arange(len(ids)), lengths - 1])
            with torch.enable_grad() if grad else torch.inference_mode():
                return torch.log_softmax(logits.double(), dim=-1)[:, self.target_id]
        with torch.enable_grad() if grad else torch.inference_mode():
            pooled = self.embedding(ids, hooks, grad, lengths)
            return torch.nn.functional.cosine_similarity(pooled.double(), self.reference.double()[None], dim=-1)

    def of_sequences(self, sequences: Sequence[Sequence[int]]) -> np.ndarray:
        """f of token sequences of any lengths, in a few batched passes of mixed lengths padded on the right
        (``padded_batches``): a decoder's read at each row's last real token (no position reads a later one), an
        encoder's with the padding masked out of attention and of the mean: float64 ``[len(sequences)]``."""
        values = np.empty(len(sequences))
        lengths = [len(sequence) for sequence in sequences]
        for indices in padded_batches(lengths):
            width = max(lengths[i] for i in indices)
            rows = [list(sequences[i]) + [sequences[i][-1]] * (width - lengths[i]) for i in indices]
            real = torch.tensor([lengths[i] for i in indices])
            values[indices] = self(torch.tensor(rows, dtype=torch.long), lengths=real).numpy()
        return values


def padded_batches(lengths: Sequence[int], budget: int = BATCH_TOKENS, pass_cost: int = PASS_TOKENS) -> list[list[int]]:
    """The indices of ``lengths`` in batches of mixed lengths, each padded to its longest (rows x longest <=
    ``budget`` tokens, or one row), chosen to cost least: a pass costs ``pass_cost`` tokens plus its padded tokens
    (sequences sorted by length, the best split into consecutive runs by dynamic programming)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    count = len(order)
    best = [0.0] + [float("inf")] * count  # best[j]: the least cost of the j longest sequences
    start = [0] * (count + 1)
    for end in range(1, count + 1):
        for begin in range(end - 1, -1, -1):
            padded = (end - begin) * lengths[order[begin]]
            if padded > budget and end - begin > 1:
                break
            cost = best[begin] + pass_cost + padded
            if cost < best[end]:
                best[end], start[end] = cost, begin
    batches, end = [], count
    while end > 0:
        batches.append(order[start[end] : end])
        end = start[end]
    return batches[::-1]


# ---- the gradient methods ---------------------------------------------------------------------------
def _token_vectors(model, ids: list[int]) -> torch.Tensor:
    """The token vectors of ``ids`` at the point ``hook_embed``, ``[n, d]``."""
    return model.hf_model.get_input_embeddings()(torch.tensor(ids)).detach().float()


def _gradients(prediction: Prediction, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(f, grad f) at token vectors ``points`` ``[B, n, d]`` put in place of the embeddings (``hook_embed``)."""
    leaf = points.detach().clone().requires_grad_(True)

    def replace(embed: torch.Tensor) -> torch.Tensor:
        return leaf.to(embed.dtype)

    ids = torch.tensor([prediction.ids] * len(points))
    with torch.enable_grad():
        values = prediction(ids, hooks={"hook_embed": replace}, grad=True)
        (grad,) = torch.autograd.grad(values.sum(), leaf)  # never into the weights' .grad
    return values.detach(), grad.detach()


def step_batch(tokens: int, steps: int = DEFAULT_STEPS) -> int:
    """Integrated gradients' points per forward and backward pass for a text of ``tokens`` tokens: as few passes as
    ``STEP_TOKENS`` allows, the points shared evenly between them."""
    passes = -(-steps // max(1, STEP_TOKENS // max(tokens, 1)))
    return -(-steps // passes)


def integrated_gradients(
    prediction: Prediction, baseline: torch.Tensor, steps: int = DEFAULT_STEPS, progress: Progress | None = None
) -> tuple[np.ndarray, float, float]:
    """(scores ``[n]``, f at the input, f at the baseline) by the midpoint Riemann sum of ``steps`` points on the
    path from ``baseline`` ``[n, d]`` to the token vectors."""
    inputs = _token_vectors(prediction.model, prediction.ids)
    alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
    total = torch.zeros_like(inputs, dtype=torch.float64)
    batch = step_batch(len(prediction.ids), steps)
    for start in range(0, steps, batch):
        chunk = alphas[start : start + batch].float()
        points = baseline[None] + chunk[:, None, None] * (inputs - baseline)[None]
        _, grad = _gradients(prediction, points)
        total += grad.double().sum(dim=0)
        report(progress, min(start + batch, steps), steps, "integrated gradients")
    scores = ((inputs - baseline).double() * total / steps).sum(dim=-1)
    return scores.numpy(), prediction.full, _f_at_vectors(prediction, baseline)


def _f_at_vectors(prediction: Prediction, vectors: torch.Tensor) -> float:
    def replace(embed: torch.Tensor) -> torch.Tensor:
        return vectors[None].to(embed.dtype).expand_as(embed)

    return float(prediction(torch.tensor([prediction.ids]), hooks={"hook_embed": replace})[0])


def gradient_x_input(prediction: Prediction) -> np.ndarray:
    """x . grad f(x) per token, ``[n]``."""
    inputs = _token_vectors(prediction.model, prediction.ids)
    _, grad = _gradients(prediction, inputs[None])
    return (inputs.double() * grad[0].double()).sum(dim=-1).numpy()


def occlusion(prediction: Prediction, candidates: np.ndarray) -> np.ndarray:
    """f(x) - f(x without token i) for the positions ``candidates`` (NaN elsewhere), ``[n]``: the shortened
    sequences in one batched pass (f(x) is the prediction's own)."""
    ids = prediction.ids
    values = prediction.of_sequences([ids[:i] + ids[i + 1 :] for i in candidates])
    scores = np.full(len(ids), np.nan)
    scores[candidates] = prediction.full - values
    return scores


# ---- the attention-based scores ---------------------------------------------------------------------
def target_rows(weights: np.ndarray, kind: str) -> np.ndarray:
    """The target's row of every ``[..., n, n]`` matrix: the last position's (next token) or the mean of all rows
    (similarity of mean-pooled embeddings): ``[..., n]``."""
    return weights[..., -1, :] if kind == "next token" else weights.mean(axis=-2)


# ---- the whole ----------------------------------------------------------------------------------------
def check_methods(methods: Sequence[str]) -> tuple[str, ...]:
    """The methods asked for, checked, in ``METHODS``' order; an ``AttributionError`` naming the known ones."""
    if isinstance(methods, str):
        methods = (methods,)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise AttributionError(
            f"Unknown attribution method {quoted(str(unknown[0]) if unknown else '', 40)}: use any of "
            f"{', '.join(METHODS)}."
        )
    return tuple(m for m in METHODS if m in methods)


def token_attribution(
    model,
    text: str | EncodedText,
    target: str | int | None = None,
    methods: Sequence[str] = METHODS,
    steps: int = DEFAULT_STEPS,
    progress: Progress | None = None,
) -> TokenAttribution:
    """One score per input token of ``text`` and method (module docstring) for the prediction of ``target``: a
    next token of a decoder (a token string with its leading space, or an id; None: the model's top prediction),
    or, for a sentence encoder, a second sentence whose similarity with ``text`` is explained."""
    methods = check_methods(methods)
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 1024:
        raise AttributionError(f"Integrated gradients takes 1 to 1024 steps, got {steps!r}.")
    if not isinstance(text, EncodedText):
        check_text(text, "text")
    encoded = encoded_prompt(model, text, "text")
    prediction = Prediction(model, encoded, target)
    special = np.asarray(encoded.special_mask, dtype=bool)
    ordinary = np.flatnonzero(~special)
    columns: dict[str, np.ndarray] = {}
    extra: dict = {}
    if "integrated_gradients" in methods:
        vectors = _token_vectors(model, prediction.ids)
        baseline = torch.where(torch.from_numpy(special)[:, None], vectors, torch.zeros_like(vectors))
        columns["integrated_gradients"], full, start = integrated_gradients(prediction, baseline, steps, progress)
        extra = dict(
            baseline_prediction=start,
            completeness_error=float(columns["integrated_gradients"].sum() - (full - start)),
        )
    if "gradient_x_input" in methods:
        columns["gradient_x_input"] = gradient_x_input(prediction)
    if "occlusion" in methods:
        columns["occlusion"] = occlusion(prediction, ordinary)
    if "value_zeroing" in methods:
        mixing = value_zeroing_rollout(context_mixing(model, prediction.ids, progress=progress))
        columns["value_zeroing"] = target_rows(mixing[-1], prediction.kind)
    report(progress, 1, 2, "attention")
    run = model.run(encoded, norms="attention_norms" in methods)
    head_rows = target_rows(run.attentions, prediction.kind).astype(np.float32)
    if "attention_norms" in methods:
        columns["attention_norms"] = target_rows(run.norms[-1].sum(axis=0), prediction.kind)
    if "rollout" in methods:
        columns["rollout"] = target_rows(attention_rollout(run)[-1], prediction.kind)
    if "attention" in methods:
        columns["attention"] = head_rows[-1].mean(axis=0)
    report(progress, 2, 2, "attention")
    value = prediction.full
    scores = pd.DataFrame(
        {"position": np.arange(len(special)), "token": list(run.tokens), "special": special}
        | {m: np.asarray(columns[m], dtype=np.float64) for m in methods}
    )
    return TokenAttribution(
        tokens=list(run.tokens),
        scores=scores,
        target=prediction.target,
        kind=prediction.kind,
        prediction=value,
        methods=methods,
        head_rows=head_rows,
        metadata={"model": model.name, "steps": steps, "target_id": getattr(prediction, "target_id", None)},
        **extra,
    )
