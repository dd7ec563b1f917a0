"""Background training for the Lab page: slices that take turns, pause and resume, and stopping when the page is gone."""

from __future__ import annotations

import math

import torch

from mha_core.lab import Lab, LabConfig
from mha_core.operations import HEAVY, LabTraining, training_step_bytes
from tests.conftest import until
from ui.budget import ByteBudgetCache, ComputeGate
from ui.jobs import Presence
from ui.lab_runner import LabRunner

TINY = LabConfig(seq_len=10, vocab_size=12, batch_size=4, d_model=16, num_heads=2, seed=4)


def watched() -> Presence:
    """A page that never goes away (these tests do not poll; a slow machine must not make them wait)."""
    return Presence(grace_s=math.inf)


def direct(operation, lab, progress, check, waiting):
    """A slice run as it is (the app's ``ui.compute.run_admitted`` holds its share of the server first)."""
    return operation.run(lab, progress)


def test_trainings_take_turns_in_heavy_works_share_each_slice_reserving_its_peak():
    """No slots of its own: every slice of every training is one ``LabTraining`` operation, admitted as the app
    admits any (its peak bytes, then a slot of heavy work's share); two trainings with one heavy slot take turns,
    never train at once, and each ends where one training alone would."""
    torch.set_num_threads(1)
    cache, gate = ByteBudgetCache(1 << 30, shares={"heavy": 1 << 29}), ComputeGate(2, shares={"heavy": 1})
    seen = {"at_once": 0, "most_at_once": 0, "slices": [], "reserved": set()}

    def admitted(operation, lab, progress, check, waiting):
        share = operation.work_class.share
        with cache.reserve(operation.peak_bytes(lab), check=check, share=share), gate.slot(check=check, share=share):
            seen["at_once"] += 1
            seen["most_at_once"] = max(seen["most_at_once"], seen["at_once"])
            seen["slices"].append(operation)
            seen["reserved"].add(cache.stats()["heavy_reserved_bytes"])
            try:
                return operation.run(lab, progress)
            finally:
                seen["at_once"] -= 1

    first, second = (LabRunner(TINY, 60, admitted, score_every=10, presence=watched()) for _ in range(2))
    assert first.start() and second.start()
    first.join(timeout=120)
    second.join(timeout=120)
    assert first.status == second.status == "done" and first.lab.step == second.lab.step == 60
    assert seen["most_at_once"] == 1  # one heavy slot: the slices took turns
    assert len(seen["slices"]) == 12 and {s.steps for s in seen["slices"]} == {10}
    assert all(isinstance(s, LabTraining) and s.work_class is HEAVY for s in seen["slices"])
    # Each running slice held its training step's peak (and the other training's waiting slice its own, memory
    # being reserved before the slot, as for every computation).
    step = training_step_bytes(TINY)
    assert step > 0 and step in seen["reserved"] and seen["reserved"] <= {step, 2 * step}
    assert [s.score_last for s in seen["slices"]].count(True) == 2  # the last slice of each scores its last step
    straight = Lab(TINY)
    straight.train(60, score_every=10)
    for runner in (first, second):
        for a, b in zip(straight.model.state_dict().values(), runner.lab.model.state_dict().values()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert not first.start()  # nothing left to train
    assert gate.queued == 0 and cache.stats()["reserved_bytes"] == 0


class PausedAt(Presence):
    """A page that is always there and presses Pause once, when the training has done ``step`` steps: the runner
    asks its page between two slices (``_check``), so a pause pressed then falls on the same step on any machine."""

    def __init__(self, step: int):
        super().__init__(grace_s=math.inf)
        self.step, self.runner = step, None

    def wait_while_away(self) -> None:
        if self.runner is not None and self.runner.lab.step >= self.step:
            self.runner, runner = None, self.runner
            runner.pause()


def test_pause_and_resume_reach_the_same_model_as_one_run():
    torch.set_num_threads(1)
    presence = PausedAt(30)  # a slice boundary: slices of score_every = 10 steps
    runner = LabRunner(TINY, 60, direct, score_every=10, presence=presence)
    presence.runner = runner
    assert runner.start()
    runner.join(timeout=60)  # the thread ends at the pause
    paused_at = runner.lab.step
    assert runner.status == "paused" and paused_at == 30
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
    gate = ComputeGate(1, shares={"heavy": 1})

    def admitted(operation, lab, progress, check, waiting):
        with gate.slot(check=check, share="heavy"):
            return operation.run(lab, progress)

    presence = Presence(grace_s=0.1, abandon_s=0.5)
    runner = LabRunner(TINY, 1_000_000, admitted, presence=presence)
    assert runner.start()
    runner.join(timeout=30)
    assert runner.status == "stopped" and gate.running("heavy") == 0 and 0 < runner.lab.step < 1_000_000
    assert presence.suspensions == 1 and not presence.busy


def test_a_training_waits_while_its_page_is_away_and_goes_on_when_it_comes_back():
    presence = Presence(grace_s=0.2, abandon_s=600)
    runner = LabRunner(TINY, 1_000_000, direct, presence=presence)
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
