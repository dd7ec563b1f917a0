"""Background training for the Lab page: the server-wide cap, pause and resume, and stopping when the page is gone."""

from __future__ import annotations

import math

import torch

from mha_core.lab import Lab, LabConfig
from tests.conftest import until
from ui.jobs import Presence
from ui.lab_runner import LabRunner, TrainingSlots

TINY = LabConfig(seq_len=10, vocab_size=12, batch_size=4, d_model=16, num_heads=2, seed=4)


def watched() -> Presence:
    """A page that never goes away (these tests do not poll; a slow machine must not make them wait)."""
    return Presence(grace_s=math.inf)


def test_slots_cap_concurrent_trainings_and_come_back():
    slots = TrainingSlots(1)
    first, second = LabRunner(TINY, 100_000, slots, presence=watched()), LabRunner(TINY, 20, slots, presence=watched())
    assert first.start() and first.running
    assert not second.start() and "1 trainings are already running" in second.message
    assert second.status == "new" and slots.in_use == 1
    first.stop()
    assert first.status == "paused" and slots.in_use == 0
    assert second.start()
    second.join(timeout=60)
    assert second.status == "done" and second.lab.step == 20 and slots.in_use == 0
    assert not second.start()  # nothing left to train: no slot taken
    assert slots.in_use == 0


class PausedAt(Presence):
    """A page that is always there and presses Pause once, when the training has done ``step`` steps (between
    two steps, where a click lands): the pause falls on the same step on any machine."""

    def __init__(self, step: int):
        super().__init__(grace_s=math.inf)
        self.step, self.runner = step, None

    def wait_while_away(self) -> None:
        if self.runner is not None and self.runner.lab.step >= self.step:
            self.runner, runner = None, self.runner
            runner.pause()


def test_pause_and_resume_reach_the_same_model_as_one_run():
    torch.set_num_threads(1)
    presence = PausedAt(25)
    runner = LabRunner(TINY, 60, TrainingSlots(2), score_every=10, presence=presence)
    presence.runner = runner
    assert runner.start()
    runner.join(timeout=60)  # the thread ends at the pause
    paused_at = runner.lab.step
    assert runner.status == "paused" and paused_at == 25
    assert runner.start()
    runner.join(timeout=60)
    assert runner.status == "done" and runner.lab.step == 60
    straight = Lab(TINY)
    straight.train(60, score_every=10)
    for a, b in zip(straight.model.state_dict().values(), runner.lab.model.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    snapshot = runner.snapshot()
    assert snapshot.step == 60 and snapshot.attention.shape == (2, 2, 10, 10)
    assert set(range(0, 61, 10)) <= set(snapshot.history["step"])


def test_a_training_nobody_looks_at_stops_and_frees_its_slot():
    slots = TrainingSlots(1)
    presence = Presence(grace_s=0.1, abandon_s=0.5)
    runner = LabRunner(TINY, 1_000_000, slots, presence=presence)
    assert runner.start()
    runner.join(timeout=30)
    assert runner.status == "stopped" and slots.in_use == 0 and 0 < runner.lab.step < 1_000_000
    assert presence.suspensions == 1 and not presence.busy


def test_a_training_waits_while_its_page_is_away_and_goes_on_when_it_comes_back():
    presence = Presence(grace_s=0.2, abandon_s=600)
    runner = LabRunner(TINY, 1_000_000, TrainingSlots(1), presence=presence)
    assert runner.start() and presence.busy
    until(lambda: presence.suspensions == 1)  # no poll for 0.2 s: the thread waits between two steps
    waiting_at = runner.lab.step
    runner.join(timeout=0.5)
    assert runner.lab.step == waiting_at and runner.running  # waiting, not stopped, and not training
    runner.touch()  # the page polls again (a reconnect): training goes on from the same step
    until(lambda: runner.lab.step > waiting_at)
    assert runner.running
    runner.stop()  # Pause (the thread may be waiting for the page again by now: it stops all the same)
    assert runner.status == "paused" and not presence.busy


def test_the_appearance_table_converts_to_arrow_with_a_head_not_yet_there():
    """One role reached at step 50, the other never: the table the page shows converts to one Arrow table
    (a column of numbers and "not yet" made Streamlit log a traceback on every redraw of the Lab page)."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa

    from mha_core.lab import role_appearance
    from ui.lab_runner import appearance_table

    history = pd.DataFrame(
        {
            "step": [0, 0, 50, 50],
            "role": ["previous_token", "induction", "previous_token", "induction"],
            "layer": [0, 1, 0, 1],
            "head": [2, 3, 2, 3],
            "score": [0.1, 0.05, 0.9, 0.2],
        }
    )
    table = appearance_table(role_appearance(history, threshold=0.5), threshold=0.5)
    arrow = pa.Table.from_pandas(table)  # raises ArrowTypeError for a column mixing int and str
    assert arrow.num_rows == 2
    assert table.to_dict("records") == [
        {"role": "previous token", "head": "layer 0 head 2", "score now": 0.9, "first step with score >= 0.5": "50"},
        {"role": "induction", "head": "layer 1 head 3", "score now": 0.2, "first step with score >= 0.5": "not yet"},
    ]
    assert np.isnan(role_appearance(history, threshold=0.5)["appears_at"].iloc[1])
