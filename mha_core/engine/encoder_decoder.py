"""The from-scratch engine's entry point for encoder-decoder models (T5, BART, Marian): the three attentions of one
pass, through the family registry (``seq2seq_blocks`` holds the pieces the families share)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..errors import EngineNotSupported
from ..hooks import Points, as_points
from ..progress import Progress
from .core import core_model
from .registry import FAMILIES
from .seq2seq_blocks import Seq2SeqAttentions


def _ids(values, device, name: str) -> torch.Tensor:
    ids = torch.as_tensor(values, device=device)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[1] == 0 or ids.dtype.is_floating_point:
        raise ValueError(f"{name} must be integer token ids of shape [batch, n] with n >= 1, got {tuple(ids.shape)}")
    return ids


def core_seq2seq_attentions(
    hf_model: torch.nn.Module,
    input_ids,
    decoder_input_ids,
    attention_mask=None,
    progress: Progress | None = None,
    hooks: Points | Mapping | None = None,
) -> Seq2SeqAttentions:
    """The three attentions of an encoder-decoder model, recomputed from scratch.

    ``input_ids`` ``[batch, n_src]`` (the source), ``decoder_input_ids`` ``[batch, n_tgt]`` (the target as the
    decoder reads it, beginning with the decoder start token); ``attention_mask`` ``[batch, n_src]``, 1 for real
    source tokens (padding on the right). ``progress(done, total, message)`` after every layer of both stacks.
    ``hooks``: the pass's named points (``encoder.{l}.``, ``decoder.{l}.``, ...: docs/hooks.md).
    """
    core = core_model(hf_model)
    family = FAMILIES[core.family]
    if not family.encoder_decoder:
        raise EngineNotSupported(f"{core.family!r} models have one stack, not an encoder and a decoder.")
    device = hf_model.get_input_embeddings().weight.device
    source = _ids(input_ids, device, "input_ids")
    target = _ids(decoder_input_ids, device, "decoder_input_ids")
    if source.shape[0] != target.shape[0]:
        raise ValueError(f"input_ids and decoder_input_ids differ in batch size: {source.shape[0]}, {target.shape[0]}")
    for ids, what in ((source, "source"), (target, "target")):
        if core.max_positions is not None and ids.shape[1] > core.max_positions:
            raise ValueError(f"{ids.shape[1]} {what} tokens exceed this model's {core.max_positions} learned positions")
    mask = None if attention_mask is None else torch.as_tensor(attention_mask, device=device).reshape(source.shape)
    with torch.inference_mode():
        padding = None if mask is None else mask.bool()
        return family.forward(core, source, target, padding, progress, hooks=as_points(hooks))
