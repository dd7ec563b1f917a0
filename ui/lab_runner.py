"""Training a lab model in the background of one session (plain Python, no Streamlit).

``LabRunner``: one session's lab and the thread that trains it. Start / Pause / Reset; the page reads a
consistent ``snapshot()`` while the thread trains. The thread stops by itself when it reaches its step budget or
when it is paused. Between two steps it waits while the session's page is away (``ui.jobs.Presence``: no
heartbeat for 3 s; a page that comes back resumes it) and ends once the session is gone: a closed tab does not
keep a core busy. It trains in slices of ``score_every`` steps, each one operation
(``mha_core.operations.LabTraining``) run by ``run`` (the app's ``ui.compute.run_admitted``: the slice's peak bytes
held in heavy work's share of the memory budget and a compute slot of heavy work's share, as every other
computation), so that trainings and other heavy work take turns in one queue and light work never waits for
them; while the page is away it leaves its slot at the next step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from mha_core.errors import redact_paths
from mha_core.lab import Lab, LabConfig, history_frame, phase_change_step, role_appearance
from mha_core.operations import LabTraining
from ui.jobs import PageAway, Presence, SessionGone

SCORE_EVERY = 25  # steps between two scorings: ~40 points on a 1000-step curve


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
    message: str = ""  # why training failed (the error's words), or ""
    waiting: str = ""  # where the next slice of training waits (its place in heavy work's queue), or ""


class LabRunner:
    def __init__(
        self,
        config: LabConfig,
        total_steps: int,
        run: Callable[..., object],
        score_every: int = SCORE_EVERY,
        presence: Presence | None = None,
    ):
        """``run(operation, lab, progress, check, waiting)``: what runs one slice of training (the app's
        ``ui.compute.run_admitted``), calling ``waiting(message)`` while it waits for its turn and ``check()``,
        which may raise to leave the queue; ``progress`` goes to the training's steps."""
        self.config, self.total_steps = config, int(total_steps)
        self._run = run
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
        """Start or resume training in a thread (its slices then wait for their turn); False when it is done."""
        with self._lock:
            if self.status == "running" or self.lab.step >= self.total_steps:
                return self.status == "running"
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
                    training = LabTraining(
                        self.config, steps, self.score_every, score_last=self.lab.step + steps >= self.total_steps
                    )
                    try:
                        self._run(training, self.lab, self._check_in_slice, self._check_in_slice, self._queued)
                    except PageAway:
                        continue
        except StopTraining as stop:
            outcome = str(stop)
        except Exception as error:  # shown to the visitor: the thread must not die silently
            outcome, self.message = "failed", redact_paths(str(error))  # the page says it failed
        finally:
            self.waiting = ""
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


def english(text: str, /, **values) -> str:
    """``text`` with its ``{fields}`` filled: the words of ``appearance_table`` when no language is given."""
    return text.format(**values) if values else text


def role_name(role: str, words: Callable[..., str] = english) -> str:
    """A role's name in words ("previous token", "offset -3"), through ``words`` (the page's ``ui.i18n.t``)."""
    if role.startswith("offset_"):
        return words("offset {k}", k=role.removeprefix("offset_"))
    return words(role.replace("_", " "))


def appearance_table(appearance: pd.DataFrame, threshold: float, words: Callable[..., str] = english) -> pd.DataFrame:
    """The Lab page's table of which head took each role and when, one type per column: the step a head
    first reached ``threshold`` is text ("250", or "not yet"), since a column of numbers and text cannot
    travel to the browser as one Arrow column (Streamlit logs a traceback and converts it on every redraw).
    ``words(text, **values)``: the table's words in the page's language (``ui.i18n.t``; English by default)."""
    reached = appearance["appears_at"]
    not_yet = words("not yet")
    return pd.DataFrame(
        {
            words("role"): [role_name(role, words) for role in appearance["role"]],
            words("head"): [
                words("layer {layer} head {head}", layer=layer, head=head)
                for layer, head in zip(appearance["layer"], appearance["head"])
            ],
            words("score now"): appearance["score"].astype(float).round(3),
            words("first step with score >= {threshold}", threshold=threshold): [
                not_yet if np.isnan(s) else str(int(s)) for s in reached
            ],
        }
    )
