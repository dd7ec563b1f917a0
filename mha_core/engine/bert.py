"""The BERT family: post-LayerNorm encoders (BERT, MiniLM, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA)."""

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
    dense_from,
    layer_norm,
    mha_head_vectors,
    norm_from,
    run_layers,
)
from .family import AttentionModules, Family, LayerModules, ModelModules, StackModules


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


def bert_layer(x: torch.Tensor, layer: BertLayerWeights, key_padding_mask: torch.Tensor | None, hooks=NO_HOOKS):
    """One post-LayerNorm encoder layer (BERT, MiniLM, RoBERTa, DistilBERT, ELECTRA).

    x: [batch, n, d]; key_padding_mask: [batch, n], True for real tokens; hooks: the layer's named points.
    Returns the layer's output and its attention weights [batch, heads, n, n].
    """
    x = hooks("hook_resid_pre", x)
    # Multi-head self-attention: every token looks at every real token, in both directions.
    attended, weights = layer.attention(x, key_padding_mask=key_padding_mask, hooks=hooks.scope("attn."))

    # Residual connection, then LayerNorm ("post-LN": the norm comes after the sum).
    x = layer_norm(x + hooks("hook_attn_out", attended), layer.attention_norm, hooks.scope("ln1."))

    # Position-wise feed-forward network: widen (usually 4x), activation, project back.
    hidden = layer.activation(layer.ffn_up(x))
    x = hooks("hook_resid_post", x + hooks("hook_mlp_out", layer.ffn_down(hidden)))
    return hooks("hook_normalized_resid_post", layer_norm(x, layer.output_norm, hooks.scope("ln2."))), weights


def bert_embeddings(
    emb: BertEmbeddingWeights, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, hooks=NO_HOOKS
):
    """Token + learned absolute position (+ segment) embeddings, then LayerNorm."""
    if emb.padding_idx is None:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
    else:
        # RoBERTa numbers real tokens from padding_idx + 1; padding tokens keep padding_idx.
        real = input_ids.ne(emb.padding_idx).long()
        positions = real.cumsum(dim=1) * real + emb.padding_idx
    position = emb.position[positions].expand(*input_ids.shape, -1)
    x = hooks("hook_embed", emb.word[input_ids]) + hooks("hook_pos_embed", position)
    if emb.token_type is not None:
        x = x + emb.token_type[0 if token_type_ids is None else token_type_ids]
    x = layer_norm(x, emb.norm)
    return x if emb.projection is None else emb.projection(x)


def bert_attentions(
    core: CoreModel, input_ids, key_padding_mask, token_type_ids, progress=None, hooks=NO_HOOKS, outputs=None
):
    x = bert_embeddings(core.embeddings, input_ids, token_type_ids, hooks)
    return run_layers(core.layers, bert_layer, x, (key_padding_mask,), progress=progress, hooks=hooks, outputs=outputs)


def read_bert(base, config, family: Family) -> CoreModel:
    e = base.embeddings
    distil = config.model_type == "distilbert"
    offset_positions = config.model_type in family.positions_after_padding
    embeddings = BertEmbeddingWeights(
        word=as_float32(e.word_embeddings.weight),
        position=as_float32(e.position_embeddings.weight),
        token_type=None if distil else as_float32(e.token_type_embeddings.weight),
        norm=norm_from(e.LayerNorm),
        projection=dense_from(base.embeddings_project) if hasattr(base, "embeddings_project") else None,
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
        attention = attention_from(
            config.hidden_size,
            config.num_attention_heads,
            *(p.weight for p in projections),
            *(p.bias for p in projections),
        )
        layers.append(
            BertLayerWeights(
                attention=attention,
                attention_norm=norm_from(norms[0]),
                ffn_up=dense_from(ffn[0]),
                activation=activation,
                ffn_down=dense_from(ffn[1]),
                output_norm=norm_from(norms[1]),
            )
        )
    # RoBERTa's first padding_idx + 1 position rows are never used by a real token.
    max_positions = config.max_position_embeddings - (config.pad_token_id + 1 if offset_positions else 0)
    return CoreModel("bert", embeddings, layers, max_positions)


def bert_head_vectors(core: CoreModel, layer: BertLayerWeights, x: torch.Tensor, values_only=False) -> HeadVectors:
    return mha_head_vectors(layer.attention, x, None, False, values_only)


def bert_modules(base) -> ModelModules:
    """Where a transformers BERT-family model computes (DistilBERT names its modules its own way)."""
    distil = hasattr(base, "transformer")
    heads = base.config.num_attention_heads
    layers = []
    for block in base.transformer.layer if distil else base.encoder.layer:
        if distil:
            a = block.attention
            attention = AttentionModules((a.q_lin, a.k_lin, a.v_lin), a.out_lin, a, heads)
            norms, mlp = (block.sa_layer_norm, block.output_layer_norm), block.ffn.lin2
        else:
            a = block.attention.self
            attention = AttentionModules((a.query, a.key, a.value), block.attention.output.dense, a, heads)
            norms, mlp = (block.attention.output.LayerNorm, block.output.LayerNorm), block.output.dense
        layers.append(LayerModules(block, attention, norms, mlp))
    embeddings = base.embeddings
    stack = StackModules(layers, embeddings.word_embeddings, embeddings.position_embeddings)
    return ModelModules({"blocks": stack})


def _bert_check(config) -> str | None:
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "it is configured as a decoder (is_decoder / add_cross_attention)"
    return None


FAMILY = Family(
    name="bert",
    model_types=("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra"),
    summary="post-LayerNorm encoder: BERT, MiniLM, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA",
    causal=False,
    positions="learned absolute position vectors added to the token vectors",
    read=read_bert,
    forward=bert_attentions,
    layer=bert_layer,
    heads=bert_head_vectors,
    helpers=(bert_embeddings, layer_norm),
    activation_of=lambda config: config.activation if config.model_type == "distilbert" else config.hidden_act,
    check=_bert_check,
    positions_after_padding=("roberta", "xlm-roberta", "camembert"),
    modules=bert_modules,
    post_norm=True,
    lm_head="masked",
    head_weight_prefixes=("cls.predictions.", "lm_head."),
    types_without_head=("distilbert", "electra"),
    head_of=lambda lm_model: getattr(lm_model, "cls", getattr(lm_model, "lm_head", None)),
)
