"""What is computed from a run without a model: a view of it (word level, without special tokens), its head
metrics, head distances and semantic scores, attention rollout and flow.

Each is an operation like the others, run on the ``AttentionRun`` it reads (``run(source, progress)``, where the
other operations take a model; ``peak_bytes(source)`` likewise): its key is the key of the run it reads
(``source_key``: the run's operation's key with the view's shape, so a word-level view and its run cache their
measurements apart) with its own fields. A run that did not come from an operation has no key to name its
values by (``source`` None): such an operation is run, never cached (``cacheable``).

    op = Metrics.of(run)
    op.key, op.peak_bytes(run), op.run(run)           # named after the run, what it holds, the table
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..analysis.flow import attention_flow, attention_rollout
from ..analysis.metrics import head_distances, head_metrics, semantic_scores
from ..progress import Progress
from ..run import AttentionRun
from .base import FLOAT_BYTES, LIGHT, NOT_IN_KEY, Operation, key_of, operation

FLOAT64_BYTES = 8


def source_key(run: AttentionRun) -> tuple | None:
    """The key naming ``run`` as it is shown: the key of the operation that made it (``metadata["cache_key"]``)
    with its level and whether its special tokens were removed (a view keeps its run's ``cache_key``), or None
    for a run that did not come from an operation."""
    key = run.metadata.get("cache_key")
    if key is None:
        return None
    return (run.level, bool(run.metadata.get("special_tokens_removed")), *key_of(tuple(key)))


class FromRun(Operation):
    """An operation on one run (subclasses are ``@operation`` classes whose first field is ``source``)."""

    work_class = LIGHT
    source: tuple | None

    @classmethod
    def of(cls, run: AttentionRun, **fields) -> FromRun:
        """The operation on ``run``, named after it (``source_key``)."""
        return cls(source_key(run), **fields)

    @property
    def cacheable(self) -> bool:
        """True when the value may be kept under ``key``: the run it reads came from an operation."""
        return self.source is not None


@operation
class View(FromRun):
    """The run as a page's toggles show it: word level first (``words``), then without its special tokens
    (``hide_special``, when it has any)."""

    work_class = LIGHT
    source: tuple | None
    words: bool = False
    hide_special: bool = False

    def peak_bytes(self, source: AttentionRun) -> int:
        """Reshaping peaks at two to three times the run's attention (measured: 540 MB for a 270 MB SmolLM2 run at
        word level; 33 MB for 11 MB of MiniLM's at word level without special tokens)."""
        return 3 * source.attentions.nbytes

    def run(self, source: AttentionRun, progress: Progress | None = None) -> AttentionRun:
        shaped = source.to_words() if self.words else source
        return shaped.without_special() if self.hide_special and np.any(shaped.special_mask) else shaped


@operation
class Metrics(FromRun):
    """``head_metrics``: one row per layer and head."""

    work_class = LIGHT
    source: tuple | None

    def peak_bytes(self, source: AttentionRun) -> int:
        """The compiled pass works one head's rows at a time: a few float64 ``[n, n]`` arrays (measured: 0.7 MB
        for MiniLM at 202 tokens; the norms' metrics, when the run has norm-based attention, read a copy of it)."""
        n = source.num_tokens
        norms = 0 if source.norms is None else source.norms.nbytes
        return 4 * FLOAT64_BYTES * n * n + norms

    def run(self, source: AttentionRun, progress: Progress | None = None):
        return head_metrics(source)


@operation
class HeadDistances(FromRun):
    """``head_distances`` (Clark et al. 2019), over at most ``max_queries`` query rows."""

    work_class = LIGHT
    source: tuple | None
    max_queries: int | None = None

    def peak_bytes(self, source: AttentionRun) -> int:
        """The smoothed rows of every head (float32 ``[L * H, q, n]``) beside the copy they are made from, and the
        4 MB blocks of head pairs (measured: 17 MB for MiniLM at 202 tokens)."""
        num_layers, num_heads, n = source.num_layers, source.num_heads, source.num_tokens
        rows = n if self.max_queries is None else min(n, int(self.max_queries))
        return 2 * FLOAT_BYTES * num_layers * num_heads * rows * n + (8 << 20)

    def run(self, source: AttentionRun, progress: Progress | None = None):
        return head_distances(source, max_queries=self.max_queries)


@operation
class SemanticScores(FromRun):
    """``semantic_scores``: per head, the correlation of its weights with the cosine of the input embeddings
    (``embeddings``, a table look-up of the run's token ids, named by the run's key)."""

    work_class = LIGHT
    source: tuple | None
    embeddings: np.ndarray = dataclasses.field(metadata=NOT_IN_KEY, repr=False)

    def peak_bytes(self, source: AttentionRun) -> int:
        """Every head's weights at the pairs in float64 (``[L, H, P]``, P < n^2), centred, and their product with
        the cosines: three such arrays (measured: 68 MB for MiniLM at 202 tokens), and the cosines ``[n, n]``."""
        n = source.num_tokens
        return 3 * FLOAT64_BYTES * source.num_layers * source.num_heads * n * n + 4 * FLOAT64_BYTES * n * n

    def run(self, source: AttentionRun, progress: Progress | None = None):
        return semantic_scores(source, self.embeddings)


@operation
class Rollout(FromRun):
    """``attention_rollout`` (Abnar & Zuidema 2020): float32 ``[L, n, n]``."""

    work_class = LIGHT
    source: tuple | None

    def peak_bytes(self, source: AttentionRun) -> int:
        """The head means mixed with the identity (float64 ``[L, n, n]``) and their float32 copy (measured with
        numpy's temporaries: 4.7 MB for MiniLM at 202 tokens), and torch's float32 products."""
        return (3 * FLOAT64_BYTES + FLOAT_BYTES) * source.num_layers * source.num_tokens**2

    def run(self, source: AttentionRun, progress: Progress | None = None):
        return attention_rollout(source)


@operation
class Flow(FromRun):
    """``attention_flow`` after ``layer``: float32 ``[n, n]`` (at most ``MAX_FLOW_TOKENS`` tokens)."""

    work_class = LIGHT
    source: tuple | None
    layer: int | None = None

    def peak_bytes(self, source: AttentionRun) -> int:
        """The graph's (L + 1) * n * n edges, their ends and capacities as arrays and as scipy's sparse matrix, and
        the flows: small, at most 48 tokens (measured: 80 kB for MiniLM at 12 tokens)."""
        edges = (source.num_layers + 1) * source.num_tokens**2
        return 16 * FLOAT64_BYTES * edges + FLOAT64_BYTES * source.num_tokens**2

    def run(self, source: AttentionRun, progress: Progress | None = None):
        return attention_flow(source, layer=self.layer)
