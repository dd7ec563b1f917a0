"""The class session store (ui/class_session.py): restart, expiry, threads, one answer per student, the rate cap,
the teacher token check, the CSV export."""

from __future__ import annotations

import csv
import io
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from ui import class_session as cs
from ui.figures.answers import answers_figure


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def student(n: int) -> str:
    return f"{n:032x}"


def test_view_versions_and_restart_lose_nothing(tmp_path):
    path = tmp_path / "class.sqlite3"
    store = cs.ClassStore(path)
    session = cs.class_id("secret")
    assert store.version(session) == 0 and store.view(session).page is None
    store.open_session(session)
    assert store.publish_view(session, "explore", {"layer": "3", "head": "1"}) == 1
    assert store.publish_view(session, "explore", {"head": "1", "layer": "3"}) == 1  # the same view: no new version
    assert store.publish_view(session, "classroom", {"step": "3"}) == 2
    store.ask(session, "q1", "classroom", "Which?", ["a", "b", "c"], correct=1)
    assert store.version(session) == 3
    assert store.answer(session, "q1", student(1), 2) == cs.ACCEPTED
    store.close()
    reopened = cs.ClassStore(path)  # a server restart: a new process opens the same file
    view = reopened.view(session)
    assert (view.version, view.page, view.params) == (3, "classroom", {"step": "3"})
    assert reopened.counts(session, "q1") == [0, 0, 1]
    assert reopened.answer_of(session, "q1", student(1)) == 2
    assert reopened.answer(session, "q1", student(1), 0) == cs.ALREADY
    assert reopened.counts(session, "q1") == [0, 0, 1]
    assert reopened.question(session, "q1").correct == 1
    assert reopened.journal_mode == "wal"


def test_reveal_reset_and_closed_questions(tmp_path):
    store = cs.ClassStore(tmp_path / "c.sqlite3")
    session = "s"
    store.ask(session, "q", "explore", "Which token?", ["[CLS]", "cat", "it"], correct=1, model_values=[0.1, 0.7, 0.2])
    assert store.answer(session, "q", student(1), 1) == cs.ACCEPTED
    before = store.version(session)
    store.reveal(session, "q")
    assert store.version(session) == before + 1 and store.question(session, "q").revealed
    assert store.answer(session, "q", student(2), 0) == cs.CLOSED  # revealed: no more answers
    assert store.answer(session, "unknown", student(2), 0) == cs.CLOSED
    store.reset(session, "q")
    question = store.question(session, "q")
    assert not question.revealed and store.counts(session, "q") == [0, 0, 0]
    assert question.model_values == pytest.approx((0.1, 0.7, 0.2))
    assert store.answer(session, "q", student(1), 0) == cs.ACCEPTED  # asked again: everyone answers again
    with pytest.raises(ValueError):
        store.answer(session, "q", student(3), 3)  # not an answer offered
    with pytest.raises(ValueError):
        store.answer(session, "q", "not-a-student", 0)
    with pytest.raises(ValueError):
        store.ask(session, "bad", "classroom", "?", ["a"], correct=1)
    # The current question (Explore's) changes the version once, and closing it too.
    version = store.version(session)
    store.ask(session, "q", "explore", "Which token?", ["[CLS]", "cat", "it"], current=True)
    store.ask(session, "q", "explore", "Which token?", ["[CLS]", "cat", "it"], current=True)
    assert store.version(session) == version + 1 and store.view(session).current_question == "q"
    store.close_current(session)
    assert store.view(session).current_question is None and store.version(session) == version + 2


def test_old_sessions_expire_with_their_answers(tmp_path):
    clock = Clock()
    store = cs.ClassStore(tmp_path / "c.sqlite3", expire_after_s=3600, clock=clock)
    store.publish_view("old", "explore", {})
    store.ask("old", "q", "classroom", "?", ["a", "b"])
    store.answer("old", "q", student(1), 0)
    assert store.answers("old", "q") == {student(1): [0]}
    clock.now += 1800
    store.publish_view("new", "explore", {})
    clock.now += 2000  # "old" unused for 3800 s, "new" for 2000 s
    assert store.expire() == 1
    assert store.version("old") == 0 and store.question("old", "q") is None
    assert store.answers("old", "q") == {}
    assert store.version("new") == 1
    # Opening the file again expires too (a server started the next morning).
    clock.now += 4000
    assert cs.ClassStore(tmp_path / "c.sqlite3", expire_after_s=3600, clock=clock).version("new") == 0


def test_rate_cap_per_second_per_session(tmp_path):
    clock = Clock()
    store = cs.ClassStore(tmp_path / "c.sqlite3", max_answers_per_s=5, clock=clock)
    store.ask("s", "q", "classroom", "?", ["a", "b"])
    store.ask("other", "q", "classroom", "?", ["a", "b"])
    results = [store.answer("s", "q", student(n), n % 2) for n in range(8)]
    assert results == [cs.ACCEPTED] * 5 + [cs.BUSY] * 3
    assert store.answer("other", "q", student(99), 0) == cs.ACCEPTED  # another session has its own cap
    clock.now += 1.5
    assert store.answer("s", "q", student(6), 0) == cs.ACCEPTED  # a second later, accepted
    assert sum(store.counts("s", "q")) == 6


def test_threads_lose_no_answer_and_accept_none_twice(tmp_path):
    store = cs.ClassStore(tmp_path / "c.sqlite3", max_answers_per_s=10_000)
    store.ask("s", "q", "classroom", "?", ["a", "b", "c"])
    students, tries = 30, 4  # each student sends its answer 4 times, from 4 threads at once
    results: list[tuple[int, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(students)

    def send(n: int) -> None:
        barrier.wait()
        for attempt in range(tries):
            result = store.answer("s", "q", student(n), (n + attempt) % 3)
            with lock:
                results.append((n, result))
        store.close()

    def publish(n: int) -> None:
        for step in range(20):
            store.publish_view("s", "classroom", {"step": str(step), "by": str(n)})
        store.close()

    threads = [threading.Thread(target=send, args=(n,)) for n in range(students)]
    threads += [threading.Thread(target=publish, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    accepted = [n for n, result in results if result == cs.ACCEPTED]
    assert sorted(accepted) == list(range(students))  # every student's first answer kept, none twice
    assert sum(result == cs.ALREADY for _, result in results) == students * (tries - 1)
    counts = store.counts("s", "q")
    assert counts == [sum(1 for n in range(students) if n % 3 == k) for k in range(3)]
    assert store.version("s") >= 1 + 2  # the question, then views from both threads


def test_token_check_is_strict():
    token = "tok-" + "x" * 30
    assert cs.token_matches(token, token)
    assert not cs.token_matches(token + "y", token)
    assert not cs.token_matches(token[:-1], token)
    assert not cs.token_matches("", token)
    assert not cs.token_matches(None, token)
    assert not cs.token_matches("anything", None)  # no token configured: nobody leads
    assert not cs.token_matches("", "")
    assert not cs.token_matches("é" * 10, token)  # non-ASCII text compares (and fails), no exception
    proof = cs.teacher_proof(token)
    assert cs.proof_matches(proof, token) and proof != token and token not in proof
    assert cs.teacher_proof(token) != proof  # each browser its own proof (a random nonce)...
    assert cs.proof_matches(cs.teacher_proof(token), token)
    assert not cs.proof_matches(proof, token + "y")  # ...and a new token makes every old proof worthless
    nonce, mac = proof.split(".")
    assert not cs.proof_matches(f"{nonce}.{'0' * len(mac)}", token)
    assert not cs.proof_matches(f"{'0' * len(nonce)}.{mac}", token)
    for bad in (None, "", "x", proof + ".", "é.é", token):
        assert not cs.proof_matches(bad, token)
    assert not cs.proof_matches(proof, None)
    assert cs.class_id(token) != cs.class_id(token + "y") and token not in cs.class_id(token)
    assert cs.STUDENT_ID.fullmatch(cs.new_student_id()) and cs.new_student_id() != cs.new_student_id()


def test_student_ids_are_signed_by_the_server():
    """A student id counts only as the server signed it: an id made up by a client, or signed for another token,
    is no id."""
    token = "tok-" + "x" * 30
    signed = cs.signed_student(token)
    student, mac = signed.split(".")
    assert cs.verified_student(signed, token) == student and cs.STUDENT_ID.fullmatch(student)
    assert cs.verified_student(cs.signed_student(token, student), token) == student  # the same id signs the same
    assert cs.signed_student(token) != signed
    assert cs.verified_student(signed, token + "y") is None
    assert cs.verified_student(f"{cs.new_student_id()}.{mac}", token) is None
    assert cs.verified_student(student, token) is None  # a bare id, as an older server set it
    for bad in (None, "", ".", "x.y", signed + "0", signed.upper(), "é" * 3):
        assert cs.verified_student(bad, token) is None
    assert cs.verified_student(signed, None) is None


def test_client_limits_count_each_client_apart():
    clock = Clock(0.0)
    limits = cs.ClientLimits(3, window_s=1.0, clock=clock)
    assert [limits.allow("10.0.0.1") for _ in range(5)] == [True, True, True, False, False]
    assert limits.allow("10.0.0.2")  # another client has its own limit
    clock.now += 0.5
    assert not limits.allow("10.0.0.1")  # refusals were not counted: the window still holds the first three
    clock.now += 0.6
    assert limits.allow("10.0.0.1")  # a second after them


def test_csv_export(tmp_path):
    store = cs.ClassStore(tmp_path / "c.sqlite3")
    store.ask("s", "q1", "classroom", "Which key?", ["=cmd()", "cat", "sat"], correct=1)
    store.answer("s", "q1", student(1), 1)
    store.answer("s", "q1", student(2), 0)
    rows = list(csv.DictReader(io.StringIO(store.export_csv("s"))))
    assert [(row["answer"], row["correct"]) for row in rows] == [("cat", "1"), ("'=cmd()", "0")]
    assert rows[0]["student"] == cs.student_label(student(1)) != cs.student_label(student(2))
    assert student(1) not in store.export_csv("s")  # the browser's id is not given away
    assert rows[0]["correct_answer"] == "cat" and rows[0]["prompt"] == "Which key?"


def test_start_token_is_kept_for_a_restart(tmp_path):
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": str(tmp_path)}
    env.pop(cs.TOKEN_ENV, None)
    command = [sys.executable, "-m", "ui.class_session", "token"]
    first = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    again = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert len(first) >= 30 and first == again
    assert (tmp_path / "class" / "teacher-token").stat().st_mode & 0o077 == 0
    given = subprocess.run(
        command, env={**env, cs.TOKEN_ENV: "my-own-token"}, cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert given.stdout.strip() == "my-own-token"


def test_answers_figure_data():
    fig = answers_figure(["[CLS]", "<b>cat</b>", "it"], [1, 3, 0], correct=1, model_values=[0.2, 0.5, 0.3], mine=0)
    class_bars, model_bars = fig.data
    assert list(class_bars.y) == pytest.approx([0.25, 0.75, 0.0])
    assert list(class_bars.text) == ["1", "3", "0"]
    assert list(class_bars.marker.color) == ["#4c78a8", "#54a24b", "#4c78a8"]
    assert list(model_bars.y) == pytest.approx([0.2, 0.5, 0.3])
    ticks = list(fig.layout.xaxis.ticktext)
    assert ticks[1] == "&lt;b&gt;cat&lt;/b&gt;" and ticks[0].endswith("(you)")
    assert fig.layout.showlegend  # two kinds of bar: a legend names them
    empty = answers_figure(["a", "b"], [0, 0])
    assert list(empty.data[0].y) == [0.0, 0.0] and len(empty.data) == 1
    assert empty.layout.showlegend is False and empty.layout.margin.t < 40  # the class's bars alone: no legend


def test_the_class_file_and_its_wal_are_private(tmp_path):
    """The class file holds raw student ids: it and its -wal and -shm are mode 0600 (an older file is made so)."""
    path = tmp_path / "c.sqlite3"
    store = cs.ClassStore(path)
    store.ask("s", "q", "classroom", "?", ["a", "b"])
    assert store.answer("s", "q", student(1), 0) == cs.ACCEPTED
    files = [path, Path(f"{path}-wal"), Path(f"{path}-shm")]
    assert all(name.exists() for name in files)  # WAL mode, a connection open: all three are there
    assert [oct(name.stat().st_mode & 0o777) for name in files] == [oct(0o600)] * 3
    store.close()
    for name in files:
        if name.exists():
            os.chmod(name, 0o644)  # as an earlier version left them
    reopened = cs.ClassStore(path)
    reopened.answer("s", "q", student(2), 1)
    assert [oct(name.stat().st_mode & 0o777) for name in files if name.exists()] == [oct(0o600)] * sum(
        name.exists() for name in files
    )


@pytest.mark.slow
def test_a_15_second_lock_loses_no_answer(tmp_path):
    """Another process holds a write lock on the class file for 15 s while 12 students answer: every answer waits
    and is stored once the lock goes (none lost, none twice); a publish that may wait only briefly says busy."""
    path = tmp_path / "c.sqlite3"
    store = cs.ClassStore(path)
    store.ask("s", "q", "classroom", "?", ["a", "b", "c"])
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # the write lock, as a backup tool or a second server would hold it
        other.execute("UPDATE sessions SET touched = touched")
        locked.set()
        release.wait(15)
        other.execute("COMMIT")
        other.close()

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(30)
    results: dict[int, str] = {}

    def send(n: int) -> None:
        results[n] = store.answer("s", "q", student(n), n % 3)

    senders = [threading.Thread(target=send, args=(n,)) for n in range(12)]
    for sender in senders:
        sender.start()
    with pytest.raises(cs.StoreBusy):  # the teacher's publish does not wait the lock out: it tries again later
        store.publish_view("s", "classroom", {"step": "2"}, wait_s=0.2)
    assert sum(store.counts("s", "q")) == 0  # readers are not blocked by the lock (WAL); nothing is in yet
    release.set()
    holder.join(60)
    for sender in senders:
        sender.join(120)
    assert results == {n: cs.ACCEPTED for n in range(12)}
    assert store.answers("s", "q") == {student(n): [n % 3] for n in range(12)}


def test_a_lock_past_the_deadline_is_store_busy_and_stores_nothing(tmp_path):
    path = tmp_path / "c.sqlite3"
    store = cs.ClassStore(path, write_wait_s=0.3)
    store.ask("s", "q", "classroom", "?", ["a", "b"])
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(cs.StoreBusy):
            store.answer("s", "q", student(1), 0)
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert store.answers("s", "q") == {}
    assert store.answer("s", "q", student(1), 0) == cs.ACCEPTED  # the lock gone, the click again is stored
