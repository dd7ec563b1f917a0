"""The long path of the from-scratch engine: attention in blocks of query rows, keeping what makes the weights.

Storing every head's weights is hopeless at length (SmolLM2's 30 x 9 heads at 8,192 tokens: 72 GB). As flash
attention does, a pass here computes each layer's attention a block of query rows at a time and keeps, per
layer, the queries and keys as the scores see them (after rotary positions; grouped KV heads stored once) and
each row's log-sum-exp. Any block of weights is then exact on demand: ``exp(score(q_i, k_j) + bias - lse_i)``.
The values flow through the layer as in the dense path (the same products, block by block), so the hidden
states are the dense path's. Observers see every block of weights once, while it exists, to pool overviews and
stream the head metrics.

``BlockwiseAttention`` is the kernel ``mha_core.attention.attention_kernel`` switches in for the length of one
pass; every family's layer code runs unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..attention import attention_kernel, attention_scores
from ..errors import EngineNotSupported
from ..progress import Progress, report

# One block of scores holds at most this many bytes (heads x rows x keys x 4): a few such buffers live at once.
BLOCK_BYTES = 32 << 20
# What a decoder's hidden keys score in a pass: finite, far below any real score.
HIDDEN_SCORE = -3.0e38
# attention_block never builds more entries than this for one request: larger regions are overviews.
MAX_BLOCK_ENTRIES = 1 << 24


class Scratch:
    """One float32 buffer reused for a tensor of any shape up to the largest asked for: a fresh [heads, rows, n]
    block every time would fault in new pages (glibc serves large blocks by mmap), which costs more than the
    arithmetic on them."""

    def __init__(self):
        self._buffer = torch.empty(0)

    def __call__(self, *shape: int) -> torch.Tensor:
        size = math.prod(shape)
        if self._buffer.numel() < size:
            self._buffer = torch.empty(size)
        return self._buffer[:size].view(*shape)


def scores_into(query: torch.Tensor, key: torch.Tensor, score: str, out: torch.Tensor) -> torch.Tensor:
    """``attention_scores(query, key, score)`` written into ``out`` (the same operations, in the same order)."""
    if score == "scaled":
        return torch.matmul(query * (1.0 / math.sqrt(query.shape[-1])), key.transpose(-2, -1), out=out)
    if score == "dot":
        return torch.matmul(query, key.transpose(-2, -1), out=out)
    return out.copy_(attention_scores(query, key, score))


def as_positions(index, n: int, what: str) -> torch.Tensor:
    """Positions from a slice, a range, a ``(start, stop)`` pair or a sequence of ints, checked against ``n``."""
    if isinstance(index, slice):
        positions = torch.arange(n)[index]
    elif isinstance(index, range):
        positions = torch.tensor(list(index), dtype=torch.long)
    elif isinstance(index, tuple) and len(index) == 2 and all(isinstance(v, (int, np.integer)) for v in index):
        positions = torch.arange(int(index[0]), int(index[1]))
    else:
        positions = torch.as_tensor(np.asarray(index, dtype=np.int64).reshape(-1))
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= n):
        raise ValueError(f"{what} must lie in 0..{n - 1}, got {int(positions.min())}..{int(positions.max())}")
    return positions


@dataclass
class LayerScores:
    """What makes one layer's attention weights: ``weights[h, i, j] = exp(score(q_hi, k_hj) + bias_h(i - j) - lse_hi)``
    for the keys query i sees (j <= i in a decoder), 0 elsewhere."""

    query: torch.Tensor  # [heads, n, d_k], as the scores see it (after rotary positions)
    key: torch.Tensor  # [stored key heads, n, d_k]: a key head that serves several query heads is stored once
    key_of_head: torch.Tensor  # [heads] long: which stored key head each query head reads
    log_sum_exp: torch.Tensor  # [heads, n]: log sum_j exp(score_ij) over the keys row i sees
    score: str  # "scaled" or "dot" (mha_core.attention.attention_scores)
    causal: bool
    bias_by_offset: torch.Tensor | None = None  # [heads, 2n - 1]: MPNet's bias of offset i - j, at i - j + n - 1

    @property
    def num_tokens(self) -> int:
        return self.query.shape[1]

    @property
    def nbytes(self) -> int:
        tensors = (self.query, self.key, self.key_of_head, self.log_sum_exp, self.bias_by_offset)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def scores(self, heads: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``[len(heads), len(rows), len(cols)]`` masked scores (-inf where a decoder's query cannot see)."""
        query = self.query[heads][:, rows]
        key = self.key[self.key_of_head[heads]][:, cols]
        s = attention_scores(query, key, self.score)
        if self.bias_by_offset is not None:
            offsets = rows[:, None] - cols[None, :] + self.num_tokens - 1
            s = s + self.bias_by_offset[heads][:, offsets]
        if self.causal:
            s = s.masked_fill(cols[None, None, :] > rows[None, :, None], float("-inf"))
        return s

    def weights(self, heads, rows, cols) -> torch.Tensor:
        """Exact weights of ``heads`` at ``rows`` x ``cols`` (positions as ``as_positions`` reads them), float32."""
        n = self.num_tokens
        heads = torch.as_tensor(np.asarray(heads, dtype=np.int64).reshape(-1))
        rows, cols = as_positions(rows, n, "rows"), as_positions(cols, n, "cols")
        if len(heads) * len(rows) * len(cols) > MAX_BLOCK_ENTRIES:
            raise ValueError(
                f"a block of {len(rows)} x {len(cols)} for {len(heads)} heads is too large to build at once: "
                "ask for a smaller region, or an overview (attention_overview) of this one"
            )
        s = self.scores(heads, rows, cols)
        return s.sub_(self.log_sum_exp[heads][:, rows, None]).exp_()


def distinct_key_heads(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(stored [K, n, d], key_of_head [H])``: a key head equal to the one before it (grouped-query attention
    repeats each key head for the query heads it serves) is stored once."""
    stored, key_of_head = [key[0]], [0]
    for h in range(1, key.shape[0]):
        if not torch.equal(key[h], stored[-1]):
            stored.append(key[h])
        key_of_head.append(len(stored) - 1)
    return torch.stack(stored).contiguous(), torch.tensor(key_of_head, dtype=torch.long)


def bias_by_offset(mask: torch.Tensor, heads: int, n: int) -> torch.Tensor:
    """An additive score mask that depends only on the offset i - j, as ``[heads, 2n - 1]``; raises when it
    does not (the long path keeps no [n, n] mask)."""
    full = mask[0].expand(heads, n, n)
    offsets = torch.cat([full[:, 0, :].flip(-1), full[:, 1:, 0]], dim=-1)
    index = torch.arange(n)
    for start in range(0, n, 256):  # checked a band of rows at a time
        rows = index[start : start + 256]
        rebuilt = offsets[:, rows[:, None] - index[None, :] + n - 1]
        if not torch.equal(rebuilt, full[:, start : start + 256]):
            raise EngineNotSupported("the long path supports score biases that depend only on the offset i - j")
    return offsets.contiguous()


class BlockwiseAttention:
    """The attention kernel of a long pass: called once per layer, in order, with that layer's
    ``q, k, v [1, heads, n, d]``; returns ``(output, None)`` and keeps the layer's ``LayerScores``.

    ``observers``: objects with ``add(layer, row_start, weights [heads, rows, keys], logs)`` that see every block
    of exact weights once (a decoder's block holds the keys up to its last row: the rest are 0); ``logs`` is
    ``(shifted [heads, rows, keys], log_total [heads, rows, 1])`` with ln w = shifted - log_total.
    ``progress(done, total, message)`` after every block, ``total`` the number of layers (it may raise to stop).
    """

    def __init__(self, num_layers: int, observers: Sequence = (), progress: Progress | None = None):
        self.num_layers = num_layers
        self.observers = list(observers)
        self.progress = progress
        self.layers: list[LayerScores] = []
        self._bias_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._scores, self._weights = Scratch(), Scratch()

    def _bias(self, mask, heads: int, n: int) -> torch.Tensor | None:
        if mask is None:
            return None
        if mask.dtype == torch.bool:
            if not bool(mask.all()):
                raise EngineNotSupported("the long path reads one text without padding")
            return None
        if self._bias_cache is not None and self._bias_cache[0] is mask:  # MPNet: one bias for every layer
            return self._bias_cache[1]
        bias = bias_by_offset(mask.float(), heads, n)
        self._bias_cache = (mask, bias)
        return bias

    def __call__(self, q, k, v, mask, causal: bool, score: str):
        if q.shape[0] != 1:
            raise EngineNotSupported("the long path reads one text at a time (batch of 1)")
        if q.shape[-2] != k.shape[-2]:
            raise EngineNotSupported("the long path computes self-attention only")
        layer = len(self.layers)
        query, key, value = q[0], k[0], v[0]
        heads, n, _ = query.shape
        bias = self._bias(mask, heads, n)
        stored_key, key_of_head = distinct_key_heads(key)
        scores = LayerScores(
            query=query.clone(memory_format=torch.contiguous_format),
            key=stored_key,
            key_of_head=key_of_head,
            log_sum_exp=torch.empty(heads, n),
            score=score,
            causal=bool(causal),
            bias_by_offset=bias,
        )
        output = torch.empty(heads, n, value.shape[-1], dtype=value.dtype)
        block_rows = max(1, min(n, BLOCK_BYTES // (4 * heads * n)))
        all_heads = torch.arange(heads)
        for start in range(0, n, block_rows):
            stop = min(n, start + block_rows)
            keys = stop if causal else n  # a decoder's rows here see no key after ``stop``
            rows, cols = torch.arange(start, stop), torch.arange(keys)
            s = scores_into(query[:, start:stop], key[:, :keys], score, self._scores(heads, stop - start, keys))
            if bias is not None:
                s += bias[all_heads][:, rows[:, None] - cols[None, :] + n - 1]
            if causal:  # a finite fill: exp gives 0 all the same, and 0 x fill stays 0 (not NaN) below
                s.masked_fill_(cols[None, None, :] > rows[None, :, None], HIDDEN_SCORE)
            # softmax as torch computes it (subtract the row max, exponentiate, divide by the sum), keeping
            # log-sum-exp = max + log(sum) for every later block of this layer.
            row_max = s.amax(dim=-1, keepdim=True)
            shifted = s.sub_(row_max)
            weights = torch.exp(shifted, out=self._weights(*shifted.shape))
            total = weights.sum(dim=-1, keepdim=True)
            weights.div_(total)
            log_total = total.log()
            scores.log_sum_exp[:, start:stop] = (row_max + log_total)[..., 0]
            output[:, start:stop] = torch.matmul(weights, value[:, :keys])
            # ln w_ij = shifted_ij - log_total_i: observers that need the logs (entropy) read them from here.
            logs = (shifted, log_total)
            for observer in self.observers:
                observer.add(layer, start, weights, logs)
            del shifted, weights
            report(self.progress, layer + stop / n, self.num_layers, f"layer {layer + 1} of {self.num_layers}")
        self.layers.append(scores)
        return output[None], None

    def run(self, forward, *args, **kwargs):
        """``forward(*args, **kwargs)`` with this kernel in every layer's attention."""
        with attention_kernel(self):
            return forward(*args, **kwargs)
