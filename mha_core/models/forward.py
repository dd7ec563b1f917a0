"""One description of a forward pass: what it takes (``ForwardPass``) and what it gives back (``PassResult``).

Every pass of a ``LoadedModel`` (a run, a batch of runs, the losses, the neuron view's layer inputs, every
intervention's pass with its hook functions) is one ``ForwardPass`` handed to ``LoadedModel.run_pass``; the
engines, the capture of attentions and the losses read the same object instead of a list of keywords.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import torch

from ..progress import Progress, progress_part


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


@dataclass(frozen=True)
class ForwardPass:
    """What one forward pass takes and what it keeps.

    ``input_ids`` ``[batch, n]``; ``attention_mask`` ``[batch, n]`` (1 for real tokens) or None; ``token_type_ids``
    ``[batch, n]`` or None; ``hooks``: ``{name: function}`` on the named points (``mha_core.hooks``: head ablation is
    a function on ``blocks.{l}.attn.hook_z``); ``keep``: a predicate of the names whose tensors the pass keeps
    (``PassResult.cache``; None: none); ``progress(done, total, message)`` after each layer; ``keep_hidden``: keep
    the final hidden states (after any final norm: what the LM head reads); ``keep_layer_inputs``: keep each
    layer's input hidden states; ``out``: memory the attentions may reuse (``capture.AttentionBuffer``);
    ``attentions``: capture every layer's attention weights (False: a pass for its output, its cache or the
    hooks' effects only); ``grad``: with autograd, for gradients through the hook functions (otherwise in
    inference mode); ``logits_at``: one position per text whose LM-head logits the pass keeps
    (``PassResult.logits``: the next-token prediction drawn from the same pass as the attentions).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None
    hooks: Mapping[str, Callable] | None = None
    keep: Callable[[str], bool] | None = None
    progress: Progress | None = None
    keep_hidden: bool = False
    keep_layer_inputs: bool = False
    out: AttentionBuffer | None = None
    attentions: bool = True
    grad: bool = False
    logits_at: tuple[int, ...] | None = None

    @property
    def keeps_output(self) -> bool:
        """Whether anything of the model's output beyond the attentions is kept or changed."""
        return (
            self.keep_hidden
            or self.keep_layer_inputs
            or bool(self.hooks)
            or self.keep is not None
            or self.logits_at is not None
        )

    def part(self, index: int, parts: int) -> ForwardPass:
        """The same pass reporting its progress as part ``index`` of ``parts`` (the core engine runs two)."""
        return replace(self, progress=progress_part(self.progress, index, parts))

    def with_changes(self, **changes) -> ForwardPass:
        """A copy with some fields changed."""
        return replace(self, **changes)


@dataclass
class PassResult:
    """What a forward pass gives back.

    ``attentions`` float32 ``[batch, layers, heads, n, n]`` (None when not captured); ``reference``: transformers'
    attentions when the core engine ran (it reports its difference from them), else None; ``hidden``: the final
    hidden states when kept; ``layer_inputs``: each layer's input ``[batch, n, d]`` when kept; ``cache``: the
    tensors of the kept names (``{name: tensor}``); ``logits``: float32 ``[batch, vocab]``, the LM head at each
    text's ``logits_at`` position (None when not asked for).
    """

    attentions: torch.Tensor | None
    reference: torch.Tensor | None = None
    hidden: torch.Tensor | None = None
    layer_inputs: list | None = None
    cache: dict = field(default_factory=dict)
    logits: torch.Tensor | None = None
