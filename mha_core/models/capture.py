"""Each layer's attention weights, taken from a transformers model as it computes them.

The model's family says which module returns each layer's weights (``engine.family.AttentionModules``: the
attention module, whose output holds them, or the module they pass through). Forward hooks on those modules copy
every layer's weights into one preallocated ``[batch, layers, heads, n, n]`` tensor as the layer finishes, so no
second copy is ever held, and report progress after each layer (a progress callback that raises stops the forward
pass there). A caller that keeps nothing of the model's output stops the pass as soon as the last layer's
weights are in: the rest of that layer (its output projection and feed-forward block, about a sixth of MiniLM's
forward) and the final norm would compute nothing it reads. A model of no known family returns its weights
through ``output_attentions`` (``LoadedModel``).
"""

from __future__ import annotations

import torch

from ..edits import forward_hooks
from ..engine.family import ModelModules
from ..progress import report
from .forward import AttentionBuffer, ForwardPass

__all__ = ["AttentionBuffer", "attention_recorders", "captured_attentions"]


class _AllCaptured(Exception):
    """Raised by the last layer's hook to end a pass whose output nobody reads."""


def attention_recorders(modules: ModelModules | None) -> list[tuple[torch.nn.Module, int | None]]:
    """``(module, output index)`` of each layer's attention weights, in layer order (index None: the module's output
    is the weights), from a one-stack model's declared modules; empty for a model of no known family."""
    if modules is None or set(modules.stacks) != {"blocks"}:
        return []
    return [
        (layer.attention.weights_module, layer.attention.weights_index) for layer in modules.stacks["blocks"].layers
    ]


def captured_attentions(
    hf_model, recorders: list[tuple[torch.nn.Module, int | None]], inputs: dict, forward: ForwardPass
) -> tuple[torch.Tensor | None, object]:
    """``(attentions copied by forward hooks on the recorders, the model's own output)``; the attentions are None
    if a layer gave none.

    Hooks live on shared modules: the caller holds the model's forward lock. ``forward.progress`` is told after
    each layer; ``forward.out`` is the memory to copy into (see ``AttentionBuffer``; None: a new tensor). When the
    pass keeps nothing of the model's output (``forward.keeps_output``) it stops once every layer's weights are
    captured, and the output is None. ``forward.grad``: the pass runs with autograd (the copies are detached).
    """
    layer_count = len(recorders)
    captured: dict = {"layers": set()}
    stop_early = not forward.keeps_output
    out, progress = forward.out, forward.progress

    def recorder(layer: int, index: int | None):
        def hook(module, args, output):
            if index is None:
                weights = output
            else:
                weights = output[index] if isinstance(output, tuple) and len(output) > index else None
            if weights is None:
                return
            if "all" not in captured:
                shape = (weights.shape[0], layer_count, *weights.shape[1:])
                captured["all"] = out.tensor(shape) if out is not None else torch.empty(shape, dtype=torch.float32)
            captured["all"][:, layer].copy_(weights.detach())
            captured["layers"].add(layer)
            report(progress, layer + 1, layer_count, f"layer {layer + 1} of {layer_count}")
            if stop_early and len(captured["layers"]) == layer_count:
                raise _AllCaptured

        return hook

    output = None
    hooks = [(module, recorder(layer, index)) for layer, (module, index) in enumerate(recorders)]
    with forward_hooks(hooks):
        try:
            with torch.enable_grad() if forward.grad else torch.inference_mode():
                output = hf_model(**inputs)
        except _AllCaptured:
            pass
    attentions = captured["all"] if len(captured["layers"]) == layer_count else None
    return attentions, (output if forward.keeps_output else None)
