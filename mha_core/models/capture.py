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

from ..progress import Progress, report


class AttentionBuffer:
    """Memory for the attentions of one forward pass after another, reused from pass to pass.

    A new ``[batch, layers, heads, n, n]`` tensor is new memory, which the kernel faults in and zeroes
    page by page on first write: at n = 512 that costs more than copying the weights into memory already
    touched. A caller that is done with one pass's attentions before the next (a profile measures each
    batch and drops it) passes the same buffer to each: every tensor it hands out is overwritten by the
    next. Not shared between threads: each caller makes its own.
    """

    def __init__(self):
        self._storage = torch.empty(0, dtype=torch.float32)

    def tensor(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A float32 tensor of ``shape`` in the buffer's memory (grown, never shrunk, when it is too small)."""
        size = 1
        for dimension in shape:
            size *= int(dimension)
        if self._storage.numel() < size:
            self._storage = torch.empty(size, dtype=torch.float32)
        return self._storage[:size].view(shape)


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
    hf_model,
    recorders: list[tuple[torch.nn.Module, int]],
    inputs: dict,
    lock: threading.Lock,
    progress: Progress | None = None,
    outputs: dict | None = None,
    out: AttentionBuffer | None = None,
) -> torch.Tensor | None:
    """Attentions copied by forward hooks on the ``recorders``, or None if a layer gave none.

    Hooks live on shared modules, so ``lock`` (one per model) lets one forward pass at a time use them.
    ``outputs``: a dict that receives the model's own output as ``"model"`` (final and, when asked for,
    per-layer hidden states); without it the pass stops once every layer's weights are captured.
    ``out``: the memory to copy into (see ``AttentionBuffer``); None: a new tensor.
    """
    layer_count = len(recorders)
    captured: dict = {"layers": set()}
    stop_early = outputs is None

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

    with lock:
        handles = [
            module.register_forward_hook(recorder(layer, index)) for layer, (module, index) in enumerate(recorders)
        ]
        try:
            with torch.inference_mode():
                output = hf_model(**inputs)
            if outputs is not None:
                outputs["model"] = output
        except _AllCaptured:
            pass
        finally:
            for handle in handles:
                handle.remove()
    return captured["all"] if len(captured["layers"]) == layer_count else None
