"""Classroom load: one server in classroom mode, many browser sessions at once, in Debian Chromium.

    python -m bench.classroom [--sessions 1,10,30] [--json PATH] [--quick] [--parts ...]

A teacher starts the app (``HEADSCOPE_CLASSROOM=1``, bound to 0.0.0.0 as ``scripts/app.sh --classroom``
does, a fresh temporary ``HEADSCOPE_CACHE_DIR``) and thirty students open the link at once. All traffic
goes to 127.0.0.1. Every browser session is its own Playwright context (own cookies, own Streamlit
session) in ONE Chromium, driven with Playwright's async API so that sessions really act at once.
Every sentence a session types carries a marker word unique to that session and round, so no cached
run is ever reused and a figure showing another session's marker is caught as cross-talk.

Parts (``--parts``, all by default):

concurrency  For N sessions (``--sessions``): all open the link together, the browsers settle (their CPU
             below ``SETTLED_CORES``, at most a minute: a class reads before it types), then in each round every
             session types its own ~20-token MiniLM sentence and they press Enter together. Measured:
             errors (not drawn in time, exceptions, st.error boxes, a traceback), cross-talk (a figure
             with another session's marker, or without its own once drawn), median and p95 time from
             Enter until the Explore head view is completely drawn (``tools.browser.head_view_js``) and
             until its data arrived over the websocket (the server's share of that time), the
             server's CPU seconds per interaction (psutil, the server process and its children, from
             just before Enter until every session is idle again), the browser's CPU per interaction,
             and the server's peak RSS (sampled every 0.2 s in a thread).
heavy        K sessions keep typing MiniLM sentences while one more session does heavy work: the first
             SmolLM2 load (a GGUF conversion when the cache directory is fresh) with a 512-token run,
             then several 512-token SmolLM2 runs; their Enter -> drawn times against the same K sessions
             with nothing heavy running.
abandoned    One session fires a burst of long SmolLM2 runs (new text + Enter, several times quickly)
             and closes its browser context; the server's CPU seconds and RSS growth in the 0-10 s and
             10-20 s after it left, against the idle server.
memory       A second server with ``HEADSCOPE_CACHE_BUDGET_MB`` (``--budget-mb``, 1024) gets distinct
             long texts for BOTH embedded models as links (``?model=smollm2&text=...``, many cut at 512
             tokens, ~280 MB of attention per SmolLM2 run) from a few sessions; the server's RSS over
             time (start, after loading the models, max, end) against the budget: "under the budget"
             when the peak RSS minus the RSS with both models loaded is at most the budget.

teacher      A teacher leads: 30 lightweight followers (Streamlit's websocket protocol, nothing drawn) and 2
             Chromium followers, 10 moves and 5 questions; follow time p95 (goal 2 s), answers lost and
             accepted twice (goal 0), every click acknowledged within 2 s, late joiners on the view, server
             CPU per follower per minute (bench/class_teacher.py; ``--followers``, ``--class-browsers``,
             ``--class-root`` to serve another checkout, e.g. the code before a change).

``--quick`` (under 3 minutes once its cache holds the converted SmolLM2): N = 1, 3, fewer links, and a
kept cache directory (bench/out/classroom-cache) instead of a fresh one, so SmolLM2 loads without the
conversion. ``--server-arg`` passes options to ``streamlit run`` (e.g. ``--runner.postScriptGC=false``).

Prints the load average and Markdown tables; ``--json PATH`` writes every row. Nothing is asserted:
the goals (0 errors and 0 cross-talk at 30 sessions, p95 <= 8 s at 30, server CPU <= 0.25 s per
interaction) are printed beside the numbers. The server and the browser are stopped on exit, Ctrl-C
included. Timings on a shared machine are noisy: compare the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlencode

import psutil

from bench import class_teacher
from bench.class_teacher import percentile
from tools.browser import (
    APP_IDLE_JS,
    HEAD_VIEW_TOKENS_JS,
    PAGE_PROBLEMS_JS,
    SENTENCE_LABEL,
    StreamlitServer,
    chromium_launch_options,
    head_view_js,
    start_streamlit,
)

# ---- settings ---------------------------------------------------------------------------------------
CLASSROOM_ENV = {"HEADSCOPE_CLASSROOM": "1"}
CLASSROOM_ADDRESS = "0.0.0.0"  # as the classroom setting binds; the benchmark itself only uses 127.0.0.1
HEADS = {"minilm": 12, "smollm2": 9}
SHORT_TOKENS = 20  # a student's sentence, in MiniLM tokens ([CLS] and [SEP] included)
LONG_TOKENS = 600  # more than the 512-token cap: the run is cut to 512 (SmolLM2: 283 MB of attention)
POLL_MS = 50  # how often a page checks whether its view is drawn (the timing resolution)
TYPING_PAUSE_S = 1.0  # a typing session's pause between one drawn view and its next sentence
VIEWPORT = {"width": 1500, "height": 1100}
GOALS = {"p95_s": 8.0, "cpu_s": 0.25, "sessions": 30}
ROOT = Path(__file__).resolve().parents[1]
# --quick keeps its cache directory (the converted SmolLM2 checkpoint), so only its first run converts.
QUICK_CACHE_DIR = ROOT / "bench" / "out" / "classroom-cache"

# Filler words around the marker; markers are never taken from these.
FILLER_TEXT = (
    "the students in our class read a short story about a small village near the sea where people "
    "fish early in the morning and sell fresh bread at the market before the rain comes down over "
    "the hills and everyone walks home along the river"
)
FILLER = FILLER_TEXT.split()


@dataclass(frozen=True)
class Profile:
    """How much of each part to run: the full benchmark or ``--quick``."""

    sessions: tuple[int, ...] = (1, 10, 30)
    rounds: int = 3  # rounds of Enter per N (fewer if the N's time limit is reached)
    seconds_per_n: float = 100.0  # no new round for an N after this long (after the sessions opened)
    heavy_typists: int = 5  # K sessions typing during the heavy work
    heavy_baseline_each: int = 4  # interactions per typist with nothing heavy running
    first_load_tokens: int = LONG_TOKENS  # the text of the session that loads SmolLM2 first
    heavy_long_runs: int = 3  # 512-token SmolLM2 runs after the load
    burst: int = 5  # long runs fired by the session that then leaves
    idle_seconds: float = 10.0  # how long the idle server's CPU is measured, for comparison
    memory_sentences: int = 200
    memory_workers: int = 2  # sessions following the links in parallel
    memory_seconds: float = 2400.0  # the memory part stops after this long, whatever is left
    # RSS measured again this long after the last link (0: not measured). Streamlit keeps a closed session
    # up to 2 minutes for a reconnect, but its store drops expired ones only when it is next used.
    memory_settle_seconds: float = 130.0
    interaction_timeout_s: float = 60.0
    followers: int = 30  # the teacher part's lightweight followers (bench/class_teacher.py)
    class_browsers: int = 2  # and its Chromium followers


QUICK = Profile(
    sessions=(1, 3),
    rounds=2,
    seconds_per_n=40.0,
    heavy_typists=2,
    heavy_baseline_each=2,
    first_load_tokens=SHORT_TOKENS,
    heavy_long_runs=0,
    burst=3,
    idle_seconds=3.0,
    memory_sentences=24,
    memory_workers=2,
    memory_seconds=25.0,
    memory_settle_seconds=0.0,
    followers=5,
    class_browsers=1,
)


# ---- texts --------------------------------------------------------------------------------------------
class Texts:
    """Sentences of a given token length with a marker word, and an endless supply of fresh markers.

    A marker is a lowercase word that both embedded tokenizers read as one token after "the"
    (MiniLM: ``cow``; SmolLM2: ``Ġcow``), so the head view shows it as a whole token. Markers come
    from the two vocabularies shuffled by ``seed``: the same seed types the same texts, and a new seed
    makes sure nothing a server cached on disk in an earlier run is reused.
    """

    def __init__(self, seed: int):
        from transformers import AutoTokenizer
        from transformers.utils import logging as hf_logging

        from mha_core.models.sources import minilm_path, smollm2_gguf_path

        hf_logging.set_verbosity_error()
        gguf = smollm2_gguf_path()
        self.tokenizers = {
            "minilm": AutoTokenizer.from_pretrained(minilm_path()),
            "smollm2": AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name),
        }
        bert_vocab = self.tokenizers["minilm"].get_vocab()
        bpe_vocab = self.tokenizers["smollm2"].get_vocab()
        candidates = sorted(
            word
            for word in bert_vocab
            if word.isascii()
            and word.isalpha()
            and word.islower()
            and 4 <= len(word) <= 8
            and "Ġ" + word in bpe_vocab
            and word not in FILLER
        )
        random.Random(seed).shuffle(candidates)
        self._candidates = iter(candidates)
        self._offset = 0

    def marker(self) -> str:
        """A marker never handed out before in this run."""
        for word in self._candidates:
            if self.tokenizers["minilm"].tokenize(f"the {word}") == ["the", word] and self.tokenizers[
                "smollm2"
            ].tokenize(f"the {word}") == ["the", "Ġ" + word]:
                return word
        raise RuntimeError("out of marker words")

    def count(self, model: str, text: str) -> int:
        return len(self.tokenizers[model](text)["input_ids"])

    def sentence(self, model: str, marker: str, num_tokens: int) -> str:
        """ "the <marker> ..." with filler words, as close to ``num_tokens`` tokens as words allow (not over).

        The marker comes second: views that show only the first tokens of a long text still show it.
        """
        self._offset += 7  # another stretch of filler each time, so texts differ beyond their marker

        def text_of(num_words: int) -> str:
            filler = [FILLER[(self._offset + i) % len(FILLER)] for i in range(max(num_words - 2, 0))]
            return " ".join(["the", marker, *filler])

        low, high = 2, num_tokens  # every word is at least one token
        while low < high:  # the most words whose text has at most num_tokens tokens
            middle = (low + high + 1) // 2
            if self.count(model, text_of(middle)) <= num_tokens:
                low = middle
            else:
                high = middle - 1
        return text_of(low)


# ---- measuring processes --------------------------------------------------------------------------------
def _cpu_seconds(processes) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
    return total


class ServerMonitor:
    """The server's CPU seconds and resident memory (its process and any children); RSS sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.process = psutil.Process(pid)
        self.samples: list[tuple[float, int]] = []  # (time.monotonic(), RSS bytes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), name="rss-sampler", daemon=True)
        self._thread.start()

    def _processes(self) -> list[psutil.Process]:
        try:
            return [self.process, *self.process.children(recursive=True)]
        except psutil.Error:
            return []

    def cpu_seconds(self) -> float:
        return _cpu_seconds(self._processes())

    def rss(self) -> int:
        total = 0
        for process in self._processes():
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def _sample(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.samples.append((time.monotonic(), self.rss()))

    def peak_rss(self, since: float, until: float = float("inf")) -> int:
        values = [rss for at, rss in list(self.samples) if since <= at <= until]
        return max(values, default=self.rss())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def browser_cpu_seconds() -> float:
    """CPU seconds of the Chromium processes this benchmark started (live ones)."""
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0.0
    return _cpu_seconds(p for p in descendants if "chrom" in _name(p))


def _name(process: psutil.Process) -> str:
    try:
        return process.name().lower()
    except psutil.Error:
        return ""


def mb(num_bytes: float) -> float:
    return num_bytes / 2**20


def load_average() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


# ---- browser sessions ------------------------------------------------------------------------------------
@dataclass
class Interaction:
    """One Enter in one session."""

    seconds: float | None  # Enter -> the head view drawn with the session's marker; None if never
    server_seconds: float | None = None  # Enter -> the head view's data received over the websocket
    error: str | None = None  # timeout, exception, or a problem shown on the page
    cross_talk: bool = False  # another session's marker in the figure, or its own missing once drawn


@dataclass
class Session:
    """A student: one browser context (own cookies, own Streamlit session) with one page.

    It also watches its page's websocket: ``received_at`` is when the first message holding the
    head view's data for the awaited marker arrived (the server's share of Enter -> drawn).
    """

    name: str
    context: object
    page: object
    markers: set[str] = field(default_factory=set)
    awaited: re.Pattern | None = None
    received_at: float | None = None

    def watch_websocket(self) -> None:
        def on_frame(payload) -> None:
            if self.awaited is not None and self.received_at is None:
                data = payload if isinstance(payload, bytes) else str(payload).encode()
                if self.awaited.search(data):
                    self.received_at = time.perf_counter()

        self.page.on("websocket", lambda websocket: websocket.on("framereceived", on_frame))

    def expect(self, marker: str) -> None:
        """From now on, note when the head view's data for ``marker`` arrives: the marker as a token of its
        own, a JSON string in the component's data (the sentence itself only ever travels inside longer text)."""
        self.awaited = re.compile(rb'"' + re.escape(marker.encode()) + rb'"')
        self.received_at = None

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.context.close()


# True as soon as the page shows an exception or an st.error box (cheap enough to poll every 50 ms).
PAGE_FAILED_JS = """
() => !!document.querySelector('[data-testid="stException"], [data-testid="stAlertContentError"]')
"""


async def wait_drawn(page, model: str, marker: str, timeout_s: float) -> str | None:
    """Until the head view shows ``marker`` (None) or the page shows an error (its text); raises on timeout."""
    drawn = head_view_js(HEADS[model], marker)
    await page.wait_for_function(
        f"() => ({drawn})() || ({PAGE_FAILED_JS})()", timeout=timeout_s * 1000, polling=POLL_MS
    )
    if await page.evaluate(drawn):
        return None
    return "; ".join(await page.evaluate(PAGE_PROBLEMS_JS))[:200] or "an error on the page"


def link(url: str, model: str, text: str) -> str:
    return f"{url}/?{urlencode({'model': model, 'text': text, 'page': 'explore'})}"


async def open_session(
    browser, name: str, address: str, model: str, marker: str, timeout_s: float
) -> tuple[Session, float]:
    """A new context opening ``address``; returns the session and the seconds until its head view was drawn."""
    context = await browser.new_context(viewport=VIEWPORT)
    session = Session(name, context, await context.new_page(), {marker})
    session.watch_websocket()
    start = time.perf_counter()
    try:
        await session.page.goto(address, timeout=timeout_s * 1000)
        problem = await wait_drawn(session.page, model, marker, timeout_s)
        if problem:
            raise RuntimeError(f"{name}: {problem}")
    except BaseException:
        await session.close()
        raise
    return session, time.perf_counter() - start


# A class does not type the instant its pages load: before the first round, the browsers finish what the
# opening burst left them (N pages laid out and painted at once on the same 2 cores), for at most this long.
SETTLED_CORES = 0.3
SETTLE_MAX_SECONDS = 60.0


async def browsers_settle(window_s: float = 2.0) -> float:
    """Seconds until the benchmark's Chromium processes use less than ``SETTLED_CORES`` over ``window_s``."""
    began = time.monotonic()
    while time.monotonic() - began < SETTLE_MAX_SECONDS:
        before = browser_cpu_seconds()
        await asyncio.sleep(window_s)
        if (browser_cpu_seconds() - before) / window_s < SETTLED_CORES:
            break
    return time.monotonic() - began


async def wait_idle(session: Session, timeout_s: float) -> bool:
    """Until the session's script run has finished; False if it had not within ``timeout_s``."""
    try:
        await session.page.wait_for_function(APP_IDLE_JS, timeout=timeout_s * 1000, polling=200)
        return True
    except Exception:
        return False


async def fill_sentence(session: Session, text: str) -> None:
    await session.page.get_by_label(SENTENCE_LABEL, exact=True).fill(text)


async def shown_markers(session: Session, markers: set[str]) -> set[str]:
    tokens = await session.page.evaluate(HEAD_VIEW_TOKENS_JS) or []
    return markers & set(tokens)


async def press_enter_and_wait(
    session: Session, model: str, marker: str, foreign: set[str], timeout_s: float
) -> Interaction:
    """Enter in the (already filled) sentence box; wait until drawn; check the page. Never raises."""
    page = session.page
    try:
        session.expect(marker)
        start = time.perf_counter()
        await page.get_by_label(SENTENCE_LABEL, exact=True).press("Enter")
        try:
            problem = await wait_drawn(page, model, marker, timeout_s)
            result = Interaction(None, problem) if problem else Interaction(time.perf_counter() - start)
            if session.received_at is not None and not problem:
                result.server_seconds = session.received_at - start
        except Exception as error:
            result = Interaction(
                None,
                f"not drawn within {timeout_s:.0f} s"
                if "Timeout" in type(error).__name__
                else f"{type(error).__name__}: {str(error)[:120]}",
            )
        seen = await shown_markers(session, foreign | {marker})
        result.cross_talk = bool(seen & foreign)
        await wait_idle(session, timeout_s)
        seen = await shown_markers(session, foreign | {marker})
        # Once drawn with its own marker, the figure must keep it and never show anyone else's.
        result.cross_talk = (
            result.cross_talk or bool(seen & foreign) or (result.seconds is not None and marker not in seen)
        )
        problems = await page.evaluate(PAGE_PROBLEMS_JS)
        if problems and not result.error:
            result.error = "; ".join(problems)[:200]
        return result
    except Exception as error:  # the page itself failed (closed, crashed)
        return Interaction(None, f"{type(error).__name__}: {str(error)[:120]}")


async def type_and_wait(session: Session, texts: Texts, foreign: set[str], timeout_s: float) -> Interaction:
    """One MiniLM sentence with a fresh marker, typed and Entered, waited for."""
    marker = texts.marker()
    session.markers.add(marker)
    await fill_sentence(session, texts.sentence("minilm", marker, SHORT_TOKENS))
    return await press_enter_and_wait(session, "minilm", marker, foreign, timeout_s)


async def open_sessions(
    browser, url: str, texts: Texts, count: int, prefix: str, timeout_s: float
) -> tuple[list[Session], list[float], list[str]]:
    """``count`` sessions opening their own MiniLM link at once: (sessions, open seconds, errors)."""
    markers = [texts.marker() for _ in range(count)]
    outcomes = await asyncio.gather(
        *(
            open_session(
                browser,
                f"{prefix}{i}",
                link(url, "minilm", texts.sentence("minilm", marker, SHORT_TOKENS)),
                "minilm",
                marker,
                timeout_s,
            )
            for i, marker in enumerate(markers)
        ),
        return_exceptions=True,
    )
    sessions, seconds, errors = [], [], []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            errors.append(f"open: {type(outcome).__name__}: {str(outcome)[:120]}")
        else:
            sessions.append(outcome[0])
            seconds.append(outcome[1])
    await asyncio.gather(*(wait_idle(session, timeout_s) for session in sessions))
    return sessions, seconds, errors


# ---- part: concurrency ---------------------------------------------------------------------------------
async def concurrency_part(
    browser, server: StreamlitServer, monitor: ServerMonitor, texts: Texts, profile: Profile, results: dict
) -> None:
    rows = results.setdefault("concurrency", [])
    for n in profile.sessions:
        print(f"\n[concurrency] {n} sessions, load average {load_average()}", flush=True)
        began = time.monotonic()
        sessions, open_seconds, open_errors = await open_sessions(
            browser, server.url, texts, n, f"s{n}-", timeout_s=max(120.0, 6.0 * n)
        )
        open_median = statistics.median(open_seconds) if open_seconds else None
        print(f"  opened {len(sessions)}/{n}; open link -> drawn median {_fmt(open_median)} s", flush=True)
        settled = await browsers_settle()
        print(f"  browsers settled after {settled:.1f} s (their CPU below {SETTLED_CORES} cores)", flush=True)
        rounds_began = time.monotonic()  # the rounds' time limit starts once everyone is in
        interactions: list[Interaction] = []
        server_cpu = browser_cpu = 0.0
        rounds = 0
        while (
            sessions
            and rounds < profile.rounds
            and (rounds == 0 or time.monotonic() - rounds_began < profile.seconds_per_n)
        ):
            markers = {session.name: texts.marker() for session in sessions}
            for session in sessions:
                session.markers.add(markers[session.name])
            everyone = set().union(*(session.markers for session in sessions))
            await asyncio.gather(
                *(
                    fill_sentence(session, texts.sentence("minilm", markers[session.name], SHORT_TOKENS))
                    for session in sessions
                )
            )
            cpu_before, browser_before = monitor.cpu_seconds(), browser_cpu_seconds()
            outcome = await asyncio.gather(
                *(
                    press_enter_and_wait(
                        session,
                        "minilm",
                        markers[session.name],
                        everyone - session.markers,
                        profile.interaction_timeout_s,
                    )
                    for session in sessions
                )
            )
            server_cpu += monitor.cpu_seconds() - cpu_before
            browser_cpu += browser_cpu_seconds() - browser_before
            interactions += outcome
            rounds += 1
            times = [i.seconds for i in outcome if i.seconds is not None]
            print(
                f"  round {rounds}: median {_fmt(statistics.median(times) if times else None)} s, "
                f"max {_fmt(max(times, default=None))} s, errors {sum(1 for i in outcome if i.error)}, "
                f"cross-talk {sum(i.cross_talk for i in outcome)}",
                flush=True,
            )
            for problem in sorted({i.error for i in outcome if i.error})[:3]:
                print(f"    {problem}", flush=True)
        await asyncio.gather(*(session.close() for session in sessions))
        times = [i.seconds for i in interactions if i.seconds is not None]
        received = [i.server_seconds for i in interactions if i.server_seconds is not None]
        count = max(len(interactions), 1)
        rows.append(
            {
                "sessions": n,
                "rounds": rounds,
                "interactions": len(interactions),
                "errors": len(open_errors) + sum(1 for i in interactions if i.error),
                "cross_talk": sum(i.cross_talk for i in interactions),
                "open_median_s": open_median,
                "open_p95_s": percentile(open_seconds, 95),
                "median_s": statistics.median(times) if times else None,
                "p95_s": percentile(times, 95),
                "max_s": max(times, default=None),
                "received_median_s": statistics.median(received) if received else None,
                "received_p95_s": percentile(received, 95),
                "server_cpu_per_interaction_s": server_cpu / count,
                "browser_cpu_per_interaction_s": browser_cpu / count,
                "peak_server_rss_mb": mb(monitor.peak_rss(began)),
                "load_average": load_average(),
                "error_examples": sorted({i.error for i in interactions if i.error} | set(open_errors))[:5],
            }
        )


# ---- part: heavy work ----------------------------------------------------------------------------------
async def typing_loop(
    session: Session, texts: Texts, foreign_of, stop: asyncio.Event, max_interactions: int, timeout_s: float
) -> list[Interaction]:
    """MiniLM sentences one after another (TYPING_PAUSE_S between) until ``stop`` or ``max_interactions``."""
    done: list[Interaction] = []
    while not stop.is_set() and len(done) < max_interactions:
        done.append(await type_and_wait(session, texts, foreign_of(session), timeout_s))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=TYPING_PAUSE_S)
    return done


async def heavy_part(
    browser,
    server: StreamlitServer,
    monitor: ServerMonitor,
    texts: Texts,
    profile: Profile,
    cache_dir: Path,
    results: dict,
) -> None:
    print(f"\n[heavy] {profile.heavy_typists} sessions typing MiniLM, load average {load_average()}", flush=True)
    rows = results.setdefault("heavy", [])
    typists, _, open_errors = await open_sessions(
        browser, server.url, texts, profile.heavy_typists, "typist-", timeout_s=120.0
    )
    everyone = lambda: set().union(*(s.markers for s in typists))  # noqa: E731
    foreign_of = lambda session: everyone() - session.markers  # noqa: E731

    async def phase(label: str, heavy_work, max_each: int) -> None:
        stop = asyncio.Event()
        began = time.perf_counter()
        loops = [
            asyncio.create_task(typing_loop(s, texts, foreign_of, stop, max_each, profile.interaction_timeout_s))
            for s in typists
        ]
        heavy_seconds, heavy_error = None, None
        if heavy_work is not None:
            try:
                heavy_seconds = await heavy_work()
            except Exception as error:
                heavy_error = f"{type(error).__name__}: {str(error)[:120]}"
            stop.set()
        interactions = [i for loop in await asyncio.gather(*loops) for i in loop]
        times = [i.seconds for i in interactions if i.seconds is not None]
        row = {
            "phase": label,
            "heavy_seconds": heavy_seconds,
            "heavy_error": heavy_error,
            "interactions": len(interactions),
            "errors": sum(1 for i in interactions if i.error),
            "cross_talk": sum(i.cross_talk for i in interactions),
            "median_s": statistics.median(times) if times else None,
            "p95_s": percentile(times, 95),
            "max_s": max(times, default=None),
            "seconds": time.perf_counter() - began,
            "load_average": load_average(),
        }
        rows.append(row)
        print(
            f"  {label}: heavy {_fmt(heavy_seconds)} s {heavy_error or ''}; {len(interactions)} MiniLM "
            f"interactions, median {_fmt(row['median_s'])} s, p95 {_fmt(row['p95_s'])} s, errors {row['errors']}",
            flush=True,
        )

    heavy: dict[str, Session] = {}

    async def load_smollm2() -> float:
        marker = texts.marker()
        session, seconds = await open_session(
            browser,
            "heavy",
            link(server.url, "smollm2", texts.sentence("smollm2", marker, profile.first_load_tokens)),
            "smollm2",
            marker,
            timeout_s=300.0,
        )
        heavy["session"] = session
        return seconds

    async def long_runs() -> float:
        session = heavy["session"]
        began = time.perf_counter()
        for _ in range(profile.heavy_long_runs):
            marker = texts.marker()
            await fill_sentence(session, texts.sentence("smollm2", marker, LONG_TOKENS))
            outcome = await press_enter_and_wait(session, "smollm2", marker, set(), timeout_s=180.0)
            if outcome.error:
                raise RuntimeError(outcome.error)
        return time.perf_counter() - began

    try:
        await phase("nothing heavy", None, profile.heavy_baseline_each)
        converted = any(cache_dir.glob("smollm2-*/model.safetensors"))
        first_run = "512-token run" if profile.first_load_tokens > 512 else f"{profile.first_load_tokens}-token run"
        await phase(
            "SmolLM2 first load" + (" (cache present)" if converted else " (GGUF conversion)") + f" + {first_run}",
            load_smollm2,
            200,
        )
        if "session" in heavy and profile.heavy_long_runs:
            await phase(f"{profile.heavy_long_runs} SmolLM2 runs of 512 tokens", long_runs, 200)
    finally:
        await asyncio.gather(*(s.close() for s in [*typists, *heavy.values()]))
    if open_errors:
        rows[0]["errors"] += len(open_errors)


# ---- part: abandoned sessions --------------------------------------------------------------------------
async def abandoned_part(
    browser, server: StreamlitServer, monitor: ServerMonitor, texts: Texts, profile: Profile, results: dict
) -> None:
    print(
        f"\n[abandoned] burst of {profile.burst} long SmolLM2 runs, then leave; load average {load_average()}",
        flush=True,
    )
    marker = texts.marker()
    session, _ = await open_session(
        browser,
        "leaver",
        link(server.url, "smollm2", texts.sentence("smollm2", marker, SHORT_TOKENS)),
        "smollm2",
        marker,
        timeout_s=300.0,
    )
    await wait_idle(session, 60)
    await asyncio.sleep(2)
    idle_before = monitor.cpu_seconds()
    await asyncio.sleep(profile.idle_seconds)
    idle_cpu = (monitor.cpu_seconds() - idle_before) * 10 / profile.idle_seconds
    box = session.page.get_by_label(SENTENCE_LABEL, exact=True)
    burst_began = time.perf_counter()
    for _ in range(profile.burst):
        await box.fill(texts.sentence("smollm2", texts.marker(), LONG_TOKENS))
        await box.press("Enter")
        await asyncio.sleep(0.4)
    burst_seconds = time.perf_counter() - burst_began
    await session.close()
    left_at = time.monotonic()
    cpu_at_leave, rss_at_leave = monitor.cpu_seconds(), monitor.rss()
    per_second = []  # server CPU seconds in each second after leaving
    checkpoints = {}
    previous = cpu_at_leave
    for second in range(1, 21):
        await asyncio.sleep(max(0.0, left_at + second - time.monotonic()))
        now = monitor.cpu_seconds()
        per_second.append(now - previous)
        previous = now
        if second in (10, 20):
            checkpoints[second] = (now, monitor.rss())
    busy = [second for second, cpu in enumerate(per_second, start=1) if cpu > 0.2]
    row = {
        "runs_fired": profile.burst,
        "burst_seconds": burst_seconds,
        "idle_cpu_per_10s": idle_cpu,
        "cpu_0_10s": checkpoints[10][0] - cpu_at_leave,
        "cpu_10_20s": checkpoints[20][0] - checkpoints[10][0],
        "busy_until_s": max(busy, default=0),
        "rss_at_leave_mb": mb(rss_at_leave),
        "rss_10s_mb": mb(checkpoints[10][1]),
        "rss_20s_mb": mb(checkpoints[20][1]),
        "peak_rss_after_leave_mb": mb(monitor.peak_rss(left_at)),
        "load_average": load_average(),
        "cpu_per_second_after_leave": [round(c, 3) for c in per_second],
    }
    results["abandoned"] = row
    print(
        f"  CPU after leaving: 0-10 s {row['cpu_0_10s']:.2f} s, 10-20 s {row['cpu_10_20s']:.2f} s "
        f"(idle {idle_cpu:.2f} s per 10 s); RSS {row['rss_at_leave_mb']:.0f} -> {row['rss_20s_mb']:.0f} MB",
        flush=True,
    )


# ---- part: memory under a budget -----------------------------------------------------------------------
def memory_texts(texts: Texts, count: int) -> list[tuple[str, str, str]]:
    """(model, marker, text): SmolLM2 and MiniLM alternating, mostly long, many cut at 512 tokens."""
    lengths = {"smollm2": [LONG_TOKENS, 512, 384, LONG_TOKENS, 256], "minilm": [128, LONG_TOKENS, 256]}
    items = []
    for i in range(count):
        model = "smollm2" if i % 2 == 0 else "minilm"
        marker = texts.marker()
        items.append((model, marker, texts.sentence(model, marker, lengths[model][(i // 2) % len(lengths[model])])))
    return items


async def memory_part(
    browser,
    server: StreamlitServer,
    monitor: ServerMonitor,
    texts: Texts,
    profile: Profile,
    budget_mb: int | None,
    results: dict,
) -> None:
    print(
        f"\n[memory] {profile.memory_sentences} links, budget {budget_mb or 'default'} MB, "
        f"load average {load_average()}",
        flush=True,
    )
    began = time.monotonic()
    rss_start = monitor.rss()
    for model in ("minilm", "smollm2"):  # one after the other, as a teacher would warm the server
        marker = texts.marker()
        session, _ = await open_session(
            browser,
            f"warm-{model}",
            link(server.url, model, texts.sentence(model, marker, SHORT_TOKENS)),
            model,
            marker,
            timeout_s=300.0,
        )
        await wait_idle(session, 120)
        await session.close()
    await asyncio.sleep(3)
    rss_models = monitor.rss()
    print(f"  RSS: fresh server {mb(rss_start):.0f} MB, both models loaded {mb(rss_models):.0f} MB", flush=True)

    queue = memory_texts(texts, profile.memory_sentences)
    pending = list(reversed(queue))
    done: list[tuple[str, Interaction]] = []
    timeline = [{"sentences": 0, "seconds": 0.0, "rss_mb": mb(rss_models), "peak_rss_mb": mb(rss_models)}]
    deadline = time.monotonic() + profile.memory_seconds
    step = max(1, profile.memory_sentences // 10)
    links_began = time.monotonic()

    async def worker(index: int) -> None:
        context = await browser.new_context(viewport=VIEWPORT)
        page = await context.new_page()
        session = Session(f"memory-{index}", context, page)
        try:
            while pending and time.monotonic() < deadline:
                model, marker, text = pending.pop()
                start = time.perf_counter()
                try:
                    await page.goto(link(server.url, model, text), timeout=120_000)
                    problem = await wait_drawn(page, model, marker, 180.0)
                    outcome = Interaction(None, problem) if problem else Interaction(time.perf_counter() - start)
                except Exception as error:
                    outcome = Interaction(None, f"{type(error).__name__}: {str(error)[:120]}")
                done.append((model, outcome))
                if len(done) % step == 0:
                    timeline.append(
                        {
                            "sentences": len(done),
                            "seconds": time.monotonic() - links_began,
                            "rss_mb": mb(monitor.rss()),
                            "peak_rss_mb": mb(monitor.peak_rss(links_began)),
                        }
                    )
                    print(
                        f"  {len(done)} links: RSS {timeline[-1]['rss_mb']:.0f} MB "
                        f"(peak {timeline[-1]['peak_rss_mb']:.0f} MB), {timeline[-1]['seconds']:.0f} s",
                        flush=True,
                    )
        finally:
            await session.close()

    await asyncio.gather(*(worker(i) for i in range(profile.memory_workers)))
    await asyncio.sleep(3)
    rss_end = monitor.rss()
    rss_settled = None
    if profile.memory_settle_seconds:
        print(
            f"  RSS {mb(rss_end):.0f} MB after the last link; waiting {profile.memory_settle_seconds:.0f} s "
            "for Streamlit to drop the closed sessions",
            flush=True,
        )
        await asyncio.sleep(profile.memory_settle_seconds)
        rss_settled = monitor.rss()
    if timeline[-1]["sentences"] != len(done):
        timeline.append(
            {
                "sentences": len(done),
                "seconds": time.monotonic() - links_began,
                "rss_mb": mb(rss_end),
                "peak_rss_mb": mb(monitor.peak_rss(links_began)),
            }
        )
    errors = [outcome.error for _, outcome in done if outcome.error]
    halfway = min(timeline, key=lambda point: abs(point["sentences"] - len(done) / 2))
    results["memory"] = {
        "budget_mb": budget_mb,
        "sentences_planned": len(queue),
        "sentences_done": len(done),
        "smollm2_done": sum(1 for model, _ in done if model == "smollm2"),
        "minilm_done": sum(1 for model, _ in done if model == "minilm"),
        "errors": len(errors),
        "error_examples": sorted(set(errors))[:5],
        "median_link_s": statistics.median([o.seconds for _, o in done if o.seconds] or [0.0]),
        "rss_start_mb": mb(rss_start),
        "rss_models_mb": mb(rss_models),
        "rss_max_mb": mb(monitor.peak_rss(links_began)),
        "rss_end_mb": mb(rss_end),
        "rss_settled_mb": None if rss_settled is None else mb(rss_settled),
        "settle_seconds": profile.memory_settle_seconds,
        "rss_halfway_mb": halfway["rss_mb"],
        "growth_second_half_mb": mb(rss_end) - halfway["rss_mb"],
        # how far the peak rose in the second half of the links (RSS swings by a run's size from one
        # sample to the next, so two single samples say little)
        "peak_first_half_mb": halfway["peak_rss_mb"],
        "peak_growth_second_half_mb": mb(monitor.peak_rss(links_began)) - halfway["peak_rss_mb"],
        "seconds": time.monotonic() - began,
        "load_average": load_average(),
        "timeline": timeline,
    }


# ---- report ---------------------------------------------------------------------------------------------
def _fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _met(ok: bool | None) -> str:
    return "-" if ok is None else ("yes" if ok else "NO")


def report(results: dict) -> str:
    out = [
        f"Load average at start (1/5/15 min): {results['load_average_start']}; "
        f"at end: {results.get('load_average_end', '-')}; {os.cpu_count()} cores"
    ]
    if results.get("teacher"):
        out += class_teacher.report(results["teacher"], markdown)
    if results.get("concurrency"):
        out += ["", "### Concurrent sessions (MiniLM, ~20 tokens, Explore head view)", ""]
        out.append(
            markdown(
                [
                    "sessions",
                    "rounds",
                    "interactions",
                    "errors",
                    "cross-talk",
                    "Enter -> drawn median (s)",
                    "p95 (s)",
                    "max (s)",
                    "Enter -> data received median / p95 (s)",
                    "open link -> drawn p95 (s)",
                    "server CPU / interaction (s)",
                    "browser CPU / interaction (s)",
                    "peak server RSS (MB)",
                    "load avg",
                ],
                [
                    [
                        r["sessions"],
                        r["rounds"],
                        r["interactions"],
                        r["errors"],
                        r["cross_talk"],
                        _fmt(r["median_s"]),
                        _fmt(r["p95_s"]),
                        _fmt(r["max_s"]),
                        f"{_fmt(r['received_median_s'])} / {_fmt(r['received_p95_s'])}",
                        _fmt(r["open_p95_s"]),
                        _fmt(r["server_cpu_per_interaction_s"], 3),
                        _fmt(r["browser_cpu_per_interaction_s"], 3),
                        f"{r['peak_server_rss_mb']:.0f}",
                        r["load_average"],
                    ]
                    for r in results["concurrency"]
                ],
            )
        )
        largest = max(results["concurrency"], key=lambda r: r["sessions"])
        n = largest["sessions"]
        at_goal_size = n >= GOALS["sessions"]
        cpu_worst = max(r["server_cpu_per_interaction_s"] for r in results["concurrency"])
        out += [
            "",
            f"Goals (measured at {n} sessions"
            + ("" if at_goal_size else f"; the goals are for {GOALS['sessions']}")
            + "):",
            "",
        ]
        out.append(
            markdown(
                ["goal", "measured", "met"],
                [
                    [f"0 errors at {GOALS['sessions']} sessions", largest["errors"], _met(largest["errors"] == 0)],
                    [
                        f"0 cross-talk at {GOALS['sessions']} sessions",
                        largest["cross_talk"],
                        _met(largest["cross_talk"] == 0),
                    ],
                    [
                        f"p95 Enter -> drawn <= {GOALS['p95_s']:.0f} s at {GOALS['sessions']} sessions",
                        _fmt(largest["p95_s"]),
                        _met(None if largest["p95_s"] is None else largest["p95_s"] <= GOALS["p95_s"]),
                    ],
                    [
                        f"server CPU per interaction <= {GOALS['cpu_s']} s (worst N)",
                        _fmt(cpu_worst, 3),
                        _met(cpu_worst <= GOALS["cpu_s"]),
                    ],
                ],
            )
        )
    if results.get("heavy"):
        base = results["heavy"][0]["p95_s"]
        out += ["", "### Heavy work beside typing sessions (MiniLM Enter -> drawn of the typing sessions)", ""]
        out.append(
            markdown(
                [
                    "heavy work",
                    "heavy work took (s)",
                    "MiniLM interactions",
                    "errors",
                    "cross-talk",
                    "median (s)",
                    "p95 (s)",
                    "max (s)",
                    "p95 / p95 with nothing heavy",
                ],
                [
                    [
                        r["phase"] + (f" ({r['heavy_error']})" if r["heavy_error"] else ""),
                        _fmt(r["heavy_seconds"], 1),
                        r["interactions"],
                        r["errors"],
                        r["cross_talk"],
                        _fmt(r["median_s"]),
                        _fmt(r["p95_s"]),
                        _fmt(r["max_s"]),
                        _fmt(r["p95_s"] / base if base and r["p95_s"] else None),
                    ]
                    for r in results["heavy"]
                ],
            )
        )
    if results.get("abandoned"):
        a = results["abandoned"]
        out += ["", "### A session that fires long SmolLM2 runs and leaves", ""]
        out.append(
            markdown(
                [
                    "runs fired",
                    "server CPU 0-10 s after leaving (s)",
                    "10-20 s (s)",
                    "idle server, per 10 s (s)",
                    "busy (>0.2 CPU-s/s) until (s after leaving)",
                    "RSS at leaving (MB)",
                    "+10 s (MB)",
                    "+20 s (MB)",
                    "RSS growth after leaving (MB)",
                ],
                [
                    [
                        a["runs_fired"],
                        _fmt(a["cpu_0_10s"]),
                        _fmt(a["cpu_10_20s"]),
                        _fmt(a["idle_cpu_per_10s"]),
                        a["busy_until_s"],
                        f"{a['rss_at_leave_mb']:.0f}",
                        f"{a['rss_10s_mb']:.0f}",
                        f"{a['rss_20s_mb']:.0f}",
                        f"{a['peak_rss_after_leave_mb'] - a['rss_at_leave_mb']:.0f}",
                    ]
                ],
            )
        )
    if results.get("memory"):
        m = results["memory"]
        budget = m["budget_mb"]
        out += ["", f"### Memory: distinct links through both models, budget {budget or 'default'} MB", ""]
        peak_rise = m.get("peak_growth_second_half_mb")
        if peak_rise is None and m.get("timeline"):  # a JSON from before this column: from its timeline
            half = min(m["timeline"], key=lambda point: abs(point["sentences"] - m["sentences_done"] / 2))
            peak_rise = m["rss_max_mb"] - half["peak_rss_mb"]
        out.append(
            markdown(
                [
                    "links done (SmolLM2 / MiniLM)",
                    "errors",
                    "RSS fresh server (MB)",
                    "RSS models loaded (MB)",
                    "RSS max (MB)",
                    "RSS end (MB)",
                    f"RSS {m['settle_seconds']:.0f} s later (MB)"
                    if m["settle_seconds"]
                    else "RSS later (not measured)",
                    "max - models (MB)",
                    "budget (MB)",
                    "RSS end - RSS halfway (MB)",
                    "peak rise over the 2nd half of the links (MB)",
                    "plateau (2nd-half peak rise <= 10% of budget)",
                    "under the budget (max - models <= budget)",
                ],
                [
                    [
                        f"{m['sentences_done']} of {m['sentences_planned']} ({m['smollm2_done']} / {m['minilm_done']})",
                        m["errors"],
                        f"{m['rss_start_mb']:.0f}",
                        f"{m['rss_models_mb']:.0f}",
                        f"{m['rss_max_mb']:.0f}",
                        f"{m['rss_end_mb']:.0f}",
                        _fmt(m["rss_settled_mb"], 0),
                        f"{m['rss_max_mb'] - m['rss_models_mb']:.0f}",
                        budget or "default",
                        f"{m['growth_second_half_mb']:.0f}",
                        _fmt(peak_rise, 0),
                        _met(
                            None
                            if m["sentences_done"] < 10 or peak_rise is None
                            else peak_rise <= 0.1 * (budget or 2048)
                        ),
                        _met(m["rss_max_mb"] - m["rss_models_mb"] <= (budget or 2048)),
                    ]
                ],
            )
        )
        out += ["", "RSS over time:", ""]
        out.append(
            markdown(
                ["links done", "seconds", "RSS (MB)", "peak so far (MB)"],
                [
                    [t["sentences"], f"{t['seconds']:.0f}", f"{t['rss_mb']:.0f}", f"{t['peak_rss_mb']:.0f}"]
                    for t in m["timeline"]
                ],
            )
        )
    return "\n".join(out)


# ---- main -----------------------------------------------------------------------------------------------
PARTS = ("concurrency", "heavy", "abandoned", "memory", "teacher")


async def run_benchmark(args, profile: Profile, results: dict) -> None:
    from playwright.async_api import async_playwright

    with contextlib.ExitStack() as stack:
        if args.cache_dir:
            cache_dir = Path(args.cache_dir)
            cache_dir.mkdir(parents=True, exist_ok=True)
        else:
            cache_dir = Path(tempfile.mkdtemp(prefix="headscope-classroom-cache-"))
            stack.callback(shutil.rmtree, cache_dir, True)
        results["cache_dir"] = str(cache_dir)
        classroom = {**CLASSROOM_ENV, "HEADSCOPE_CACHE_DIR": str(cache_dir)}
        # The tokenizers load (~10 s) while the first server starts.
        loading = stack.enter_context(ThreadPoolExecutor(max_workers=1)).submit(Texts, args.seed)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(**chromium_launch_options())
            try:
                if {"concurrency", "heavy", "abandoned"} & set(args.parts):
                    with start_streamlit(
                        env=classroom, address=CLASSROOM_ADDRESS, extra_args=args.server_arg
                    ) as server:
                        monitor = ServerMonitor(server.pid)
                        try:
                            print(f"server {server.url} (pid {server.pid}, log {server.log_path})", flush=True)
                            texts = loading.result()
                            marker = texts.marker()
                            warm, warm_seconds = await open_session(
                                browser,
                                "warm",
                                link(server.url, "minilm", texts.sentence("minilm", marker, 12)),
                                "minilm",
                                marker,
                                timeout_s=300.0,
                            )
                            await wait_idle(warm, 120)
                            await warm.close()
                            print(
                                f"  MiniLM warm in {warm_seconds:.1f} s; server RSS {mb(monitor.rss()):.0f} MB",
                                flush=True,
                            )
                            if "concurrency" in args.parts:
                                await concurrency_part(browser, server, monitor, texts, profile, results)
                            if "heavy" in args.parts:
                                await heavy_part(browser, server, monitor, texts, profile, cache_dir, results)
                            if "abandoned" in args.parts:
                                await abandoned_part(browser, server, monitor, texts, profile, results)
                        finally:
                            monitor.close()
                if "teacher" in args.parts:
                    await class_teacher.teacher_part(
                        playwright,
                        ServerMonitor,
                        profile.followers,
                        profile.class_browsers,
                        results,
                        root=Path(args.class_root).resolve() if args.class_root else None,
                    )
                if "memory" in args.parts:
                    budget = {"HEADSCOPE_CACHE_BUDGET_MB": str(args.budget_mb)} if args.budget_mb else {}
                    with start_streamlit(
                        env={**classroom, **budget}, address=CLASSROOM_ADDRESS, extra_args=args.server_arg
                    ) as server:
                        monitor = ServerMonitor(server.pid)
                        try:
                            texts = loading.result()
                            await memory_part(browser, server, monitor, texts, profile, args.budget_mb, results)
                        finally:
                            monitor.close()
            finally:
                await browser.close()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="N = 1, 3 and fewer links: under 3 minutes")
    parser.add_argument("--sessions", help="comma-separated session counts (default 1,10,30; quick 1,3)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument(
        "--budget-mb",
        type=int,
        default=1024,
        help="HEADSCOPE_CACHE_BUDGET_MB for the memory part (0: the app's default)",
    )
    parser.add_argument("--memory-sentences", type=int, help="links for the memory part (default 200; quick 24)")
    parser.add_argument(
        "--memory-seconds", type=float, help="time limit of the memory part's links (default 2400 s; quick 25)"
    )
    parser.add_argument(
        "--cache-dir",
        help="HEADSCOPE_CACHE_DIR for the servers, kept (default: a fresh temporary "
        f"one; with --quick, {QUICK_CACHE_DIR.relative_to(ROOT)})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=random.randrange(10**6),
        help="shuffles the marker words (default: a new one each run, printed)",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="an extra `streamlit run` option for the servers (repeatable), "
        "e.g. --server-arg=--runner.postScriptGC=false",
    )
    parser.add_argument("--followers", type=int, help="the teacher part's lightweight followers (default 30; quick 5)")
    parser.add_argument("--class-browsers", type=int, help="the teacher part's Chromium followers (default 2; quick 1)")
    parser.add_argument(
        "--class-root",
        help="the teacher part serves this checkout instead (e.g. the code before a change, exported with git "
        "archive): its serve.py, or its app.py when it has none",
    )
    parser.add_argument("--json", help="write every measured row to this file")
    parser.add_argument("--report", metavar="JSON", help="print the tables of a --json file again, run nothing")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts: {', '.join(sorted(unknown))}")
    profile = QUICK if args.quick else Profile()
    if args.sessions:
        profile = Profile(**{**asdict(profile), "sessions": tuple(int(n) for n in args.sessions.split(","))})
    if args.quick and not args.cache_dir:
        args.cache_dir = str(QUICK_CACHE_DIR)
    if args.memory_sentences:
        profile = Profile(**{**asdict(profile), "memory_sentences": args.memory_sentences})
    for name in ("followers", "class_browsers"):
        if getattr(args, name) is not None:
            profile = Profile(**{**asdict(profile), name: getattr(args, name)})
    if args.memory_seconds:
        profile = Profile(**{**asdict(profile), "memory_seconds": args.memory_seconds})

    signal.signal(signal.SIGTERM, _interrupt)
    results: dict = {
        "load_average_start": load_average(),
        "profile": asdict(profile),
        "parts": args.parts,
        "server_args": args.server_arg,
        "seed": args.seed,
        "cache_dir_given": args.cache_dir,
        "argv": sys.argv[1:],
    }
    print(
        f"load average at start: {results['load_average_start']} ({os.cpu_count()} cores); seed {args.seed}", flush=True
    )
    began = time.monotonic()
    failed = 0
    try:
        asyncio.run(run_benchmark(args, profile, results))
    except KeyboardInterrupt:
        failed = 130
        print("\ninterrupted: the server and the browser are stopped; results so far:", flush=True)
    except Exception:
        failed = 1
        traceback.print_exc()
        print("\nthe benchmark failed (above); the server and the browser are stopped; results so far:", flush=True)
    results["load_average_end"] = load_average()
    results["seconds"] = time.monotonic() - began
    print()
    print(report(results))
    print(f"\ntotal {results['seconds'] / 60:.1f} min", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if failed:
        sys.exit(failed)


if __name__ == "__main__":
    main()
