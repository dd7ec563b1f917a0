"""The T5 family: pre-RMSNorm encoder-decoders whose only position signal is a learned bias by bucketed
relative offset, shared by every layer of a stack (computed in its first layer), and whose scores are not
scaled by 1/sqrt(d_k) (T5, T5 v1.1, Flan-T5)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..attention import MultiHeadAttention
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
from .family import Family
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


def t5_feed_forward(x: torch.Tensor, layer: T5LayerWeights) -> torch.Tensor:
    """RMS norm, then widen, activation (gated or not), project back: the residual branch."""
    h = rms_norm(x, layer.ffn_norm)
    if layer.ffn_gate is None:
        hidden = layer.activation(layer.ffn_in(h))
    else:
        hidden = layer.activation(layer.ffn_gate(h)) * layer.ffn_in(h)
    return layer.ffn_out(hidden)


def t5_encoder_layer(x, layer: T5LayerWeights, key_padding_mask, position_bias, edit=None):
    """One T5 encoder layer: RMS norm, self-attention with the shared position bias (no score scaling),
    residual; then the feed-forward branch. Returns the layer's output and its weights [batch, heads, n, n]."""
    h = rms_norm(x, layer.attention_norm)
    attended, weights = layer.attention(h, mask=position_bias, key_padding_mask=key_padding_mask, edit=edit)
    x = x + attended
    return x + t5_feed_forward(x, layer), weights


def t5_decoder_layer(y, layer: T5LayerWeights, memory, memory_mask, position_bias):
    """One T5 decoder layer: causal self-attention with the decoder's (one-directional) position bias; then
    cross-attention from the target to the encoder's output ``memory`` (no position bias: the source's
    positions are already in it); then the feed-forward branch. Pre-norm, residual around each.
    Returns the output, the self-attention weights [batch, heads, n_tgt, n_tgt] and the cross-attention
    weights [batch, heads, n_tgt, n_src]."""
    h = rms_norm(y, layer.attention_norm)
    attended, self_weights = layer.attention(h, mask=position_bias, causal=True)
    y = y + attended
    h = rms_norm(y, layer.cross_norm)
    attended, cross_weights = layer.cross(h, memory, memory, key_padding_mask=memory_mask)
    y = y + attended
    return y + t5_feed_forward(y, layer), self_weights, cross_weights


def t5_position_bias(bias: RelativePositionBias, n: int, bidirectional: bool) -> torch.Tensor:
    """[1, heads, n, n]: each head's learned bias for the bucket of each (query, key) offset."""
    buckets = relative_position_buckets(n, bias.num_buckets, bias.max_distance, bidirectional)
    return bias.table[buckets.to(bias.table.device)].permute(2, 0, 1)[None]


def t5_attentions(core: Seq2SeqCore, input_ids, decoder_input_ids, source_mask, progress=None):
    encoder_bias = t5_position_bias(core.relative_bias, input_ids.shape[1], bidirectional=True)
    decoder_bias = t5_position_bias(core.decoder_embeddings[1], decoder_input_ids.shape[1], bidirectional=False)
    # T5 adds no position vector to the tokens: position is only in the score bias.
    x, y = core.embeddings[input_ids], core.decoder_embeddings[0][decoder_input_ids]
    return run_encoder_decoder(
        core,
        lambda x, layer: t5_encoder_layer(x, layer, source_mask, encoder_bias),
        lambda y, layer, memory: t5_decoder_layer(y, layer, memory, source_mask, decoder_bias),
        x,
        y,
        progress=progress,
        finish_encoder=lambda x: rms_norm(x, core.encoder_final_norm),
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
    )


def t5_head_vectors(core: Seq2SeqCore, layer: T5LayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    """The encoder's heads: their vectors read the RMS-normed input, and their scores get the position bias."""
    bias = t5_position_bias(core.relative_bias, x.shape[1], bidirectional=True)
    return mha_head_vectors(layer.attention, rms_norm(x, layer.attention_norm), bias, False, values_only)


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
    output_projections=lambda base: [block.layer[0].SelfAttention.o for block in base.encoder.block],
    encoder_decoder=True,
)
