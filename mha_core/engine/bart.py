"""The BART family: post-LayerNorm encoder-decoders with absolute position vectors (BART: learned, read from row
position + 2 of the table; Marian / opus-mt: sinusoidal, from row position, with no LayerNorm on the
embeddings)."""

from __future__ import annotations

import math
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
    as_float32,
    attention_from,
    dense_from,
    layer_norm,
    mha_head_vectors,
    norm_from,
)
from .family import AttentionModules, Family, LayerModules, ModelModules, StackModules
from .seq2seq_blocks import Seq2SeqCore, run_encoder_decoder

# BART's learned position table keeps its first two rows unused (a fairseq convention): position p is row p + 2.
BART_POSITION_OFFSET = 2


@dataclass
class BartEmbeddingWeights:
    word: torch.Tensor  # [vocab, d]
    scale: float  # sqrt(d) where the config scales embeddings (Marian), else 1
    position: torch.Tensor  # [rows, d]: learned (BART) or sinusoidal (Marian)
    position_offset: int  # BART_POSITION_OFFSET, or 0 (Marian)
    norm: Norm | None  # BART's layernorm_embedding; Marian has none


@dataclass
class BartLayerWeights:
    attention: MultiHeadAttention
    attention_norm: Norm
    cross: MultiHeadAttention | None  # decoder layers only
    cross_norm: Norm | None
    ffn_up: Dense
    activation: Callable[[torch.Tensor], torch.Tensor]
    ffn_down: Dense
    output_norm: Norm


def bart_embeddings(emb: BartEmbeddingWeights, input_ids: torch.Tensor, hooks=NO_HOOKS, names=ENCODER) -> torch.Tensor:
    """Token vectors (times the embedding scale) + the position vector of each position (+ LayerNorm, BART)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device) + emb.position_offset
    x = hooks(names.embed, emb.word[input_ids] * emb.scale)
    x = x + hooks(names.pos_embed, emb.position[positions].expand(*input_ids.shape, -1))
    return x if emb.norm is None else layer_norm(x, emb.norm)


def bart_feed_forward(x: torch.Tensor, layer: BartLayerWeights, hooks=NO_HOOKS, norm: str = "ln2.") -> torch.Tensor:
    """Widen, activation, project back; residual, then LayerNorm (post-LN, its points ``norm``)."""
    x = hooks("hook_resid_post", x + hooks("hook_mlp_out", layer.ffn_down(layer.activation(layer.ffn_up(x)))))
    return hooks("hook_normalized_resid_post", layer_norm(x, layer.output_norm, hooks.scope(norm)))


def bart_encoder_layer(x, layer: BartLayerWeights, key_padding_mask, hooks=NO_HOOKS):
    """One BART encoder layer: self-attention over the source, residual, LayerNorm; then the feed-forward branch.
    Returns the layer's output and its weights [batch, heads, n, n]."""
    x = hooks("hook_resid_pre", x)
    attended, weights = layer.attention(x, key_padding_mask=key_padding_mask, hooks=hooks.scope("attn."))
    x = layer_norm(x + hooks("hook_attn_out", attended), layer.attention_norm, hooks.scope("ln1."))
    return bart_feed_forward(x, layer, hooks), weights


def bart_decoder_layer(y, layer: BartLayerWeights, memory, memory_mask, hooks=NO_HOOKS):
    """One BART decoder layer: causal self-attention over the target; then cross-attention from the target to
    the encoder's output ``memory``; then the feed-forward branch; residual and LayerNorm after each (post-LN).
    Returns the output, the self-attention weights [batch, heads, n_tgt, n_tgt] and the cross-attention
    weights [batch, heads, n_tgt, n_src]."""
    y = hooks("hook_resid_pre", y)
    attended, self_weights = layer.attention(y, causal=True, hooks=hooks.scope("attn."))
    y = layer_norm(y + hooks("hook_attn_out", attended), layer.attention_norm, hooks.scope("ln1."))
    attended, cross_weights = layer.cross(
        y, memory, memory, key_padding_mask=memory_mask, hooks=hooks.scope("cross_attn.")
    )
    y = layer_norm(y + hooks("hook_cross_attn_out", attended), layer.cross_norm, hooks.scope("ln2."))
    return bart_feed_forward(y, layer, hooks, "ln3."), self_weights, cross_weights


def bart_attentions(core: Seq2SeqCore, input_ids, decoder_input_ids, source_mask, progress=None, hooks=NO_HOOKS):
    return run_encoder_decoder(
        core,
        lambda x, layer, points: bart_encoder_layer(x, layer, source_mask, points),
        lambda y, layer, memory, points: bart_decoder_layer(y, layer, memory, source_mask, points),
        bart_embeddings(core.embeddings, input_ids, hooks, ENCODER),
        bart_embeddings(core.decoder_embeddings, decoder_input_ids, hooks, DECODER),
        progress=progress,
        hooks=hooks,
    )


def _attention(module, d_model: int, num_heads: int) -> MultiHeadAttention:
    projections = (module.q_proj, module.k_proj, module.v_proj, module.out_proj)
    return attention_from(d_model, num_heads, *(p.weight for p in projections), *(p.bias for p in projections))


def _embeddings(stack, config) -> BartEmbeddingWeights:
    marian = config.model_type == "marian"
    norm = getattr(stack, "layernorm_embedding", None)
    return BartEmbeddingWeights(
        word=as_float32(stack.embed_tokens.weight),
        scale=math.sqrt(config.d_model) if config.scale_embedding else 1.0,
        position=as_float32(stack.embed_positions.weight),
        position_offset=0 if marian else BART_POSITION_OFFSET,
        norm=None if norm is None else norm_from(norm),
    )


def _layers(stack, config, activation, heads: int, decoder: bool) -> list[BartLayerWeights]:
    return [
        BartLayerWeights(
            attention=_attention(block.self_attn, config.d_model, heads),
            attention_norm=norm_from(block.self_attn_layer_norm),
            cross=_attention(block.encoder_attn, config.d_model, heads) if decoder else None,
            cross_norm=norm_from(block.encoder_attn_layer_norm) if decoder else None,
            ffn_up=dense_from(block.fc1),
            activation=activation,
            ffn_down=dense_from(block.fc2),
            output_norm=norm_from(block.final_layer_norm),
        )
        for block in stack.layers
    ]


def read_bart(base, config, family: Family) -> Seq2SeqCore:
    activation = ACTIVATIONS[family.activation_of(config)]
    embeddings = _embeddings(base.encoder, config)
    return Seq2SeqCore(
        "bart",
        embeddings,
        _layers(base.encoder, config, activation, config.encoder_attention_heads, decoder=False),
        embeddings.position.shape[0] - embeddings.position_offset,
        decoder_embeddings=_embeddings(base.decoder, config),
        decoder_layers=_layers(base.decoder, config, activation, config.decoder_attention_heads, decoder=True),
    )


def bart_head_vectors(core: Seq2SeqCore, layer: BartLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    """The encoder's heads (post-LN: their vectors read the layer's input as it is)."""
    return mha_head_vectors(layer.attention, x, None, False, values_only)


def _bart_attention_modules(module, heads: int) -> AttentionModules:
    return AttentionModules((module.q_proj, module.k_proj, module.v_proj), module.out_proj, module, heads)


def bart_modules(base) -> ModelModules:
    """Where a transformers BART or Marian computes (post-LN: each sublayer's norm after its residual sum)."""
    config, stacks = base.config, {}
    for name, stack, heads in (
        ("encoder", base.encoder, config.encoder_attention_heads),
        ("decoder", base.decoder, config.decoder_attention_heads),
    ):
        layers = []
        for block in stack.layers:
            cross = getattr(block, "encoder_attn", None)
            norms = (
                block.self_attn_layer_norm,
                getattr(block, "encoder_attn_layer_norm", None),
                block.final_layer_norm,
            )
            layers.append(
                LayerModules(
                    block,
                    _bart_attention_modules(block.self_attn, heads),
                    tuple(norm for norm in norms if norm is not None),
                    block.fc2,
                    None if cross is None else _bart_attention_modules(cross, heads),
                )
            )
        # Marian scales the token vectors after its embedding table (BART's table scales them itself).
        scale = getattr(stack, "embed_scale", 1.0)
        stacks[name] = StackModules(layers, stack.embed_tokens, stack.embed_positions, module=stack, token_scale=scale)
    return ModelModules(stacks)


def _bart_check(config) -> str | None:
    # mBART-style pre-LN stacks (normalize_before) compute differently.
    if getattr(config, "normalize_before", False) or getattr(config, "add_final_layer_norm", False):
        return "it normalises before each sublayer (pre-LN), which this family does not"
    return None


FAMILY = Family(
    name="bart",
    model_types=("bart", "marian"),
    summary="post-LayerNorm encoder-decoder with absolute positions: BART (learned), Marian / opus-mt (sinusoidal)",
    causal=False,
    positions="absolute position vectors added to the tokens: learned from row 2 (BART), or sinusoidal (Marian)",
    read=read_bart,
    forward=bart_attentions,
    layer=bart_decoder_layer,
    heads=bart_head_vectors,
    helpers=(bart_embeddings, bart_encoder_layer, bart_feed_forward, layer_norm),
    activation_of=lambda config: config.activation_function,
    check=_bart_check,
    modules=bart_modules,
    post_norm=True,
    encoder_decoder=True,
)
