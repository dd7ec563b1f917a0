"""``LabModel``: a tiny causal transformer built on ``MultiHeadAttention``, and its training loss."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import MultiHeadAttention
from ..edits import chain, scale_heads
from ..errors import HeadscopeError
from ..hooks import NO_HOOKS, HookFunction, Hooks, Points, block_point
from ..positional import sinusoidal_encoding
from .config import LabConfig
from .tasks import IGNORE


# ---- the model --------------------------------------------------------------------------------------
class LabBlock(nn.Module):
    def __init__(self, config: LabConfig):
        super().__init__()
        self.attention_norm = nn.LayerNorm(config.d_model)
        self.attention = MultiHeadAttention(config.d_model, config.num_heads)
        self.mlp = None
        if config.mlp:
            self.mlp_norm = nn.LayerNorm(config.d_model)
            self.mlp = nn.Sequential(
                nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(), nn.Linear(4 * config.d_model, config.d_model)
            )

    def forward(self, x: torch.Tensor, hooks: Points = NO_HOOKS) -> tuple[torch.Tensor, torch.Tensor]:
        """A pre-LN block; ``hooks``: its named points (``hook_resid_pre``, ``attn.*``, ``hook_attn_out``,
        ``hook_mlp_out``, ``hook_resid_post``)."""
        x = hooks("hook_resid_pre", x)
        attended, weights = self.attention(self.attention_norm(x), causal=True, hooks=hooks.scope("attn."))
        x = x + hooks("hook_attn_out", attended)
        if self.mlp is not None:
            x = x + hooks("hook_mlp_out", self.mlp(self.mlp_norm(x)))
        return hooks("hook_resid_post", x), weights


class LabModel(nn.Module):
    """A causal transformer: embedding (+ positions) -> blocks of MultiHeadAttention -> LayerNorm -> unembedding."""

    def __init__(self, config: LabConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        rows = config.position_rows()
        if config.positions == "learned":
            self.position = nn.Parameter(torch.randn(rows, config.d_model))
        elif config.positions == "sinusoidal":
            self.register_buffer(
                "position", torch.as_tensor(sinusoidal_encoding(rows, config.d_model), dtype=torch.float32)
            )
        else:
            self.position = None
        self.blocks = nn.ModuleList(LabBlock(config) for _ in range(config.num_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(
        self,
        ids: torch.Tensor,
        head_mask: torch.Tensor | None = None,
        offsets: torch.Tensor | None = None,
        hooks: Mapping[str, HookFunction] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``ids [B, n]`` -> ``(logits [B, n, vocab], [weights [B, H, n, n] per layer])``.

        ``head_mask [L, H]``: each head's output times its factor (``mha_core.edits.scale_heads`` on the named point
        ``blocks.{l}.attn.hook_z``): 0 zero-ablates it, 1 keeps it. ``hooks``: ``{name: function}`` on the
        named points (``hook_embed``, ``blocks.{l}.`` as in ``LabBlock``; docs/hooks.md).
        ``offsets [B]`` (training): sequence b reads the position rows ``offsets[b] ... offsets[b] + n - 1``
        (at most ``position_offsets``); none = rows ``0 ... n - 1``.
        """
        n = ids.shape[-1]
        if n > self.config.seq_len:
            raise HeadscopeError(f"the lab model reads at most {self.config.seq_len} tokens, got {n}")
        functions = dict(hooks or {})
        for layer in range(len(self.blocks) if head_mask is not None else 0):
            name = block_point(layer, "attn.hook_z")
            functions[name] = chain(scale_heads(head_mask[layer]), functions.get(name))
        points = Hooks(functions) if functions else NO_HOOKS
        x = points("hook_embed", self.embed(ids))
        if self.position is not None:
            if offsets is None:
                x = x + self.position[:n]
            else:
                x = x + self.position[offsets[:, None] + torch.arange(n)]
        weights = []
        for layer, block in enumerate(self.blocks):
            x, layer_weights = block(x, points.scope(block_point(layer, "")))
            weights.append(layer_weights)
        return self.unembed(self.final_norm(x)), weights


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """Mean cross-entropy over the trained positions (and only those in ``where``, when given)."""
    if where is not None:
        targets = targets.masked_fill(~where, IGNORE)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def training_loss(
    logits: torch.Tensor, targets: torch.Tensor, focus: torch.Tensor, other_weight: float
) -> torch.Tensor:
    """The weighted mean cross-entropy training minimises: weight 1 on the ``focus`` positions and
    ``other_weight`` on the other trained ones (``masked_loss`` when that is 1)."""
    if other_weight == 1.0:
        return masked_loss(logits, targets)
    targets = targets.reshape(-1)
    per_position = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets, ignore_index=IGNORE, reduction="none")
    weights = torch.where(focus.reshape(-1), 1.0, other_weight) * (targets != IGNORE)
    return (per_position * weights).sum() / weights.sum()
