"""The GPT-2 family: pre-LayerNorm decoders with learned positions (GPT-2, DistilGPT2)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention import MultiHeadAttention
from ..hooks import NO_HOOKS
from .blocks import (
    ACTIVATIONS,
    CoreModel,
    Dense,
    HeadVectors,
    Norm,
    as_float32,
    attention_from,
    layer_norm,
    mha_head_vectors,
    norm_from,
    run_layers,
)
from .family import AttentionModules, Family, LayerModules, ModelModules, StackModules


@dataclass
class Gpt2LayerWeights:
    attention_norm: Norm
    attention: MultiHeadAttention
    ffn_norm: Norm
    ffn_up: Dense
    activation: Callable[[torch.Tensor], torch.Tensor]
    ffn_down: Dense


def gpt2_layer(x: torch.Tensor, layer: Gpt2LayerWeights, key_padding_mask: torch.Tensor | None, hooks=NO_HOOKS):
    """One pre-LayerNorm decoder layer (GPT-2, DistilGPT2).

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens; hooks: the layer's named points.
    Returns the layer's output and its attention weights [batch, heads, n, n].
    """
    x = hooks("hook_resid_pre", x)
    # Masked (causal) self-attention on the normalised input: token i sees tokens 0..i only.
    attended, weights = layer.attention(
        layer_norm(x, layer.attention_norm, hooks.scope("ln1.")),
        causal=True,
        key_padding_mask=key_padding_mask,
        hooks=hooks.scope("attn."),
    )
    x = x + hooks("hook_attn_out", attended)  # residual connection ("pre-LN": the norm is inside the branch)

    # Feed-forward network on the normalised sum, added back to the residual stream.
    hidden = layer.activation(layer.ffn_up(layer_norm(x, layer.ffn_norm, hooks.scope("ln2."))))
    x = x + hooks("hook_mlp_out", layer.ffn_down(hidden))
    return hooks("hook_resid_post", x), weights


def gpt2_embeddings(
    word: torch.Tensor,
    position: torch.Tensor,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    hooks=NO_HOOKS,
):
    """Token + learned absolute position embeddings (segments, if any, reuse the token table)."""
    positions = position[torch.arange(input_ids.shape[1], device=input_ids.device)]
    x = hooks("hook_embed", word[input_ids]) + hooks("hook_pos_embed", positions.expand(*input_ids.shape, -1))
    return x if token_type_ids is None else x + word[token_type_ids]


def gpt2_attentions(
    core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, hooks=NO_HOOKS, outputs=None
):
    x = gpt2_embeddings(*core.embeddings, input_ids, token_type_ids, hooks)
    # The final ln_f only shapes the output (what the LM head reads), not any attention weight.
    return run_layers(
        core.layers,
        gpt2_layer,
        x,
        (key_padding_mask,),
        progress=progress,
        hooks=hooks,
        outputs=outputs,
        final_norm=(layer_norm, core.final_norm),
    )


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
        attention = attention_from(
            d_model=d,
            num_heads=config.num_attention_heads,
            w_q=w_q,
            w_k=w_k,
            w_v=w_v,
            w_o=block.attn.c_proj.weight.t(),
            b_q=b_q,
            b_k=b_k,
            b_v=b_v,
            b_o=block.attn.c_proj.bias,
            score="scaled" if config.scale_attn_weights else "dot",
        )
        mlp = block.mlp
        layers.append(
            Gpt2LayerWeights(
                attention_norm=norm_from(block.ln_1),
                attention=attention,
                ffn_norm=norm_from(block.ln_2),
                ffn_up=Dense(as_float32(mlp.c_fc.weight).t(), as_float32(mlp.c_fc.bias)),
                activation=activation,
                ffn_down=Dense(as_float32(mlp.c_proj.weight).t(), as_float32(mlp.c_proj.bias)),
            )
        )
    embeddings = (as_float32(base.wte.weight), as_float32(base.wpe.weight))
    return CoreModel("gpt2", embeddings, layers, config.max_position_embeddings, final_norm=norm_from(base.ln_f))


def gpt2_head_vectors(core: CoreModel, layer: Gpt2LayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    return mha_head_vectors(layer.attention, layer_norm(x, layer.attention_norm), None, True, values_only)


def gpt2_modules(base) -> ModelModules:
    """Where a transformers GPT-2 computes: one projection gives the queries, keys and values, ``[q | k | v]``."""
    heads = base.config.num_attention_heads
    layers = [
        LayerModules(
            block,
            AttentionModules((block.attn.c_attn,), block.attn.c_proj, block.attn, heads),  # [q | k | v]
            (block.ln_1, block.ln_2),
            block.mlp,
        )
        for block in base.h
    ]
    return ModelModules({"blocks": StackModules(layers, base.wte, base.wpe, base.ln_f)})


FAMILY = Family(
    name="gpt2",
    model_types=("gpt2",),
    summary="pre-LayerNorm decoder with learned positions: GPT-2, DistilGPT2",
    causal=True,
    positions="learned absolute position vectors added to the token vectors",
    read=read_gpt2,
    forward=gpt2_attentions,
    layer=gpt2_layer,
    heads=gpt2_head_vectors,
    helpers=(gpt2_embeddings, layer_norm),
    activation_of=lambda config: config.activation_function,
    modules=gpt2_modules,
    lm_head="causal",
    head_weight_prefixes=("lm_head.",),
    head_of=lambda lm_model: lm_model.lm_head,
)
