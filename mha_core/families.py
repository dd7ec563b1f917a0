"""The one registry of model families: everything Headscope knows per family, in one table.

A family groups the transformers ``config.model_type`` values whose layers compute the same way.
Each entry says which model types it covers, whether it is causal, how it encodes positions, how
the from-scratch engine reads its weights (``read``) and replays it (``forward``, ``layer`` and the
``helpers`` the app shows as source), and which configurations the engine cannot replay (``check``).
Models, the engine and the app all read this table; adding a family is adding one entry.

A model type that no family covers still loads and runs with the transformers engine; its family
name is then its model type, and the from-scratch engine says it cannot replay it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import engine


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    summary: str  # one line for people: the architecture in words
    causal: bool  # a decoder: token i sees tokens 0..i only
    positions: str  # how position enters, in words
    read: Callable[..., engine.CoreModel]  # (base transformers module, config) -> weights for the engine
    forward: Callable[..., object]  # (CoreModel, ids, padding mask, segments, progress, *, record, edits, outputs)
    layer: Callable[..., object]  # the layer function: what the app shows as "the code that ran"
    helpers: tuple[Callable[..., object], ...]  # the functions that layer relies on, shown beside it
    activation_of: Callable[[object], str]  # config -> its activation's name
    heads: Callable[..., engine.HeadVectors]  # (CoreModel, layer weights, layer input) -> every head's q, k, v
    check: Callable[[object], str | None] = lambda config: None  # config -> why the engine cannot replay it
    # Position tables that reserve the rows up to padding_idx (RoBERTa): usable positions are fewer.
    positions_after_padding: tuple[str, ...] = ()
    # Causal evidence (mha_core.causal). The output projection of each layer's attention, whose input is
    # Concat(head_1, ..., head_H): ablating a head edits its slice of that input. (base module -> modules)
    output_projections: Callable[[object], list] = lambda base: []
    # The language-model head the family's checkpoints may ship: "causal" (next token), "masked" (MLM) or None.
    lm_head: str | None = None
    # The weight names a checkpoint has when it ships that head (tied heads need none: see has_lm_head).
    head_weight_prefixes: tuple[str, ...] = ()
    # Model types of the family whose head transformers builds differently (no single head module).
    types_without_head: tuple[str, ...] = ()
    # (model with a head) -> the module mapping final hidden states to logits.
    head_of: Callable[[object], object] = lambda lm_model: None
    # (base module) -> the norm applied after the last layer (pre-norm decoders), or None.
    final_norm_of: Callable[[object], object] = lambda base: None


def _bert_check(config) -> str | None:
    if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
        return "it is configured as a decoder (is_decoder / add_cross_attention)"
    return None


def _llama_check(config) -> str | None:
    rope_type = engine.rope_parameters(config)["rope_type"]
    if rope_type not in engine.STATIC_ROPE_TYPES:
        return f"its rotary scaling {rope_type!r} depends on the input length"
    return None


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            name="bert",
            model_types=("bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra"),
            summary="post-LayerNorm encoder: BERT, MiniLM, RoBERTa, XLM-RoBERTa, DistilBERT, ELECTRA",
            causal=False,
            positions="learned absolute position vectors added to the token vectors",
            read=engine.read_bert,
            forward=engine.bert_attentions,
            layer=engine.bert_layer,
            heads=engine.bert_head_vectors,
            helpers=(engine.bert_embeddings, engine.layer_norm),
            activation_of=lambda config: config.activation if config.model_type == "distilbert" else config.hidden_act,
            check=_bert_check,
            positions_after_padding=("roberta", "xlm-roberta", "camembert"),
            output_projections=lambda base: [
                block.attention.out_lin if hasattr(base, "transformer") else block.attention.output.dense
                for block in (base.transformer.layer if hasattr(base, "transformer") else base.encoder.layer)
            ],
            lm_head="masked",
            head_weight_prefixes=("cls.predictions.", "lm_head."),
            types_without_head=("distilbert", "electra"),
            head_of=lambda lm_model: getattr(lm_model, "cls", getattr(lm_model, "lm_head", None)),
        ),
        Family(
            name="mpnet",
            model_types=("mpnet",),
            summary="post-LayerNorm encoder with learned absolute positions and a relative position bias: MPNet",
            causal=False,
            positions="learned absolute position vectors, plus a learned per-head score bias by bucketed offset",
            read=engine.read_mpnet,
            forward=engine.mpnet_attentions,
            layer=engine.mpnet_layer,
            heads=engine.mpnet_head_vectors,
            helpers=(engine.bert_embeddings, engine.relative_position_buckets, engine.layer_norm),
            activation_of=lambda config: config.hidden_act,
            positions_after_padding=("mpnet",),
        ),
        Family(
            name="gpt2",
            model_types=("gpt2",),
            summary="pre-LayerNorm decoder with learned positions: GPT-2, DistilGPT2",
            causal=True,
            positions="learned absolute position vectors added to the token vectors",
            read=engine.read_gpt2,
            forward=engine.gpt2_attentions,
            layer=engine.gpt2_layer,
            heads=engine.gpt2_head_vectors,
            helpers=(engine.gpt2_embeddings, engine.layer_norm),
            activation_of=lambda config: config.activation_function,
            output_projections=lambda base: [block.attn.c_proj for block in base.h],
            lm_head="causal",
            head_weight_prefixes=("lm_head.",),
            head_of=lambda lm_model: lm_model.lm_head,
            final_norm_of=lambda base: base.ln_f,
        ),
        Family(
            name="llama",
            model_types=("llama", "mistral"),
            summary="pre-RMSNorm decoder with rotary positions, grouped KV heads and SwiGLU: Llama, SmolLM2, Mistral",
            causal=True,
            positions="rotary: queries and keys turned by angles that grow with position",
            read=engine.read_llama,
            forward=engine.llama_attentions,
            layer=engine.llama_layer,
            heads=engine.llama_head_vectors,
            helpers=(engine.rotary_angles, engine.rotate, engine.rms_norm),
            activation_of=lambda config: config.hidden_act,
            check=_llama_check,
            output_projections=lambda base: [block.self_attn.o_proj for block in base.layers],
            lm_head="causal",
            head_weight_prefixes=("lm_head.",),
            head_of=lambda lm_model: lm_model.lm_head,
            final_norm_of=lambda base: base.norm,
        ),
    )
}

FAMILY_OF_MODEL_TYPE: dict[str, Family] = {
    model_type: family for family in FAMILIES.values() for model_type in family.model_types
}


def family_name(model_type: str) -> str:
    """The family a model type belongs to; an uncovered type is its own family."""
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    return family.name if family is not None else model_type


def supported_types() -> str:
    """``"bert: bert, roberta, ...; gpt2: gpt2; ..."`` for messages."""
    return "; ".join(f"{family.name}: {', '.join(family.model_types)}" for family in FAMILIES.values())


def head_class_name(model_type: str) -> str | None:
    """The transformers auto class that loads a model type with its LM head, or None (no head known)."""
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None or family.lm_head is None or model_type in family.types_without_head:
        return None
    return {"causal": "AutoModelForCausalLM", "masked": "AutoModelForMaskedLM"}[family.lm_head]
