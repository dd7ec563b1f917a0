"""The named hook points of a transformers model (docs/hooks.md): where the transformers engine takes each one,
from its family's declaration of where its modules are (``engine.family.ModelModules``).

Each point is a module's input or output, seen in TransformerLens' shape: the projections' outputs as
``[batch, pos, head, d_head]`` (``attn.hook_q``, ``hook_k``, ``hook_v``), the output projection's input
(``attn.hook_z``) and output (``hook_attn_out``), the MLP's output, a block's input and output, a norm's scale
and normalised input computed from what it reads. The scores and the pattern live inside the checkpoint's own
attention function, not in a module: they are the input and output of the one softmax that the attention module's
forward runs (``edits.softmax_hooks``), with the large negative numbers of transformers' masks shown as -inf, as the
from-scratch engine has them. A hook function's replacement goes back into the model in the module's own layout.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch

from ..edits import apply_to_concat, forward_hooks, forward_pre_hooks, softmax_hooks
from ..engine.family import AttentionModules, Family, ModelModules, StackModules
from ..hooks import ATTENTION_POINTS, NORM_POINTS, STACKS, HookError, Hooks, stack_point_names


def point_names(family: Family, modules: ModelModules) -> list[str]:
    """Every named point of a model of ``family`` whose modules are ``modules``, in the order a pass reaches them."""
    names = []
    for key, stack in modules.stacks.items():
        names += stack_point_names(
            STACKS[key],
            len(stack.layers),
            post_norm=family.post_norm,
            cross=bool(stack.layers) and stack.layers[0].cross is not None,
            positions=stack.position_embedding is not None,
            final_norm=stack.final_norm is not None,
        )
    return names


def _output(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def _with_output(output, tensor: torch.Tensor):
    return (tensor, *output[1:]) if isinstance(output, tuple) else tensor


def _width(module) -> int:
    """The input width of a projection: ``nn.Linear`` is ``[out, in]``, GPT-2's ``Conv1D`` ``[in, out]``."""
    return module.weight.shape[1] if isinstance(module, torch.nn.Linear) else module.weight.shape[0]


class _Sites:
    """The module hooks that take the points a ``Hooks`` wants, gathered by kind before they are registered."""

    def __init__(self, hooks: Hooks, batch: int, post_norm: bool):
        self.hooks, self.batch, self.post_norm = hooks, batch, post_norm
        self.pre: list = []  # (module, hook(module, args))
        self.pre_kwargs: list = []  # (module, hook(module, args, kwargs))
        self.post: list = []  # (module, hook(module, args, output))
        self.softmax: list = []  # (module, on_scores, on_weights)
        self.stack: dict = {"active": None}  # which stack runs now (an encoder-decoder's shared embedding)

    def wants(self, *names: str) -> bool:
        return any(self.hooks.wants(name) for name in names)

    # ---- the residual stream ----
    def block_input(self, block, name: str) -> None:
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            new = self.hooks(name, hidden)
            if new is hidden:
                return None
            return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})

        if self.wants(name):
            self.pre_kwargs.append((block, hook))

    def module_input(self, module, name: str) -> None:
        def hook(module, args):
            new = self.hooks(name, args[0])
            return None if new is args[0] else (new, *args[1:])

        if self.wants(name):
            self.pre.append((module, hook))

    def module_output(self, module, name: str, scale: float = 1.0) -> None:
        """``name`` is the module's output (times ``scale``, a factor the model applies after the module)."""

        def hook(module, args, output):
            tensor = _output(output)
            seen = tensor * scale if scale != 1.0 else tensor
            new = self.hooks(name, seen)
            if new is seen:
                return None
            return _with_output(output, new / scale if scale != 1.0 else new)

        if self.wants(name):
            self.post.append((module, hook))

    def norm(self, module, prefix: str) -> None:
        """``{prefix}hook_scale`` ``[batch, n, 1]`` and ``{prefix}hook_normalized`` (before gain and bias), from what
        the norm reads: a LayerNorm centres and divides by sqrt(variance + eps), an RMS norm divides by
        sqrt(mean(x^2) + eps). A replacement of either makes the norm's output again from them."""
        names = [prefix + point for point in NORM_POINTS]

        def hook(module, args, output):
            x = args[0].float()
            centred = isinstance(module, torch.nn.LayerNorm)
            if centred:
                x = x - x.mean(dim=-1, keepdim=True)
            eps = module.eps if centred else getattr(module, "variance_epsilon", getattr(module, "eps", None))
            scale = (x.pow(2).mean(dim=-1, keepdim=True) + eps).sqrt()
            new_scale = self.hooks(names[0], scale)
            normalized = x / new_scale
            new = self.hooks(names[1], normalized)
            if new is normalized and new_scale is scale:
                return None
            bias = getattr(module, "bias", None)
            made = new * module.weight.float() + (0.0 if bias is None else bias.float())
            return _with_output(output, made.to(_output(output).dtype))

        if self.wants(*names):
            self.post.append((module, hook))

    # ---- embeddings ----
    def embeddings(self, key: str, stack: StackModules, shared: dict) -> None:
        names = STACKS[key]
        if stack.module is not None:  # an encoder-decoder: each stack says when it runs
            self.stack_marker(stack.module, key)
        if self.wants(names.embed):
            shared.setdefault(id(stack.token_embedding), (stack.token_embedding, {}))[1][key] = stack.token_scale
        if stack.position_embedding is not None and self.wants(names.pos_embed):

            def positions(module, args, output):
                tensor = _output(output)
                seen = tensor.expand(self.batch, *tensor.shape[-2:])  # [n, d] or [1, n, d]: one row for all
                new = self.hooks(names.pos_embed, seen)
                return None if new is seen else _with_output(output, new)

            self.post.append((stack.position_embedding, positions))

    def shared_embeddings(self, shared: dict) -> None:
        """One hook per token embedding module, naming its output by the stack that runs it."""
        for module, scales in shared.values():

            def hook(module, args, output, scales=scales):
                key = self.stack["active"] if len(scales) > 1 else next(iter(scales))
                tensor, scale = _output(output), scales[key]
                seen = tensor * scale if scale != 1.0 else tensor
                new = self.hooks(STACKS[key].embed, seen)
                return None if new is seen else _with_output(output, new / scale if scale != 1.0 else new)

            self.post.append((module, hook))

    def stack_marker(self, module, key: str) -> None:
        def enter(module, args, kwargs):
            self.stack["active"] = key

        self.pre_kwargs.append((module, enter))

    # ---- attention ----
    def attention(self, attention: AttentionModules, prefix: str, out_name: str) -> None:
        names = {point: prefix + point for point in ATTENTION_POINTS}
        head_dim = _width(attention.output) // attention.heads
        projections = ("hook_q", "hook_k", "hook_v")

        def heads_of(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.view(*tensor.shape[:-1], tensor.shape[-1] // head_dim, head_dim)

        def projected(point: str):
            def hook(module, args, output):
                tensor = _output(output)
                seen = heads_of(tensor)
                new = self.hooks(names[point], seen)
                return None if new is seen else _with_output(output, new.reshape(tensor.shape))

            return hook

        def fused(module, args, output):  # GPT-2: one projection gives [q | k | v]
            parts = output.split(output.shape[-1] // 3, dim=-1)
            seen = [heads_of(part) for part in parts]
            new = [self.hooks(names[point], view) for point, view in zip(projections, seen)]
            if all(a is b for a, b in zip(new, seen)):
                return None
            return torch.cat([part.reshape(output.shape[:-1] + (-1,)) for part in new], dim=-1)

        if len(attention.projections) == 1:
            if self.wants(*(names[point] for point in projections)):
                self.post.append((attention.projections[0], fused))
        else:
            for point, module in zip(projections, attention.projections):
                if self.wants(names[point]):
                    self.post.append((module, projected(point)))
        if self.wants(names["hook_attn_scores"], names["hook_pattern"]):
            self.softmax.append((attention.attention, *self.softmax_points(names)))
        if self.wants(names["hook_z"]):

            def concat(module, args):  # Concat(heads), seen as z [batch, n, heads, d_head]
                edited = apply_to_concat(lambda z: self.hooks(names["hook_z"], z), args[0], attention.heads)
                return None if edited is args[0] else (edited, *args[1:])

            self.pre.append((attention.output, concat))
        self.module_output(attention.output, out_name)

    def softmax_points(self, names: dict):
        def on_scores(scores: torch.Tensor) -> torch.Tensor:
            if not self.hooks.wants(names["hook_attn_scores"]):
                return scores
            shown = scores.masked_fill(scores < torch.finfo(scores.dtype).min / 2, float("-inf"))
            new = self.hooks(names["hook_attn_scores"], shown)
            return scores if new is shown else new

        def on_weights(weights: torch.Tensor) -> torch.Tensor:
            return self.hooks(names["hook_pattern"], weights)

        return on_scores, on_weights


def _stack_sites(sites: _Sites, key: str, stack: StackModules, shared: dict) -> None:
    names = STACKS[key]
    sites.embeddings(key, stack, shared)
    for index, layer in enumerate(stack.layers):
        prefix = f"{names.blocks}.{index}."
        sites.block_input(layer.block, prefix + "hook_resid_pre")
        sites.attention(layer.attention, prefix + "attn.", prefix + "hook_attn_out")
        if layer.cross is not None:
            sites.attention(layer.cross, prefix + "cross_attn.", prefix + "hook_cross_attn_out")
        for number, norm in enumerate(layer.norms):
            sites.norm(norm, f"{prefix}ln{number + 1}.")
        sites.module_output(layer.mlp, prefix + "hook_mlp_out")
        if sites.post_norm:  # the sum before the last norm; the block's output is that sum normalised
            sites.module_input(layer.norms[-1], prefix + "hook_resid_post")
            sites.module_output(layer.block, prefix + "hook_normalized_resid_post")
        else:
            sites.module_output(layer.block, prefix + "hook_resid_post")
    if stack.final_norm is not None:
        sites.norm(stack.final_norm, f"{names.final_norm}.")


@contextmanager
def module_points(family: Family | None, base, hooks: Hooks, batch: int) -> Iterator[None]:
    """For the ``with`` block, module hooks on ``base`` (a transformers model of ``family``) take every point that
    ``hooks`` wants, for a pass over ``batch`` texts. The caller holds the model's forward lock."""
    if not hooks:
        yield
        return
    if family is None:
        raise HookError(
            "Named hook points need a model of a family Headscope knows (docs/hooks.md); this one runs with the "
            "transformers engine only as it is."
        )
    sites = _Sites(hooks, batch, family.post_norm)
    shared: dict = {}
    for key, stack in family.modules(base).stacks.items():
        _stack_sites(sites, key, stack, shared)
    sites.shared_embeddings(shared)
    with ExitStack() as stack:
        stack.enter_context(forward_pre_hooks(sites.pre_kwargs, with_kwargs=True))
        stack.enter_context(forward_pre_hooks(sites.pre))
        stack.enter_context(forward_hooks(sites.post))
        stack.enter_context(softmax_hooks(sites.softmax))
        yield
