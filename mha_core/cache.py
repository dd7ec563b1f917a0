"""A cache bounded in bytes, shared by threads: ``ByteBudgetCache``, and what it needs to measure and free memory.

Plain Python (no Streamlit): the app keeps its runs in one (``ui.budget``, ``ui.state``), the corpus profile its
finished results (``corpus.profiling``).

* ``ByteBudgetCache``: least-recently-used entries, evicted when their total size passes a budget in
  bytes (a SmolLM2 run at 512 tokens is 283 MB, a MiniLM run at 20 tokens 0.1 MB: a count of entries
  bounds nothing). One computation per key at a time: a second caller asking for the same value waits
  for the first instead of computing it again, and computes it itself if the first is stopped.
  The budget covers more than what is cached: a computation reserves its estimated working memory
  *before* it starts (``reserve_bytes``; older entries are evicted to make room, and while other
  computations in flight fill the budget it waits for them, in arrival order), and an evicted value that a
  caller still uses stays counted until it is freed. No reservation is larger than the budget: one that would
  be is refused (``OverBudget``), never run alone over it.
  Named *shares* bound a kind of work within the budget: the reservations made in a share hold at most its
  bytes together (a larger one is refused), and wait in a queue of their own, so that work outside the share
  always finds the rest of the budget (the app's heavy work, ``ui.budget``).
* ``release_memory``: the C allocator gives evicted bytes back to the system (``c_library``: glibc).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import functools
import gc
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .errors import HeadscopeError

POLL_S = 0.25  # how often a waiting session checks whether it has been stopped

_reserving = threading.local()  # how many reservations this thread holds (nested ones never wait)

_TRIM_EVERY_S = 5.0
_last_trim = [0.0]


def cache_dir() -> Path:
    """Where Headscope keeps files between runs (converted checkpoints, profiles, cards, the class's database, built
    kernels): ``$HEADSCOPE_CACHE_DIR`` or ``~/.cache/headscope``."""
    return Path(os.environ.get("HEADSCOPE_CACHE_DIR") or Path.home() / ".cache" / "headscope").expanduser()


@functools.cache
def c_library():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError, TypeError):
        return None
    return libc


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
    libc = c_library()
    if libc is not None:
        libc.malloc_trim(0)


MB = 1 << 20


class OverBudget(HeadscopeError):
    """A computation would hold more than its budget (or its share of it) at its peak: refused, never run alone
    over it. ``nbytes``: what it asked for; ``limit``: the most it may hold; ``share``: the share's name, or None
    for the whole budget."""

    def __init__(self, nbytes: int, limit: int, share: str | None = None, message: str | None = None):
        self.nbytes, self.limit, self.share = int(nbytes), int(limit), share
        if message is None:
            where = (
                f"the {limit / MB:,.0f} MB given to {share} work" if share else f"the budget of {limit / MB:,.0f} MB"
            )
            message = f"This computation needs about {nbytes / MB:,.0f} MB at its peak, more than {where}: refused."
        super().__init__(message)


class _Reservation(NamedTuple):
    nbytes: int
    share: str | None


_NOTHING = _Reservation(0, None)


def estimate_bytes(value: Any, _depth: int = 0) -> int:
    """Memory held by ``value``: arrays, DataFrames, dataclasses (an ``AttentionRun``), containers."""
    if _depth > 4 or value is None:
        return 0
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a torch tensor (a long run's queries and keys)
        return int(value.numel() * value.element_size())
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
    """A thread-safe LRU cache whose entries' sizes (``estimate_bytes``) stay within ``budget_bytes``,
    together with the working memory reserved by computations in flight and the evicted values still in use.
    ``shares``: name -> the most bytes the reservations made in that share may hold at once.
    """

    def __init__(
        self,
        budget_bytes: int,
        size_of: Callable[[Any], int] = estimate_bytes,
        shares: Mapping[str, int] | None = None,
    ):
        self.budget_bytes = int(budget_bytes)
        self.shares = {name: min(int(limit), self.budget_bytes) for name, limit in (shares or {}).items()}
        self._size_of = size_of
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._computing: dict[Hashable, threading.Event] = {}
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # notified when a reservation ends
        self.total_bytes = 0
        self.reserved_bytes = 0  # working memory of the computations in flight
        self._in_flight = 0  # computations holding a reservation
        # Per pool (a share's name, or None for the work outside every share): bytes reserved, reservations in
        # flight, and the reservations waiting, in arrival order.
        pools = [None, *self.shares]
        self._pool_bytes = dict.fromkeys(pools, 0)
        self._pool_in_flight = dict.fromkeys(pools, 0)
        self._waiting: dict[str | None, deque] = {pool: deque() for pool in pools}
        # Values evicted (or too large to keep) that someone may still use: (weak reference, size). Values
        # that cannot be referenced weakly (tuples) are taken as freed with their entry.
        self._let_go: list[tuple[weakref.ref, int]] = []
        self.hits = self.misses = self.evictions = self.waits = 0

    def limit(self, share: str | None = None) -> int:
        """The most bytes one reservation (and all of ``share``'s together) may hold: the share's, or the budget."""
        if share is None:
            return self.budget_bytes
        if share not in self.shares:
            raise KeyError(f"no share {share!r} in this budget (shares: {', '.join(self.shares) or 'none'})")
        return self.shares[share]

    def get_or_compute(
        self,
        key: Hashable,
        compute: Callable[[], Any],
        check: Callable[[], None] | None = None,
        reserve_bytes: int = 0,
        share: str | None = None,
        waiting: Callable[[int | None], None] | None = None,
    ):
        """The cached value for ``key``, or ``compute()``'s (stored if it fits in the budget).

        While another caller computes the same key, this one waits, calling ``check()`` every
        ``POLL_S`` seconds (``check`` may raise to give up waiting) and ``waiting(None)`` once. ``reserve_bytes``:
        the computation's estimated peak memory, held against the budget (in ``share``) from before ``compute()``
        until its value is stored (``reserve``).
        """
        told = False
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
                if waiting is not None and not told:
                    waiting(None)
                    told = True
                if check is not None:
                    check()
        try:
            reserved = self._acquire(reserve_bytes, check, share, waiting)
            try:
                value = compute()
            except BaseException:
                self._release(reserved)
                raise
        except BaseException:
            with self._lock:
                self._computing.pop(key).set()  # waiters wake up and compute it themselves
            raise
        size = int(self._size_of(value))
        with self._lock:
            self._end_reservation(reserved)
            if size <= self.budget_bytes:
                self._entries[key] = (value, size)
                self.total_bytes += size
            else:
                self._keep_track(value, size)
            evicted_any = self._evict(0)
            self._computing.pop(key).set()
        if evicted_any:
            release_memory()
        return value

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The cached value for ``key`` (it becomes the most recently used), or ``default``."""
        with self._lock:
            if key not in self._entries:
                return default
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key][0]

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` under ``key`` as the most recently used entry; older entries go to fit the budget."""
        size = int(self._size_of(value))
        with self._lock:
            previous = self._entries.pop(key, None)
            if previous is not None:
                self.total_bytes -= previous[1]
            if size <= self.budget_bytes:
                self._entries[key] = (value, size)
                self.total_bytes += size
            else:
                self._keep_track(value, size)
            self._evict(0)

    def __contains__(self, key: Hashable) -> bool:
        """True when ``key``'s value is cached (its place in the eviction order is left as it was)."""
        with self._lock:
            return key in self._entries

    def keys(self) -> list:
        """The cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    @contextlib.contextmanager
    def reserve(
        self,
        nbytes: int,
        check: Callable[[], None] | None = None,
        share: str | None = None,
        waiting: Callable[[int | None], None] | None = None,
    ) -> Iterator[None]:
        """Hold ``nbytes`` of the budget (in ``share``) for the ``with`` block.

        More than ``limit(share)`` is refused (``OverBudget``). Least recently used entries are evicted until
        cached + reserved + evicted-but-in-use + ``nbytes`` fit in the budget, and in a share until its
        reservations fit in its bytes. Until they do, this waits in its pool's queue, first come first served
        (``waiting(ahead)`` says how many reservations of the pool wait before this one, whenever that changes;
        ``check()`` every ``POLL_S`` seconds may raise to give up). What keeps it waiting is only ever other
        reservations, or evicted values still in use: with none of its pool in flight and the reservations
        within the budget, it goes ahead after a collection; nested in a reservation of the same thread it
        never waits (it would wait for itself).
        """
        reserved = self._acquire(nbytes, check, share, waiting)
        try:
            yield
        finally:
            self._release(reserved)

    def _acquire(
        self,
        nbytes: int,
        check: Callable[[], None] | None,
        share: str | None = None,
        waiting: Callable[[int | None], None] | None = None,
    ) -> _Reservation:
        nbytes = max(0, int(nbytes))
        limit = self.limit(share)
        if nbytes == 0:
            return _NOTHING
        if nbytes > limit:
            raise OverBudget(nbytes, limit, share)
        nested = getattr(_reserving, "depth", 0) > 0
        queue = self._waiting[share]
        ticket = object()
        if not nested:
            with self._lock:
                queue.append(ticket)
        waited = collected = False
        told = None
        try:
            while True:
                with self._lock:
                    ahead = 0 if nested else queue.index(ticket)
                    evicted_any = ahead == 0 and self._evict(nbytes)
                    in_share = share is None or self._pool_bytes[share] + nbytes <= limit
                    fits = in_share and self._used_bytes() + nbytes <= self.budget_bytes
                    alone = (
                        in_share
                        and self._pool_in_flight[share] == 0
                        and self.reserved_bytes + nbytes <= self.budget_bytes
                        and (collected or not self._let_go)
                    )
                    if nested or (ahead == 0 and (fits or alone)):
                        if not nested:
                            queue.popleft()
                        self.reserved_bytes += nbytes
                        self._in_flight += 1
                        self._pool_bytes[share] += nbytes
                        self._pool_in_flight[share] += 1
                        self.waits += waited
                        self._room.notify_all()  # the next in the queue is first now
                        break
                    held_elsewhere = ahead == 0 and bool(self._let_go)
                    if not held_elsewhere or collected:
                        self._room.wait(POLL_S)
                if held_elsewhere and not collected:
                    # Evicted runs still referenced: some only by a reference cycle (a stopped script's frames),
                    # which a collection frees now rather than at Python's next full collection.
                    release_memory(force=True)
                    collected = True
                    continue
                waited = True
                if evicted_any:
                    release_memory()
                if waiting is not None and ahead != told:
                    waiting(ahead)
                    told = ahead
                if check is not None:
                    check()
        except BaseException:
            with self._lock:
                if ticket in queue:
                    queue.remove(ticket)
                self._room.notify_all()
            raise
        _reserving.depth = getattr(_reserving, "depth", 0) + 1
        if evicted_any:
            release_memory()
        return _Reservation(nbytes, share)

    def _end_reservation(self, reserved: _Reservation) -> None:  # under the lock
        if reserved.nbytes:
            self.reserved_bytes -= reserved.nbytes
            self._in_flight -= 1
            self._pool_bytes[reserved.share] -= reserved.nbytes
            self._pool_in_flight[reserved.share] -= 1
            _reserving.depth -= 1
            self._room.notify_all()

    def _release(self, reserved: _Reservation) -> None:
        with self._lock:
            self._end_reservation(reserved)

    def waiting(self, share: str | None = None) -> int:
        """How many reservations of ``share`` (None: outside every share) wait now."""
        with self._lock:
            return len(self._waiting[share])

    def _keep_track(self, value: Any, size: int) -> None:  # under the lock
        # A value that cannot be referenced weakly is taken as freed with its entry.
        with contextlib.suppress(TypeError):
            self._let_go.append((weakref.ref(value), size))

    def _in_use_elsewhere(self) -> int:  # under the lock
        self._let_go = [(ref, size) for ref, size in self._let_go if ref() is not None]
        return sum(size for _, size in self._let_go)

    def _used_bytes(self) -> int:  # under the lock
        return self.total_bytes + self.reserved_bytes + self._in_use_elsewhere()

    def _evict(self, room: int) -> bool:  # under the lock
        """Evict least recently used entries until ``room`` more bytes fit; True if any went."""
        evicted_any = False
        while self._entries and self._used_bytes() + room > self.budget_bytes:
            _, (value, size) = self._entries.popitem(last=False)
            self.total_bytes -= size
            self.evictions += 1
            evicted_any = True
            self._keep_track(value, size)
            del value
        return evicted_any

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.total_bytes = 0

    def stats(self) -> dict[str, int]:
        """Entries and their bytes, the bytes reserved by computations in flight and those of evicted
        values still in use; ``used_bytes`` is the sum of the three, what the budget bounds."""
        with self._lock:
            elsewhere = self._in_use_elsewhere()
            return {
                "entries": len(self._entries),
                "bytes": self.total_bytes,
                "reserved_bytes": self.reserved_bytes,
                "in_use_elsewhere_bytes": elsewhere,
                "used_bytes": self.total_bytes + self.reserved_bytes + elsewhere,
                "budget_bytes": self.budget_bytes,
                "in_flight": self._in_flight,
                **{f"{name}_reserved_bytes": self._pool_bytes[name] for name in self.shares},
                "hits": self.hits,
                "misses": self.misses,
                "evictions": self.evictions,
                "waits": self.waits,
            }
