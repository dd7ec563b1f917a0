"""The from-scratch engine's entry points: which family recomputes a model, its weights gathered once, a whole
pass, and one layer's head vectors."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping

import torch

from ..errors import EngineNotSupported
from ..hooks import Points, as_points
from ..progress import Progress
from .blocks import ACTIVATIONS, CoreModel, HeadVectors
from .registry import FAMILIES, FAMILY_OF_MODEL_TYPE, supported_types


def core_family(hf_model: torch.nn.Module) -> str:
    """The family (``mha_core.engine.registry``) whose code recomputes ``hf_model``.

    Raises ``EngineNotSupported`` with the reason when the architecture, or a configuration
    option it uses, has no from-scratch implementation here.
    """
    config = getattr(hf_model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise EngineNotSupported(f"the from-scratch engine needs a transformers model; got {type(hf_model).__name__}")
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    reason = "its architecture is not implemented" if family is None else family.check(config)
    if reason is None and family.activation_of(config) not in ACTIVATIONS:
        reason = f"its activation {family.activation_of(config)!r} is not implemented"
    if reason is not None:
        raise EngineNotSupported(
            f"the from-scratch (core) engine cannot recompute this {model_type!r} model: {reason}. "
            f"Use engine='transformers' instead. Supported model types: {supported_types()}."
        )
    return family.name


_CORE_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


_BUILD_LOCK = threading.Lock()


def core_model(hf_model) -> CoreModel:
    """The weights of ``hf_model`` gathered for the engine, built once per model and cached.

    The cache is keyed weakly on the model, so it goes away with the model. It holds weight
    tensors (shared with the model where no conversion is needed), never the model itself.
    """
    with _BUILD_LOCK:
        core = _CORE_MODELS.get(hf_model)
        if core is None:
            family = FAMILIES[core_family(hf_model)]
            base = getattr(hf_model, "base_model", hf_model)  # *ForMaskedLM / *ForCausalLM wrap the base model
            with torch.no_grad():
                core = family.read(base, hf_model.config, family)
            _CORE_MODELS[hf_model] = core
    return core


def _same_shape(values, input_ids: torch.Tensor, name: str) -> torch.Tensor | None:
    """``values`` as a tensor shaped like ``input_ids`` (a single ``[n]`` row is a batch of one)."""
    if values is None:
        return None
    values = torch.as_tensor(values, device=input_ids.device)
    if values.dim() == 1:
        values = values[None]
    if values.shape != input_ids.shape:
        raise ValueError(f"{name} must have the shape of input_ids {tuple(input_ids.shape)}, got {tuple(values.shape)}")
    return values


def core_attentions(
    hf_model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    progress: Progress | None = None,
    hooks: Points | Mapping | None = None,
    outputs: dict | None = None,
    grad: bool = False,
) -> torch.Tensor:
    """Attention weights of every layer and head, recomputed from scratch: float32 ``[batch, layers, heads, n, n]``.

    ``input_ids`` ``[batch, n]`` (a single ``[n]`` sequence is treated as a batch of one);
    ``attention_mask`` ``[batch, n]`` with 1 for real tokens (padding on the right for decoders);
    ``token_type_ids`` ``[batch, n]`` segment ids, for encoders with sentence pairs.
    Weights in the rows of padding tokens are not meaningful; columns of padding tokens are 0.
    ``progress(done, total, message)`` is called after every layer;
    ``hooks``: the pass's named points (``mha_core.hooks.Hooks``, or ``{name: function}``: docs/hooks.md), e.g. head
    ablation as a function on ``blocks.{l}.attn.hook_z``, each layer's input kept as ``blocks.{l}.hook_resid_pre``;
    ``outputs``: a dict that receives ``"hidden"``, the residual stream after the last layer, and ``"final"``, the
    hidden states after the final norm of a pre-norm decoder (what its LM head reads; ``"hidden"`` otherwise);
    ``grad``: with autograd (gradients through hook functions, e.g. importance gates); otherwise in inference mode.
    """
    core = core_model(hf_model)
    device = hf_model.get_input_embeddings().weight.device
    input_ids = torch.as_tensor(input_ids, device=device)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2 or input_ids.shape[1] == 0 or input_ids.dtype.is_floating_point:
        raise ValueError(
            f"input_ids must be integer token ids of shape [batch, n] with n >= 1, got {tuple(input_ids.shape)}"
        )
    n = input_ids.shape[1]
    if core.max_positions is not None and n > core.max_positions:
        raise ValueError(f"{n} tokens exceed this model's {core.max_positions} learned positions")
    if core.sliding_window is not None and n > core.sliding_window:
        raise EngineNotSupported(
            f"the from-scratch engine does not implement sliding-window attention, which this "
            f"model applies beyond {core.sliding_window} tokens ({n} given)"
        )
    key_padding_mask = _same_shape(attention_mask, input_ids, "attention_mask")
    if key_padding_mask is not None:
        key_padding_mask = key_padding_mask.bool()
    token_type_ids = _same_shape(token_type_ids, input_ids, "token_type_ids")
    with torch.enable_grad() if grad else torch.inference_mode():
        forward = FAMILIES[core.family].forward
        weights = forward(
            core, input_ids, key_padding_mask, token_type_ids, progress, hooks=as_points(hooks), outputs=outputs
        )
    return None if weights is None else weights.float()  # None: a blockwise kernel kept no dense weights


def head_vectors(hf_model, layer_index: int, x: torch.Tensor, values_only: bool = False) -> HeadVectors:
    """The query, key and value vectors of every head of layer ``layer_index`` for its input ``x``
    ``[batch, n, d]`` (``layer_inputs`` of ``core_attentions``, or transformers' ``hidden_states``).
    ``values_only``: only the value vectors (query and key None), for norm-based attention."""
    core = core_model(hf_model)
    with torch.inference_mode():
        return FAMILIES[core.family].heads(core, core.layers[layer_index], x.float(), values_only)
