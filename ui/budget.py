"""Shared-server resources for the app: a cache bounded in bytes, and a gate on concurrent forward passes.

Plain Python (no Streamlit), so both are unit-tested directly. ``ui.state`` holds one of each per
server process.

* ``ByteBudgetCache``: least-recently-used entries, evicted when their total size passes a budget in
  bytes (a SmolLM2 run at 512 tokens is 283 MB, a MiniLM run at 20 tokens 0.1 MB: a count of entries
  bounds nothing). One computation per key at a time: a second session asking for the same run waits
  for the first instead of computing it again, and computes it itself if the first is stopped.
* ``ComputeGate``: at most ``slots`` forward passes at once, first come first served, so thirty
  sessions pressing Enter together share the cores instead of thrashing them, and a waiting session
  can still be stopped.
* ``tune_allocator`` / ``release_memory``: the C allocator gives evicted bytes back to the system, so
  the server's memory follows the budget instead of its high-water mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

POLL_S = 0.25  # how often a waiting session checks whether it has been stopped


# glibc's mallopt parameters (malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 4 << 20  # blocks this large come from mmap and go back to the system when freed
ARENA_MAX = 2
_TRIM_EVERY_S = 5.0
_last_trim = [0.0]


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError, TypeError):
        return None
    return libc


@functools.cache
def tune_allocator() -> bool:
    """Make freed run arrays return to the system (glibc; elsewhere nothing happens, False).

    By default glibc raises its mmap threshold to the size of the largest block freed (up to 32 MB) and
    keeps one heap arena per thread (Streamlit runs each session in a thread): arrays of evicted runs then
    stay in the process as free heap. Measured (a server process, 1 GB budget, 60 long MiniLM and SmolLM2
    texts, 3 at a time): growth over the loaded models 1.34 GB by default, 1.06 GB with a fixed 4 MB
    threshold and 2 arenas, for a cache holding 0.9-1.0 GB."""
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(libc.mallopt(_M_ARENA_MAX, ARENA_MAX))


def release_memory(force: bool = False) -> None:
    """Free what evicted runs still hold, at most every few seconds: a full garbage collection (the
    server turns Streamlit's collection after every rerun off, so a run caught in a reference cycle,
    e.g. through a stopped script's traceback, would otherwise wait for Python's rare full collections),
    then free heap pages back to the system (``malloc_trim``, glibc)."""
    now = time.monotonic()
    if not force and now - _last_trim[0] < _TRIM_EVERY_S:
        return
    _last_trim[0] = now
    gc.collect()
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


def estimate_bytes(value: Any, _depth: int = 0) -> int:
    """Memory held by ``value``: arrays, DataFrames, dataclasses (an ``AttentionRun``), containers."""
    if _depth > 4 or value is None:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if hasattr(value, "memory_usage") and hasattr(value, "columns"):  # a pandas DataFrame
        return int(value.memory_usage(deep=True).sum())
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, dict):
        return sum(estimate_bytes(v, _depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(estimate_bytes(v, _depth + 1) for v in value) + 8 * len(value)
    if dataclasses.is_dataclass(value):
        return sum(estimate_bytes(getattr(value, f.name), _depth + 1) for f in dataclasses.fields(value))
    if hasattr(value, "__dict__"):
        return sum(estimate_bytes(v, _depth + 1) for v in vars(value).values())
    return 64


class ByteBudgetCache:
    """A thread-safe LRU cache whose entries' sizes (``estimate_bytes``) stay within ``budget_bytes``."""

    def __init__(self, budget_bytes: int, size_of: Callable[[Any], int] = estimate_bytes):
        self.budget_bytes = int(budget_bytes)
        self._size_of = size_of
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._computing: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self.total_bytes = 0
        self.hits = self.misses = self.evictions = 0

    def get_or_compute(self, key: Hashable, compute: Callable[[], Any], check: Callable[[], None] | None = None):
        """The cached value for ``key``, or ``compute()``'s (stored if it fits in the budget).

        While another caller computes the same key, this one waits, calling ``check()`` every
        ``POLL_S`` seconds (``check`` may raise to give up waiting).
        """
        while True:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
                    self.hits += 1
                    return self._entries[key][0]
                running = self._computing.get(key)
                if running is None:
                    running = self._computing[key] = threading.Event()
                    self.misses += 1
                    break
            while not running.wait(POLL_S):  # someone else computes it: wait, stoppably
                if check is not None:
                    check()
        try:
            value = compute()
        except BaseException:
            with self._lock:
                self._computing.pop(key).set()  # waiters wake up and compute it themselves
            raise
        size = int(self._size_of(value))
        evicted_any = False
        with self._lock:
            if size <= self.budget_bytes:
                self._entries[key] = (value, size)
                self.total_bytes += size
                while self.total_bytes > self.budget_bytes:
                    _, (_, evicted) = self._entries.popitem(last=False)
                    self.total_bytes -= evicted
                    self.evictions += 1
                    evicted_any = True
            self._computing.pop(key).set()
        if evicted_any:
            release_memory()
        return value

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.total_bytes = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "bytes": self.total_bytes,
                "budget_bytes": self.budget_bytes,
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
            }


class ComputeGate:
    """At most ``slots`` holders at once, served in arrival order."""

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self._condition = threading.Condition()
        self._queue: deque[object] = deque()
        self._running = 0

    @contextmanager
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
