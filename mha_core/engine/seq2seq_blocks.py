"""The building blocks the from-scratch engine shares between encoder-decoder families (T5, BART, Marian): the weights of both
stacks (``Seq2SeqCore``), the three attentions of a pass (``Seq2SeqAttentions``), and the layer loop
(``run_encoder_decoder``): the encoder over the source, then the decoder over the target, each decoder layer
attending to itself (causally) and to the encoder's output (cross-attention)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..hooks import DECODER, ENCODER, NO_HOOKS, Points
from ..progress import Progress, report
from .blocks import CoreModel, finish


@dataclass
class Seq2SeqCore(CoreModel):
    """``layers``/``embeddings`` are the encoder's; the decoder has its own."""

    decoder_embeddings: object = None
    decoder_layers: list = field(default_factory=list)
    encoder_final_norm: object = None  # T5: the RMS norm after the encoder's last layer, which cross-attention reads
    decoder_final_norm: object = None  # T5: the RMS norm after the decoder's last layer, which the LM head reads


@dataclass
class Seq2SeqAttentions:
    """float32 ``encoder [B, L_enc, H, n_src, n_src]``, ``decoder [B, L_dec, H, n_tgt, n_tgt]``,
    ``cross [B, L_dec, H, n_tgt, n_src]``."""

    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor


def run_encoder_decoder(
    core: Seq2SeqCore,
    encoder_step,
    decoder_step,
    x,
    y,
    *,
    progress: Progress | None,
    hooks: Points = NO_HOOKS,
    final_norms: tuple = (None, None),
) -> Seq2SeqAttentions:
    """The layer loop of an encoder-decoder pass. ``encoder_step(x, layer, hooks) -> (x, weights)`` over the
    encoder's layers; ``memory`` = the encoder's output (through ``final_norms[0]``, ``(norm function, Norm)``,
    where given: T5's final norm, which cross-attention reads); then ``decoder_step(y, layer, memory, hooks) -> (y,
    self weights, cross weights)``, and the decoder's final norm (``final_norms[1]``) when its points are hooked.
    ``hooks``: the pass's named points (``encoder.{l}.``, ``decoder.{l}.``, ``encoder_final_ln.``,
    ``decoder_final_ln.``). ``progress`` after every layer of either stack."""
    total = len(core.layers) + len(core.decoder_layers)
    encoder_weights, decoder_weights, cross_weights = [], [], []
    for index, layer in enumerate(core.layers):
        x, weights = encoder_step(x, layer, hooks.scope(f"{ENCODER.blocks}.{index}."))
        encoder_weights.append(weights)
        report(progress, index + 1, total, f"from-scratch encoder layer {index + 1} of {len(core.layers)}")
    memory = finish(x, final_norms[0], hooks.scope(f"{ENCODER.final_norm}."), always=True)
    for index, layer in enumerate(core.decoder_layers):
        y, self_weights, cross = decoder_step(y, layer, memory, hooks.scope(f"{DECODER.blocks}.{index}."))
        decoder_weights.append(self_weights)
        cross_weights.append(cross)
        done = len(core.layers) + index + 1
        report(progress, done, total, f"from-scratch decoder layer {index + 1} of {len(core.decoder_layers)}")
    finish(y, final_norms[1], hooks.scope(f"{DECODER.final_norm}."), always=False)
    return Seq2SeqAttentions(
        torch.stack(encoder_weights, dim=1).float(),
        torch.stack(decoder_weights, dim=1).float(),
        torch.stack(cross_weights, dim=1).float(),
    )
