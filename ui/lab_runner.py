"""Training a lab model in the background of one session, within a server-wide cap (plain Python, no Streamlit).

* ``TrainingSlots``: at most ``slots`` trainings at once on this server; a session that finds none free
  is told so instead of slowing everyone down.
* ``LabRunner``: one session's lab and the thread that trains it. Start / Pause / Reset; the page reads a
  consistent ``snapshot()`` while the thread trains. The thread stops by itself when it reaches its step
  budget or when it is paused. Between two steps it waits while the session's page is away (``ui.jobs.
  Presence``: no heartbeat for 3 s; a page that comes back resumes it) and ends once the session is gone:
  a closed tab does not keep a core busy. It trains in slices of ``score_every`` steps, each admitted by
  ``admit`` (the app's: heavy work's share of the memory budget and of the compute slots, ``ui.compute``), so
  that trainings and other heavy work take turns and light work never waits for them; while the page is away
  it leaves its slot at the next step.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mha_core.errors import redact_paths
from mha_core.lab import Lab, LabConfig, history_frame, phase_change_step, role_appearance
from ui.jobs import PageAway, Presence, SessionGone

SCORE_EVERY = 25  # steps between two scorings: ~40 points on a 1000-step curve


class TrainingSlots:
    """A counting gate: ``acquire()`` takes a slot if one is free (never waits), ``release()`` gives it back."""

    def __init__(self, slots: int):
        self.slots = max(1, int(slots))
        self._used = 0
        self._lock = threading.Lock()

    def acquire(self) -> bool:
        with self._lock:
            if self._used >= self.slots:
                return False
            self._used += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._used = max(0, self._used - 1)

    @property
    def in_use(self) -> int:
        return self._used


class StopTraining(Exception):
    """Raised from the progress callable to end ``Lab.train`` between two steps."""


@dataclass
class Snapshot:
    """What the page draws, taken under the runner's lock."""

    status: str  # "new", "running", "paused", "done", "stopped" (session gone), "failed"
    step: int
    total_steps: int
    history: pd.DataFrame
    attention: np.ndarray | None  # [L, H, n, n]
    tokens: list[str]
    phase_step: int | None
    appearance: pd.DataFrame
    message: str = ""
    waiting: str = ""  # where the next slice of training waits (its place in heavy work's queue), or ""


class LabRunner:
    def __init__(
        self,
        config: LabConfig,
        total_steps: int,
        slots: TrainingSlots,
        score_every: int = SCORE_EVERY,
        presence: Presence | None = None,
        admit: Callable[[Callable[[], None], Callable[[str], None]], contextlib.AbstractContextManager] | None = None,
    ):
        """``admit(check, waiting)``: a context manager holding what one slice of training needs (the app's
        ``ui.compute.lab_admission``), calling ``waiting(message)`` while it waits and ``check()``, which may
        raise to leave the queue; None: nothing to wait for."""
        self.config, self.total_steps, self.slots = config, int(total_steps), slots
        self._admit = admit or (lambda check, waiting: contextlib.nullcontext())
        self.waiting = ""
        self.score_every = int(score_every)
        self.presence = presence if presence is not None else Presence()  # the session's (ui.session.presence)
        self.lab = Lab(config)
        self.status = "new"
        self.message = ""
        self._lock = threading.Lock()
        self._pause = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- control ---------------------------------------------------------------------------
    def start(self) -> bool:
        """Start or resume training in a thread; False (with ``message``) when the server has no free slot."""
        with self._lock:
            if self.status == "running" or self.lab.step >= self.total_steps:
                return self.status == "running"
            if not self.slots.acquire():
                self.message = (
                    f"{self.slots.slots} trainings are already running on this server; try again in a minute."
                )
                return False
            self.status, self.message = "running", ""
            self._pause.clear()
            self.presence.beat()  # the page that pressed Start is there, however long it was idle before
            self._thread = threading.Thread(target=self._train, name="headscope-lab", daemon=True)
            self._thread.start()
            return True

    def pause(self) -> None:
        self._pause.set()
        self.presence.beat()  # a click is the page being there: a thread waiting for it stops now

    def join(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def stop(self) -> None:
        """Pause and wait for the thread (Reset does this before dropping the runner)."""
        self.pause()
        self.join()

    def touch(self) -> None:
        """The page is still looking (called on every poll)."""
        self.presence.beat()

    @property
    def running(self) -> bool:
        return self.status == "running"

    # ---- the thread ------------------------------------------------------------------------
    def _check(self, done: float = 0, total: float = 0, message: str = "") -> None:
        """Between two slices: waits while the page is away; ``StopTraining`` when paused or the session is gone."""
        if self._pause.is_set():
            raise StopTraining("paused")
        try:
            self.presence.wait_while_away()
        except SessionGone:
            raise StopTraining("stopped") from None
        if self._pause.is_set():  # Pause or Reset pressed by the page that came back
            raise StopTraining("paused")

    def _check_in_slice(self, done: float = 0, total: float = 0, message: str = "") -> None:
        """Inside a slice (or its queue): ``StopTraining`` when paused, ``PageAway`` while the page is away, which
        ends the slice (its steps are kept) and frees its slot; ``_train`` then waits outside."""
        if self._pause.is_set():
            raise StopTraining("paused")
        if self.presence.away:
            raise PageAway

    def _queued(self, message: str) -> None:
        self.waiting = message

    def _train(self) -> None:
        outcome = "done"
        try:
            with self.presence.working():
                while self.lab.step < self.total_steps:
                    self._check()
                    # Slices end at a multiple of score_every: the curves are scored at the same steps as in one go.
                    steps = min(self.score_every - self.lab.step % self.score_every, self.total_steps - self.lab.step)
                    try:
                        with self._admit(self._check_in_slice, self._queued):
                            self.waiting = ""
                            self.lab.train(
                                steps,
                                score_every=self.score_every,
                                progress=self._check_in_slice,
                                score_last=self.lab.step + steps >= self.total_steps,
                            )
                    except PageAway:
                        continue
        except StopTraining as stop:
            outcome = str(stop)
        except Exception as error:  # shown to the visitor: the thread must not die silently
            outcome, self.message = "failed", f"training failed: {redact_paths(str(error))}"
        finally:
            self.waiting = ""
            self.slots.release()
            with self._lock:
                self.status = outcome

    # ---- reading ---------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        self.touch()
        with self._lock:  # the thread appends whole records; a copy of the list is a consistent history
            records = list(self.lab.records)
            attention = self.lab.example_attention
            status, step, message = self.status, self.lab.step, self.message
        history = history_frame(records)
        return Snapshot(
            status=status,
            step=step,
            total_steps=self.total_steps,
            history=history,
            attention=None if attention is None else attention.copy(),
            tokens=self.lab.example_tokens(0),
            phase_step=phase_change_step(history) if len(history) else None,
            appearance=role_appearance(history),
            message=message,
            waiting=self.waiting,
        )


def appearance_table(appearance: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """The Lab page's table of which head took each role and when, one type per column: the step a head
    first reached ``threshold`` is text ("250", or "not yet"), since a column of numbers and text cannot
    travel to the browser as one Arrow column (Streamlit logs a traceback and converts it on every redraw)."""
    reached = appearance["appears_at"]
    return pd.DataFrame(
        {
            "role": appearance["role"].str.replace("_", " "),
            "head": [f"layer {layer} head {head}" for layer, head in zip(appearance["layer"], appearance["head"])],
            "score now": appearance["score"].astype(float).round(3),
            f"first step with score >= {threshold}": ["not yet" if np.isnan(s) else str(int(s)) for s in reached],
        }
    )
