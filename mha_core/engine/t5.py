"""The T5 family: pre-RMSNorm encoder-decoders whose only position signal is a learned bias by bucketed
relative offset, shared by every layer of a stack (computed in its first layer), and whose scores are not
scaled by 1/sqrt(d_k) (T5, T5 v1.1, Flan-T5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention import MultiHeadAttention
from ..hooks import DECODER, ENCODER, NO_HOOKS
from .blocks import (
    ACTIVATIONS,
    Dense,
    HeadVectors,
    Norm,
    RelativePositionBias,
    as_float32,
    dense_from,
    mha_head_vectors,
    norm_from,
    relative_position_buckets,
    rms_norm,
)
from .family import AttentionModules, Family, LayerModules, ModelModules, StackModules
from .seq2seq_blocks import Seq2SeqCore, run_encoder_decoder


@dataclass
class T5LayerWeights:
    attention_norm: Norm
    attention: MultiHeadAttention  # score "dot": T5 folds 1/sqrt(d_k) into its initialisation instead
    cross_norm: Norm | None  # decoder layers only
    cross: MultiHeadAttention | None
    ffn_norm: Norm
    ffn_in: Dense
    ffn_gate: Dense | None  # gated variants (T5 v1.1, Flan-T5): act(x W_0) * (x W_1)
    ffn_out: Dense
    activation: Callable[[torch.Tensor], torch.Tensor]


def t5_feed_forward(x: torch.Tensor, layer: T5LayerWeights, norm=NO_HOOKS) -> torch.Tensor:
    """RMS norm (its points ``norm``), then widen, activation (gated or not), project back: the residual branch."""
    h = rms_norm(x, layer.ffn_norm, norm)
    if layer.ffn_gate is None:
        hidden = layer.activation(layer.ffn_in(h))
    else:
        hidden = layer.activation(layer.ffn_gate(h)) * layer.ffn_in(h)
    return layer.ffn_out(hidden)


def t5_encoder_layer(x, layer: T5LayerWeights, key_padding_mask, position_bias, hooks=NO_HOOKS):
    """One T5 encoder layer: RMS norm, self-attention with the shared position bias (no score scaling),
    residual; then the feed-forward branch. Returns the layer's output and its weights [batch, heads, n, n]."""
    x = hooks("hook_resid_pre", x)
    h = rms_norm(x, layer.attention_norm, hooks.scope("ln1."))
    attended, weights = layer.attention(
        h, mask=position_bias, key_padding_mask=key_padding_mask, hooks=hooks.scope("attn.")
    )
    x = x + hooks("hook_attn_out", attended)
    x = x + hooks("hook_mlp_out", t5_feed_forward(x, layer, hooks.scope("ln2.")))
    return hooks("hook_resid_post", x), weights


def t5_decoder_layer(y, layer: T5LayerWeights, memory, memory_mask, position_bias, hooks=NO_HOOKS):
    """One T5 decoder layer: causal self-attention with the decoder's (one-directional) position bias; then
    cross-attention from the target to the encoder's output ``memory`` (no position bias: the source's
    positions are already in it); then the feed-forward branch. Pre-norm, residual around each.
    Returns the output, the self-attention weights [batch, heads, n_tgt, n_tgt] and the cross-attention
    weights [batch, heads, n_tgt, n_src]."""
    y = hooks("hook_resid_pre", y)
    h = rms_norm(y, layer.attention_norm, hooks.scope("ln1."))
    attended, self_weights = layer.attention(h, mask=position_bias, causal=True, hooks=hooks.scope("attn."))
    y = y + hooks("hook_attn_out", attended)
    h = rms_norm(y, layer.cross_norm, hooks.scope("ln2."))
    attended, cross_weights = layer.cross(
        h, memory, memory, key_padding_mask=memory_mask, hooks=hooks.scope("cross_attn.")
    )
    y = y + hooks("hook_cross_attn_out", attended)
    y = y + hooks("hook_mlp_out", t5_feed_forward(y, layer, hooks.scope("ln3.")))
    return hooks("hook_resid_post", y), self_weights, cross_weights


def t5_position_bias(bias: RelativePositionBias, n: int, bidirectional: bool) -> torch.Tensor:
    """[1, heads, n, n]: each head's learned bias for the bucket of each (query, key) offset."""
    buckets = relative_position_buckets(n, bias.num_buckets, bias.max_distance, bidirectional)
    return bias.table[buckets.to(bias.table.device)].permute(2, 0, 1)[None]


def t5_attentions(core: Seq2SeqCore, input_ids, decoder_input_ids, source_mask, progress=None, hooks=NO_HOOKS):
    encoder_bias = t5_position_bias(core.relative_bias, input_ids.shape[1], bidirectional=True)
    decoder_bias = t5_position_bias(core.decoder_embeddings[1], decoder_input_ids.shape[1], bidirectional=False)
    # T5 adds no position vector to the tokens: position is only in the score bias. Both stacks share one table.
    x = hooks(ENCODER.embed, core.embeddings[input_ids])
    y = hooks(DECODER.embed, core.decoder_embeddings[0][decoder_input_ids])
    return run_encoder_decoder(
        core,
        lambda x, layer, points: t5_encoder_layer(x, layer, source_mask, encoder_bias, hooks=points),
        lambda y, layer, memory, points: t5_decoder_layer(y, layer, memory, source_mask, decoder_bias, hooks=points),
        x,
        y,
        progress=progress,
        hooks=hooks,
        final_norms=((rms_norm, core.encoder_final_norm), (rms_norm, core.decoder_final_norm)),
    )


def _t5_attention(config, module) -> MultiHeadAttention:
    attention = MultiHeadAttention(config.d_model, config.num_heads, bias=False, score="dot", d_k=config.d_kv)
    attention.set_weights(*(as_float32(p.weight) for p in (module.q, module.k, module.v, module.o)))
    return attention.requires_grad_(False).eval().to(module.q.weight.device)


def _t5_layers(stack, config, activation, decoder: bool) -> list[T5LayerWeights]:
    layers = []
    for block in stack.block:
        self_part, ffn_part = block.layer[0], block.layer[-1]
        cross_part = block.layer[1] if decoder else None
        ffn = ffn_part.DenseReluDense
        gated = hasattr(ffn, "wi_0")
        layers.append(
            T5LayerWeights(
                attention_norm=norm_from(self_part.layer_norm),
                attention=_t5_attention(config, self_part.SelfAttention),
                cross_norm=None if cross_part is None else norm_from(cross_part.layer_norm),
                cross=None if cross_part is None else _t5_attention(config, cross_part.EncDecAttention),
                ffn_norm=norm_from(ffn_part.layer_norm),
                ffn_in=dense_from(ffn.wi_1 if gated else ffn.wi),
                ffn_gate=dense_from(ffn.wi_0) if gated else None,
                ffn_out=dense_from(ffn.wo),
                activation=activation,
            )
        )
    return layers


def _relative_bias(stack, config) -> RelativePositionBias:
    table = stack.block[0].layer[0].SelfAttention.relative_attention_bias.weight  # only the first layer has one
    return RelativePositionBias(
        as_float32(table), config.relative_attention_num_buckets, config.relative_attention_max_distance
    )


def read_t5(base, config, family: Family) -> Seq2SeqCore:
    activation = ACTIVATIONS[family.activation_of(config)]
    encoder, decoder = base.encoder, base.decoder
    return Seq2SeqCore(
        "t5",
        as_float32(encoder.embed_tokens.weight),
        _t5_layers(encoder, config, activation, decoder=False),
        None,
        relative_bias=_relative_bias(encoder, config),
        decoder_embeddings=(as_float32(decoder.embed_tokens.weight), _relative_bias(decoder, config)),
        decoder_layers=_t5_layers(decoder, config, activation, decoder=True),
        encoder_final_norm=norm_from(encoder.final_layer_norm),
        decoder_final_norm=norm_from(decoder.final_layer_norm),
    )


def t5_head_vectors(core: Seq2SeqCore, layer: T5LayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    """The encoder's heads: their vectors read the RMS-normed input, and their scores get the position bias."""
    bias = t5_position_bias(core.relative_bias, x.shape[1], bidirectional=True)
    return mha_head_vectors(layer.attention, rms_norm(x, layer.attention_norm), bias, False, values_only)


def _t5_attention_modules(module, heads: int) -> AttentionModules:
    # T5Attention returns (output, position bias, weights).
    return AttentionModules((module.q, module.k, module.v), module.o, module, heads, weights_index=2)


def t5_modules(base) -> ModelModules:
    """Where a transformers T5 computes: each block is a list of sublayers (self-attention, [cross-attention,]
    feed-forward), each with its norm."""
    heads = base.config.num_heads
    stacks = {}
    for name, stack in (("encoder", base.encoder), ("decoder", base.decoder)):
        layers = []
        for block in stack.block:
            parts = list(block.layer)
            cross = _t5_attention_modules(parts[1].EncDecAttention, heads) if len(parts) == 3 else None
            attention = _t5_attention_modules(parts[0].SelfAttention, heads)
            norms = tuple(part.layer_norm for part in parts)
            layers.append(LayerModules(block, attention, norms, parts[-1].DenseReluDense, cross))
        stacks[name] = StackModules(layers, stack.embed_tokens, None, stack.final_layer_norm, module=stack)
    return ModelModules(stacks)


FAMILY = Family(
    name="t5",
    model_types=("t5",),
    summary="pre-RMSNorm encoder-decoder with a relative position bias and unscaled scores: T5, Flan-T5",
    causal=False,
    positions="a learned per-head score bias by bucketed relative offset, shared by the layers of each stack",
    read=read_t5,
    forward=t5_attentions,
    layer=t5_decoder_layer,
    heads=t5_head_vectors,
    helpers=(t5_encoder_layer, t5_feed_forward, t5_position_bias, relative_position_buckets, rms_norm),
    activation_of=lambda config: config.dense_act_fn,
    modules=t5_modules,
    encoder_decoder=True,
)
