"""The from-scratch engine: every layer of a checkpoint recomputed with Headscope's own code.

The weights come from a transformers model; the computation does not. Embeddings, LayerNorm,
RMSNorm, rotary positions, feed-forward networks and residual connections are written out
below, and every attention head is computed by ``mha_core.attention`` (``MultiHeadAttention``
for BERT and GPT-2, ``scaled_dot_product_attention`` for Llama's rotary, grouped-query heads).
The tests check that the weights equal ``transformers``' own (eager) attentions to 1e-4.

Per family (``mha_core.families`` is the table of which model types each covers): one function
that reads a checkpoint's weights (``read_*``), one layer function (``*_layer``, what the app shows
as the code that ran) and one whole pass (``*_attentions``).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .attention import MultiHeadAttention, linear, scaled_dot_product_attention
from .errors import EngineNotSupported
from .progress import Progress, report

if TYPE_CHECKING:
    from .families import Family

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

# Rotary variants whose frequencies are fixed by the config (no dependence on the input length).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


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


def layer_norm(x: torch.Tensor, norm: Norm) -> torch.Tensor:
    """(x - mean) / sqrt(variance + eps) * gain + bias, over the hidden axis (biased variance)."""
    mean = x.mean(dim=-1, keepdim=True)
    variance = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) * torch.rsqrt(variance + norm.eps) * norm.weight + norm.bias


def rms_norm(x: torch.Tensor, norm: Norm) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * gain: LayerNorm without centring and without bias."""
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + norm.eps) * norm.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: turn each pair (x_i, x_{i+d/2}) by the angle position * frequency_i."""
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated_half * sin


# ---------------------------------------------------------------------------------------------
# Weights, gathered once per model
# ---------------------------------------------------------------------------------------------


@dataclass
class BertEmbeddingWeights:
    word: torch.Tensor  # [vocab, d]
    position: torch.Tensor  # [max_positions, d]
    token_type: torch.Tensor | None  # [types, d]; DistilBERT has none
    norm: Norm
    projection: Dense | None  # ELECTRA: embedding size -> hidden size
    padding_idx: int | None  # RoBERTa: positions count real tokens from padding_idx + 1


@dataclass
class BertLayerWeights:
    attention: MultiHeadAttention
    attention_norm: Norm
    ffn_up: Dense
    activation: Callable[[torch.Tensor], torch.Tensor]
    ffn_down: Dense
    output_norm: Norm


@dataclass
class Gpt2LayerWeights:
    attention_norm: Norm
    attention: MultiHeadAttention
    ffn_norm: Norm
    ffn_up: Dense
    activation: Callable[[torch.Tensor], torch.Tensor]
    ffn_down: Dense


@dataclass
class LlamaLayerWeights:
    attention_norm: Norm
    query: Dense
    key: Dense
    value: Dense
    output: Dense
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_norm: Norm
    ffn_gate: Dense
    ffn_up: Dense
    ffn_down: Dense
    activation: Callable[[torch.Tensor], torch.Tensor]


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


# ---------------------------------------------------------------------------------------------
# The layers: what the app shows as "these lines compute exactly what the model computes"
# ---------------------------------------------------------------------------------------------


def bert_layer(x: torch.Tensor, layer: BertLayerWeights, key_padding_mask: torch.Tensor | None, edit=None):
    """One post-LayerNorm encoder layer (BERT, MiniLM, RoBERTa, DistilBERT, ELECTRA).

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens.
    Returns the layer's output and its attention weights [batch, heads, n, n].
    """
    # Multi-head self-attention: every token looks at every real token, in both directions.
    attended, weights = layer.attention(x, key_padding_mask=key_padding_mask, edit_heads=edit)

    # Residual connection, then LayerNorm ("post-LN": the norm comes after the sum).
    x = layer_norm(x + attended, layer.attention_norm)

    # Position-wise feed-forward network: widen (usually 4x), activation, project back.
    hidden = layer.activation(layer.ffn_up(x))
    x = layer_norm(x + layer.ffn_down(hidden), layer.output_norm)
    return x, weights


def mpnet_layer(
    x: torch.Tensor, layer: BertLayerWeights, key_padding_mask: torch.Tensor | None, position_bias, edit=None
):
    """One MPNet encoder layer: a BERT layer whose scores also get a learned bias by relative position.

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens;
    position_bias: [1, heads, n, n], added to q.k / sqrt(d_k) before the softmax (an additive mask).
    Returns the layer's output and its attention weights [batch, heads, n, n].
    """
    attended, weights = layer.attention(x, mask=position_bias, key_padding_mask=key_padding_mask, edit_heads=edit)
    x = layer_norm(x + attended, layer.attention_norm)  # residual, then post-LN, as in BERT
    hidden = layer.activation(layer.ffn_up(x))
    x = layer_norm(x + layer.ffn_down(hidden), layer.output_norm)
    return x, weights


def relative_position_buckets(n: int, num_buckets: int, max_distance: int) -> torch.Tensor:
    """[n, n] bucket of each (query i, key j): half the buckets per direction; offsets below a quarter
    of the buckets get one bucket each, larger ones share buckets on a log scale up to max_distance."""
    offset = torch.arange(n)[:, None] - torch.arange(n)[None, :]  # i - j: positive when the key is before
    half = num_buckets // 2
    bucket = (offset < 0).long() * half
    distance = offset.abs()
    exact = half // 2
    safe = distance.clamp(min=1).float()
    log_bucket = exact + (torch.log(safe / exact) / math.log(max_distance / exact) * (half - exact)).long()
    return bucket + torch.where(distance < exact, distance, log_bucket.clamp(max=half - 1))


def gpt2_layer(x: torch.Tensor, layer: Gpt2LayerWeights, key_padding_mask: torch.Tensor | None, edit=None):
    """One pre-LayerNorm decoder layer (GPT-2, DistilGPT2).

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens.
    Returns the layer's output and its attention weights [batch, heads, n, n].
    """
    # Masked (causal) self-attention on the normalised input: token i sees tokens 0..i only.
    attended, weights = layer.attention(
        layer_norm(x, layer.attention_norm), causal=True, key_padding_mask=key_padding_mask, edit_heads=edit
    )
    x = x + attended  # residual connection ("pre-LN": the norm is inside the branch)

    # Feed-forward network on the normalised sum, added back to the residual stream.
    hidden = layer.activation(layer.ffn_up(layer_norm(x, layer.ffn_norm)))
    x = x + layer.ffn_down(hidden)
    return x, weights


def llama_layer(
    x: torch.Tensor,
    layer: LlamaLayerWeights,
    key_padding_mask: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    edit=None,
):
    """One Llama decoder layer (Llama, SmolLM2): RMSNorm, rotary positions, grouped KV heads, SwiGLU.

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens;
    cos, sin: [n, head_dim] rotary angles of each position.
    Returns the layer's output and the weights of every query head [batch, heads, n, n].
    """
    batch, n, _ = x.shape
    h = rms_norm(x, layer.attention_norm)

    # Project to heads: num_heads query heads, but only num_kv_heads key and value heads.
    q = layer.query(h).view(batch, n, layer.num_heads, layer.head_dim).transpose(1, 2)
    k = layer.key(h).view(batch, n, layer.num_kv_heads, layer.head_dim).transpose(1, 2)
    v = layer.value(h).view(batch, n, layer.num_kv_heads, layer.head_dim).transpose(1, 2)

    # Position enters only here: queries and keys are rotated by angles that grow with position,
    # so the score q_i . k_j depends on the offset i - j.
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)

    # Grouped-query attention: each key/value head serves num_heads / num_kv_heads query heads.
    group = layer.num_heads // layer.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, causal=True)
    concat = heads.transpose(1, 2).reshape(batch, n, -1)
    if edit is not None:  # head ablation: the heads' slices of Concat(heads), the input of W^O
        concat = edit(concat)
    x = x + layer.output(concat)  # Concat(heads) W^O, residual

    # SwiGLU feed-forward: a SiLU-gated product of two projections, projected back.
    h = rms_norm(x, layer.ffn_norm)
    x = x + layer.ffn_down(layer.activation(layer.ffn_gate(h)) * layer.ffn_up(h))
    return x, weights


# ---------------------------------------------------------------------------------------------
# Embeddings and whole-model passes
# ---------------------------------------------------------------------------------------------


def bert_embeddings(emb: BertEmbeddingWeights, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None):
    """Token + learned absolute position (+ segment) embeddings, then LayerNorm."""
    if emb.padding_idx is None:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    else:
        # RoBERTa numbers real tokens from padding_idx + 1; padding tokens keep padding_idx.
        real = input_ids.ne(emb.padding_idx).long()
        positions = real.cumsum(dim=1) * real + emb.padding_idx
    x = emb.word[input_ids] + emb.position[positions]
    if emb.token_type is not None:
        x = x + emb.token_type[0 if token_type_ids is None else token_type_ids]
    x = layer_norm(x, emb.norm)
    return x if emb.projection is None else emb.projection(x)


def _layer_weights(
    layers,
    layer_fn,
    x,
    *args,
    progress: Progress | None = None,
    record: list | None = None,
    edits: dict | None = None,
    outputs: dict | None = None,
) -> torch.Tensor:
    """Run the layers in order; the attention weights of all of them, ``[batch, layers, heads, n, n]``.

    ``progress(done, total, message)`` after each layer (it may raise to stop the pass there);
    ``record``, when given, receives each layer's input (what ``head_vectors`` projects);
    ``edits``: ``{layer: function}`` applied to that layer's Concat(heads) (``mha_core.causal``);
    ``outputs``: a dict that receives ``"hidden"``, the residual stream after the last layer.
    """
    weights = []
    edits = edits or {}
    for index, layer in enumerate(layers):
        if record is not None:
            record.append(x)
        x, layer_weights = layer_fn(x, layer, *args, edit=edits.get(index))
        weights.append(layer_weights)
        report(progress, index + 1, len(layers), f"from-scratch layer {index + 1} of {len(layers)}")
    if outputs is not None:
        outputs["hidden"] = x
    return torch.stack(weights, dim=1)


def bert_attentions(core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, **passes):
    x = bert_embeddings(core.embeddings, input_ids, token_type_ids)
    return _layer_weights(core.layers, bert_layer, x, key_padding_mask, progress=progress, **passes)


def mpnet_attentions(core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, **passes):
    x = bert_embeddings(core.embeddings, input_ids, None)  # MPNet has no segment embeddings
    position_bias = mpnet_position_bias(core, input_ids.shape[1])  # [1, heads, n, n]
    return _layer_weights(core.layers, mpnet_layer, x, key_padding_mask, position_bias, progress=progress, **passes)


def gpt2_embeddings(
    word: torch.Tensor, position: torch.Tensor, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None
):
    """Token + learned absolute position embeddings (segments, if any, reuse the token table)."""
    x = word[input_ids] + position[torch.arange(input_ids.shape[1], device=input_ids.device)]
    return x if token_type_ids is None else x + word[token_type_ids]


def rotary_angles(n: int, inverse_frequency: torch.Tensor, amplitude: float):
    """cos and sin of position * frequency_i, ``[n, head_dim]``: each angle twice, once per half."""
    positions = torch.arange(n, device=inverse_frequency.device, dtype=torch.float32)
    angles = positions[:, None] * inverse_frequency
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos() * amplitude, angles.sin() * amplitude


def gpt2_attentions(core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, **passes):
    x = gpt2_embeddings(*core.embeddings, input_ids, token_type_ids)
    # The final ln_f only shapes the output logits, not any attention weight: it is not needed.
    return _layer_weights(core.layers, gpt2_layer, x, key_padding_mask, progress=progress, **passes)


def llama_attentions(core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, **passes):
    cos, sin = rotary_angles(input_ids.shape[1], *core.rope)
    x = core.embeddings[input_ids]  # Llama adds no position vector: position is in the rotation
    return _layer_weights(core.layers, llama_layer, x, key_padding_mask, cos, sin, progress=progress, **passes)


# ---------------------------------------------------------------------------------------------
# Reading a transformers checkpoint
# ---------------------------------------------------------------------------------------------


def _f32(t: torch.Tensor | None) -> torch.Tensor | None:
    """The engine computes in float32 whatever the checkpoint's dtype (a no-op for float32 weights)."""
    return None if t is None else t.detach().float()


def _dense(linear) -> Dense:
    return Dense(_f32(linear.weight), _f32(linear.bias))


def _norm(module) -> Norm:
    eps = getattr(module, "eps", None)
    if eps is None:
        eps = module.variance_epsilon  # Llama's RMSNorm names it so
    return Norm(_f32(module.weight), _f32(getattr(module, "bias", None)), float(eps))


def _attention_module(d_model, num_heads, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, score="scaled"):
    attention = MultiHeadAttention(d_model, num_heads, bias=True, score=score)
    attention.set_weights(*(_f32(t) for t in (w_q, w_k, w_v, w_o)), *(_f32(t) for t in (b_q, b_k, b_v, b_o)))
    return attention.requires_grad_(False).eval().to(w_q.device)


def read_bert(base, config, family: Family) -> CoreModel:
    e = base.embeddings
    distil = config.model_type == "distilbert"
    offset_positions = config.model_type in family.positions_after_padding
    embeddings = BertEmbeddingWeights(
        word=_f32(e.word_embeddings.weight),
        position=_f32(e.position_embeddings.weight),
        token_type=None if distil else _f32(e.token_type_embeddings.weight),
        norm=_norm(e.LayerNorm),
        projection=_dense(base.embeddings_project) if hasattr(base, "embeddings_project") else None,
        padding_idx=config.pad_token_id if offset_positions else None,
    )
    activation = ACTIVATIONS[family.activation_of(config)]
    layers = []
    for block in base.transformer.layer if distil else base.encoder.layer:
        if distil:
            a = block.attention
            projections = (a.q_lin, a.k_lin, a.v_lin, a.out_lin)
            norms, ffn = (block.sa_layer_norm, block.output_layer_norm), (block.ffn.lin1, block.ffn.lin2)
        else:
            a = block.attention.self
            projections = (a.query, a.key, a.value, block.attention.output.dense)
            norms = (block.attention.output.LayerNorm, block.output.LayerNorm)
            ffn = (block.intermediate.dense, block.output.dense)
        attention = _attention_module(
            config.hidden_size,
            config.num_attention_heads,
            *(p.weight for p in projections),
            *(p.bias for p in projections),
        )
        layers.append(
            BertLayerWeights(attention, _norm(norms[0]), _dense(ffn[0]), activation, _dense(ffn[1]), _norm(norms[1]))
        )
    # RoBERTa's first padding_idx + 1 position rows are never used by a real token.
    max_positions = config.max_position_embeddings - (config.pad_token_id + 1 if offset_positions else 0)
    return CoreModel("bert", embeddings, layers, max_positions)


def read_mpnet(base, config, family: Family) -> CoreModel:
    e = base.embeddings
    embeddings = BertEmbeddingWeights(
        word=_f32(e.word_embeddings.weight),
        position=_f32(e.position_embeddings.weight),
        token_type=None,
        norm=_norm(e.LayerNorm),
        projection=None,
        padding_idx=e.padding_idx,  # positions count real tokens from padding_idx + 1, as in RoBERTa
    )
    activation = ACTIVATIONS[family.activation_of(config)]
    layers = []
    for block in base.encoder.layer:
        a = block.attention.attn
        projections = (a.q, a.k, a.v, a.o)
        attention = _attention_module(
            config.hidden_size,
            config.num_attention_heads,
            *(p.weight for p in projections),
            *(p.bias for p in projections),
        )
        layers.append(
            BertLayerWeights(
                attention,
                _norm(block.attention.LayerNorm),
                _dense(block.intermediate.dense),
                activation,
                _dense(block.output.dense),
                _norm(block.output.LayerNorm),
            )
        )
    # transformers' MPNetEncoder.compute_position_bias buckets with its defaults (32 buckets, distance 128).
    bias = RelativePositionBias(_f32(base.encoder.relative_attention_bias.weight), 32, 128)
    max_positions = config.max_position_embeddings - (e.padding_idx + 1)
    return CoreModel("mpnet", embeddings, layers, max_positions, relative_bias=bias)


def read_gpt2(base, config, family: Family) -> CoreModel:
    activation = ACTIVATIONS[family.activation_of(config)]
    d = config.hidden_size
    layers = []
    for index, block in enumerate(base.h):
        # Conv1D stores weights as [in, out]; nn.Linear layout is the transpose.
        w_q, w_k, w_v = block.attn.c_attn.weight.t().split(d, dim=0)
        b_q, b_k, b_v = block.attn.c_attn.bias.split(d)
        if config.scale_attn_by_inverse_layer_idx:
            # Scores divided by (layer index + 1): the same as dividing the query projection.
            w_q, b_q = w_q / (index + 1), b_q / (index + 1)
        attention = _attention_module(
            d,
            config.num_attention_heads,
            w_q,
            w_k,
            w_v,
            block.attn.c_proj.weight.t(),
            b_q,
            b_k,
            b_v,
            block.attn.c_proj.bias,
            score="scaled" if config.scale_attn_weights else "dot",
        )
        mlp = block.mlp
        layers.append(
            Gpt2LayerWeights(
                _norm(block.ln_1),
                attention,
                _norm(block.ln_2),
                Dense(_f32(mlp.c_fc.weight).t(), _f32(mlp.c_fc.bias)),
                activation,
                Dense(_f32(mlp.c_proj.weight).t(), _f32(mlp.c_proj.bias)),
            )
        )
    embeddings = (_f32(base.wte.weight), _f32(base.wpe.weight))
    return CoreModel("gpt2", embeddings, layers, config.max_position_embeddings)


def rope_parameters(config) -> dict:
    params = dict(getattr(config, "rope_parameters", None) or {})
    params.setdefault("rope_type", "default")
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return params


def read_llama(base, config, family: Family) -> CoreModel:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rope = rope_parameters(config)
    if rope["rope_type"] == "default":
        # theta_i = base^(-2i / head_dim): one frequency per rotated pair of dimensions.
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
        inverse_frequency, amplitude = 1.0 / (rope["rope_theta"] ** exponents), 1.0
    else:
        # Scaled variants (linear, llama3, yarn) reshape the frequency table from the config;
        # the table is a constant of the checkpoint, read from transformers like a weight.
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        inverse_frequency, amplitude = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, None)
    device = base.embed_tokens.weight.device
    activation = ACTIVATIONS[family.activation_of(config)]
    layers = []
    for block in base.layers:
        a, mlp = block.self_attn, block.mlp
        layers.append(
            LlamaLayerWeights(
                _norm(block.input_layernorm),
                _dense(a.q_proj),
                _dense(a.k_proj),
                _dense(a.v_proj),
                _dense(a.o_proj),
                config.num_attention_heads,
                config.num_key_value_heads,
                head_dim,
                _norm(block.post_attention_layernorm),
                _dense(mlp.gate_proj),
                _dense(mlp.up_proj),
                _dense(mlp.down_proj),
                activation,
            )
        )
    rope_table = (inverse_frequency.float().to(device), float(amplitude))
    return CoreModel(
        "llama",
        _f32(base.embed_tokens.weight),
        layers,
        None,
        rope=rope_table,
        sliding_window=getattr(config, "sliding_window", None),
    )


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------


def core_family(hf_model: torch.nn.Module) -> str:
    """The family (``mha_core.families``) whose code recomputes ``hf_model``.

    Raises ``EngineNotSupported`` with the reason when the architecture, or a configuration
    option it uses, has no from-scratch implementation here.
    """
    from .families import FAMILY_OF_MODEL_TYPE, supported_types  # the table refers to this module's code

    config = getattr(hf_model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise EngineNotSupported(f"the from-scratch engine needs a transformers model; got {type(hf_model).__name__}")
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    reason = "its architecture is not implemented" if family is None else family.check(config)
    if reason is None and family.activation_of(config) not in ACTIVATIONS:
        reason = f"its activation {family.activation_of(config)!r} is not implemented"
    if reason is not None:
        raise EngineNotSupported(
            f"the from-scratch (core) engine cannot recompute this {model_type!r} model: {reason}. "
            f"Use engine='transformers' instead. Supported model types: {supported_types()}."
        )
    return family.name


_CORE_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_BUILD_LOCK = threading.Lock()


def core_model(hf_model) -> CoreModel:
    """The weights of ``hf_model`` gathered for the engine, built once per model and cached.

    The cache is keyed weakly on the model, so it goes away with the model. It holds weight
    tensors (shared with the model where no conversion is needed), never the model itself.
    """
    with _BUILD_LOCK:
        core = _CORE_MODELS.get(hf_model)
        if core is None:
            from .families import FAMILIES

            family = FAMILIES[core_family(hf_model)]
            base = getattr(hf_model, "base_model", hf_model)  # *ForMaskedLM / *ForCausalLM wrap the base model
            with torch.no_grad():
                core = family.read(base, hf_model.config, family)
            _CORE_MODELS[hf_model] = core
    return core


def _same_shape(values, input_ids: torch.Tensor, name: str) -> torch.Tensor | None:
    """``values`` as a tensor shaped like ``input_ids`` (a single ``[n]`` row is a batch of one)."""
    if values is None:
        return None
    values = torch.as_tensor(values, device=input_ids.device)
    if values.dim() == 1:
        values = values[None]
    if values.shape != input_ids.shape:
        raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(values.shape)}")
    return values


def core_attentions(
    hf_model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    progress: Progress | None = None,
    layer_inputs: list | None = None,
    edits: dict | None = None,
    outputs: dict | None = None,
) -> torch.Tensor:
    """Attention weights of every layer and head, recomputed from scratch: float32 ``[batch, layers, heads, n, n]``.

    ``input_ids`` ``[batch, n]`` (a single ``[n]`` sequence is treated as a batch of one);
    ``attention_mask`` ``[batch, n]`` with 1 for real tokens (padding on the right for decoders);
    ``token_type_ids`` ``[batch, n]`` segment ids, for encoders with sentence pairs.
    Weights in the rows of padding tokens are not meaningful; columns of padding tokens are 0.
    ``progress(done, total, message)`` is called after every layer; ``layer_inputs``, when given a list,
    receives each layer's input hidden states ``[batch, n, d]`` (for ``head_vectors``);
    ``edits``: ``{layer: function of Concat(heads)}``, e.g. head ablation (``mha_core.causal``);
    ``outputs``: a dict that receives ``"hidden"``, the residual stream after the last layer (before any final norm).
    """
    core = core_model(hf_model)
    device = hf_model.get_input_embeddings().weight.device
    input_ids = torch.as_tensor(input_ids, device=device)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.dtype.is_floating_point:
        raise ValueError(
            f"input_ids must be integer token ids of shape [batch, n] with n >= 1, got {tuple(input_ids.shape)}"
        )
    n = input_ids.shape[1]
    if core.max_positions is not None and n > core.max_positions:
        raise ValueError(f"{n} tokens exceed this model's {core.max_positions} learned positions")
    if core.sliding_window is not None and n > core.sliding_window:
        raise EngineNotSupported(
            f"the from-scratch engine does not implement sliding-window attention, which this "
            f"model applies beyond {core.sliding_window} tokens ({n} given)"
        )
    key_padding_mask = _same_shape(attention_mask, input_ids, "attention_mask")
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.bool()
    token_type_ids = _same_shape(token_type_ids, input_ids, "token_type_ids")
    from .families import FAMILIES

    with torch.inference_mode():
        forward = FAMILIES[core.family].forward
        return forward(
            core,
            input_ids,
            key_padding_mask,
            token_type_ids,
            progress,
            record=layer_inputs,
            edits=edits,
            outputs=outputs,
        ).float()


# ---------------------------------------------------------------------------------------------
# One layer's heads, vector by vector: what the neuron view and norm-based attention look at
# ---------------------------------------------------------------------------------------------


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


def _mha_vectors(attention: MultiHeadAttention, h: torch.Tensor, bias, causal: bool, values_only: bool) -> HeadVectors:
    if values_only:  # one projection instead of three
        b_v = None if attention.qkv_bias is None else attention.qkv_bias.split(attention.num_heads * attention.d_k)[2]
        q = k = None
        v = attention.split_heads(linear(h, attention.W_v, b_v))
    else:
        q, k, v = attention.project(h, h, h)
    return HeadVectors(q, k, v, attention.out_proj.weight, attention.score, bias, causal)


def mpnet_position_bias(core: CoreModel, n: int) -> torch.Tensor:
    bias = core.relative_bias
    buckets = relative_position_buckets(n, bias.num_buckets, bias.max_distance)
    return bias.table[buckets.to(bias.table.device)].permute(2, 0, 1)[None]


def bert_head_vectors(core: CoreModel, layer: BertLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    return _mha_vectors(layer.attention, x, None, False, values_only)


def mpnet_head_vectors(core: CoreModel, layer: BertLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    return _mha_vectors(layer.attention, x, mpnet_position_bias(core, x.shape[1]), False, values_only)


def gpt2_head_vectors(core: CoreModel, layer: Gpt2LayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    return _mha_vectors(layer.attention, layer_norm(x, layer.attention_norm), None, True, values_only)


def llama_head_vectors(core: CoreModel, layer: LlamaLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    batch, n, _ = x.shape
    h = rms_norm(x, layer.attention_norm)
    group = layer.num_heads // layer.num_kv_heads
    v = layer.value(h).view(batch, n, layer.num_kv_heads, layer.head_dim).transpose(1, 2).repeat_interleave(group, 1)
    if values_only:
        return HeadVectors(None, None, v, layer.output.weight, "scaled", None, True)
    q = layer.query(h).view(batch, n, layer.num_heads, layer.head_dim).transpose(1, 2)
    k = layer.key(h).view(batch, n, layer.num_kv_heads, layer.head_dim).transpose(1, 2)
    cos, sin = rotary_angles(n, *core.rope)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin).repeat_interleave(group, dim=1)
    return HeadVectors(q, k, v, layer.output.weight, "scaled", None, True)


def head_vectors(hf_model, layer_index: int, x: torch.Tensor, values_only: bool = False) -> HeadVectors:
    """The query, key and value vectors of every head of layer ``layer_index`` for its input ``x``
    ``[batch, n, d]`` (``layer_inputs`` of ``core_attentions``, or transformers' ``hidden_states``).
    ``values_only``: only the value vectors (query and key None), for norm-based attention."""
    from .families import FAMILIES

    core = core_model(hf_model)
    with torch.inference_mode():
        return FAMILIES[core.family].heads(core, core.layers[layer_index], x.float(), values_only)
