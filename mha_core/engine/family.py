"""What Headscope knows of one model family, as one record (``Family``); each family module fills one in.

A family groups the transformers ``config.model_type`` values whose layers compute the same way. Its
record says which model types it covers, whether it is causal, how it encodes positions, how the
from-scratch engine reads its weights (``read``) and replays it (``forward``, ``layer`` and the
``helpers`` the app shows as source), and which configurations the engine cannot replay (``check``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .blocks import CoreModel, HeadVectors


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    summary: str  # one line for people: the architecture in words
    causal: bool  # a decoder: token i sees tokens 0..i only
    positions: str  # how position enters, in words
    read: Callable[..., CoreModel]  # (base transformers module, config) -> weights for the engine
    forward: Callable[..., object]  # (CoreModel, ids, padding mask, segments, progress, *, record, edits, outputs)
    layer: Callable[..., object]  # the layer function: what the app shows as "the code that ran"
    helpers: tuple[Callable[..., object], ...]  # the functions that layer relies on, shown beside it
    activation_of: Callable[[object], str]  # config -> its activation's name
    heads: Callable[..., HeadVectors]  # (CoreModel, layer weights, layer input) -> every head's q, k, v
    check: Callable[[object], str | None] = lambda config: None  # config -> why the engine cannot replay it
    # Position tables that reserve the rows up to padding_idx (RoBERTa): usable positions are fewer.
    positions_after_padding: tuple[str, ...] = ()
    # Causal evidence (mha_core.interventions). The output projection of each layer's attention, whose input is
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
    # Residual-stream readings (mha_core.interventions: logit attribution, patching, the logit lens): each
    # layer's block, whose output is the residual stream after it, and the MLP, whose output it adds to it.
    blocks_of: Callable[[object], list] = lambda base: []  # (base module) -> the layers' blocks
    mlps_of: Callable[[object], list] = lambda base: []  # (base module) -> each layer's MLP
    # An encoder-decoder family (T5, BART): ``forward`` is then (CoreModel, source ids, target ids, source padding
    # mask, progress) -> ``encoder_decoder.Seq2SeqAttentions``, and ``read`` gives a ``Seq2SeqCore``.
    encoder_decoder: bool = False
