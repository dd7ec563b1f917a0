"""The Llama family: pre-RMSNorm decoders with rotary positions, grouped KV heads and SwiGLU (Llama, SmolLM2,
Mistral)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention import scaled_dot_product_attention
from ..hooks import NO_HOOKS
from .blocks import (
    ACTIVATIONS,
    CoreModel,
    Dense,
    HeadVectors,
    Norm,
    as_float32,
    dense_from,
    norm_from,
    rms_norm,
    rotary_angles,
    rotate,
    run_layers,
)
from .family import AttentionModules, Family, LayerModules, ModelModules, StackModules

# Rotary variants whose frequencies are fixed by the config (no dependence on the input length).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


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


def llama_layer(
    x: torch.Tensor,
    layer: LlamaLayerWeights,
    key_padding_mask: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    hooks=NO_HOOKS,
):
    """One Llama decoder layer (Llama, SmolLM2): RMSNorm, rotary positions, grouped KV heads, SwiGLU.

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens;
    cos, sin: [n, head_dim] rotary angles of each position; hooks: the layer's named points.
    Returns the layer's output and the weights of every query head [batch, heads, n, n].
    """
    batch, n, _ = x.shape
    x = hooks("hook_resid_pre", x)
    h, attn = rms_norm(x, layer.attention_norm, hooks.scope("ln1.")), hooks.scope("attn.")

    # Project to heads: num_heads query heads, but only num_kv_heads key and value heads.
    q = attn("hook_q", layer.query(h).view(batch, n, layer.num_heads, layer.head_dim)).transpose(1, 2)
    k = attn("hook_k", layer.key(h).view(batch, n, layer.num_kv_heads, layer.head_dim)).transpose(1, 2)
    v = attn("hook_v", layer.value(h).view(batch, n, layer.num_kv_heads, layer.head_dim)).transpose(1, 2)

    # Position enters only here: queries and keys are rotated by angles that grow with position,
    # so the score q_i . k_j depends on the offset i - j.
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)

    # Grouped-query attention: each key/value head serves num_heads / num_kv_heads query heads.
    group = layer.num_heads // layer.num_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)

    mask = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, causal=True, hooks=attn)
    concat = attn("hook_z", heads.transpose(1, 2)).reshape(batch, n, -1)  # z: [batch, n, heads, head_dim]
    x = x + hooks("hook_attn_out", layer.output(concat))  # Concat(heads) W^O, residual

    # SwiGLU feed-forward: a SiLU-gated product of two projections, projected back.
    h = rms_norm(x, layer.ffn_norm, hooks.scope("ln2."))
    x = x + hooks("hook_mlp_out", layer.ffn_down(layer.activation(layer.ffn_gate(h)) * layer.ffn_up(h)))
    return hooks("hook_resid_post", x), weights


def llama_attentions(
    core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, hooks=NO_HOOKS, outputs=None
):
    cos, sin = rotary_angles(input_ids.shape[1], *core.rope)
    x = hooks("hook_embed", core.embeddings[input_ids])  # Llama adds no position vector: position is in the rotation
    return run_layers(
        core.layers,
        llama_layer,
        x,
        (key_padding_mask, cos, sin),
        progress=progress,
        hooks=hooks,
        outputs=outputs,
        final_norm=(rms_norm, core.final_norm),
    )


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
        from transformers.modeling_rope_utils import (
            ROPE_INIT_FUNCTIONS,  # transformers' rope table: only for scaled rotary positions
        )

        inverse_frequency, amplitude = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, None)
    device = base.embed_tokens.weight.device
    activation = ACTIVATIONS[family.activation_of(config)]
    layers = []
    for block in base.layers:
        a, mlp = block.self_attn, block.mlp
        layers.append(
            LlamaLayerWeights(
                attention_norm=norm_from(block.input_layernorm),
                query=dense_from(a.q_proj),
                key=dense_from(a.k_proj),
                value=dense_from(a.v_proj),
                output=dense_from(a.o_proj),
                num_heads=config.num_attention_heads,
                num_kv_heads=config.num_key_value_heads,
                head_dim=head_dim,
                ffn_norm=norm_from(block.post_attention_layernorm),
                ffn_gate=dense_from(mlp.gate_proj),
                ffn_up=dense_from(mlp.up_proj),
                ffn_down=dense_from(mlp.down_proj),
                activation=activation,
            )
        )
    rope_table = (inverse_frequency.float().to(device), float(amplitude))
    return CoreModel(
        "llama",
        as_float32(base.embed_tokens.weight),
        layers,
        None,
        rope=rope_table,
        sliding_window=getattr(config, "sliding_window", None),
        final_norm=norm_from(base.norm),
    )


def llama_head_vectors(core: CoreModel, layer: LlamaLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    batch, n, _ = x.shape
    h = rms_norm(x, layer.attention_norm)
    group = layer.num_heads // layer.num_kv_heads
    v = layer.value(h).view(batch, n, layer.num_kv_heads, layer.head_dim).transpose(1, 2).repeat_interleave(group, 1)
    if values_only:
        return HeadVectors(
            query=None,
            key=None,
            value=v,
            output_weight=layer.output.weight,
            score="scaled",
            score_bias=None,
            causal=True,
        )
    q = layer.query(h).view(batch, n, layer.num_heads, layer.head_dim).transpose(1, 2)
    k = layer.key(h).view(batch, n, layer.num_kv_heads, layer.head_dim).transpose(1, 2)
    cos, sin = rotary_angles(n, *core.rope)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin).repeat_interleave(group, dim=1)
    return HeadVectors(
        query=q, key=k, value=v, output_weight=layer.output.weight, score="scaled", score_bias=None, causal=True
    )


def llama_modules(base) -> ModelModules:
    """Where a transformers Llama computes (its queries and keys before the rotation, keys and values per KV head)."""
    heads = base.config.num_attention_heads
    layers = [
        LayerModules(
            block,
            AttentionModules((a.q_proj, a.k_proj, a.v_proj), a.o_proj, a, heads),
            (block.input_layernorm, block.post_attention_layernorm),
            block.mlp,
        )
        for block, a in ((block, block.self_attn) for block in base.layers)
    ]
    return ModelModules({"blocks": StackModules(layers, base.embed_tokens, None, base.norm)})


def _llama_check(config) -> str | None:
    rope_type = rope_parameters(config)["rope_type"]
    if rope_type not in STATIC_ROPE_TYPES:
        return f"its rotary scaling {rope_type!r} depends on the input length"
    return None


FAMILY = Family(
    name="llama",
    model_types=("llama", "mistral"),
    summary="pre-RMSNorm decoder with rotary positions, grouped KV heads and SwiGLU: Llama, SmolLM2, Mistral",
    causal=True,
    positions="rotary: queries and keys turned by angles that grow with position",
    read=read_llama,
    forward=llama_attentions,
    layer=llama_layer,
    heads=llama_head_vectors,
    helpers=(rotary_angles, rotate, rms_norm),
    activation_of=lambda config: config.hidden_act,
    check=_llama_check,
    modules=llama_modules,
    lm_head="causal",
    head_weight_prefixes=("lm_head.",),
    head_of=lambda lm_model: lm_model.lm_head,
)
