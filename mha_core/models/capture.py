"""Each layer's attention weights, taken from a transformers model as it computes them.

transformers itself knows which module returns each layer's weights (``_can_record_outputs``, the
same table it uses to serve ``output_attentions``). Forward hooks on those modules copy every
layer's weights into one preallocated ``[batch, layers, heads, n, n]`` tensor as the layer finishes,
so no second copy is ever held, and report progress after each layer (a progress callback that
raises stops the forward pass there). A caller that keeps nothing of the model's output stops the
pass as soon as the last layer's weights are in: the rest of that layer (its output projection and
feed-forward block, about a sixth of MiniLM's forward) and the final norm would compute nothing it reads.
"""

from __future__ import annotations

import threading

import torch

from ..edits import forward_hooks
from ..progress import report
from .forward import AttentionBuffer, ForwardPass

__all__ = ["AttentionBuffer", "attention_recorders", "captured_attentions"]


class _AllCaptured(Exception):
    """Raised by the last layer's hook to end a pass whose output nobody reads."""


def attention_recorders(hf_model) -> list[tuple[torch.nn.Module, int]]:
    """``(module, output index)`` of each layer's attention weights, in layer order.

    Found the way transformers itself finds them to serve ``output_attentions`` (the model's
    ``_can_record_outputs["attentions"]``: a module class, or an ``OutputRecorder`` with a class,
    a class-name suffix and a layer name). Empty when the model does not say.
    """
    spec = (getattr(hf_model, "_can_record_outputs", None) or {}).get("attentions")
    if spec is None or isinstance(spec, list):
        return []
    if isinstance(spec, (type, str)):
        target, class_name, layer_name, index = (
            (spec, None, None, 1) if isinstance(spec, type) else (None, spec, None, 1)
        )
    else:
        target, class_name = getattr(spec, "target_class", None), getattr(spec, "class_name", None)
        layer_name, index = getattr(spec, "layer_name", None), getattr(spec, "index", 1)
    found = []
    for module_name, module in hf_model.named_modules():
        matches = (target is not None and isinstance(module, target)) or bool(
            class_name and module_name.endswith(class_name)
        )
        if matches and (layer_name is None or f".{layer_name.strip('.')}." in f".{module_name}."):
            found.append((module, index))
    return found


def captured_attentions(
    hf_model, recorders: list[tuple[torch.nn.Module, int]], inputs: dict, lock: threading.Lock, forward: ForwardPass
) -> tuple[torch.Tensor | None, object]:
    """``(attentions copied by forward hooks on the recorders, the model's own output)``; the attentions are None
    if a layer gave none.

    Hooks live on shared modules, so ``lock`` (one per model) lets one forward pass at a time use them.
    ``forward.progress`` is told after each layer; ``forward.out`` is the memory to copy into (see
    ``AttentionBuffer``; None: a new tensor). When the pass keeps nothing of the model's output
    (``forward.keeps_output``) it stops once every layer's weights are captured, and the output is None.
    """
    layer_count = len(recorders)
    captured: dict = {"layers": set()}
    stop_early = not forward.keeps_output
    out, progress = forward.out, forward.progress

    def recorder(layer: int, index: int):
        def hook(module, args, output):
            weights = output[index] if isinstance(output, tuple) and len(output) > index else None
            if weights is None:
                return
            if "all" not in captured:
                shape = (weights.shape[0], layer_count, *weights.shape[1:])
                captured["all"] = out.tensor(shape) if out is not None else torch.empty(shape, dtype=torch.float32)
            captured["all"][:, layer].copy_(weights)
            captured["layers"].add(layer)
            report(progress, layer + 1, layer_count, f"layer {layer + 1} of {layer_count}")
            if stop_early and len(captured["layers"]) == layer_count:
                raise _AllCaptured

        return hook

    output = None
    hooks = [(module, recorder(layer, index)) for layer, (module, index) in enumerate(recorders)]
    with lock, forward_hooks(hooks):
        try:
            with torch.inference_mode():
                output = hf_model(**inputs)
        except _AllCaptured:
            pass
    attentions = captured["all"] if len(captured["layers"]) == layer_count else None
    return attentions, (output if forward.keeps_output else None)
