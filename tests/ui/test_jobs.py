"""A session's long work in threads (ui/jobs.py): it waits while the page is away (a job unwinds first, freeing
what it holds), goes on when the page comes back, and ends once the session is gone; a job's value or error
reaches the script that waits for it."""

from __future__ import annotations

import threading
import time

import pytest

from tests.conftest import until
from ui.jobs import Job, Presence, SessionGone


class Clock:
    """A clock the test moves by hand."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_presence_passes_waits_and_gives_up_by_the_time_since_the_last_beat():
    clock = Clock()
    presence = Presence(grace_s=3, abandon_s=30, clock=clock)
    clock.now += 2.9
    presence.wait_while_away()  # within the grace period: returns at once
    assert presence.suspensions == 0
    clock.now += 27.1  # 30 s without a beat: the session is gone
    with pytest.raises(SessionGone):
        presence.wait_while_away()
    # 5 s without a beat: the work waits for the page; a beat lets it go on.
    presence.beat()
    clock.now += 5
    waiter = threading.Thread(target=presence.wait_while_away)
    waiter.start()
    until(lambda: presence.suspensions == 1)  # the waiter has found the page away and waits for it
    waiter.join(0.3)
    assert waiter.is_alive() and presence.suspensions == 1
    presence.beat()
    waiter.join(30)
    assert not waiter.is_alive()
    assert presence.away_s == 0


def test_a_job_unwinds_while_its_page_is_away_and_computes_again_when_it_comes_back():
    presence = Presence(grace_s=0.2, abandon_s=600)
    steps: list[int] = []
    finish = threading.Event()
    held = threading.Lock()  # stands for a model's forward lock or a compute slot, which others need

    def count(job: Job) -> int:
        while not finish.is_set():
            with held:
                job.progress(len(steps), 1_000_000, f"step {len(steps)}")
            steps.append(len(steps))
            time.sleep(0.001)
        return len(steps)

    job = Job(count, presence)
    assert presence.busy and job.attempts == 1
    until(lambda: presence.suspensions == 1)  # no beat for 0.2 s: the job has unwound and waits outside
    waiting_at = len(steps)
    assert not job.wait(0.5) and len(steps) == waiting_at and job.status == "running"
    assert held.acquire(blocking=False)  # what the computation held is free while it waits
    held.release()
    until(lambda: presence.beat() or len(steps) > waiting_at + 20)  # the page is back: it computes again
    assert job.attempts == 2
    finish.set()
    until(lambda: presence.beat() or job.finished)
    assert job.status == "done" and job.result() == len(steps) and not presence.busy
    assert job.message == f"step {len(steps) - 1}" and 0 < job.fraction < 1


def test_a_job_of_a_session_that_is_gone_ends_and_a_failure_reaches_the_caller():
    presence = Presence(grace_s=0.05, abandon_s=0.3)

    def forever(job: Job) -> None:
        while True:
            job.progress(0, 1)
            time.sleep(0.001)

    job = Job(forever, presence)
    assert job.wait(60) and job.status == "stopped" and not presence.busy
    with pytest.raises(SessionGone):
        job.result()

    def fails(job: Job) -> None:
        raise ValueError("a bad corpus")

    failed = Job(fails, Presence())
    assert failed.wait(60) and failed.status == "failed"
    with pytest.raises(ValueError, match="a bad corpus"):
        failed.result()
