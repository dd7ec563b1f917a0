"""One way to edit a head: a function on every head's output before the output projection; and the library's one
place that puts a hook on a module.

The thing edited is ``z``, each head's output ``softmax(QK^T / sqrt(d_k)) V`` before Concat and W^O, shaped
``[batch, n, heads, d_head]``: the named hook point ``blocks.{l}.attn.hook_z`` (``mha_core.hooks``, docs/hooks.md).
An *edit* is a hook function ``z -> z`` of the same shape; ``{"blocks.3.attn.hook_z": edit}`` edits a model, in both
engines. Zero ablation, mean ablation, the Lab's head mask, importance gates and activation patching over heads
are edits; ``replace_positions`` patches any ``[batch, n, ...]`` point (an MLP's output, the residual stream) in
chosen rows and positions. Both engines apply them at the same place:

- the from-scratch core computes its heads itself and calls the point (``MultiHeadAttention.forward(...,
  hooks=...)``, the core engine's layers);
- the transformers engine applies it in a forward pre-hook on each layer's output projection, whose input is
  Concat(heads) ``[batch, n, heads * d_head]`` (``apply_to_concat`` reshapes it to ``z`` and back).

``forward_pre_hooks`` / ``forward_hooks`` / ``softmax_hooks`` are the library's only way to put a hook on a module:
they always take the hooks off again, whatever happens inside.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

Edit = Callable[[torch.Tensor], torch.Tensor]
LayerEdits = Mapping[int, Edit]


def _head_list(heads: Iterable[int]) -> list[int]:
    heads = sorted({int(h) for h in heads})
    if any(h < 0 for h in heads):
        raise ValueError(f"head indices must be >= 0, got {heads}")
    return heads


def _check_heads(z: torch.Tensor, heads: list[int]) -> None:
    if z.dim() != 4:
        raise ValueError(f"an edit takes z of shape [batch, n, heads, d_head], got {tuple(z.shape)}")
    if heads and heads[-1] >= z.shape[2]:
        raise ValueError(f"head {heads[-1]} is out of range for {z.shape[2]} heads")


def zero_heads(heads: Iterable[int]) -> Edit:
    """Zero ablation: the listed heads write nothing (their slice of Concat(heads) is 0)."""
    heads = _head_list(heads)

    def edit(z: torch.Tensor) -> torch.Tensor:
        _check_heads(z, heads)
        keep = torch.ones(z.shape[2], dtype=z.dtype, device=z.device)
        keep[heads] = 0
        return z * keep[:, None]

    return edit


def replace_heads(heads: Iterable[int], values: torch.Tensor) -> Edit:
    """The listed heads output ``values`` instead of their own output.

    ``values`` broadcasts to ``z`` (``[batch, n, heads, d_head]``), and only the listed heads are taken from it:
    ``[heads, d_head]`` (a mean per head: mean ablation) or ``[batch, n, heads, d_head]`` (another run's z:
    activation patching)."""
    heads = _head_list(heads)

    def edit(z: torch.Tensor) -> torch.Tensor:
        _check_heads(z, heads)
        chosen = torch.zeros(z.shape[2], dtype=torch.bool, device=z.device)
        chosen[heads] = True
        source = values.to(z.device, z.dtype).expand_as(z)
        return torch.where(chosen[:, None], source, z)

    return edit


def scale_heads(factors: torch.Tensor) -> Edit:
    """Each head's output times a factor: ``[heads]`` or ``[batch, heads]`` (0 removes a head, 1 keeps it).

    With ``factors.requires_grad`` the gradient of a loss with respect to the factors, at 1, is each head's
    importance (Michel et al. 2019)."""
    if factors.dim() not in (1, 2):
        raise ValueError(f"factors must be [heads] or [batch, heads], got shape {tuple(factors.shape)}")

    def edit(z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 4 or factors.shape[-1] != z.shape[2]:
            raise ValueError(
                f"factors of shape {tuple(factors.shape)} do not fit z of shape {tuple(z.shape)} "
                "([batch, n, heads, d_head])"
            )
        scale = factors.to(z.device, z.dtype)
        scale = scale[None, None, :, None] if scale.dim() == 1 else scale[:, None, :, None]
        return z * scale

    return edit


def replace_heads_per_row(chosen: torch.Tensor, values: torch.Tensor) -> Edit:
    """Row b of the batch takes ``values`` for the heads ``chosen[b]`` marks (``[batch, heads]`` booleans) and
    keeps its own output for the others: a batch in which each row patches other heads (exact activation
    patching, one component per row). ``values`` broadcasts to ``z`` (``[n, heads, d_head]`` or the whole z)."""
    if chosen.dim() != 2 or chosen.dtype != torch.bool:
        raise ValueError(f"chosen must be [batch, heads] booleans, got {chosen.dtype} of shape {tuple(chosen.shape)}")

    def edit(z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 4 or tuple(chosen.shape) != (z.shape[0], z.shape[2]):
            raise ValueError(
                f"chosen of shape {tuple(chosen.shape)} does not fit z of shape {tuple(z.shape)} "
                "([batch, n, heads, d_head])"
            )
        source = values.to(z.device, z.dtype).expand_as(z)
        return torch.where(chosen.to(z.device)[:, None, :, None], source, z)

    return edit


def replace_positions(
    values: torch.Tensor, rows: torch.Tensor | None = None, positions: torch.Tensor | None = None
) -> Edit:
    """A ``[batch, n, ...]`` activation replaced by ``values`` (which broadcast to it: ``[n, d]`` for another run's
    MLP output or residual stream) in the batch rows ``rows`` (booleans ``[batch]``; None: all) at ``positions``
    (booleans ``[batch, n]``; None: every position)."""

    def edit(x: torch.Tensor) -> torch.Tensor:
        where = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        if rows is not None:
            where = where & rows.to(x.device)[:, None]
        if positions is not None:
            where = where & positions.to(x.device)
        where = where.reshape(*where.shape, *([1] * (x.dim() - 2)))
        return torch.where(where, values.to(x.device, x.dtype).expand_as(x), x)

    return edit


def gradient_probe(store: list) -> Edit:
    """Adds a zero that requires a gradient to the point's tensor (z, or any other), and appends it to ``store``:
    the gradient of a loss with respect to it is d(loss)/dz of every head at every position, through every path
    of the model (attribution patching, Nanda 2023). The output itself is unchanged."""

    def edit(z: torch.Tensor) -> torch.Tensor:
        probe = torch.zeros_like(z, requires_grad=True)
        store.append(probe)
        return z + probe

    return edit


def chain(*edits: Edit | None) -> Edit | None:
    """The edits (hook functions) applied one after the other (None entries skipped; a function that returns None
    keeps its input); None when there are none."""
    present = [edit for edit in edits if edit is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def edit(z: torch.Tensor) -> torch.Tensor:
        for one in present:
            replaced = one(z)
            z = z if replaced is None else replaced
        return z

    return edit


def apply_to_concat(edit: Edit | None, concat: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Apply ``edit`` to Concat(heads) ``[..., n, heads * d_head]`` through its ``z`` view, and concatenate again."""
    if edit is None:
        return concat
    width = concat.shape[-1]
    if width % num_heads:
        raise ValueError(f"Concat(heads) width {width} is not a multiple of {num_heads} heads")
    unbatched = concat.dim() == 2
    z = concat.reshape(*concat.shape[:-1], num_heads, width // num_heads)
    if unbatched:
        z = z.unsqueeze(0)
    edited = edit(z)
    if edited.shape != z.shape:
        raise ValueError(f"an edit must keep z's shape {tuple(z.shape)}, got {tuple(edited.shape)}")
    if unbatched:
        edited = edited[0]
    return edited.reshape(concat.shape)


@contextmanager
def registered(hooks: Iterable[tuple[torch.nn.Module, Callable]], register: Callable):
    """``register(module, hook)`` (a torch registration returning its handle) for each ``(module, hook)`` for the
    ``with`` block, and every handle removed after it, whatever happens."""
    handles = []
    try:
        for module, hook in hooks:
            handles.append(register(module, hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


def forward_pre_hooks(hooks: Iterable[tuple[torch.nn.Module, Callable]], with_kwargs: bool = False):
    """Register ``(module, hook)`` forward pre-hooks for the ``with`` block, and always remove them.
    ``with_kwargs``: each hook is ``hook(module, args, kwargs) -> (args, kwargs) or None``."""
    return registered(hooks, lambda module, hook: module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))


def forward_hooks(hooks: Iterable[tuple[torch.nn.Module, Callable]], always_call: bool = False):
    """Register ``(module, hook)`` forward hooks for the ``with`` block, and always remove them.
    ``always_call``: each hook runs even when the module's forward raises (then with output None)."""
    return registered(hooks, lambda module, hook: module.register_forward_hook(hook, always_call=always_call))


SOFTMAX_FUNCTIONS = (F.softmax, torch.softmax, torch.Tensor.softmax)


class SoftmaxPoints(TorchFunctionMode):
    """For the length of one module's forward: each softmax call's input goes through ``on_scores`` and its output
    through ``on_weights`` (each returns its tensor or a replacement). How the transformers engine reaches the
    scores and the weights of an attention inside the checkpoint's own attention code (which computes both in a
    function, not a module); ``calls`` counts the softmaxes seen."""

    def __init__(self, on_scores: Callable, on_weights: Callable):
        super().__init__()
        self.on_scores, self.on_weights, self.calls = on_scores, on_weights, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in SOFTMAX_FUNCTIONS:
            return func(*args, **kwargs)
        self.calls += 1
        return self.on_weights(func(self.on_scores(args[0]), *args[1:], **kwargs))


@contextmanager
def softmax_hooks(hooks: Iterable[tuple[torch.nn.Module, Callable, Callable]]):
    """For the ``with`` block, every forward of each module runs inside a ``SoftmaxPoints(on_scores, on_weights)``
    (``(module, on_scores, on_weights)``): entered by a forward pre-hook, left by a forward hook that always runs.
    A forward that ran no softmax, or more than one, raises ``ValueError``: the attention is not computed the way
    these points assume."""
    hooks = list(hooks)
    active: dict[int, list] = {}

    def enter(on_scores: Callable, on_weights: Callable):
        def hook(module, args):
            mode = SoftmaxPoints(on_scores, on_weights)
            active.setdefault(id(module), []).append(mode)
            mode.__enter__()

        return hook

    def leave(module, args, output):
        mode = active[id(module)].pop()
        mode.__exit__(None, None, None)
        if output is not None and mode.calls != 1:  # output None: the forward raised, its error goes on
            raise ValueError(f"{type(module).__name__} ran {mode.calls} softmaxes: its scores cannot be named")

    with (
        forward_pre_hooks((module, enter(on_scores, on_weights)) for module, on_scores, on_weights in hooks),
        forward_hooks(((module, leave) for module, _, _ in hooks), always_call=True),
    ):
        yield
