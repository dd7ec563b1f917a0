"""One way to edit a head: a function on every head's output before the output projection.

The thing edited is ``z``, each head's output ``softmax(QK^T / sqrt(d_k)) V`` before Concat and W^O, shaped
``[batch, n, heads, d_head]`` (TransformerLens calls it ``hook_z``). An *edit* is a callable ``z -> z`` of the same
shape; ``{layer: edit}`` edits a model. Zero ablation, mean ablation, the Lab's head mask, importance gates and
activation patching are all edits; both engines apply them at the same place:

- the from-scratch core (``MultiHeadAttention.forward(..., edit=...)``, the core engine's layers) applies the
  edit to its own heads before W^O;
- the transformers engine applies it in a forward pre-hook on each layer's output projection, whose input is
  Concat(heads) ``[batch, n, heads * d_head]`` (``apply_to_concat`` reshapes it to ``z`` and back).

``forward_pre_hooks`` / ``forward_hooks`` are the library's only way to put a hook on a module: they always take
the hooks off again, whatever happens inside.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager

import torch

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


def gradient_probe(store: list) -> Edit:
    """Adds a zero that requires a gradient to z, and appends it to ``store``: after ``backward()`` its
    ``.grad`` is d(loss)/dz of every head at every position, through every path of the model (attribution
    patching, Nanda 2023). The output itself is unchanged."""

    def edit(z: torch.Tensor) -> torch.Tensor:
        probe = torch.zeros_like(z, requires_grad=True)
        store.append(probe)
        return z + probe

    return edit


def record_heads(store: list) -> Edit:
    """Leaves z as it is and appends it (detached, float32) to ``store``: the clean run of activation patching."""

    def edit(z: torch.Tensor) -> torch.Tensor:
        store.append(z.detach().float())
        return z

    return edit


def chain(*edits: Edit | None) -> Edit | None:
    """The edits applied one after the other (None entries skipped); None when there are none."""
    present = [edit for edit in edits if edit is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]

    def edit(z: torch.Tensor) -> torch.Tensor:
        for one in present:
            z = one(z)
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


def concat_pre_hook(edit: Edit, num_heads: int):
    """A forward pre-hook for an output projection that applies ``edit`` to its input, Concat(heads)."""

    def hook(module, args):
        return (apply_to_concat(edit, args[0], num_heads), *args[1:])

    return hook


@contextmanager
def forward_pre_hooks(hooks: Iterable[tuple[torch.nn.Module, Callable]]):
    """Register ``(module, hook)`` forward pre-hooks for the ``with`` block, and always remove them."""
    handles = []
    try:
        for module, hook in hooks:
            handles.append(module.register_forward_pre_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def forward_hooks(hooks: Iterable[tuple[torch.nn.Module, Callable]]):
    """Register ``(module, hook)`` forward hooks for the ``with`` block, and always remove them."""
    handles = []
    try:
        for module, hook in hooks:
            handles.append(module.register_forward_hook(hook))
        yield
    finally:
        for handle in handles:
            handle.remove()
