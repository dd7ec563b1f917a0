"""A long document (or token ids taken as they are) through every head, up to the model's context length
(``mha_core.models.long.run_long``), a needle-in-a-haystack test that the model answers (``run_needle``), and what
each holds at its peak."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..analysis.streamed import ROW_FIELDS
from ..engine.blockwise import BLOCK_BYTES
from ..models.long import ANSWER_PREFILL_ROWS, OVERVIEW_SIZE, NeedlePrompt, long_run_limit, run_long, run_needle
from ..models.tokens import EncodedText
from ..progress import Progress, fraction
from .base import FLOAT_BYTES, HEAVY, Operation, operation


def config_sizes(model) -> tuple[int, int, int, int, int, int]:
    """(layers, heads, key heads, head size, hidden size, feed-forward size) from the model's config."""
    config = model.hf_model.config
    d_model = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or config.dim
    heads = model.num_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or d_model // heads
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * d_model
    return model.num_layers, heads, kv, head_dim, d_model, ffn


def long_run_bytes(model, num_tokens: int, overview_size: int = OVERVIEW_SIZE) -> int:
    """The bytes a ``run_long`` of ``num_tokens`` holds at its peak, beyond the loaded model: what it keeps
    (queries, stored keys, log-sum-exps, row statistics, overviews) and what one layer's pass needs at once
    (its activations, the block buffers and their temporaries), with half as much again for the allocator's
    slack (measured: bench/long.py). A budget reserves this before the run starts."""
    layers, heads, kv, head_dim, d_model, ffn = config_sizes(model)
    n = int(num_tokens)
    cells = min(overview_size, n) ** 2
    kept = layers * (heads + kv) * n * head_dim * FLOAT_BYTES + layers * heads * n * FLOAT_BYTES
    statistics = len(ROW_FIELDS) * layers * heads * n * 4 + layers * heads * n * 8  # the rows, the column masses
    overviews = 2 * layers * heads * cells * FLOAT_BYTES
    # the layer's activations; its queries, keys and values, and the values with the keys and key features beside
    # them (the product that gives the block sums); the block buffers
    layer_pass = n * (8 * d_model + 3 * ffn) * FLOAT_BYTES + 5 * n * heads * head_dim * FLOAT_BYTES + 6 * BLOCK_BYTES
    return int(1.5 * (kept + statistics + overviews + layer_pass))


def needle_run_bytes(model, prompt_tokens: int, answer_tokens: int) -> int:
    """What ``run_needle`` holds at its peak: the long run of the prompt and its answer, or, while the model
    answers, the key-value cache of every layer and one block's eager attention and MLP, whichever is larger."""
    layers, heads, kv, head_dim, d_model, ffn = config_sizes(model)
    n = int(prompt_tokens) + int(answer_tokens)
    answering = 2 * layers * kv * head_dim * n * FLOAT_BYTES
    answering += ANSWER_PREFILL_ROWS * (3 * heads * n + 8 * d_model + 3 * ffn) * FLOAT_BYTES
    return max(long_run_bytes(model, n), int(1.5 * answering))


def most_tokens_within(model, limit_bytes: int) -> int:
    """The most tokens of ``model`` (at most its long-run limit) whose long run fits in ``limit_bytes`` (0: not
    even one)."""
    low, high = 0, long_run_limit(model)
    while low < high:  # the bytes grow with the tokens
        middle = (low + high + 1) // 2
        low, high = (middle, high) if long_run_bytes(model, middle) <= limit_bytes else (low, middle - 1)
    return low


def timed(progress: Progress | None, num_tokens: int) -> Progress | None:
    """``progress`` told each block's message with the seconds left at the rate so far."""
    if progress is None:
        return None
    started = time.monotonic()

    def report(done: float, total: float, message: str = "") -> None:
        part = fraction(done, total)
        left = (time.monotonic() - started) * (1 - part) / part if part > 0.01 else None
        when = f", about {left:.0f} s left" if left is not None else ""
        progress(done, total, f"Every head of {num_tokens:,} tokens: {message}{when}")

    return report


@operation
class LongAttention(Operation):
    """Every head of a document (``mha_core.models.long.run_long``): a ``LongRun``. The document is tokenized once,
    cut to what the model reads (``long_run_limit``), with the BOS token or without (``bos``: as asked; None for
    token ids taken as they are); its run says so in ``metadata["cut"]``."""

    work_class = HEAVY
    model: str
    encoded: EncodedText
    bos: bool | None = None

    @classmethod
    def of(
        cls, model, text: str | None = None, token_ids: Sequence[int] | None = None, bos: bool | None = None
    ) -> LongAttention:
        """A document's text (``bos``: begin with the BOS token; None: the model's default), or token ids taken as
        they are, tokenized here."""
        limit = long_run_limit(model)
        if token_ids is not None:
            return cls(model.name, model.encode_long_ids([int(i) for i in token_ids], max_tokens=limit))
        bos = model.default_bos if bos is None else bool(bos)
        return cls(model.name, model.encode_long(text, bos, max_tokens=limit), bos)

    @property
    def num_tokens(self) -> int:
        return len(self.encoded)

    @property
    def progress_label(self) -> str:
        return f"Every head of {self.num_tokens:,} tokens..."

    def peak_bytes(self, model) -> int:
        return long_run_bytes(model, self.num_tokens)

    def run(self, model, progress: Progress | None = None):
        """The run; ``progress`` is told each block's message with the seconds left at the rate so far."""
        return run_long(model, self.encoded, progress=timed(progress, self.num_tokens))


@operation
class NeedleTest(Operation):
    """A needle-in-a-haystack test (``mha_core.models.long.run_needle``): the model answers ``prompt`` (a
    ``NeedlePrompt``, token ids made once by ``needle_question``) greedily, then every head reads the prompt and
    the answer. A ``LongRun`` whose ``metadata["needle"]`` is what the model answered."""

    work_class = HEAVY
    model: str
    prompt: NeedlePrompt

    @property
    def num_tokens(self) -> int:
        """The prompt's tokens (the answer adds at most ``prompt.answer_tokens``)."""
        return len(self.prompt.token_ids)

    @property
    def progress_label(self) -> str:
        return f"Every head of {self.num_tokens:,} tokens..."

    def peak_bytes(self, model) -> int:
        return needle_run_bytes(model, self.num_tokens, self.prompt.answer_tokens)

    def run(self, model, progress: Progress | None = None):
        return run_needle(model, self.prompt, progress=timed(progress, self.num_tokens))
