"""The long path of the from-scratch engine: attention in blocks of query rows, keeping what makes the weights.

Storing every head's weights is hopeless at length (SmolLM2's 30 x 9 heads at 8,192 tokens: 72 GB). As flash
attention does, a pass here computes each layer's attention a block of query rows at a time and keeps, per
layer, the queries and keys as the scores see them (after rotary positions; grouped KV heads stored once) and
each row's log-sum-exp. Any block of weights is then exact on demand: ``exp(score(q_i, k_j) + bias - lse_i)``.
The values flow through the layer as in the dense path (the same products, block by block), so the hidden
states are the dense path's. Observers see every block of weights once, while it exists, to pool overviews and
stream the head metrics. Where the C kernels are built (``mha_core.native``), each block's softmax and the row
reductions the observers read come from one trip over the block (``native.row_pass``), which writes the weights
over the scores; elsewhere torch's operations compute the same numbers, a pass each.

``BlockwiseAttention`` is the kernel ``mha_core.attention.attention_kernel`` switches in for the length of one
pass; every family's layer code runs unchanged.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .. import native
from ..attention import attention_kernel, attention_scores
from ..errors import EngineNotSupported
from ..pooling import chunk_reduce, first_argmax
from ..progress import Progress, report

# One block of scores holds at most this many bytes (heads x rows x keys x 4): a few such buffers live at once. The
# C row pass (mha_core.native.row_pass) writes the weights over the scores, so its blocks hold twice this, in the
# same memory (no second buffer for the weights): fewer, larger products ran faster (SmolLM2 at 4,096 tokens:
# 13.3-14.4 s at 32 MB, 15.2-15.6 s at 16 MB, 18.7-20.8 s at 4 MB).
BLOCK_BYTES = 16 << 20
# What a decoder's hidden keys score in a pass: finite, far below any real score.
HIDDEN_SCORE = -3.0e38
# Keys per chunk of a block's chunk maxima and sums (``Block.chunks``).
CHUNK = 32
# A block's rows are a multiple of this (when there are more): whole tiles of the products, and a decoder's keys
# (up to the block's last row) whole chunks.
ROW_TILE = CHUNK
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


def flushing_denormals() -> bool:
    """Whether this thread's float arithmetic flushes denormal numbers (below 1.2e-38) to zero."""
    return bool(torch.tensor(1e-39) * 2 == 0)


@contextlib.contextmanager
def denormals_flushed() -> Iterator[None]:
    """This thread's float arithmetic flushes denormal numbers to zero inside (``torch.set_flush_denormal``), and
    is as it was afterwards. A softmax row whose scores lie far below its largest (a sink, a peaked head: how far
    depends on the text) has many exponentials below 1.2e-38, and without flushing the processor computes each
    in a slow path: a block's softmax took 4.5 x as long (69 ms against 15 ms, scores spread 20 around a sink).
    A weight below 1.2e-38 becomes 0, far below float32's resolution of any sum of weights. The setting is the
    calling thread's only: a pass on one torch thread (the app's) flushes everywhere; other threads of torch's
    pool do not see it."""
    if flushing_denormals():
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def scores_into(query: torch.Tensor, key: torch.Tensor, score: str, out: torch.Tensor) -> torch.Tensor:
    """``attention_scores(query, key, score)`` written into ``out`` (the same operations, in the same order; the
    kernel scales a layer's queries once and asks for "dot")."""
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


@dataclass
class Block:
    """One block of a layer's exact weights, as the kernel hands it to its observers while it exists.

    weights      ``[heads, rows, keys]``: rows ``row_start ..`` of ``layer``; a decoder's block holds the keys up to
                 its last row (the rest are 0)
    scores       ``[heads, rows, keys]``: the scores the weights come from, so that ln w = scores - log_sum_exp
                 (a decoder's hidden keys hold ``HIDDEN_SCORE``); None when the kernel wrote the weights over them
                 (``mha_core.native.row_pass``, which gave ``score_sums``)
    log_sum_exp  ``[heads, rows, 1]``
    score_sums   ``[heads, rows]``: sum_j w_ij scores_ij, when the kernel had it (from its product with the values,
                 or from the native row pass) (``weighted_scores``)
    reductions   what is known of the weights, by name: ``"max"``, ``"sum"`` (``chunks``), ``"row_max"``
                 (``max_weight``), ``"argmax"``, ``"columns"`` (``column_sums``); the native row pass gives them all,
                 else each is computed at its first use
    """

    layer: int
    row_start: int
    weights: torch.Tensor
    scores: torch.Tensor | None
    log_sum_exp: torch.Tensor | None = None
    features: torch.Tensor | None = None
    feature_sums: torch.Tensor | None = None
    score_sums: torch.Tensor | None = None
    reductions: dict = field(default_factory=dict, repr=False)

    def chunks(self, reduce: str) -> torch.Tensor:
        """``[heads, rows, ceil(keys / CHUNK)]``: the max or sum of each run of ``CHUNK`` keys, computed once per
        block for every observer that reads them (argmax, the 90% window, the overviews)."""
        if reduce not in self.reductions:
            self.reductions[reduce] = chunk_reduce(self.weights, CHUNK, reduce)
        return self.reductions[reduce]

    @property
    def max_weight(self) -> torch.Tensor:
        """``[heads, rows]``: each row's largest weight."""
        if "row_max" not in self.reductions:
            self.reductions["row_max"] = self.chunks("max").amax(dim=-1)
        return self.reductions["row_max"]

    @property
    def argmax(self) -> torch.Tensor:
        """``[heads, rows]`` long: each row's first key holding its largest weight (``torch.argmax``'s answer)."""
        if "argmax" not in self.reductions:
            self.reductions["argmax"] = first_argmax(self.weights, self.chunks("max"), self.max_weight, CHUNK)
        return self.reductions["argmax"]

    def weighted_scores(self, buffer: torch.Tensor | None = None) -> torch.Tensor:
        """``[heads, rows]``: sum_j w_ij scores_ij (what sum w ln w is made of). From the kernel's product with the
        values when it gave them (``score_sums``), else one pass over the block (its product written into
        ``buffer``, a tensor of the block's shape, when given)."""
        if self.score_sums is not None:
            return self.score_sums
        return torch.mul(self.weights, self.scores, out=buffer).sum(dim=-1)

    @property
    def column_sums(self) -> torch.Tensor:
        """``[heads, keys]``: the block's weights summed over its rows (float32), from the native row pass when it
        ran, else a product with ones (which reads the block row by row; a sum over the rows axis would stride
        across it)."""
        if "columns" not in self.reductions:
            heads, rows, _ = self.weights.shape
            self.reductions["columns"] = torch.matmul(torch.ones(heads, 1, rows), self.weights)[:, 0]
        return self.reductions["columns"]

    def key_sums(self, features: torch.Tensor) -> torch.Tensor:
        """``[heads, rows, f]``: sum_j w_ij features[j] for ``features [n, f]``. When the kernel was given these
        features they came out of the product with the values (one pass over the block for both)."""
        if features is self.features and self.feature_sums is not None:
            return self.feature_sums
        return torch.matmul(self.weights, features[: self.weights.shape[-1]])


class BlockwiseAttention:
    """The attention kernel of a long pass: called once per layer, in order, with that layer's
    ``q, k, v [1, heads, n, d]``; returns ``(output, None)`` and keeps the layer's ``LayerScores``.

    ``observers``: objects with ``add(block: Block)`` that see every block of exact weights once.
    ``key_features [n, f]``: key features whose weighted sums observers read (``Block.key_sums``); they ride along
    with the values in the block's one product with them. ``score_sums``: give each block sum_j w_ij scores_ij
    (``Block.score_sums``) from the same product: a score is q_i . k_j, so the sum is q_i . (sum_j w_ij k_j), and
    the keys ride along as well (64 more columns of a product that runs near the machine's peak, against a pass
    that writes and reads the block twice; not with a score bias, as MPNet's, nor cosine scores: there the
    observers make the pass; the C row pass gives the sums on every block and the keys stay out of the product).
    ``progress(done, total, message)`` after every block, ``total`` the number of layers (it may raise to stop).
    """

    def __init__(
        self,
        num_layers: int,
        observers: Sequence = (),
        progress: Progress | None = None,
        key_features: torch.Tensor | None = None,
        score_sums: bool = False,
    ):
        self.num_layers = num_layers
        self.observers = list(observers)
        self.progress = progress
        self.key_features = key_features
        self.score_sums = bool(score_sums)
        self.layers: list[LayerScores] = []
        self._bias_cache: tuple[torch.Tensor, torch.Tensor] | None = None
        self._scores, self._weights, self._product, self._columns = Scratch(), Scratch(), Scratch(), Scratch()

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

    def _values(self, value: torch.Tensor, key: torch.Tensor | None) -> torch.Tensor:
        """The values with the key features and ``key`` (when given) as extra columns: one product gives the output
        and the sums."""
        if not self.observers or (self.key_features is None and key is None):
            return value
        heads, n, _ = value.shape
        columns = [value]
        if self.key_features is not None:
            if self.key_features.shape[0] != n:
                raise ValueError(f"key_features has {self.key_features.shape[0]} rows for {n} tokens")
            columns.append(self.key_features.to(value.dtype)[None].expand(heads, n, self.key_features.shape[1]))
        if key is not None:
            columns.append(key.to(value.dtype))
        width = sum(column.shape[-1] for column in columns)
        padding = -width % 8  # a product whose width is a multiple of 8 runs markedly faster (71 columns: ~30% slower)
        return torch.cat([*columns, value.new_zeros(heads, n, padding)], dim=-1)

    def __call__(self, q, k, v, mask, causal: bool, score: str):
        if q.shape[0] != 1:
            raise EngineNotSupported("the long path reads one text at a time (batch of 1)")
        if q.shape[-2] != k.shape[-2]:
            raise EngineNotSupported("the long path computes self-attention only")
        layer = len(self.layers)
        query, key, value = q[0], k[0], v[0]
        heads, n, _ = query.shape
        d_v = value.shape[-1]
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
        output = torch.empty(heads, n, d_v, dtype=value.dtype)
        in_c = native.available() and value.dtype == torch.float32  # one trip over each block (native.row_pass)
        block_rows = max(1, min(n, BLOCK_BYTES * (2 if in_c else 1) // (4 * heads * n)))
        if block_rows > ROW_TILE:
            block_rows -= block_rows % ROW_TILE  # whole tiles of the matrix products
        all_heads = torch.arange(heads)
        if score == "scaled":  # the queries scaled once for the layer (attention_scores scales them the same way)
            query, score_of_block = query * (1.0 / math.sqrt(query.shape[-1])), "dot"
        else:
            score_of_block = score
        sums_of_scores = self.score_sums and bias is None and score_of_block == "dot" and not in_c
        values = self._values(value, key if sums_of_scores else None)
        features = self.key_features.shape[1] if self.key_features is not None and values is not value else 0
        key_columns = slice(d_v + features, d_v + features + key.shape[-1]) if sums_of_scores else None
        after_row = torch.ones(block_rows, block_rows, dtype=torch.bool).triu_(1)  # a block's keys after each row
        with denormals_flushed():  # peaked rows' exponentials: no slow path (denormals_flushed)
            for start in range(0, n, block_rows):
                stop = min(n, start + block_rows)
                count = stop - start
                keys = stop if causal else n  # a decoder's rows here see no key after ``stop``
                s = scores_into(query[:, start:stop], key[:, :keys], score_of_block, self._scores(heads, count, keys))
                if bias is not None:
                    rows, cols = torch.arange(start, stop), torch.arange(keys)
                    s += bias[all_heads][:, rows[:, None] - cols[None, :] + n - 1]
                if in_c:  # the weights written over the scores, with what the observers read of them
                    columns = self._columns(heads, keys).zero_()
                    passed = native.row_pass(s, start, causal, CHUNK, columns)
                    weights = s
                else:
                    if causal:  # only the block's last ``count`` keys lie after some of its rows; a finite fill: exp
                        # gives 0 all the same, and 0 x fill stays 0 (not NaN) for the observers
                        s[:, :, start:stop].masked_fill_(after_row[:count, :count], HIDDEN_SCORE)
                    weights = torch.softmax(s, dim=-1, out=self._weights(*s.shape))
                product = torch.matmul(weights, values[:, :keys], out=self._product(heads, count, values.shape[-1]))
                output[:, start:stop] = product[..., :d_v]
                block = Block(
                    layer,
                    start,
                    weights,
                    None if in_c else s,
                    features=self.key_features if features else None,
                    feature_sums=product[..., d_v : d_v + features] if features else None,
                )
                if in_c:
                    block.log_sum_exp, block.score_sums = passed.log_sum_exp[..., None], passed.weighted_scores
                    block.reductions.update(
                        max=passed.chunk_max,
                        sum=passed.chunk_sum,
                        argmax=passed.argmax,
                        columns=columns,
                        row_max=passed.max_weight,
                    )
                else:
                    if key_columns is not None:  # sum_j w_ij (q_i . k_j) = q_i . sum_j w_ij k_j
                        block.score_sums = torch.linalg.vecdot(query[:, start:stop], product[..., key_columns])
                    # softmax subtracts the row's largest score m and divides by sum = sum_j exp(s_j - m); its
                    # largest weight is exp(0) / sum, so log-sum-exp = m + log(sum) = m - log(largest weight), with
                    # m the score where the largest weight is (within 6e-8 of m if several round to it): no pass
                    # over the block for it.
                    row_max = s.gather(-1, block.argmax[..., None])
                    block.log_sum_exp = row_max - block.max_weight.log()[..., None]
                scores.log_sum_exp[:, start:stop] = block.log_sum_exp[..., 0]
                for observer in self.observers:
                    observer.add(block)
                del s, weights, block
                report(self.progress, layer + stop / n, self.num_layers, f"layer {layer + 1} of {self.num_layers}")
        self.layers.append(scores)
        return output[None], None

    def run(self, forward, *args, **kwargs):
        """``forward(*args, **kwargs)`` with this kernel in every layer's attention."""
        with attention_kernel(self):
            return forward(*args, **kwargs)
