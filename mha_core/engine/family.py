"""What Headscope knows of one model family, as one record (``Family``); each family module fills one in.

A family groups the transformers ``config.model_type`` values whose layers compute the same way. Its
record says which model types it covers, whether it is causal, how it encodes positions, how the
from-scratch engine reads its weights (``read``) and replays it (``forward``, ``layer`` and the
``helpers`` the app shows as source), which configurations the engine cannot replay (``check``), and where
each part of a transformers model of the family is (``modules``: projections, attention, MLP, blocks, norms,
embeddings), which is where the transformers engine takes the named hook points (docs/hooks.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .blocks import CoreModel, HeadVectors


@dataclass(frozen=True)
class AttentionModules:
    """Where one attention of a transformers layer computes.

    ``projections``: the query, key and value projections, whose outputs are ``[batch, n, heads * d_head]`` before
    any rotary rotation (GPT-2: one module whose output is ``[q | k | v]``); ``output``: W^O, whose input is
    Concat(heads) (``attn.hook_z``) and whose output is the attention's output (``hook_attn_out``); ``attention``:
    the module whose forward runs the softmax (``attn.hook_attn_scores``, ``attn.hook_pattern``); ``heads``: the
    number of query heads; ``weights``: the module whose output holds the attention weights without
    ``output_attentions`` (None: ``attention``), at ``weights_index`` (None: the output is the weights)."""

    projections: tuple
    output: object
    attention: object
    heads: int
    weights: object = None
    weights_index: int | None = 1

    @property
    def weights_module(self):
        return self.attention if self.weights is None else self.weights


@dataclass(frozen=True)
class LayerModules:
    """One layer (block) of a transformers model: the block, its attention (and cross-attention, in a decoder of
    an encoder-decoder), its norms in the order they run (``ln1``, ``ln2``, ...), and the module whose output is the
    MLP's contribution to the residual stream (``hook_mlp_out``)."""

    block: object
    attention: AttentionModules
    norms: tuple
    mlp: object
    cross: AttentionModules | None = None


@dataclass(frozen=True)
class StackModules:
    """A stack of layers with its embeddings (``hook_embed``; ``hook_pos_embed`` for absolute positions) and its
    final norm (``ln_final``), if any. ``module``: the stack itself (an encoder-decoder's encoder or decoder:
    the embedding table both share tells its calls apart by which stack is running). ``token_scale``: a factor
    the model applies to the token embedding's output after the module (Marian's sqrt(d_model)): ``hook_embed``
    is the token vectors as they are added to the positions."""

    layers: list
    token_embedding: object
    position_embedding: object = None
    final_norm: object = None
    module: object = None
    token_scale: float = 1.0


@dataclass(frozen=True)
class ModelModules:
    """A transformers model's stacks by their hook prefix: ``{"blocks": ...}``, or ``{"encoder": ..., "decoder":
    ...}`` for an encoder-decoder."""

    stacks: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    summary: str  # one line for people: the architecture in words
    causal: bool  # a decoder: token i sees tokens 0..i only
    positions: str  # how position enters, in words
    read: Callable[..., CoreModel]  # (base transformers module, config) -> weights for the engine
    forward: Callable[..., object]  # (CoreModel, ids, padding mask, segments, progress, *, hooks, outputs)
    layer: Callable[..., object]  # the layer function: what the app shows as "the code that ran"
    helpers: tuple[Callable[..., object], ...]  # the functions that layer relies on, shown beside it
    activation_of: Callable[[object], str]  # config -> its activation's name
    heads: Callable[..., HeadVectors]  # (CoreModel, layer weights, layer input) -> every head's q, k, v
    # (base module) -> where each part of a transformers model is: the named hook points of the transformers
    # engine, head ablation, the capture of attentions (docs/hooks.md).
    modules: Callable[[object], ModelModules]
    check: Callable[[object], str | None] = lambda config: None  # config -> why the engine cannot replay it
    # Position tables that reserve the rows up to padding_idx (RoBERTa): usable positions are fewer.
    positions_after_padding: tuple[str, ...] = ()
    # Post-LayerNorm layers (BERT, MPNet, BART): the norm comes after each residual sum, so ``hook_resid_post`` is
    # the sum before the layer's last norm and ``hook_normalized_resid_post`` the layer's output (TransformerLens).
    post_norm: bool = False
    # The language-model head the family's checkpoints may ship: "causal" (next token), "masked" (MLM) or None.
    lm_head: str | None = None
    # The weight names a checkpoint has when it ships that head (tied heads need none: see has_lm_head).
    head_weight_prefixes: tuple[str, ...] = ()
    # Model types of the family whose head transformers builds differently (no single head module).
    types_without_head: tuple[str, ...] = ()
    # (model with a head) -> the module mapping final hidden states to logits.
    head_of: Callable[[object], object] = lambda lm_model: None
    # An encoder-decoder family (T5, BART): ``forward`` is then (CoreModel, source ids, target ids, source padding
    # mask, progress, *, hooks) -> ``encoder_decoder.Seq2SeqAttentions``, and ``read`` gives a ``Seq2SeqCore``.
    encoder_decoder: bool = False
