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
  No computation holds more than the budget: a larger one is refused (``OverBudget``), never run alone over it.
* ``ComputeGate``: at most ``slots`` forward passes at once, first come first served, so thirty
  sessions pressing Enter together share the cores instead of thrashing them, and a waiting session
  can still be stopped.
* ``WorkClass`` (``mha_core.operations``): every computation is ``LIGHT`` (a sentence's heads) or ``HEAVY`` (long
  documents, needle tests, patching, profiles, importance, the search index, Lab training), declared in its
  operation's class (with ``peak_bytes``, what it reserves before it starts). Heavy work has a share of both, the budget's ``heavy`` share in bytes and the gate's in slots, and a queue of its own in each:
  light work never waits behind it (``queue_message`` says where a waiting computation is in its queue).
* ``tune_allocator`` / ``release_memory``: the C allocator gives evicted bytes back to the system, so
  the server's memory follows the budget instead of its high-water mark.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping

# The cache itself is plain library code (mha_core.cache); the app's modules import it from here.
from mha_core.cache import (  # noqa: F401
    MB,
    POLL_S,
    ByteBudgetCache,
    OverBudget,
    c_library,
    estimate_bytes,
    release_memory,
)

# What a computation is to the shares, and what it reserves, are declared by the library's operations
# (``mha_core.operations``: ``work_class``, ``peak_bytes``); the app's modules import the work classes from here.
from mha_core.operations.base import HEAVY, LIGHT, WorkClass
from ui.i18n import translate

# The server's budget (HEADSCOPE_CACHE_BUDGET_MB) bounds its memory above the loaded models. One eighth of it
# is left for what is not a run: free heap the allocator keeps, figures on their way to browsers, sessions'
# widgets (measured: 100-150 MB more than the runs' own bytes with a 1 GB budget); the rest is the
# ``ByteBudgetCache``'s, for runs and what is computed from them.
HEADROOM_SHARE = 8


def runs_budget(server_budget_bytes: int) -> int:
    """The part of the server's memory budget for runs and measurements (cached, in flight, in use)."""
    return int(server_budget_bytes) - int(server_budget_bytes) // HEADROOM_SHARE


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


QUEUE_WORDS = {
    LIGHT: "the queue",
    HEAVY: "the queue of heavy work (long documents, tests, profiles, training)",
}
QUEUE_PLACE = "The server is busy: yours is number {place} in {queue}, waiting for {waiting_for}."
SAME_WORK = "Another visitor is computing the same thing; it shows here as soon as it is ready."


def queue_message(
    work_class: WorkClass, ahead: int | None, waiting_for: str = "a compute slot", lang: str = "en"
) -> str:
    """What a page shows while its computation waits: where it is in its class's queue (``ahead``: how many wait
    before it; None: another visitor computes the same thing and this one waits for that), in ``lang`` (the
    session's language, captured in its script run: the callbacks that say it may run in a job's thread)."""
    if ahead is None:
        return translate(SAME_WORK, lang)
    return translate(
        QUEUE_PLACE,
        lang,
        place=ahead + 1,
        queue=translate(QUEUE_WORDS[work_class], lang),
        waiting_for=translate(waiting_for, lang),
    )


class ComputeGate:
    """At most ``slots`` holders at once, served in arrival order. ``shares``: name -> the most slots the holders
    of that share may hold at once; they queue apart from the others, and take a free slot only when no holder
    outside every share waits for it (so those are never queued behind a share's work)."""

    def __init__(self, slots: int, shares: Mapping[str, int] | None = None):
        self.slots = max(1, int(slots))
        self.shares = {name: max(1, min(int(count), self.slots)) for name, count in (shares or {}).items()}
        self._condition = threading.Condition()
        self._queues: dict[str | None, deque[object]] = {pool: deque() for pool in (None, *self.shares)}
        self._running = dict.fromkeys((None, *self.shares), 0)

    def _free_for(self, share: str | None) -> int:  # under the lock: how many of the pool's queue may go now
        free = self.slots - sum(self._running.values())
        if share is None:
            return free
        return min(self.shares[share] - self._running[share], free - len(self._queues[None]))

    @contextlib.contextmanager
    def slot(
        self,
        check: Callable[[], None] | None = None,
        waiting: Callable[[int], None] | None = None,
        share: str | None = None,
    ) -> Iterator[None]:
        """Hold one slot (of ``share``) for the ``with`` block. While queued, ``waiting(ahead)`` says how many of
        the same queue are ahead and ``check()`` may raise to leave the queue; both run outside the gate's lock."""
        if share is not None and share not in self.shares:
            raise KeyError(f"no share {share!r} in this gate (shares: {', '.join(self.shares) or 'none'})")
        queue = self._queues[share]
        ticket = object()
        with self._condition:
            queue.append(ticket)
        told = None  # the place last shown: a page update only when it changes
        try:
            while True:
                with self._condition:
                    ahead = queue.index(ticket)
                    if ahead < self._free_for(share):
                        queue.remove(ticket)
                        self._running[share] += 1
                        break
                    self._condition.wait(POLL_S)
                    ahead = queue.index(ticket)
                if check is not None:
                    check()
                if waiting is not None and ahead != told:
                    waiting(ahead)
                    told = ahead
        except BaseException:
            with self._condition:
                if ticket in queue:
                    queue.remove(ticket)
                self._condition.notify_all()
            raise
        try:
            yield
        finally:
            with self._condition:
                self._running[share] -= 1
                self._condition.notify_all()

    @property
    def queued(self) -> int:
        with self._condition:
            return sum(len(queue) for queue in self._queues.values())

    def running(self, share: str | None = None) -> int:
        """How many slots the holders of ``share`` (None: outside every share) hold now."""
        with self._condition:
            return self._running[share]


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
