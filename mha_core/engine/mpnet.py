"""The MPNet family: a BERT encoder whose scores also get a learned bias by relative position."""

from __future__ import annotations

import torch

from ..hooks import NO_HOOKS
from .bert import BertEmbeddingWeights, BertLayerWeights, bert_embeddings
from .blocks import (
    ACTIVATIONS,
    CoreModel,
    HeadVectors,
    RelativePositionBias,
    as_float32,
    attention_from,
    dense_from,
    layer_norm,
    mha_head_vectors,
    norm_from,
    relative_position_buckets,
    run_layers,
)
from .family import AttentionModules, Family, LayerModules, ModelModules, StackModules


def mpnet_layer(
    x: torch.Tensor, layer: BertLayerWeights, key_padding_mask: torch.Tensor | None, position_bias, hooks=NO_HOOKS
):
    """One MPNet encoder layer: a BERT layer whose scores also get a learned bias by relative position.

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens;
    position_bias: [1, heads, n, n], added to q.k / sqrt(d_k) before the softmax (an additive mask);
    hooks: the layer's named points.
    Returns the layer's output and its attention weights [batch, heads, n, n].
    """
    x = hooks("hook_resid_pre", x)
    attended, weights = layer.attention(
        x, mask=position_bias, key_padding_mask=key_padding_mask, hooks=hooks.scope("attn.")
    )
    # Residual, then post-LN, as in BERT.
    x = layer_norm(x + hooks("hook_attn_out", attended), layer.attention_norm, hooks.scope("ln1."))
    hidden = layer.activation(layer.ffn_up(x))
    x = hooks("hook_resid_post", x + hooks("hook_mlp_out", layer.ffn_down(hidden)))
    return hooks("hook_normalized_resid_post", layer_norm(x, layer.output_norm, hooks.scope("ln2."))), weights


def mpnet_position_bias(core: CoreModel, n: int) -> torch.Tensor:
    bias = core.relative_bias
    buckets = relative_position_buckets(n, bias.num_buckets, bias.max_distance)
    return bias.table[buckets.to(bias.table.device)].permute(2, 0, 1)[None]


def mpnet_attentions(
    core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, hooks=NO_HOOKS, outputs=None
):
    x = bert_embeddings(core.embeddings, input_ids, None, hooks)  # MPNet has no segment embeddings
    position_bias = mpnet_position_bias(core, input_ids.shape[1])  # [1, heads, n, n]
    return run_layers(
        core.layers,
        mpnet_layer,
        x,
        (key_padding_mask, position_bias),
        progress=progress,
        hooks=hooks,
        outputs=outputs,
    )


def read_mpnet(base, config, family: Family) -> CoreModel:
    e = base.embeddings
    embeddings = BertEmbeddingWeights(
        word=as_float32(e.word_embeddings.weight),
        position=as_float32(e.position_embeddings.weight),
        token_type=None,
        norm=norm_from(e.LayerNorm),
        projection=None,
        padding_idx=e.padding_idx,  # positions count real tokens from padding_idx + 1, as in RoBERTa
    )
    activation = ACTIVATIONS[family.activation_of(config)]
    layers = []
    for block in base.encoder.layer:
        a = block.attention.attn
        projections = (a.q, a.k, a.v, a.o)
        attention = attention_from(
            config.hidden_size,
            config.num_attention_heads,
            *(p.weight for p in projections),
            *(p.bias for p in projections),
        )
        layers.append(
            BertLayerWeights(
                attention=attention,
                attention_norm=norm_from(block.attention.LayerNorm),
                ffn_up=dense_from(block.intermediate.dense),
                activation=activation,
                ffn_down=dense_from(block.output.dense),
                output_norm=norm_from(block.output.LayerNorm),
            )
        )
    # transformers' MPNetEncoder.compute_position_bias buckets with its defaults (32 buckets, distance 128).
    bias = RelativePositionBias(as_float32(base.encoder.relative_attention_bias.weight), 32, 128)
    max_positions = config.max_position_embeddings - (e.padding_idx + 1)
    return CoreModel("mpnet", embeddings, layers, max_positions, relative_bias=bias)


def mpnet_head_vectors(core: CoreModel, layer: BertLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    return mha_head_vectors(layer.attention, x, mpnet_position_bias(core, x.shape[1]), False, values_only)


def mpnet_modules(base) -> ModelModules:
    """Where a transformers MPNet computes: its attention returns weights only with ``output_attentions``, so they
    are read from the dropout the weights pass through (the identity in evaluation)."""
    heads = base.config.num_attention_heads
    layers = []
    for block in base.encoder.layer:
        a = block.attention.attn
        attention = AttentionModules((a.q, a.k, a.v), a.o, a, heads, weights=a.dropout, weights_index=None)
        norms = (block.attention.LayerNorm, block.output.LayerNorm)
        layers.append(LayerModules(block, attention, norms, block.output.dense))
    embeddings = base.embeddings
    stack = StackModules(layers, embeddings.word_embeddings, embeddings.position_embeddings)
    return ModelModules({"blocks": stack})


FAMILY = Family(
    name="mpnet",
    model_types=("mpnet",),
    summary="post-LayerNorm encoder with learned absolute positions and a relative position bias: MPNet",
    causal=False,
    positions="learned absolute position vectors, plus a learned per-head score bias by bucketed offset",
    read=read_mpnet,
    forward=mpnet_attentions,
    layer=mpnet_layer,
    heads=mpnet_head_vectors,
    helpers=(bert_embeddings, relative_position_buckets, layer_norm),
    activation_of=lambda config: config.hidden_act,
    positions_after_padding=("mpnet",),
    modules=mpnet_modules,
    post_norm=True,
)
