"""What a head's weights do, token by token: its OV and QK circuits (Elhage et al. 2021; Dar et al. 2022), its
copying and previous-token scores, and the composition of heads in different layers.

Every head h of layer l reads the residual stream x (a row vector) through the norm before it and computes
``q = x W_Q``, ``k = x W_K``, ``v = x W_V`` (``[d, e]`` each, e = d_head; grouped KV heads: the KV head serving h)
and writes ``z W_O`` (``[e, d]``). Its OV circuit is ``W_V W_O`` (``[d, d]``, what it writes for what it reads), its
QK circuit ``W_Q W_K^T`` (the bilinear form of its scores, before scaling and any rotation). At token level:

* decoders (GPT-2, Llama): ``W_E W_V W_O W_U`` (vocab x vocab: token in -> logits out) and ``W_E W_Q W_K^T W_E^T``
  (query token x key token), with the normalisations' weights folded in as TransformerLens' ``fold_ln`` does: the
  gain of the norm a matrix reads through multiplies its rows (``diag(g) W``), a LayerNorm's centring projects out
  the all-ones direction (``(I - 11^T/d) diag(g) W``), the final norm's gain folds into ``W_U``. The scale
  (1/sqrt(variance)) depends on the input and is left out; the norms' biases are terms of their own, left out.
* encoders (BERT, MiniLM, MPNet): through the embedding matrix at both ends (Dar et al. 2022), ``W_E W_V W_O W_E^T``
  and ``W_E W_Q W_K^T W_E^T``, raw weights (a post-LN layer normalises the residual sum after the head).

Nothing vocab x vocab is ever built (49,152^2 for SmolLM2): a token's row is ``(E_t W_V)(W_O W_U)``, a product of
rank e, and its top tokens are taken over chunks of the vocabulary. The copying score of a head is
``sum(eigenvalues) / sum(|eigenvalues|)`` of its OV circuit: the nonzero eigenvalues of ``(W_E W_V)(W_O W_U)`` are
those of the e x e product ``(W_O W_U)(W_E W_V)`` (``AB`` and ``BA`` share them), so one e x e matrix per head.

Composition (Elhage et al. 2021): how much of what head A (earlier layer) writes head B reads, as
``||W_A W_B||_F / (||W_A||_F ||W_B||_F)`` with ``W_A`` A's OV circuit and ``W_B`` B's QK circuit (Q-composition:
A's output feeds B's queries), its transpose (K: B's keys) or B's OV circuit (V). Each norm is computed from e x e
Gram matrices: each head becomes one d x d matrix (its OV circuit's Gram, or its circuit's as a receiver), and
a pair's squared norm is one inner product of two of them (``composition_scores``).
"""

from __future__ import annotations

import math
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from ..engine import registry as families
from ..engine.blocks import rotary_angles, rotate
from ..engine.core import core_model
from ..errors import HeadscopeError, quoted
from ..progress import Progress, progress_part, report

if TYPE_CHECKING:
    from ..models.loaded import LoadedModel

COMPOSITION_MODES = ("q", "k", "v")
DEFAULT_TEXT = " The cat sat on the mat because it was tired and the dog barked"
VOCAB_CHUNK = 8192
# Random matrices drawn for the composition baseline (per mode): its spread over draws is about 1% of its mean.
BASELINE_DRAWS = 64
# The length over which the previous-token QK score is averaged (positions 1..n-1 of n).
POSITIONAL_LENGTH = 32


class QKOVError(HeadscopeError, ValueError):
    """A request the weight circuits cannot answer: an unknown family, a layer or head out of range, bad tokens."""


@dataclass(frozen=True)
class HeadWeights:
    """Every head's weights of one model, norms folded (module docstring), float32, ``[layers, heads, ...]``."""

    w_q: torch.Tensor  # [L, H, d, e]
    w_k: torch.Tensor  # [L, H, d, e]: grouped KV heads repeated for each query head they serve
    w_v: torch.Tensor  # [L, H, d, e]
    w_o: torch.Tensor  # [L, H, e, d]
    embedding: torch.Tensor  # [vocab, d]: W_E
    unembedding: torch.Tensor  # [d, vocab]: W_U with the final norm's gain folded (encoders: W_E^T)
    positions: torch.Tensor | None  # [positions, d]: absolute position vectors (None: rotary or none)
    rope: tuple | None  # (inverse frequencies, amplitude): Llama's rotation
    causal: bool
    decoder: bool  # through W_U (True) or W_E at both ends (False)

    @property
    def num_layers(self) -> int:
        return int(self.w_q.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.w_q.shape[1])

    @property
    def d_head(self) -> int:
        return int(self.w_q.shape[-1])


def _as_in_out(module) -> torch.Tensor:
    """A projection's weight as ``[in, out]``: ``nn.Linear`` keeps ``[out, in]``, GPT-2's ``Conv1D`` ``[in, out]``."""
    weight = module.weight.detach().float()
    return weight if type(module).__name__ == "Conv1D" else weight.t()


def _fold(weight: torch.Tensor, norm, centre: bool) -> torch.Tensor:
    """``diag(g) W`` for the norm the weight reads through, centred (``(I - 11^T/d) ...``) for a LayerNorm."""
    if norm is not None:
        weight = norm.weight.detach().float()[:, None] * weight
    if centre:
        weight = weight - weight.mean(dim=0, keepdim=True)
    return weight


def head_weights(model: LoadedModel) -> HeadWeights:
    """Every head's W_Q, W_K, W_V, W_O of ``model`` with the norms folded, and the token matrices at both ends."""
    family = families.FAMILY_OF_MODEL_TYPE.get(model.model_type)
    if family is None or model.modules is None or family.encoder_decoder:
        raise QKOVError(
            f"OV and QK circuits read the weights of single-stack families Headscope knows; {quoted(model.model_type)} "
            f"is not one. Supported: {families.supported_types()}."
        )
    stack = model.modules.stacks["blocks"]
    config = model.hf_model.config
    heads = model.num_heads
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    decoder = bool(model.is_causal) and model.lm_model is not None
    pre_norm = not family.post_norm
    w_q, w_k, w_v, w_o = [], [], [], []
    for layer in stack.layers:
        attention = layer.attention
        norm = layer.norms[0] if pre_norm else None
        centre = pre_norm and isinstance(norm, torch.nn.LayerNorm)
        if len(attention.projections) == 1:  # GPT-2: [q | k | v]
            q, k, v = _as_in_out(attention.projections[0]).chunk(3, dim=1)
        else:
            q, k, v = (_as_in_out(p) for p in attention.projections)
        d_model = q.shape[0]
        d_head = q.shape[1] // heads
        q, k, v = (_fold(m, norm, centre) for m in (q, k, v))
        group = heads // kv_heads
        w_q.append(q.view(d_model, heads, d_head).permute(1, 0, 2))
        w_k.append(k.view(d_model, kv_heads, d_head).permute(1, 0, 2).repeat_interleave(group, dim=0))
        w_v.append(v.view(d_model, kv_heads, d_head).permute(1, 0, 2).repeat_interleave(group, dim=0))
        w_o.append(_as_in_out(attention.output).reshape(heads, d_head, d_model))
    embedding = model.hf_model.get_input_embeddings().weight.detach().float()
    if decoder:
        unembedding = model.lm_model.get_output_embeddings().weight.detach().float().t()
        final = stack.final_norm
        if final is not None:
            unembedding = _fold(unembedding, final, isinstance(final, torch.nn.LayerNorm))
    else:
        unembedding = embedding.t()
    position_module = stack.position_embedding
    positions = None if position_module is None else position_module.weight.detach().float()
    rope = core_model(model.hf_model).rope if family.name == "llama" else None  # the engine's rotary table
    return HeadWeights(
        w_q=torch.stack(w_q),
        w_k=torch.stack(w_k),
        w_v=torch.stack(w_v),
        w_o=torch.stack(w_o),
        embedding=embedding,
        unembedding=unembedding,
        positions=positions,
        rope=rope,
        causal=bool(model.is_causal),
        decoder=decoder,
    )


_WEIGHTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WEIGHTS_LOCK = threading.Lock()


def _weights(model) -> HeadWeights:
    """The model's ``HeadWeights``, read once per loaded model (kept weakly: they go with the model)."""
    with _WEIGHTS_LOCK:
        weights = _WEIGHTS.get(model.hf_model)
        if weights is None:
            weights = _WEIGHTS[model.hf_model] = head_weights(model)
        return weights


def _check_head(weights: HeadWeights, layer: int, head: int) -> None:
    for value, size, what in ((layer, weights.num_layers, "layer"), (head, weights.num_heads, "head")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
            raise QKOVError(f"The {what} must be a whole number from 0 to {size - 1}, not {quoted(str(value), 20)}.")


def circuit_tokens(model: LoadedModel, tokens) -> list[int]:
    """Token ids: a text (its tokens, no special tokens), a list of ids, or a list of strings each one token."""
    if tokens is None:
        tokens = DEFAULT_TEXT
    vocab = model.hf_model.get_input_embeddings().weight.shape[0]
    if isinstance(tokens, str):
        ids = model.tokenizer.encode(tokens, add_special_tokens=False)
    else:
        ids = []
        for token in tokens:
            if isinstance(token, str):
                pieces = model.tokenizer.encode(token, add_special_tokens=False)
                if len(pieces) != 1:
                    raise QKOVError(f"{quoted(token, 30)} is {len(pieces)} tokens, not one.")
                ids.append(pieces[0])
            else:
                ids.append(int(token))
    ids = list(dict.fromkeys(int(i) for i in ids))
    if not ids:
        raise QKOVError("Give at least one token to read the circuit at.")
    if any(not 0 <= i < vocab for i in ids):
        raise QKOVError(f"Token ids must be from 0 to {vocab - 1}.")
    return ids


def top_columns(left: torch.Tensor, right: torch.Tensor, k: int, chunk: int = VOCAB_CHUNK):
    """The ``k`` largest entries of each row of ``left @ right`` (``[m, r] x [r, V]``) and their columns, taken over
    chunks of ``chunk`` columns (the ``[m, V]`` product is never whole when V is large)."""
    values = torch.full((left.shape[0], 0), -math.inf)
    columns = torch.zeros((left.shape[0], 0), dtype=torch.long)
    for start in range(0, right.shape[1], chunk):
        block = left @ right[:, start : start + chunk]
        values = torch.cat([values, block], dim=1)
        columns = torch.cat([columns, torch.arange(start, start + block.shape[1]).expand(left.shape[0], -1)], dim=1)
        keep = min(k, values.shape[1])
        values, order = values.topk(keep, dim=1)
        columns = columns.gather(1, order)
    return values, columns


def _token_table(model, ids, values, columns, kind: str) -> pd.DataFrame:
    decode = model.tokenizer.decode
    rows = []
    for row, token in enumerate(ids):
        for rank, (value, column) in enumerate(zip(values[row].tolist(), columns[row].tolist(), strict=True)):
            rows.append((decode([token]), token, rank + 1, decode([column]), column, value))
    names = ["token", "token_id", "rank", f"{kind}_token", f"{kind}_id", "value"]
    return pd.DataFrame(rows, columns=names)


def ov_circuit(model: LoadedModel, layer: int, head: int, k: int = 10, tokens=None) -> pd.DataFrame:
    """What head ``layer``-``head`` writes when it attends to each of ``tokens`` (a text, token ids or one-token
    strings; default a short sentence): the ``k`` output tokens whose logits its OV circuit raises most
    (``E_t W_V W_O W_U``; encoders read through ``W_E^T``). Columns: token, token_id, rank, output_token, output_id,
    value (the logit added per unit of attention, norm scale left out); ``attrs["self_rank"]``: per token, the rank
    of the token itself among all outputs (1: the head copies it)."""
    weights = _weights(model)
    _check_head(weights, layer, head)
    ids = circuit_tokens(model, tokens)
    with torch.inference_mode():
        left = weights.embedding[ids] @ weights.w_v[layer, head]  # [m, e]
        right = weights.w_o[layer, head] @ weights.unembedding  # [e, vocab]
        values, columns = top_columns(left, right, k)
        own = (left * right[:, ids].t()).sum(dim=1)
        self_rank = [int((left[row] @ right > own[row]).sum()) + 1 for row in range(len(ids))]
    table = _token_table(model, ids, values, columns, "output")
    table.attrs.update(layer=layer, head=head, self_rank=dict(zip(ids, self_rank, strict=True)), model=model.name)
    return table


def qk_circuit(model: LoadedModel, layer: int, head: int, k: int = 10, tokens=None) -> pd.DataFrame:
    """Which key tokens head ``layer``-``head`` scores highest for a query at each of ``tokens``: the ``k`` largest
    entries of ``E_t W_Q W_K^T W_E^T / sqrt(d_head)`` (token content only: no position, no rotation, no biases).
    Columns: token, token_id, rank, key_token, key_id, value (the score)."""
    weights = _weights(model)
    _check_head(weights, layer, head)
    ids = circuit_tokens(model, tokens)
    with torch.inference_mode():
        left = weights.embedding[ids] @ weights.w_q[layer, head] / math.sqrt(weights.d_head)
        right = (weights.embedding @ weights.w_k[layer, head]).t()  # [e, vocab]
        values, columns = top_columns(left, right, k)
    table = _token_table(model, ids, values, columns, "key")
    table.attrs.update(layer=layer, head=head, model=model.name)
    return table


# ---- copying and positional scores ------------------------------------------------------------------------
def ov_eigenvalues(weights: HeadWeights, layer: int, head: int, through: torch.Tensor | None = None) -> np.ndarray:
    """The e eigenvalues of ``(W_O W_U)(W_E W_V)``: the nonzero eigenvalues of the token-level OV circuit
    ``W_E W_V W_O W_U``. ``through``: ``W_U W_E`` (``[d, d]``), computed once per model when given."""
    if through is None:
        through = weights.unembedding @ weights.embedding
    small = weights.w_o[layer, head].double() @ through.double() @ weights.w_v[layer, head].double()
    return np.linalg.eigvals(small.numpy())


def copying_score(eigenvalues: np.ndarray) -> float:
    """``sum(eigenvalues) / sum(|eigenvalues|)`` (real part): 1 when the circuit copies, -1 when it suppresses."""
    magnitude = float(np.abs(eigenvalues).sum())
    return float(np.real(eigenvalues.sum()) / magnitude) if magnitude > 0 else 0.0


def positional_inputs(weights: HeadWeights, length: int) -> tuple[torch.Tensor, tuple | None]:
    """What the previous-token score feeds the QK circuit: the position vectors (absolute positions), or for a
    rotary model the mean token vector (rescaled to a root mean square of 1, as the norm before the head would
    make it) at every position, with the rotation applied after the projections."""
    if weights.positions is not None:
        return weights.positions[:length], None
    mean = weights.embedding.mean(dim=0, keepdim=True)
    mean = mean / mean.pow(2).mean().sqrt().clamp(min=1e-12)
    return mean.expand(length, -1), weights.rope


def previous_token_scores(weights: HeadWeights, length: int = POSITIONAL_LENGTH) -> np.ndarray:
    """Per head ``[L, H]``: the attention its QK circuit alone puts on the previous position, averaged over query
    positions 1..length-1, when every position holds the same content (the position vectors for absolute models;
    the mean token vector, rotated by position, for rotary ones): 1 for a pure previous-token head."""
    inputs, rope = positional_inputs(weights, length)
    n = inputs.shape[0]
    with torch.inference_mode():
        q = torch.einsum("nd,lhde->lhne", inputs, weights.w_q)
        k = torch.einsum("nd,lhde->lhne", inputs, weights.w_k)
        if rope is not None:
            cos, sin = rotary_angles(n, *rope)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        scores = q @ k.transpose(-1, -2) / math.sqrt(weights.d_head)
        if weights.causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
        pattern = scores.softmax(dim=-1)
        previous = pattern[..., torch.arange(1, n), torch.arange(0, n - 1)]
    return previous.mean(dim=-1).numpy()


def copying_scores(model: LoadedModel, progress: Progress | None = None) -> pd.DataFrame:
    """Every head's copying score (its OV circuit's eigenvalues, ``copying_score``) and previous-token QK score
    (``previous_token_scores``): columns layer, head, copying, previous_token; one row per head."""
    weights = _weights(model)
    with torch.inference_mode():
        through = weights.unembedding @ weights.embedding
    rows = []
    for layer in range(weights.num_layers):
        report(progress, layer, weights.num_layers, f"eigenvalues of layer {layer}")
        for head in range(weights.num_heads):
            rows.append((layer, head, copying_score(ov_eigenvalues(weights, layer, head, through))))
    previous = previous_token_scores(weights)
    report(progress, weights.num_layers, weights.num_layers, "done")
    table = pd.DataFrame(rows, columns=["layer", "head", "copying"])
    table["previous_token"] = previous.reshape(-1)
    table.attrs.update(model=model.name, through="W_U" if weights.decoder else "W_E^T")
    return table


# ---- composition --------------------------------------------------------------------------------------------
def _gram(a: torch.Tensor) -> torch.Tensor:
    """``a^T a`` over the d axis of ``[..., d, e]``: ``[..., e, e]``."""
    return a.transpose(-1, -2) @ a


def _whitener(gram: torch.Tensor) -> torch.Tensor:
    """``C`` with ``C^T C = gram`` (``[..., e, e]``, symmetric positive semi-definite): ``||X R||_F = ||X C^T||_F``
    when ``gram = R R^T``, so an e x d factor becomes e x e. A Cholesky factor in float64, the diagonal raised by
    1e-12 of its mean so that a singular gram (a head with zeroed weights) has one (an eigendecomposition would
    do without, but batched it runs many times slower on a busy machine's threads)."""
    double = gram.double()
    eye = torch.eye(double.shape[-1], dtype=torch.float64)
    jitter = 1e-12 * double.diagonal(dim1=-2, dim2=-1).mean(dim=-1)[..., None, None] + 1e-300
    return torch.linalg.cholesky(double + jitter * eye).transpose(-1, -2).to(gram.dtype)


def composition_factors(weights: HeadWeights, mode: str, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head as a sender ``S`` (``[L*H, e, d]``) and as a receiver through ``mode`` ``T`` (``[L*H, d, e]``) such
    that ``||S_A T_B||_F`` is the Frobenius norm of A's OV circuit times B's circuit, ``||S_A||_F`` the norm of A's
    OV circuit and ``||T_B||_F`` the norm of B's: ``S = C_V W_O`` with ``C_V^T C_V = W_V^T W_V``, and ``T = W_Q C^T``
    with ``C^T C = W_K^T W_K`` (Q: ``OV_A QK_B``), ``W_K`` with ``W_Q`` (K: ``OV_A QK_B^T``), ``W_V`` with ``W_O W_O^T``
    (V: ``OV_A OV_B``)."""
    if mode not in COMPOSITION_MODES:
        raise QKOVError(f"Composition mode must be one of {', '.join(COMPOSITION_MODES)}, not {quoted(mode)}.")
    count = weights.num_layers * weights.num_heads
    w_q, w_k, w_v, w_o = (
        getattr(weights, f"w_{name}").to(dtype).reshape(count, *getattr(weights, f"w_{name}").shape[2:])
        for name in "qkvo"
    )
    sender = _whitener(_gram(w_v)) @ w_o
    reads, gram = {"q": (w_q, _gram(w_k)), "k": (w_k, _gram(w_q)), "v": (w_v, w_o @ w_o.transpose(-1, -2))}[mode]
    return sender, reads @ _whitener(gram).transpose(-1, -2)


def composition_scores(
    weights: HeadWeights, mode: str, progress: Progress | None = None, dtype=torch.float32
) -> np.ndarray:
    """``[L, H, L, H]``: the ``mode`` composition score of sender (l1, h1) into receiver (l2, h2), NaN unless
    l1 < l2. ``||S_A T_B||_F^2 = <S_A^T S_A, T_B T_B^T>``: each head becomes one symmetric d x d matrix (its upper
    triangle packed), and a receiver layer's scores are one matrix product with every earlier sender's."""
    layers, heads = weights.num_layers, weights.num_heads
    sender, receiver = composition_factors(weights, mode, dtype)
    d_model = sender.shape[-1]
    rows, cols = torch.triu_indices(d_model, d_model)
    twice = torch.where(rows == cols, 1.0, 2.0).to(dtype)  # each off-diagonal entry stands for two

    def packed(square: torch.Tensor) -> torch.Tensor:
        return square[:, rows, cols]

    scores = np.full((layers, heads, layers, heads), np.nan)
    with torch.inference_mode():
        sender_norm = sender.pow(2).sum(dim=(-1, -2)).sqrt()
        receiver_norm = receiver.pow(2).sum(dim=(-1, -2)).sqrt()
        senders = packed(sender.transpose(-1, -2) @ sender) * twice  # [L*H, d(d+1)/2]
        for layer in range(1, layers):
            report(progress, layer - 1, layers - 1, f"{mode.upper()}-composition into layer {layer}")
            part = receiver[layer * heads : (layer + 1) * heads]
            earlier = layer * heads
            squared = senders[:earlier] @ packed(part @ part.transpose(-1, -2)).t()  # [earlier, H]
            norms = sender_norm[:earlier, None] * receiver_norm[None, layer * heads : (layer + 1) * heads]
            values = squared.clamp(min=0).sqrt() / norms.clamp(min=torch.finfo(dtype).tiny)
            scores[:layer, :, layer, :] = values.double().numpy().reshape(layer, heads, heads)
    report(progress, layers - 1, layers - 1, "done")
    return scores


def composition_baseline(d_model: int, d_head: int, mode: str, draws: int = BASELINE_DRAWS, seed: int = 0) -> float:
    """The mean ``mode`` composition score of random Gaussian matrices of the heads' shapes (Elhage et al.'s
    baseline: what two unrelated heads score by chance, about ``sqrt(d_head / d_model)`` for these shapes)."""
    generator = torch.Generator().manual_seed(seed)
    # A two-layer stack of ``draws`` heads a layer, every matrix drawn on its own: head 0-i into head 1-i.
    w_q, w_k, w_v = (torch.randn(2, draws, d_model, d_head, generator=generator, dtype=torch.float64) for _ in range(3))
    w_o = torch.randn(2, draws, d_head, d_model, generator=generator, dtype=torch.float64)
    chance = HeadWeights(
        w_q=w_q,
        w_k=w_k,
        w_v=w_v,
        w_o=w_o,
        embedding=torch.zeros(1, d_model),
        unembedding=torch.zeros(d_model, 1),
        positions=None,
        rope=None,
        causal=True,
        decoder=True,
    )
    sender, receiver = composition_factors(chance, mode, torch.float64)
    sender, receiver = sender[:draws], receiver[draws:]
    product = (sender @ receiver).pow(2).sum(dim=(-1, -2)).sqrt()
    norms = sender.pow(2).sum(dim=(-1, -2)).sqrt() * receiver.pow(2).sum(dim=(-1, -2)).sqrt()
    return float((product / norms).mean())


def composition(model: LoadedModel, progress: Progress | None = None) -> pd.DataFrame:
    """Q-, K- and V-composition scores for every pair of heads in different layers (sender layer < receiver layer):
    columns sender_layer, sender_head, receiver_layer, receiver_head, q, k, v, and each minus the baseline of random
    matrices of the same shapes (q_excess, k_excess, v_excess); the baselines in ``attrs["baseline"]``."""
    weights = _weights(model)
    d_model, d_head = weights.w_q.shape[2], weights.d_head
    columns = {}
    for index, mode in enumerate(COMPOSITION_MODES):
        columns[mode] = composition_scores(weights, mode, progress_part(progress, index, len(COMPOSITION_MODES)))
    layers, heads = weights.num_layers, weights.num_heads
    grid = np.indices((layers, heads, layers, heads)).reshape(4, -1)
    keep = grid[0] < grid[2]
    table = pd.DataFrame(
        {
            "sender_layer": grid[0][keep],
            "sender_head": grid[1][keep],
            "receiver_layer": grid[2][keep],
            "receiver_head": grid[3][keep],
        }
    )
    baseline = {}
    for mode in COMPOSITION_MODES:
        baseline[mode] = composition_baseline(d_model, d_head, mode)
        table[mode] = columns[mode].reshape(-1)[keep]
        table[f"{mode}_excess"] = table[mode] - baseline[mode]
    table.attrs.update(baseline=baseline, model=model.name)
    return table
