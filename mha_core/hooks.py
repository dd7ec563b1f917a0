"""Named hook points: every activation of a forward pass has a name, in both engines (docs/hooks.md).

The names and shapes are TransformerLens' (batch first): ``blocks.3.attn.hook_pattern`` is layer 3's attention
after the softmax, ``[batch, head, query, key]``; ``blocks.3.hook_resid_post`` the residual stream after layer 3,
``[batch, pos, d_model]``. Encoder-decoder models name their stacks ``encoder.{l}`` and ``decoder.{l}``, as
TransformerLens' ``HookedEncoderDecoder`` does.

A *hook function* takes the tensor at its point and returns its replacement (of the same shape), or None to
keep it. ``Hooks`` holds what one pass does at its points: ``functions`` by name, and a filter of the names whose
tensors the pass keeps in ``cache`` (after the functions: what the pass went on with). Code that computes a
pass calls ``hooks(name, tensor)`` at every point, or ``hooks.scope("blocks.3.")`` to hand a layer the points of
its own (``scope("attn.")`` within it); ``NO_HOOKS`` does nothing at all, so a pass without hooks pays for a
function call per point and nothing else.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch

from .errors import HeadscopeError, quoted

HookFunction = Callable[[torch.Tensor], torch.Tensor | None]
NameFilter = None | str | Iterable[str] | Callable[[str], bool]


class HookError(HeadscopeError, ValueError):
    """A hook that cannot be applied: a name the model does not have, a replacement of another shape."""


class Points:
    """Where a pass does nothing: ``points(name, tensor)`` returns the tensor, ``wants`` is always False."""

    def __call__(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def wants(self, name: str) -> bool:
        return False

    def scope(self, prefix: str) -> Points:
        return self


NO_HOOKS = Points()


class Hooks(Points):
    """The hook functions of one pass (``{name: function}``) and the names whose tensors it keeps.

    ``keep``: a predicate of the name (None: keep nothing). ``cache`` receives each kept tensor, detached, as the
    pass went on with it (after the point's function)."""

    def __init__(self, functions: Mapping[str, HookFunction] | None = None, keep: Callable[[str], bool] | None = None):
        self.functions = dict(functions or {})
        self.keep = keep
        self.cache: dict[str, torch.Tensor] = {}

    def __bool__(self) -> bool:
        return bool(self.functions) or self.keep is not None

    def wants(self, name: str) -> bool:
        return name in self.functions or (self.keep is not None and self.keep(name))

    def __call__(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        function = self.functions.get(name)
        if function is not None:
            replaced = function(tensor)
            if replaced is not None:
                if not isinstance(replaced, torch.Tensor) or replaced.shape != tensor.shape:
                    shape = tuple(replaced.shape) if isinstance(replaced, torch.Tensor) else type(replaced).__name__
                    raise HookError(
                        f"The hook on {name} returned {shape}; it must return a tensor of the point's shape "
                        f"{tuple(tensor.shape)}, or None to keep it."
                    )
                tensor = replaced
        if self.keep is not None and self.keep(name):
            self.cache[name] = tensor.detach()
        return tensor

    def scope(self, prefix: str) -> Points:
        return Scope(self, prefix)


class Scope(Points):
    """The points of one part of a pass (a layer, its attention): names relative to ``prefix``."""

    __slots__ = ("hooks", "prefix")

    def __init__(self, hooks: Hooks, prefix: str):
        self.hooks, self.prefix = hooks, prefix

    def __call__(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return self.hooks(self.prefix + name, tensor)

    def wants(self, name: str) -> bool:
        return self.hooks.wants(self.prefix + name)

    def scope(self, prefix: str) -> Points:
        return Scope(self.hooks, self.prefix + prefix)


def as_points(hooks: Points | Mapping[str, HookFunction] | None) -> Points:
    """``NO_HOOKS`` for None, a ``Hooks`` for a mapping of names to functions, the object itself otherwise."""
    if hooks is None:
        return NO_HOOKS
    if isinstance(hooks, Points):
        return hooks
    return Hooks(hooks) if hooks else NO_HOOKS


def name_filter(names: NameFilter, known: Iterable[str]) -> Callable[[str], bool]:
    """A predicate of the names to keep: None keeps every name, a string one name, a list those names (each must
    be one of ``known``), a callable is used as it is."""
    if names is None:
        return lambda name: True
    if callable(names):
        return names
    wanted = {names} if isinstance(names, str) else set(names)
    check_names(wanted, known)
    return wanted.__contains__


def check_names(names: Iterable[str], known: Iterable[str]) -> None:
    """A ``HookError`` naming the first of ``names`` that is not one of ``known``, with the nearest known names."""
    known = list(known)
    missing = sorted(set(names) - set(known))
    if missing:
        name = str(missing[0])
        near = difflib.get_close_matches(name, known, n=3)
        hint = f" Nearest: {', '.join(near)}." if near else ""
        raise HookError(f"This model has no hook point {quoted(name, 80)}.{hint} See model.hook_names().")


# ---- the names ----------------------------------------------------------------------------------------------
ATTENTION_POINTS = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")
NORM_POINTS = ("hook_scale", "hook_normalized")


@dataclass(frozen=True)
class StackNames:
    """How one stack's points are named: its layers ``{blocks}.{l}.``, its embeddings and its final norm."""

    blocks: str
    embed: str
    pos_embed: str
    final_norm: str


SINGLE_STACK = StackNames("blocks", "hook_embed", "hook_pos_embed", "ln_final")
ENCODER = StackNames("encoder", "hook_embed", "hook_pos_embed", "encoder_final_ln")
DECODER = StackNames("decoder", "hook_decoder_embed", "hook_decoder_pos_embed", "decoder_final_ln")
STACKS = {names.blocks: names for names in (SINGLE_STACK, ENCODER, DECODER)}


def layer_point_names(norms: int, post_norm: bool, cross: bool) -> list[str]:
    """One layer's points (relative to ``blocks.{l}.``), in the order the layer computes them: ``norms`` norms
    (``ln1``, ``ln2``, ...), before their sublayer (pre-LN) or after its residual sum (``post_norm``), and a
    cross-attention after the self-attention (``cross``)."""
    sublayers = [[f"attn.{point}" for point in ATTENTION_POINTS] + ["hook_attn_out"]]
    if cross:
        sublayers.append([f"cross_attn.{point}" for point in ATTENTION_POINTS] + ["hook_cross_attn_out"])
    sublayers.append(["hook_mlp_out"])
    if len(sublayers) != norms:
        raise ValueError(f"a layer with {len(sublayers)} sublayers has {len(sublayers)} norms, not {norms}")
    names = ["hook_resid_pre"]
    for index, points in enumerate(sublayers):
        norm = [f"ln{index + 1}.{point}" for point in NORM_POINTS]
        last = index == len(sublayers) - 1
        if post_norm:
            names += points + (["hook_resid_post"] if last else []) + norm
        else:
            names += norm + points
    return names + (["hook_normalized_resid_post"] if post_norm else ["hook_resid_post"])


def stack_point_names(
    names: StackNames,
    layers: int,
    *,
    post_norm: bool,
    cross: bool = False,
    positions: bool = False,
    final_norm: bool = False,
) -> list[str]:
    """Every point of one stack: its embeddings (``positions``: absolute position vectors), its layers, and its
    final norm (``final_norm``)."""
    points = [names.embed] + ([names.pos_embed] if positions else [])
    per_layer = layer_point_names(3 if cross else 2, post_norm, cross)
    points += [f"{names.blocks}.{layer}.{point}" for layer in range(layers) for point in per_layer]
    return points + ([f"{names.final_norm}.{point}" for point in NORM_POINTS] if final_norm else [])


def block_point(layer: int, point: str, names: StackNames = SINGLE_STACK) -> str:
    """The name of a layer's point: ``block_point(3, "attn.hook_z")`` is ``"blocks.3.attn.hook_z"``."""
    return f"{names.blocks}.{layer}.{point}"
