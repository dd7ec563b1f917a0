"""Shared-server resources for the app: a cache bounded in bytes, and a gate on concurrent forward passes.

Plain Python (no Streamlit), so both are unit-tested directly. ``ui.compute`` holds one of each per
server process.

* ``ByteBudgetCache`` (``mha_core.cache``): least-recently-used entries, evicted when their total size passes a budget in
  bytes (a SmolLM2 run at 512 tokens is 283 MB, a MiniLM run at 20 tokens 0.1 MB: a count of entries
  bounds nothing). One computation per key at a time: a second session asking for the same run waits
  for the first instead of computing it again, and computes it itself if the first is stopped.
  The budget covers more than what is cached: a computation reserves its estimated working memory
  *before* it starts (``reserve_bytes``; older entries are evicted to make room, and while other
  computations in flight fill the budget it waits for them), and an evicted value that a session still
  uses (a page being drawn) stays counted until it is freed.
* ``ComputeGate``: at most ``slots`` forward passes at once, first come first served, so thirty
  sessions pressing Enter together share the cores instead of thrashing them, and a waiting session
  can still be stopped.
* ``tune_allocator`` / ``release_memory``: the C allocator gives evicted bytes back to the system, so
  the server's memory follows the budget instead of its high-water mark.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

# The cache itself is plain library code (mha_core.cache); the app's modules import it from here.
from mha_core.cache import POLL_S, ByteBudgetCache, c_library, estimate_bytes, release_memory  # noqa: F401
from mha_core.errors import HeadscopeError

# Working memory of a forward pass, as a multiple of its attention array (layers x heads x n^2 float32).
# Measured on SmolLM2 at 512 tokens (30 x 9 heads, 270 MB of attention): the pass peaks 408 MB above
# where it started (each layer's attention in torch before the copy, the LM head's logits for
# token_losses) and keeps 274 MB.
RUN_PEAK_FACTOR = 1.5


# The server's budget (HEADSCOPE_CACHE_BUDGET_MB) bounds its memory above the loaded models. One eighth of it
# is left for what is not a run: free heap the allocator keeps, figures on their way to browsers, sessions'
# widgets (measured: 100-150 MB more than the runs' own bytes with a 1 GB budget); the rest is the
# ``ByteBudgetCache``'s, for runs and what is computed from them.
HEADROOM_SHARE = 8


def runs_budget(server_budget_bytes: int) -> int:
    """The part of the server's memory budget for runs and measurements (cached, in flight, in use)."""
    return int(server_budget_bytes) - int(server_budget_bytes) // HEADROOM_SHARE


def attention_bytes(num_layers: int, num_heads: int, num_tokens: int) -> int:
    """Bytes of a run's float32 attention array ``[layers, heads, n, n]``."""
    return 4 * int(num_layers) * int(num_heads) * int(num_tokens) ** 2


# glibc's mallopt parameters (malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 4 << 20  # blocks this large come from mmap and go back to the system when freed
ARENA_MAX = 2


@functools.cache
def tune_allocator() -> bool:
    """Make freed run arrays return to the system (glibc; elsewhere nothing happens, False).

    By default glibc raises its mmap threshold to the size of the largest block freed (up to 32 MB) and
    keeps one heap arena per thread (Streamlit runs each session in a thread): arrays of evicted runs then
    stay in the process as free heap. Measured (a server process, 1 GB budget, 60 long MiniLM and SmolLM2
    texts, 3 at a time): growth over the loaded models 1.34 GB by default, 1.06 GB with a fixed 4 MB
    threshold and 2 arenas, for a cache holding 0.9-1.0 GB."""
    libc = c_library()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(libc.mallopt(_M_ARENA_MAX, ARENA_MAX))


class ComputeGate:
    """At most ``slots`` holders at once, served in arrival order."""

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self._condition = threading.Condition()
        self._queue: deque[object] = deque()
        self._running = 0

    @contextlib.contextmanager
    def slot(
        self, check: Callable[[], None] | None = None, waiting: Callable[[int], None] | None = None
    ) -> Iterator[None]:
        """Hold one slot for the ``with`` block. While queued, ``waiting(ahead)`` says how many are
        ahead and ``check()`` may raise to leave the queue; both run outside the gate's lock."""
        ticket = object()
        with self._condition:
            self._queue.append(ticket)
        told = None  # the place last shown: a page update only when it changes
        try:
            while True:
                with self._condition:
                    ahead = self._queue.index(ticket)
                    if ahead < self.slots - self._running:
                        self._queue.remove(ticket)
                        self._running += 1
                        break
                    self._condition.wait(POLL_S)
                    ahead = self._queue.index(ticket)
                if check is not None:
                    check()
                if waiting is not None and ahead != told:
                    waiting(ahead)
                    told = ahead
        except BaseException:
            with self._condition:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                self._condition.notify_all()
            raise
        try:
            yield
        finally:
            with self._condition:
                self._running -= 1
                self._condition.notify_all()

    @property
    def queued(self) -> int:
        with self._condition:
            return len(self._queue)


class StopPoint:
    """A ``check()`` that calls ``touch()`` at most every ``every_s`` seconds.

    In the app ``touch`` updates a Streamlit placeholder: Streamlit raises its stop signal at such a
    call once the session has gone away or asked for another run, which ends the work there.
    """

    def __init__(self, touch: Callable[[], None], every_s: float = POLL_S):
        self._touch = touch
        self._every_s = every_s
        self._last = time.monotonic()

    def __call__(self, *args, **kwargs) -> None:  # also usable as a progress callback
        now = time.monotonic()
        if now - self._last >= self._every_s:
            self._last = now
            self._touch()


# ---- what a computation reserves before it starts (``ui.compute.compute``'s ``reserve_bytes``) ------------------
# Backpropagation keeps every layer's attention and its softmax's input for the backward pass, on top of a
# forward pass's own peak: head importance by gradient holds about twice a forward pass (an estimate from
# what autograd saves per layer, not a measurement).
GRADIENT_PEAK_FACTOR = 2.0


def pass_peak_bytes(num_layers: int, num_heads: int, num_tokens: int, batch: int = 1, arrays: int = 1) -> int:
    """A forward pass's peak memory: ``RUN_PEAK_FACTOR`` x the attention arrays of ``batch`` sequences of
    ``num_tokens`` (``arrays`` = 2 with norm-based attention, which holds the norms' array beside it)."""
    return int(RUN_PEAK_FACTOR * arrays * batch * attention_bytes(num_layers, num_heads, num_tokens))


def layer_inputs_bytes(num_layers: int, num_tokens: int, width: int) -> int:
    """Every layer's float32 input ``[n, width]`` kept beside a pass (the neuron view reads them)."""
    return 4 * (int(num_layers) + 1) * int(num_tokens) * int(width)


def run_peak_bytes(model, text: str, text_pair: str | None, bos: bool, arrays: int = 1) -> int:
    """What a forward pass of ``model`` on this text holds at its peak (``RUN_PEAK_FACTOR`` x its attention
    array; ``arrays`` = 2 with norm-based attention): reserved in the budget before the pass starts."""
    try:
        num_tokens = len(model.encode(text, text_pair, bos).input_ids)
    except HeadscopeError:  # the run itself will say what is wrong with the text
        return 0
    return pass_peak_bytes(model.num_layers, model.num_heads, num_tokens, arrays=arrays)


def batch_peak_bytes(model, items, batch_size: int, factor: float = 1.0) -> int:
    """A batched pass over ``items`` (texts or lists of words) at its peak: ``batch_size`` sequences padded to
    the longest item's tokens (at most the model's limit), times ``factor``."""
    longest = max((len(model.encode(item).input_ids) for item in items), default=0)
    return int(factor * pass_peak_bytes(model.num_layers, model.num_heads, longest, batch=batch_size))
