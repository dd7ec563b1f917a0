"""Scaled dot-product attention and multi-head attention, written from the formulas.

    Attention(Q, K, V) = softmax(score(Q, K) + mask) V
    head_i             = Attention(X W_i^Q, X W_i^K, X W_i^V)
    MultiHead(X)       = Concat(head_1, ..., head_h) W^O

Nothing here wraps ``torch.nn.MultiheadAttention`` or ``F.scaled_dot_product_attention``;
the tests compare against both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import nn

from . import native
from .hooks import HookError, Points, as_points
from .pages import MIN_BYTES, written_buffer

SCORE_FUNCTIONS = ("dot", "scaled", "cosine")


def attention_scores(
    q: torch.Tensor, k: torch.Tensor, score: str = "scaled", out: torch.Tensor | None = None
) -> torch.Tensor:
    """Similarity of every query with every key, ``[..., n_query, n_key]`` (course notes 002, section 4.1).

    dot:    Q K^T
    scaled: Q K^T / sqrt(d_k)   (keeps the score variance near 1 as d_k grows)
    cosine: Q K^T / (|Q| |K|)   (bounded in [-1, 1], so softmax never saturates)

    ``out``: a buffer of that shape to write them into (not with autograd).
    """
    if score == "scaled":
        # Scaling q before the product costs n*d_k multiplications instead of n*n.
        return torch.matmul(q * (1.0 / math.sqrt(q.shape[-1])), k.transpose(-2, -1), out=out)
    if score == "dot":
        return torch.matmul(q, k.transpose(-2, -1), out=out)
    if score == "cosine":
        return torch.matmul(F.normalize(q, dim=-1), F.normalize(k, dim=-1).transpose(-2, -1), out=out)
    raise ValueError(f"score must be one of {SCORE_FUNCTIONS}, got {score!r}")


# oneDNN's matrix product, which torch's own compiler uses for CPU linear layers, is taken for products that autograd
# does not follow (it has no gradient for its input): on an AMD EPYC with AVX-512 it took 0.79-0.94 of MKL's time
# for the core's product shapes, and the whole core 0.87-0.99 of its time with MKL at d_model 768 (docs/benchmarks.md).
_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
USE_ONEDNN = _ONEDNN_LINEAR is not None and torch.backends.mkldnn.is_available()


def _autograd_follows(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd records what is computed from these tensors (None: no tensor)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _onednn_takes(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    if not USE_ONEDNN or x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32:
        return False
    if bias is not None and bias.dtype != torch.float32:
        return False
    if not x.is_contiguous():  # oneDNN copies such an operand first; MKL reads a transposed one as it is
        return False
    return not _autograd_follows(x, weight, bias)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x W^T + b`` on a 2-D view (on CPU the 3-D path is up to 2x slower for short sequences); through oneDNN
    when autograd does not follow it (``USE_ONEDNN``), else ``F.linear``: the same numbers to float32 rounding."""
    flat = x.reshape(-1, x.shape[-1])
    if _onednn_takes(flat, weight, bias):
        out = _ONEDNN_LINEAR(flat, weight, bias, attr="none", scalars=[], algorithm="")
    else:
        out = F.linear(flat, weight, bias)
    return out.view(*x.shape[:-1], weight.shape[0])


def causal_keep_mask(n_query: int, n_key: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean ``[n_query, n_key]``: True where query i may see key j (j <= i + n_key - n_query)."""
    return torch.ones(n_query, n_key, dtype=torch.bool, device=device).tril(diagonal=n_key - n_query)


def _keep_mask(scores: torch.Tensor, mask: torch.Tensor | None, causal: bool) -> torch.Tensor | None:
    """Boolean keep-mask (True = may attend) from a bool mask, an additive mask's finite entries, and causality."""
    keep = None
    if mask is not None:
        if mask.dtype == torch.bool:
            keep = mask
        else:
            finite = torch.isfinite(mask)
            keep = None if bool(finite.all()) else finite
    if causal:
        tri = causal_keep_mask(scores.shape[-2], scores.shape[-1], scores.device)
        keep = tri if keep is None else keep & tri
    return keep


def masked_scores(
    scores: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(scores + mask with -inf at every hidden key, the keep-mask or None)``: what the softmax reads
    (``attn.hook_attn_scores``). ``mask`` is boolean (True = attend) or additive float (0 = attend, -inf or a large
    negative number = do not), broadcast against ``scores``."""
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask.to(scores.dtype)  # additive mask: -inf where hidden
    keep = _keep_mask(scores, mask, causal)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))  # hidden keys get -inf: exp(-inf) = 0
    return scores, keep


def softmax_rows(scores: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last axis; a row whose keys are all hidden (``keep``) gets all-zero weights, not the NaN
    that 0/0 would give."""
    weights = torch.softmax(scores, dim=-1)
    if keep is not None:
        weights = weights.masked_fill(~keep.any(dim=-1, keepdim=True), 0.0)
    return weights


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """softmax(scores + mask) over the last axis: the formula, step by step.

    ``mask`` is either boolean (True = attend) or additive float (0 = attend, -inf or a large
    negative number = do not), broadcast against ``scores``. ``torch.softmax`` subtracts the row
    maximum before exponentiating, so scores of any magnitude stay finite. A row whose keys are
    all masked gets all-zero weights instead of the NaN that 0/0 would give.
    """
    return softmax_rows(*masked_scores(scores, mask, causal))


def masked_softmax_(scores: torch.Tensor, mask: torch.Tensor | None = None, causal: bool = False) -> torch.Tensor:
    """``masked_softmax`` written into ``scores`` itself (an optimisation; the tests check it equals the formula).

    A fresh [n, n] buffer costs page faults that take longer than the softmax (4x at n = 1024), so when
    autograd does not need the scores, they are overwritten. Where a mask would have to grow ``scores``
    by broadcasting, that step falls back to a new tensor.
    """

    def fits(other: torch.Tensor) -> bool:  # an in-place op cannot grow ``scores`` by broadcasting
        return torch.broadcast_shapes(other.shape, scores.shape) == scores.shape

    if mask is not None and mask.dtype != torch.bool:
        additive = mask.to(scores.dtype)
        scores = scores.add_(additive) if fits(additive) else scores + additive
    keep = _keep_mask(scores, mask, causal)
    if keep is not None:
        scores = scores.masked_fill_(~keep, float("-inf")) if fits(keep) else scores.masked_fill(~keep, float("-inf"))
    weights = torch.softmax(scores, dim=-1, out=scores)
    if keep is not None:
        empty_rows = ~keep.any(dim=-1, keepdim=True)
        weights = weights.masked_fill_(empty_rows, 0.0) if fits(empty_rows) else weights.masked_fill(empty_rows, 0.0)
    return weights


# The long path (mha_core.engine.blockwise) replaces the dense softmax of every layer's attention with a blockwise
# one for the length of a pass: one switch here, so that every family's layer code stays as it is.
_ATTENTION_KERNEL: ContextVar[Callable | None] = ContextVar("attention_kernel", default=None)


@contextmanager
def attention_kernel(kernel: Callable) -> Iterator[None]:
    """Within the block, ``scaled_dot_product_attention(q, k, v, mask, causal, score)`` returns
    ``kernel(q, k, v, mask, causal, score)``: ``(output, None)`` for a kernel that keeps no dense weights."""
    token = _ATTENTION_KERNEL.set(kernel)
    try:
        yield
    finally:
        _ATTENTION_KERNEL.reset(token)


def _scores_buffer(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """Where autograd does not follow the scores and they are large, a fresh buffer for them in huge pages
    (``mha_core.pages``: the product writes it whole; faulting in its 4 KB pages took longer than the product); else
    None (the product allocates)."""
    if _autograd_follows(q, k):
        return None
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    if math.prod(shape) * q.element_size() < MIN_BYTES:
        return None
    return written_buffer(shape, dtype=q.dtype, device=q.device)


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    causal: bool = False,
    score: str = "scaled",
    hooks: Points | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(score(q, k) + mask) v. Shapes ``[..., n_q, d_k]``, ``[..., n_k, d_k]``, ``[..., n_k, d_v]``.

    Returns ``(output [..., n_q, d_v], weights [..., n_q, n_k])``. ``hooks`` (``mha_core.hooks``): the points
    ``hook_attn_scores`` (what the softmax reads: scaled, with the mask's bias, -inf at hidden keys) and
    ``hook_pattern`` (the weights), each ``[batch, head, query, key]``.

    Without autograd, a mask or a hook on the scores or pattern, ``MultiHeadAttention``'s one-sequence layout (each
    head's block transposed) goes to ``native.attend`` where the C kernels are built: the scores, softmax and output
    of a block of query rows at a time, while they are in cache (0.78-0.83 of the three passes' time at d_k = 32,
    n = 256; docs/benchmarks.md). The same numbers to float32 rounding.
    """
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"query and key must share their last dimension, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"key and value must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    hooked = hooks is not None and (hooks.wants("hook_attn_scores") or hooks.wants("hook_pattern"))
    kernel = _ATTENTION_KERNEL.get()
    if kernel is not None:
        if hooked:
            raise HookError("A long run computes attention in blocks: it has no scores or pattern to hook.")
        return kernel(q, k, v, mask=mask, causal=causal, score=score)
    unmasked = not hooked and mask is None and score in ("dot", "scaled") and not _autograd_follows(q, k, v)
    if unmasked and native.attends(q, k, v):  # MultiHeadAttention's one sequence: scores to output a block at a time
        scale = 1.0 / math.sqrt(q.shape[-1]) if score == "scaled" else 1.0
        return native.attend(q, k, v, scale, causal, weights=_scores_buffer(q, k))
    scores = attention_scores(q, k, score, out=_scores_buffer(q, k))
    if hooked:  # the scores are kept or replaced: they are not overwritten by the weights
        scores, keep = masked_scores(scores, mask, causal)
        weights = hooks("hook_pattern", softmax_rows(hooks("hook_attn_scores", scores), keep))
    elif _autograd_follows(scores):
        weights = masked_softmax(scores, mask, causal)
    else:
        weights = masked_softmax_(scores, mask, causal)  # the same numbers, without a second [n, n] buffer
    if v.stride(-2) == 1 and v.stride(-1) != 1:
        # v is a transposed view (MultiHeadAttention's one-sequence projection): the output is written the same way,
        # (V^T W^T)^T, so that Concat of the heads is a view of it. The same products, the same numbers.
        return torch.matmul(v.transpose(-2, -1), weights.transpose(-2, -1)).transpose(-2, -1), weights
    return torch.matmul(weights, v), weights


def head_point(hooks: Points, name: str, heads: torch.Tensor) -> torch.Tensor:
    """The point ``name`` on per-head vectors ``[batch, heads, n, d]``, seen as ``[batch, n, heads, d]``
    (TransformerLens' layout of q, k, v and z)."""
    if not hooks.wants(name):
        return heads
    return hooks(name, heads.transpose(1, 2)).transpose(1, 2)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with the W^Q, W^K, W^V, W^O of the seeds.

    The three input projections live in one fused ``[3 * h * d_k, d_model]`` matrix, so
    self-attention projects X once; ``W_q``, ``W_k``, ``W_v`` are views of its thirds, laid
    out as ``nn.Linear`` weights (``[out, in]``: X W^Q in the seeds' notation is ``X @ W_q.T``).
    """

    def __init__(self, d_model: int, num_heads: int, bias: bool = True, score: str = "scaled", d_k: int | None = None):
        super().__init__()
        if num_heads <= 0 or d_model <= 0:
            raise ValueError(f"d_model and num_heads must be positive, got {d_model} and {num_heads}")
        if d_k is None:
            if d_model % num_heads != 0:
                raise ValueError(
                    f"d_model ({d_model}) must be divisible by num_heads ({num_heads}) so each head gets "
                    f"d_k = d_model / num_heads dimensions; pass d_k explicitly to choose another size"
                )
            d_k = d_model // num_heads
        if score not in SCORE_FUNCTIONS:
            raise ValueError(f"score must be one of {SCORE_FUNCTIONS}, got {score!r}")
        self.d_model, self.num_heads, self.d_k, self.score = d_model, num_heads, d_k, score
        inner = num_heads * d_k
        self.qkv_weight = nn.Parameter(torch.empty(3 * inner, d_model))
        self.qkv_bias = nn.Parameter(torch.zeros(3 * inner)) if bias else None
        self.out_proj = nn.Linear(inner, d_model, bias=bias)
        nn.init.xavier_uniform_(self.qkv_weight)

    # Views of the fused projection, one per role.
    @property
    def W_q(self) -> torch.Tensor:
        return self.qkv_weight[: self.num_heads * self.d_k]

    @property
    def W_k(self) -> torch.Tensor:
        inner = self.num_heads * self.d_k
        return self.qkv_weight[inner : 2 * inner]

    @property
    def W_v(self) -> torch.Tensor:
        return self.qkv_weight[2 * self.num_heads * self.d_k :]

    @property
    def W_o(self) -> torch.Tensor:
        return self.out_proj.weight

    @torch.no_grad()
    def set_weights(
        self,
        w_q: torch.Tensor,
        w_k: torch.Tensor,
        w_v: torch.Tensor,
        w_o: torch.Tensor,
        b_q: torch.Tensor | None = None,
        b_k: torch.Tensor | None = None,
        b_v: torch.Tensor | None = None,
        b_o: torch.Tensor | None = None,
    ) -> MultiHeadAttention:
        """Copy projection weights given in ``nn.Linear`` layout (``[out, in]``)."""
        self.qkv_weight.copy_(torch.cat([w_q, w_k, w_v], dim=0))
        if self.qkv_bias is not None:
            zeros = torch.zeros(self.num_heads * self.d_k)
            self.qkv_bias.copy_(torch.cat([zeros if b is None else b for b in (b_q, b_k, b_v)]))
        self.out_proj.weight.copy_(w_o)
        if self.out_proj.bias is not None:
            self.out_proj.bias.copy_(torch.zeros(self.d_model) if b_o is None else b_o)
        return self

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of a ``torch.nn.MultiheadAttention`` (its ``batch_first`` does not matter: ours is batch-first)."""
        if module.in_proj_weight is None:  # separate q, k, v projections: kdim or vdim != embed_dim
            raise ValueError("from_torch supports nn.MultiheadAttention with kdim == vdim == embed_dim only")
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("from_torch does not support add_bias_kv or add_zero_attn")
        mha = cls(module.embed_dim, module.num_heads, bias=module.in_proj_bias is not None)
        with torch.no_grad():
            mha.qkv_weight.copy_(module.in_proj_weight)
            if mha.qkv_bias is not None:
                mha.qkv_bias.copy_(module.in_proj_bias)
            mha.out_proj.weight.copy_(module.out_proj.weight)
            if mha.out_proj.bias is not None:
                mha.out_proj.bias.copy_(module.out_proj.bias)
        return mha.to(module.in_proj_weight.dtype)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, n, h * d_k]`` -> ``[batch, h, n, d_k]``."""
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.d_k).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """``[batch, h, n, d_k]`` -> ``[batch, n, h * d_k]`` (the Concat of the formula)."""
        b, _, n, _ = x.shape
        return x.transpose(1, 2).reshape(b, n, self.num_heads * self.d_k)

    def project(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Q, K, V as ``[batch, heads, n, d_k]``; one fused matmul when key and value are the query."""
        inner = self.num_heads * self.d_k
        if key is query and value is query and not torch.is_grad_enabled():
            return self._project_packed(query)
        if key is query and value is query:
            q, k, v = linear(query, self.qkv_weight, self.qkv_bias).split(inner, dim=-1)
        else:
            b_q = b_k = b_v = None
            if self.qkv_bias is not None:
                b_q, b_k, b_v = self.qkv_bias.split(inner)
            q = linear(query, self.W_q, b_q)
            k = linear(key, self.W_k, b_k)
            v = linear(value, self.W_v, b_v)
        return self.split_heads(q), self.split_heads(k), self.split_heads(v)

    def _project_packed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention's Q, K, V without autograd, each head's block contiguous, so that the attention products read
        them in order (split heads of one ``[n, 3 * h * d_k]`` product are strided views whose batched products
        measured slower, bench/core.py). One sequence is projected transposed, ``W X^T`` (``[3 * h * d_k, n]``): each
        head's Q^T, K^T, V^T is a contiguous ``[d_k, n]`` block and q, k, v are its transposed views (no copy).
        ``scaled_dot_product_attention`` gives these to ``native.attend``, which writes the heads' outputs as Concat;
        without the C kernels, torch's products read them through the BLAS's transpose flags and write each head's
        output in the same layout, so that ``merge_heads`` is a view too (no copy of Q, K, V or of the heads' outputs;
        docs/benchmarks.md). A batch is projected in one product and laid out ``[3, batch, heads, n, d_k]`` with one
        copy. The same numbers as ``project``."""
        b, n, _ = x.shape
        h, d_k = self.num_heads, self.d_k
        if b == 1:
            product = linear(self.qkv_weight, x[0], None)  # W X^T: row r of the weight becomes row r of the product
            if self.qkv_bias is not None:
                product.add_(self.qkv_bias[:, None])
            qkv = product.view(3, 1, h, d_k, n).transpose(-2, -1)
        else:
            product = linear(x, self.qkv_weight, self.qkv_bias)
            qkv = torch.empty((3, b, h, n, d_k), dtype=product.dtype, device=product.device)
            qkv.copy_(product.view(b, n, 3, h, d_k).permute(2, 0, 3, 1, 4))
        return qkv[0], qkv[1], qkv[2]

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        key_padding_mask: torch.Tensor | None = None,
        hooks=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(output [batch, n_q, d_model], weights [batch, heads, n_q, n_k])``.

        ``hooks``: ``{name: function}`` or a ``mha_core.hooks`` scope, on the points ``hook_q``, ``hook_k``,
        ``hook_v`` (``[batch, n, heads, d_k]``), ``hook_attn_scores``, ``hook_pattern`` (``[batch, heads, n_q, n_k]``:
        the weights returned are the pattern after its hook) and ``hook_z`` (each head's output before Concat and
        W^O, ``[batch, n_q, heads, d_k]``: ``mha_core.edits``' zero or mean ablation, the Lab's head mask,
        importance gates, patching).

        ``key``/``value`` default to ``query`` (self-attention); ``value`` defaults to ``key``.
        ``mask`` broadcasts to ``[batch, heads, n_q, n_k]`` (bool keep-mask or additive float);
        ``key_padding_mask`` is ``[batch, n_k]`` bool, True for real tokens.
        Unbatched ``[n, d_model]`` input gives ``[n, d_model]`` and ``[heads, n_q, n_k]``.
        """
        if key is None:
            key = query
        if value is None:
            value = key
        hooks = as_points(hooks)
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(0), key.unsqueeze(0), value.unsqueeze(0)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3:
                raise ValueError(f"{name} must be [batch, n, d_model] or [n, d_model], got shape {tuple(t.shape)}")
            if t.shape[-1] != self.d_model:
                raise ValueError(f"{name} last dimension must be d_model={self.d_model}, got {t.shape[-1]}")
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value must have the same length, got {key.shape[1]} and {value.shape[1]}")
        if key_padding_mask is not None:
            pad = key_padding_mask[:, None, None, :].to(torch.bool)
            if mask is None:
                mask = pad
            elif mask.dtype == torch.bool:
                mask = mask & pad
            else:
                mask = mask.masked_fill(~pad, float("-inf"))
        q, k, v = (
            head_point(hooks, name, t)
            for name, t in zip(("hook_q", "hook_k", "hook_v"), self.project(query, key, value))
        )
        score = self.score
        if score == "scaled" and not hooks.wants("hook_q") and not _autograd_follows(q) and not native.attends(q, k, v):
            # 1/sqrt(d_k) folded into the queries in place (native.attend scales each score as it computes it): their
            # memory is this call's own projection (nothing else holds it), so the scaled product costs no new [n, d]
            # buffer. The same numbers as "scaled".
            q, score = q.mul_(1.0 / math.sqrt(self.d_k)), "dot"
        heads, weights = scaled_dot_product_attention(q, k, v, mask=mask, causal=causal, score=score, hooks=hooks)
        merged = self.merge_heads(head_point(hooks, "hook_z", heads))
        out = linear(merged, self.out_proj.weight, self.out_proj.bias)
        if unbatched:
            return out[0], weights[0]
        return out, weights
