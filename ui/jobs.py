"""A session's long work in threads of its own, kept going while its page is open and no longer (plain Python).

* ``Presence``: whether a session's page is still there, from a heartbeat the page renews about every
  second while the session has work running (``beat``). Once no beat came for ``grace_s`` (3 s) the page
  is away; once none came for ``abandon_s`` (the server's session TTL, 30 s) the session is gone.
  ``wait_while_away()`` returns at once while the page is there, waits while it is away (a thread
  blocked there uses no CPU) and raises ``SessionGone`` once it is gone: the Lab's training waits there
  between two steps, and goes on where it was when the page comes back.
* ``Job``: one computation (a corpus profile, head importance, an experiment) in a thread, with its
  progress; the session's script waits for it and draws that progress, and a script run that is stopped
  meanwhile (a lost connection, a click elsewhere) leaves the job going for the next run to find. A job
  does not wait inside its computation, which may hold a model's forward lock or one of the server's
  compute slots that other sessions need: at its next progress report while the page is away it
  unwinds (``PageAway``), releasing them, waits outside, and computes again when the page comes back
  (a corpus profile then takes its finished shards from the cache).

Streamlit stops a script run when its browser disconnects, so work done in the script thread cannot
outlive a lost connection and come back; work in these threads can, and the heartbeat decides how long.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from mha_core.progress import fraction

BEAT_S = 1.0  # how often an open page renews the heartbeat while work runs
GRACE_S = 3.0  # no beat for this long: the page is away and the work waits (stopped within 5 s of a closed tab)
ABANDON_S = 30.0  # no beat for this long: the session is gone (the server's disconnectedSessionTTL)


class SessionGone(Exception):
    """The page did not come back within ``Presence.abandon_s``: the work ends."""


class PageAway(BaseException):  # like KeyboardInterrupt: no ``except Exception`` in the work keeps it
    """Raised from a job's progress report while its page is away: the computation unwinds and waits outside."""


class Presence:
    """A session's heartbeat, and the place where its work waits while the page is away."""

    def __init__(self, grace_s: float = GRACE_S, abandon_s: float = ABANDON_S, clock=time.monotonic):
        self.grace_s, self.abandon_s = float(grace_s), max(float(abandon_s), float(grace_s))
        self._clock = clock
        self._condition = threading.Condition()
        self._last_beat = clock()
        self._working = 0
        self.suspensions = 0  # how many times work has waited for the page (for tests and the log)

    def beat(self) -> None:
        """The page is there (its heartbeat fragment ran, or a script run is waiting for the work)."""
        with self._condition:
            self._last_beat = self._clock()
            self._condition.notify_all()

    @property
    def away_s(self) -> float:
        """Seconds since the last beat."""
        return self._clock() - self._last_beat

    @property
    def away(self) -> bool:
        """True once no beat came for ``grace_s``."""
        return self.away_s >= self.grace_s

    @property
    def busy(self) -> bool:
        """True while some work of the session runs (its page must then renew the heartbeat)."""
        return self._working > 0

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Counts a piece of work as running for the ``with`` block (``busy``)."""
        with self._condition:
            self._working += 1
        try:
            yield
        finally:
            with self._condition:
                self._working -= 1

    def wait_while_away(self) -> None:
        """Return at once while the page is there; wait while it is away; ``SessionGone`` once it is gone."""
        with self._condition:
            waited = False
            while True:
                away = self._clock() - self._last_beat
                if away < self.grace_s:
                    return
                if away >= self.abandon_s:
                    raise SessionGone(f"no sign of the page for {away:.0f} s")
                if not waited:
                    waited = True
                    self.suspensions += 1
                self._condition.wait(min(self.abandon_s - away, BEAT_S))


class Job:
    """``compute(job)`` in a thread of its own, started at once. ``compute`` reports through
    ``job.progress(done, total, message)`` (the ``mha_core.progress`` signature) and may call ``job.check()``
    where it has nothing to report (e.g. while queued for memory or a compute slot, whose ``waiting`` is
    ``job.queued``); both raise ``PageAway`` while the page is away (see the module's docstring)."""

    def __init__(self, compute: Callable[[Job], Any], presence: Presence, name: str = "headscope-work"):
        self.presence = presence
        self.fraction, self.message = 0.0, ""
        self.status = "running"  # then "done", "failed" or "stopped" (the session is gone)
        self.attempts = 0  # 1, and one more each time the page came back to a job that had unwound
        self.value: Any = None
        self.error: BaseException | None = None
        self._compute = compute
        self._finished = threading.Event()
        presence.beat()  # the page that starts it is there, however long it was idle before
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def progress(self, done: float, total: float, message: str = "") -> None:
        self.fraction = fraction(done, total)
        if message:
            self.message = message
        self.check()

    def check(self) -> None:
        if self.presence.away:
            raise PageAway

    def queued(self, message: str) -> None:
        """Where the job waits (``ui.compute.admitted``'s ``waiting``: its place in its queue), shown on its
        progress bar until the computation reports progress of its own; ``""`` once it runs."""
        self.message = message

    def _run(self) -> None:
        with self.presence.working():
            try:
                while True:
                    self.attempts += 1
                    try:
                        self.value = self._compute(self)
                        self.status = "done"
                        return
                    except PageAway:
                        self.presence.wait_while_away()  # outside every lock and slot; SessionGone: gone
            except SessionGone:
                self.status = "stopped"
            except Exception as error:  # handed to the script that waits for the job (``result``)
                self.error, self.status = error, "failed"
            finally:
                self._finished.set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """True once the job has finished (within ``timeout`` seconds)."""
        return self._finished.wait(timeout)

    def result(self) -> Any:
        """The value; the job's own error if it failed."""
        if not self.finished:
            raise RuntimeError("the job is still running")
        if self.error is not None:
            raise self.error
        if self.status == "stopped":
            raise SessionGone("the session's page went away")
        return self.value
