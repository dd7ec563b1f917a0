"""The from-scratch engine's building blocks, shared by every family: dense maps, norms, rotary angles,
relative position buckets, the weights a pass reads (``CoreModel``), every head's vectors (``HeadVectors``),
the layer loop, and the helpers that read a transformers module's weights as float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention import MultiHeadAttention, linear
from ..hooks import NO_HOOKS, NORM_POINTS, SINGLE_STACK, Points, StackNames
from ..progress import Progress, report

# config.hidden_act / activation_function -> the function. The tanh forms are one formula
# under several names: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_python": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


@dataclass
class Dense:
    """An affine map x W^T + b, with W in ``nn.Linear`` layout ``[out, in]``."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


@dataclass
class Norm:
    """LayerNorm (with ``bias``) or RMSNorm (``bias`` None) parameters."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    eps: float


def layer_norm(x: torch.Tensor, norm: Norm, hooks: Points = NO_HOOKS) -> torch.Tensor:
    """(x - mean) / scale * gain + bias, scale = sqrt(variance + eps) over the hidden axis (biased variance).
    ``hooks``: the norm's points ``hook_scale`` ``[batch, n, 1]`` and ``hook_normalized`` (before gain and bias)."""
    centred = x - x.mean(dim=-1, keepdim=True)
    scale = hooks("hook_scale", (centred.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt())
    return hooks("hook_normalized", centred / scale) * norm.weight + norm.bias


def rms_norm(x: torch.Tensor, norm: Norm, hooks: Points = NO_HOOKS) -> torch.Tensor:
    """x / scale * gain, scale = sqrt(mean(x^2) + eps): LayerNorm without centring and without bias."""
    scale = hooks("hook_scale", (x.pow(2).mean(dim=-1, keepdim=True) + norm.eps).sqrt())
    return hooks("hook_normalized", x / scale) * norm.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: turn each pair (x_i, x_{i+d/2}) by the angle position * frequency_i."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin


def rotary_angles(n: int, inverse_frequency: torch.Tensor, amplitude: float):
    """cos and sin of position * frequency_i, ``[n, head_dim]``: each angle twice, once per half."""
    positions = torch.arange(n, device=inverse_frequency.device, dtype=torch.float32)
    angles = positions[:, None] * inverse_frequency
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos() * amplitude, angles.sin() * amplitude


def relative_position_buckets(n: int, num_buckets: int, max_distance: int, bidirectional: bool = True) -> torch.Tensor:
    """[n, n] bucket of each (query i, key j): half the buckets per direction; offsets below a quarter
    of the buckets get one bucket each, larger ones share buckets on a log scale up to max_distance.
    ``bidirectional=False`` (T5's decoder): every bucket for keys before the query, later keys in bucket 0."""
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # i - j: positive when the key is before
    if bidirectional:
        half = num_buckets // 2
        bucket = (offset < 0).long() * half
        distance = offset.abs()
    else:
        half = num_buckets
        bucket = torch.zeros_like(offset)
        distance = offset.clamp(min=0)
    exact = half // 2
    safe = distance.clamp(min=1).float()
    log_bucket = exact + (torch.log(safe / exact) / math.log(max_distance / exact) * (half - exact)).long()
    return bucket + torch.where(distance < exact, distance, log_bucket.clamp(max=half - 1))


@dataclass
class RelativePositionBias:
    """MPNet's (and T5's) learned bias per head and bucketed offset, added to every layer's scores."""

    table: torch.Tensor  # [buckets, heads]
    num_buckets: int
    max_distance: int


@dataclass
class CoreModel:
    family: str
    embeddings: object  # BertEmbeddingWeights; the token (and position) tables for the decoders
    layers: list
    max_positions: int | None
    rope: tuple[torch.Tensor, float] | None = None  # Llama: (inverse frequencies, amplitude scale)
    sliding_window: int | None = None  # Mistral: keys further back than this are not seen
    relative_bias: RelativePositionBias | None = None  # MPNet: a per-head bias by offset, shared by all layers
    final_norm: Norm | None = None  # pre-norm decoders: the norm after the last layer, which the LM head reads


@dataclass
class HeadVectors:
    """Every head's vectors in one layer, for an input ``x`` of that layer.

    scores = score(query, key) + score_bias; weights = softmax(scores) (masked); the head's output
    is weights @ value, and its share of the layer's output is that times its slice of ``output_weight``.
    """

    query: torch.Tensor | None  # [batch, heads, n, d_k]: after rotation for rotary models (None: values only)
    key: torch.Tensor | None  # [batch, heads, n, d_k]: grouped KV heads repeated for each query head they serve
    value: torch.Tensor  # [batch, heads, n, d_v]: x W_V^h + b_V^h
    output_weight: torch.Tensor  # [d_model, heads * d_v], nn.Linear layout: head h is columns h*d_v:(h+1)*d_v
    score: str  # "scaled" or "dot" (mha_core.attention.attention_scores)
    score_bias: torch.Tensor | None  # [1, heads, n, n] added to the scores (MPNet's relative position bias)
    causal: bool


def run_layers(
    layers,
    layer_fn,
    x,
    layer_args: tuple = (),
    *,
    progress: Progress | None = None,
    hooks: Points = NO_HOOKS,
    outputs: dict | None = None,
    names: StackNames = SINGLE_STACK,
    final_norm: tuple | None = None,
) -> torch.Tensor:
    """Run the layers in order; the attention weights of all of them, ``[batch, layers, heads, n, n]`` (None under
    a blockwise ``attention_kernel``, which keeps no dense weights).

    Each layer is ``layer_fn(x, layer, *layer_args, hooks=...)`` (the masks and position tables it shares), given
    the named points of its own (``blocks.{l}.``, ``names``: the stack's naming).

    ``progress(done, total, message)`` after each layer (it may raise to stop the pass there);
    ``hooks``: the pass's named points (``mha_core.hooks``); ``outputs``: a dict that receives ``"hidden"``, the
    residual stream after the last layer, and ``"final"``, the hidden states after ``final_norm`` (``(norm
    function, Norm)``: a pre-norm decoder's last norm, points ``ln_final.``; without one, ``"hidden"``).
    """
    weights = []
    for index, layer in enumerate(layers):
        x, layer_weights = layer_fn(x, layer, *layer_args, hooks=hooks.scope(f"{names.blocks}.{index}."))
        weights.append(layer_weights)
        report(progress, index + 1, len(layers), f"from-scratch layer {index + 1} of {len(layers)}")
    final = finish(x, final_norm, hooks.scope(f"{names.final_norm}."), always=outputs is not None)
    if outputs is not None:
        outputs["hidden"], outputs["final"] = x, final
    return None if weights and weights[0] is None else torch.stack(weights, dim=1)


def finish(x: torch.Tensor, final_norm: tuple | None, points: Points, always: bool) -> torch.Tensor:
    """A stack's output through its final norm (``(norm function, Norm)``), if it has one (computed when it is
    ``always`` needed, or its points are hooked)."""
    if final_norm is None or not (always or any(map(points.wants, NORM_POINTS))):
        return x
    normalize, norm = final_norm
    return normalize(x, norm, points)


def as_float32(t: torch.Tensor | None) -> torch.Tensor | None:
    """The engine computes in float32 whatever the checkpoint's dtype (a no-op for float32 weights)."""
    return None if t is None else t.detach().float()


def dense_from(linear) -> Dense:
    return Dense(as_float32(linear.weight), as_float32(linear.bias))


def norm_from(module) -> Norm:
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = module.variance_epsilon  # Llama's RMSNorm names it so
    return Norm(as_float32(module.weight), as_float32(getattr(module, "bias", None)), float(eps))


def attention_from(d_model, num_heads, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, score="scaled"):
    attention = MultiHeadAttention(d_model, num_heads, bias=True, score=score)
    attention.set_weights(
        *(as_float32(t) for t in (w_q, w_k, w_v, w_o)), *(as_float32(t) for t in (b_q, b_k, b_v, b_o))
    )
    return attention.requires_grad_(False).eval().to(w_q.device)


def mha_head_vectors(
    attention: MultiHeadAttention, h: torch.Tensor, bias, causal: bool, values_only: bool
) -> HeadVectors:
    if values_only:  # one projection instead of three
        b_v = None if attention.qkv_bias is None else attention.qkv_bias.split(attention.num_heads * attention.d_k)[2]
        q = k = None
        v = attention.split_heads(linear(h, attention.W_v, b_v))
    else:
        q, k, v = attention.project(h, h, h)
    return HeadVectors(
        query=q,
        key=k,
        value=v,
        output_weight=attention.out_proj.weight,
        score=attention.score,
        score_bias=bias,
        causal=causal,
    )
