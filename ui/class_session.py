"""A class session kept in SQLite: who leads, the view the class follows, questions and answers (plain Python).

One file under the cache directory (``class/sessions.sqlite3``, WAL mode), so a server restart in the middle of a
class loses nothing: the session, its current view (with a version number), every question and every answer are
read back from it. Followers poll one number (``ClassStore.version``); the view itself is read only when that
number changed. Every change a follower must see (the teacher moved, a question was asked, revealed or reset)
raises it.

A class session is named by the teacher's token (``class_id``): the server that holds the token leads that session,
and a restart with the same token finds it again. The token is checked on the server in constant time
(``token_matches``); students are anonymous, known only by an unguessable per-browser id, and answer each question
once (the answers' primary key); a session accepts at most ``max_answers_per_s`` answers a second. Sessions not
used for ``expire_after_s`` (12 h) are deleted with their questions and answers.

The file and its ``-wal``/``-shm`` are mode 0600 (they hold the students' ids). Another process holding a write
lock on the file makes a write wait and try again (SQLite's busy timeout, then a retry until ``write_wait_s``): an
answer sent during a 15-second lock is stored once the lock goes; only past the deadline does a call raise
``StoreBusy``, which the app turns into "click again". Connections are pooled (a Streamlit run is a new thread).

A student is known by a signed id (``signed_student``): the id and an HMAC of it under a key made from the teacher
token, which the class server sets as an HttpOnly cookie (``ui.class_http``) and a session reads back from its
connection's cookies (``verified_student``); an id the server did not make is no id. ``ClientLimits`` bounds what
one client address may do (identities made, answers sent) in this process's memory, apart from the session's cap.

Also a command: ``python -m ui.class_session token`` prints the teacher token for ``scripts/app.sh --classroom``
(``HEADSCOPE_TEACHER_TOKEN``, else the one kept in the cache directory while it is younger than the expiry, else
a new one), so a restarted server keeps the teacher's link.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import hmac
import io
import json
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from mha_core.cache import cache_dir

EXPIRE_AFTER_S = 12 * 3600.0  # a class session not used for this long is deleted
MAX_ANSWERS_PER_S = 60  # answers a session accepts in one second: a class of 30 answers well within it
MAX_OPTIONS = 64  # answers offered by one question (tokens of a sentence, at most)
STUDENT_ID = re.compile(r"[0-9a-f]{32}")  # what ``new_student_id`` makes; anything else is not a student id
TOKEN_ENV = "HEADSCOPE_TEACHER_TOKEN"
BUSY_WAIT_S = 2.0  # one attempt waits this long for another writer (SQLite's busy timeout), then tries again
WRITE_WAIT_S = 40.0  # a write keeps trying this long before ``StoreBusy`` (a 15 s lock loses nothing)
READ_WAIT_S = 5.0
POOLED_CONNECTIONS = 8  # idle connections kept for the next run (each Streamlit run is a new thread)
FILE_MODE = 0o600  # the class file holds raw student ids: only the server's user reads it

# Results of ``ClassStore.answer``.
ACCEPTED, ALREADY, BUSY, CLOSED = "accepted", "already answered", "busy", "closed"


class StoreBusy(Exception):
    """The class file stayed locked by another writer past the deadline: nothing was written; try again."""


SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, created REAL NOT NULL, touched REAL NOT NULL, version INTEGER NOT NULL,
    page TEXT, params TEXT NOT NULL DEFAULT '{}', current_question TEXT
);
CREATE TABLE IF NOT EXISTS questions (
    session TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE, key TEXT NOT NULL, kind TEXT NOT NULL,
    prompt TEXT NOT NULL, options TEXT NOT NULL, correct INTEGER, model_values TEXT,
    revealed INTEGER NOT NULL DEFAULT 0, asked REAL NOT NULL, PRIMARY KEY (session, key)
);
CREATE TABLE IF NOT EXISTS answers (
    session TEXT NOT NULL, question TEXT NOT NULL, student TEXT NOT NULL, choice INTEGER NOT NULL, at REAL NOT NULL,
    PRIMARY KEY (session, question, student),
    FOREIGN KEY (session, question) REFERENCES questions(session, key) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS answers_by_time ON answers (session, at);
"""


def default_path() -> Path:
    """``$HEADSCOPE_CLASS_DB``, else ``class/sessions.sqlite3`` in the cache directory."""
    return Path(os.environ.get("HEADSCOPE_CLASS_DB") or cache_dir() / "class" / "sessions.sqlite3")


def class_id(token: str) -> str:
    """The session a teacher token leads (a digest: the token itself is never stored)."""
    return hashlib.sha256(f"headscope-class\n{token}".encode()).hexdigest()[:32]


def token_matches(given: str | None, token: str | None) -> bool:
    """True when ``given`` is the teacher token; constant time, and never true without a token configured."""
    if not token or not isinstance(given, str) or not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode("utf-8"))


def _mac(token: str, purpose: bytes, text: str) -> str:
    return hmac.new(token.encode(), purpose + b"\n" + text.encode(), hashlib.sha256).hexdigest()[:32]


def teacher_proof(token: str, nonce: str | None = None) -> str:
    """What a teacher's browser keeps (an HttpOnly cookie) instead of the token: a random nonce and its HMAC under
    the token, so each browser's proof differs and a new token (``start_token`` makes one every 12 h, or
    ``HEADSCOPE_TEACHER_TOKEN`` changed) makes every old proof worthless."""
    nonce = nonce or secrets.token_hex(16)
    return f"{nonce}.{_mac(token, b'headscope-teacher-browser', nonce)}"


def proof_matches(given: str | None, token: str | None) -> bool:
    """True when ``given`` is a proof ``teacher_proof`` made with ``token`` (constant time)."""
    if not token or not isinstance(given, str) or given.count(".") != 1:
        return False
    nonce, mac = given.split(".")
    if not re.fullmatch(r"[0-9a-f]{32}", nonce):
        return False
    return hmac.compare_digest(
        mac.encode("utf-8", "replace"), _mac(token, b"headscope-teacher-browser", nonce).encode()
    )


def new_student_id() -> str:
    """An unguessable per-browser id (128 random bits)."""
    return secrets.token_hex(16)


def signed_student(token: str, student: str | None = None) -> str:
    """A student identity as the server hands it to a browser: ``id.mac`` (a new id unless ``student`` given)."""
    student = student or new_student_id()
    return f"{student}.{_mac(token, b'headscope-student', student)}"


def verified_student(given: str | None, token: str | None) -> str | None:
    """The student id of a cookie ``signed_student`` made with ``token``; None for anything else (a made-up id, an
    id of another token, no cookie)."""
    if not token or not isinstance(given, str) or given.count(".") != 1:
        return None
    student, mac = given.split(".")
    if not STUDENT_ID.fullmatch(student):
        return None
    expected = _mac(token, b"headscope-student", student)
    return student if hmac.compare_digest(mac.encode("utf-8", "replace"), expected.encode()) else None


class ClientLimits:
    """At most ``limit`` events per ``window_s`` for each client (an address), in this process's memory: what one
    client may do, counted apart from what the class as a whole may do. Thread-safe."""

    def __init__(self, limit: int, window_s: float, clock=time.monotonic, max_clients: int = 4096):
        self.limit, self.window_s, self._clock, self._max = int(limit), float(window_s), clock, max_clients
        self._events: dict[str, deque] = {}
        self._lock = threading.Lock()

    def allow(self, client: str | None) -> bool:
        """Count one event of ``client`` if it is within its limit; False (and nothing counted) when it is not."""
        now = self._clock()
        with self._lock:
            if len(self._events) > self._max:  # forget clients with no recent event: memory stays bounded
                self._events = {k: v for k, v in self._events.items() if v and v[-1] > now - self.window_s}
            events = self._events.setdefault(str(client), deque())
            while events and events[0] <= now - self.window_s:
                events.popleft()
            if len(events) >= self.limit:
                return False
            events.append(now)
            return True


def _first(cursor):
    """A query's first row (None without one), its statement run to the end and closed: a statement left open
    keeps its read snapshot, and a pooled connection would go on reading that old state in later calls."""
    rows = cursor.fetchall()
    cursor.close()
    return rows[0] if rows else None


def _busy(error: sqlite3.OperationalError) -> bool:
    text = str(error).lower()
    return "locked" in text or "busy" in text


def _private_file(path: Path) -> None:
    """The class file and its WAL and shared-memory files exist with mode 0600 (SQLite gives the -wal and -shm it
    makes the database file's mode); files left with another mode by an older version are set to 0600."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE)
    os.close(descriptor)
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        with contextlib.suppress(FileNotFoundError):
            if name.stat().st_mode & 0o777 != FILE_MODE:
                os.chmod(name, FILE_MODE)


def student_label(student: str) -> str:
    """How the CSV export names a student: the same browser gets the same label, which does not give its id."""
    return "s-" + hashlib.sha256(student.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class View:
    """What the class follows: the teacher's page and its address's settings, at ``version``."""

    version: int
    page: str | None
    params: dict
    current_question: str | None


@dataclass(frozen=True)
class Question:
    key: str
    kind: str  # "classroom" (a step's prediction) or "explore" (a token a head attends to)
    prompt: str
    options: tuple[str, ...]
    correct: int | None
    model_values: tuple[float, ...] | None
    revealed: bool


class ClassStore:
    """The class sessions of one server, in one SQLite file; safe to use from many threads (a connection each)."""

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        expire_after_s: float = EXPIRE_AFTER_S,
        max_answers_per_s: int = MAX_ANSWERS_PER_S,
        clock=time.time,
        write_wait_s: float = WRITE_WAIT_S,
    ):
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.expire_after_s, self.max_answers_per_s = float(expire_after_s), int(max_answers_per_s)
        self.write_wait_s = float(write_wait_s)
        self._clock = clock
        self._idle: list[sqlite3.Connection] = []
        self._pool_lock = threading.Lock()
        _private_file(self.path)
        with self._connection() as db:
            db.executescript(SCHEMA)  # its own transaction (executescript commits first)
        _private_file(self.path)  # the -wal and -shm SQLite just made
        self.expire()

    # ---- connections ----------------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=BUSY_WAIT_S, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # WAL: a power cut may lose the last moment, never corrupt
        db.execute("PRAGMA foreign_keys=ON")
        return db

    @contextlib.contextmanager
    def _connection(self):
        """A connection of its own for one call (from the pool, or new): one thread uses it at a time."""
        with self._pool_lock:
            db = self._idle.pop() if self._idle else None
        if db is None:
            db = self._connect()
        try:
            yield db
        finally:
            if db.in_transaction:  # a failure between BEGIN and COMMIT: leave nothing open
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            with self._pool_lock:
                kept = len(self._idle) < POOLED_CONNECTIONS
                if kept:
                    self._idle.append(db)
            if not kept:
                db.close()

    def _retrying(self, work, *, write: bool, wait_s: float | None = None):
        """``work(db)`` in a transaction of its own (``write``: BEGIN IMMEDIATE, one writer at a time, decided at
        the start: no lost updates), tried again while another connection holds the lock, for at most ``wait_s``
        (``write_wait_s`` for writes); then ``StoreBusy``."""
        wait_s = (self.write_wait_s if write else READ_WAIT_S) if wait_s is None else wait_s
        give_up, pause = time.monotonic() + wait_s, 0.05
        while True:
            try:
                with self._connection() as db:
                    if not write:
                        return work(db)
                    db.execute("BEGIN IMMEDIATE")
                    result = work(db)
                    db.execute("COMMIT")
                    return result
            except sqlite3.OperationalError as error:
                if not _busy(error):
                    raise
                left = give_up - time.monotonic()
                if left <= 0:
                    raise StoreBusy(f"the class file is locked ({error})") from error
            time.sleep(min(pause, max(left, 0.0)))
            pause = min(pause * 2, 0.5)

    def _read(self, work, wait_s: float | None = None):
        return self._retrying(work, write=False, wait_s=wait_s)

    def _write(self, work, wait_s: float | None = None):
        return self._retrying(work, write=True, wait_s=wait_s)

    def close(self) -> None:
        """Close the pooled connections (one in use closes when it comes back and the pool is full)."""
        with self._pool_lock:
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()

    # ---- sessions and the view --------------------------------------------------------------------------
    def open_session(self, session: str) -> None:
        """Make sure ``session`` exists (a teacher starting, or coming back after a restart); expired sessions
        are deleted then (and when the file is opened)."""
        self.expire()
        now = self._clock()
        self._write(
            lambda db: db.execute(
                "INSERT INTO sessions (id, created, touched, version) VALUES (?, ?, ?, 0) "
                "ON CONFLICT(id) DO UPDATE SET touched = excluded.touched",
                (session, now, now),
            )
        )

    def version(self, session: str, wait_s: float | None = None) -> int:
        """The number every follower polls: 0 for a session that does not exist (yet, or any more)."""
        row = self._read(lambda db: _first(db.execute("SELECT version FROM sessions WHERE id = ?", (session,))), wait_s)
        return int(row[0]) if row else 0

    def view(self, session: str) -> View:
        row = self._read(
            lambda db: _first(
                db.execute("SELECT version, page, params, current_question FROM sessions WHERE id = ?", (session,))
            )
        )
        if row is None:
            return View(0, None, {}, None)
        return View(int(row[0]), row[1], json.loads(row[2]), row[3])

    def publish_view(self, session: str, page: str, params: dict, wait_s: float | None = None) -> int:
        """The teacher's view is now ``page`` with ``params`` (str -> str); the version rises only if it changed.
        ``wait_s``: how long to keep trying while the file is locked (then ``StoreBusy``)."""
        params = {str(k): str(v) for k, v in params.items()}
        text = json.dumps(params, sort_keys=True)
        now = self._clock()

        def publish(db) -> int:
            self._ensure(db, session, now)
            row = _first(db.execute("SELECT version, page, params FROM sessions WHERE id = ?", (session,)))
            if row[1] == page and row[2] == text:
                return int(row[0])
            db.execute(
                "UPDATE sessions SET version = version + 1, page = ?, params = ?, touched = ? WHERE id = ?",
                (page, text, now, session),
            )
            return int(row[0]) + 1

        return self._write(publish, wait_s)

    def _ensure(self, db, session: str, now: float) -> None:
        db.execute(
            "INSERT INTO sessions (id, created, touched, version) VALUES (?, ?, ?, 0) ON CONFLICT(id) DO NOTHING",
            (session, now, now),
        )

    def _bump(self, db, session: str) -> None:
        db.execute("UPDATE sessions SET version = version + 1, touched = ? WHERE id = ?", (self._clock(), session))

    # ---- questions ----------------------------------------------------------------------------------------
    def ask(
        self,
        session: str,
        key: str,
        kind: str,
        prompt: str,
        options,
        correct: int | None = None,
        model_values=None,
        current: bool = False,
    ) -> Question:
        """The question ``key`` of ``session`` (made now if new; an existing one keeps its answers).
        ``current``: it becomes the session's current question (Explore shows that one)."""
        options = [str(option) for option in options][:MAX_OPTIONS]
        if not options:
            raise ValueError("a question needs at least one answer to choose")
        if correct is not None and not 0 <= int(correct) < len(options):
            raise ValueError("the correct answer is not one of the options")
        values = None if model_values is None else json.dumps([float(v) for v in model_values][: len(options)])
        now = self._clock()

        def ask(db) -> None:
            self._ensure(db, session, now)
            inserted = db.execute(
                "INSERT INTO questions (session, key, kind, prompt, options, correct, model_values, asked) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(session, key) DO NOTHING",
                (session, key, kind, prompt, json.dumps(options), correct, values, now),
            ).rowcount
            changed = inserted > 0
            if current:
                row = _first(db.execute("SELECT current_question FROM sessions WHERE id = ?", (session,)))
                if row[0] != key:
                    db.execute("UPDATE sessions SET current_question = ? WHERE id = ?", (key, session))
                    changed = True
            if changed:
                self._bump(db, session)

        self._write(ask)
        return self.question(session, key)

    def close_current(self, session: str) -> None:
        """No current question any more (its answers stay, for the export)."""

        def close(db) -> None:
            if db.execute("UPDATE sessions SET current_question = NULL WHERE id = ?", (session,)).rowcount:
                self._bump(db, session)

        self._write(close)

    def question(self, session: str, key: str) -> Question | None:
        row = self._read(
            lambda db: _first(
                db.execute(
                    "SELECT key, kind, prompt, options, correct, model_values, revealed FROM questions "
                    "WHERE session = ? AND key = ?",
                    (session, key),
                )
            )
        )
        if row is None:
            return None
        values = None if row[5] is None else tuple(json.loads(row[5]))
        key, kind, prompt, options, correct = row[:5]
        return Question(
            key, kind, prompt, tuple(json.loads(options)), correct=correct, model_values=values, revealed=bool(row[6])
        )

    def reveal(self, session: str, key: str) -> None:
        def reveal(db) -> None:
            if db.execute(
                "UPDATE questions SET revealed = 1 WHERE session = ? AND key = ? AND revealed = 0", (session, key)
            ).rowcount:
                self._bump(db, session)

        self._write(reveal)

    def reset(self, session: str, key: str) -> None:
        """Ask ``key`` again: its answers deleted, its answer hidden."""

        def reset(db) -> None:
            db.execute("DELETE FROM answers WHERE session = ? AND question = ?", (session, key))
            db.execute("UPDATE questions SET revealed = 0 WHERE session = ? AND key = ?", (session, key))
            self._bump(db, session)

        self._write(reset)

    # ---- answers ------------------------------------------------------------------------------------------
    def answer(self, session: str, key: str, student: str, choice: int) -> str:
        """Record ``student``'s answer: ``ACCEPTED``; ``ALREADY`` (one answer per question: the first stays);
        ``CLOSED`` (no such question, or already revealed); ``BUSY`` (the session's answers per second are at
        their cap). Raises ``ValueError`` for an id that is not a student id or a choice that is not offered,
        ``StoreBusy`` when the file stayed locked for ``write_wait_s`` (nothing stored: the student clicks again)."""
        if not isinstance(student, str) or not STUDENT_ID.fullmatch(student):
            raise ValueError("not a student id")

        def answer(db) -> str:
            now = self._clock()
            row = _first(
                db.execute("SELECT options, revealed FROM questions WHERE session = ? AND key = ?", (session, key))
            )
            if row is None or row[1]:
                return CLOSED
            if not (isinstance(choice, int) and 0 <= choice < len(json.loads(row[0]))):
                raise ValueError("not one of the answers offered")
            recent = _first(
                db.execute("SELECT COUNT(*) FROM answers WHERE session = ? AND at > ?", (session, now - 1.0))
            )[0]
            if recent >= self.max_answers_per_s:
                return BUSY
            inserted = db.execute(
                "INSERT INTO answers (session, question, student, choice, at) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(session, question, student) DO NOTHING",
                (session, key, student, choice, now),
            ).rowcount
            return ACCEPTED if inserted else ALREADY

        return self._write(answer)

    def answer_of(self, session: str, key: str, student: str) -> int | None:
        row = self._read(
            lambda db: _first(
                db.execute(
                    "SELECT choice FROM answers WHERE session = ? AND question = ? AND student = ?",
                    (session, key, student),
                )
            )
        )
        return None if row is None else int(row[0])

    def answers(self, session: str, key: str) -> dict[str, list[int]]:
        """Every stored answer of ``key``, by student id (a list, so that two answers of one student would show)."""
        rows = self._read(
            lambda db: db.execute(
                "SELECT student, choice FROM answers WHERE session = ? AND question = ? ORDER BY at", (session, key)
            ).fetchall()
        )
        found: dict[str, list[int]] = {}
        for student, choice in rows:
            found.setdefault(student, []).append(int(choice))
        return found

    def latest_question(self, session: str) -> str | None:
        """The key of the question asked last in ``session``."""
        row = self._read(
            lambda db: _first(
                db.execute("SELECT key FROM questions WHERE session = ? ORDER BY asked DESC LIMIT 1", (session,))
            )
        )
        return None if row is None else row[0]

    @property
    def journal_mode(self) -> str:
        return self._read(lambda db: _first(db.execute("PRAGMA journal_mode"))[0])

    def counts(self, session: str, key: str) -> list[int]:
        """How many students chose each option of ``key`` (zeros for an unknown question)."""
        question = self.question(session, key)
        if question is None:
            return []
        counts = [0] * len(question.options)
        rows = self._read(
            lambda db: db.execute(
                "SELECT choice, COUNT(*) FROM answers WHERE session = ? AND question = ? GROUP BY choice",
                (session, key),
            ).fetchall()
        )
        for choice, count in rows:
            counts[int(choice)] = int(count)
        return counts

    def export_csv(self, session: str) -> str:
        """Every answer of ``session``, one row each: question, prompt, the student's label, the answer, whether
        it was the model's, and when (UTC)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(
            ["question", "kind", "prompt", "student", "answer", "correct_answer", "correct", "answered_utc"]
        )
        rows = self._read(
            lambda db: db.execute(
                "SELECT q.key, q.kind, q.prompt, q.options, q.correct, a.student, a.choice, a.at FROM answers a "
                "JOIN questions q ON q.session = a.session AND q.key = a.question WHERE a.session = ? "
                "ORDER BY q.asked, a.at",
                (session,),
            ).fetchall()
        )
        for key, kind, prompt, options, correct, student, choice, at in rows:
            options = json.loads(options)
            writer.writerow(
                [
                    key,
                    kind,
                    _csv_safe(prompt),
                    student_label(student),
                    _csv_safe(options[choice]),
                    "" if correct is None else _csv_safe(options[correct]),
                    "" if correct is None else int(choice == correct),
                    time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)),
                ]
            )
        return buffer.getvalue()

    # ---- expiry -------------------------------------------------------------------------------------------
    def expire(self) -> int:
        """Delete the sessions not used for ``expire_after_s``, with their questions and answers; how many."""
        return self._write(
            lambda db: (
                db.execute("DELETE FROM sessions WHERE touched < ?", (self._clock() - self.expire_after_s,)).rowcount
            )
        )

    def touch(self, session: str) -> None:
        self._write(lambda db: db.execute("UPDATE sessions SET touched = ? WHERE id = ?", (self._clock(), session)))


def _csv_safe(text: str) -> str:
    """A cell a spreadsheet shows as text: a leading = + - @ would make it a formula (CSV injection)."""
    text = str(text)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


# ---- the teacher token for scripts/app.sh ---------------------------------------------------------------------
def token_path() -> Path:
    return cache_dir() / "class" / "teacher-token"


def start_token(now: float | None = None) -> str:
    """``HEADSCOPE_TEACHER_TOKEN`` if set; else the token kept in the cache directory while it is younger than
    ``EXPIRE_AFTER_S`` (a restarted server keeps its teacher link); else a new one, kept there (mode 0600)."""
    given = os.environ.get(TOKEN_ENV, "").strip()
    if given:
        return given
    path, now = token_path(), time.time() if now is None else now
    try:
        if now - path.stat().st_mtime < EXPIRE_AFTER_S:
            kept = path.read_text(encoding="ascii").strip()
            if re.fullmatch(r"[A-Za-z0-9_-]{20,}", kept):
                return kept
    except (OSError, UnicodeDecodeError):
        pass
    token = secrets.token_urlsafe(24)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as file:
        file.write(token + "\n")
    return token


if __name__ == "__main__":
    if sys.argv[1:] != ["token"]:
        sys.exit("usage: python -m ui.class_session token")
    print(start_token())
