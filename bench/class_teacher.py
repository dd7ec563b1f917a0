"""bench/classroom.py's ``teacher`` part: one teacher leads, followers follow, the class answers questions.

A classroom server with a teacher token (``HEADSCOPE_TEACHER_TOKEN``) and its own class store, served as
``scripts/app.sh`` serves it (``serve.py``; ``root``: another checkout, e.g. the code before a change, which is
served through its own ``serve.py``, or its ``app.py`` when it has none). ``followers`` lightweight clients
(``bench.streamlit_client``: the websocket protocol a browser speaks, each its own Streamlit session, the same
script runs and the same data sent, nothing drawn; each loads the page over HTTP first and keeps its cookies, as a
browser does, from its own loopback address, as each student's machine is its own address) plus ``browsers``
real Chromium pages open the student link and follow. The teacher opens the links of 10 views one after the
other, as a teacher with bookmarked steps does (docs/teaching.md): 5 Explore views (layers, heads, two new
sentences) and 5 Classroom steps, each of those a question. Measured:

* follow: from the teacher's page having finished its run (its view is published then) until each follower's
  run of the same page and the teacher's address (the teacher's screen's, as the teacher's client holds it)
  finished (a Chromium follower: its address shows the view and its script
  is idle); p95 over every follower and move; goal 2 s. A follower's run that ended between the publish and the
  teacher's client hearing of its run's end counts 0 s;
* answers: at each question every lightweight follower clicks an answer, then replays a click on another one
  (a double click, or a forged message); an answer the page asks to click again is clicked again a second later.
  Lost: a follower whose answer is not in the store; accepted twice: more than one answer, or not the first;
  goal 0 and 0. A click is acknowledged when the follower's screen shows its answer taken or asks it to click
  again: the time from the click, p95 and max, goal 2 s for every click. Then the teacher reveals (a click), and
  every follower's screen must show the class's answers;
* late joiners: at each move one more client opens the student link; from its first page drawn to the teacher's
  view on its screen;
* server CPU per follower per minute: the server's CPU seconds while the class follows an unmoving teacher
  (the polls alone), and over the whole lesson, each divided by followers and minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

from bench.streamlit_client import StreamlitClient
from tools.browser import APP_IDLE_JS, chromium_launch_options, start_streamlit
from ui import class_session
from ui.widgets.messages import md_escape

OUT = Path(__file__).with_name("out")

FOLLOW_GOAL_S = 2.0
ACK_GOAL_S = 2.0  # every click acknowledged within this
FOLLOW_TIMEOUT_S = 60.0  # a follower not on the view by then counts as missing it
IDLE_FOLLOW_S = 30.0  # the class follows an unmoving teacher this long, for the polls' CPU
TEXTS = (
    "The cat sat on the mat because it was tired.",
    "The trophy did not fit in the suitcase because it was too big.",
    "The students read a short story about a village near the sea.",
)


def lesson() -> list[tuple[str, dict]]:
    """The teacher's 10 views: (page, link settings); the Classroom steps ask the class."""
    explore = [
        {"text": TEXTS[0], "layer": "0", "head": "2"},
        {"text": TEXTS[0], "layer": "3", "head": "1"},
        {"text": TEXTS[1], "layer": "3", "head": "1"},
        {"text": TEXTS[1], "layer": "5", "head": "11", "view": "model"},
        {"text": TEXTS[2], "layer": "1", "head": "4"},
    ]
    steps = [{"step": str(step)} for step in (2, 3, 4, 5, 7)]
    moves = []
    for view, step in zip(explore, steps, strict=True):
        moves += [("explore", view), ("classroom", step)]
    return moves


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between the closest ranks; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def shown_by(teacher: StreamlitClient) -> dict:
    """The view the teacher's screen shows: its address (the view is everything in it), the key left out."""
    return {key: value for key, value in teacher.params().items() if key != "teacher"}


def shows_view(client: StreamlitClient, page_hash: str, wanted: dict, since: float) -> bool:
    params = client.params()
    return (
        client.page_hash == page_hash
        and all(params.get(key) == value for key, value in wanted.items())
        and client.finished_at > max(since, client.query_changed_at)
        and not client.running
    )


async def light_on_view(client: StreamlitClient, page_hash: str, wanted: dict, since: float) -> float | None:
    """When ``client``'s run that shows the view finished (its own time of that message), or None."""
    if await client.wait_for(lambda c: shows_view(c, page_hash, wanted, since), FOLLOW_TIMEOUT_S):
        return client.finished_at
    return None


async def browser_on_view(page, path: str, wanted: dict, timeout_s: float) -> float | None:
    conditions = [f"location.pathname.replace(/\\//g, '') === {path!r}"] + [
        f"new URLSearchParams(location.search).get({key!r}) === {value!r}" for key, value in wanted.items()
    ]
    check = " && ".join(conditions)
    try:
        await page.wait_for_function(f"() => ({check}) && ({APP_IDLE_JS})()", timeout=timeout_s * 1000, polling=50)
    except Exception:
        return None
    return time.monotonic()


def follower_address(number: int) -> str:
    """The loopback address follower ``number`` connects from: one per follower, as one per student's machine."""
    return f"127.0.{10 + number // 200}.{10 + number % 200}"


async def join(client: StreamlitClient, page: str = "", query: str = "") -> None:
    """Load the page over HTTP, keeping its cookies, then open the session, as a browser does."""
    await asyncio.to_thread(client.join, page, query)
    await client.open(page, query)


def student_of(client: StreamlitClient, token: str) -> str | None:
    """The student id the server knows this client by: its signed identity cookie, or (a server before identities
    were set over HTTP) the id it set by script."""
    signed = client.cookies.get("headscope_student")
    if signed:
        return class_session.verified_student(signed, token)
    found = re.search(r"headscope_student=([0-9a-f]{32})", " ".join(client.texts))
    return found.group(1) if found else None


async def teacher_part(
    playwright, monitor_for, followers: int, browsers: int, results: dict, root: Path | None = None
) -> None:
    token = "bench-" + secrets.token_urlsafe(24)
    folder = Path(tempfile.mkdtemp(prefix="headscope-class-"))
    env = {
        "HEADSCOPE_CLASSROOM": "1",
        "HEADSCOPE_TEACHER_TOKEN": token,
        "HEADSCOPE_CLASS_DB": str(folder / "class.sqlite3"),
        "HEADSCOPE_PUBLIC_URL": None,
    }
    served = {}
    if root is not None:  # another checkout: its own packages first on the path
        env["PYTHONPATH"] = str(root)
        served = {"root": root, "script": "serve.py" if (root / "serve.py").exists() else "app.py"}
    else:
        served = {"script": "serve.py"}
    row: dict = {
        "followers": followers,
        "browsers": browsers,
        "moves": [],
        "questions": [],
        "late_joiners_s": [],
        "root": str(root or "this checkout"),
        "script": served["script"],
        "load_average_start": os.getloadavg(),
    }
    results["teacher"] = row
    with start_streamlit(env=env, **served) as server:
        monitor = monitor_for(server.pid)
        store = class_session.ClassStore(folder / "class.sqlite3")
        session = class_session.class_id(token)
        browser = await playwright.chromium.launch(**chromium_launch_options()) if browsers else None
        clients: list[StreamlitClient] = []
        pages = []
        teacher: StreamlitClient | None = None
        try:
            print(f"teacher part: server {server.url} (pid {server.pid})", flush=True)

            async def lead(page: str, params: dict) -> StreamlitClient:
                nonlocal teacher
                if teacher is not None:
                    await teacher.close()  # a teacher opening a bookmark: the tab's old session ends
                teacher = StreamlitClient(server.url, "teacher")
                await teacher.open(page, urlencode({"teacher": token, **params}))
                if not await teacher.wait_for(lambda c: c.runs_finished >= 1 and not c.running, 300):
                    raise RuntimeError(f"the teacher's {page} did not finish")
                return teacher

            await lead(*lesson()[0])
            # The class joins: every follower opens the student link at once.
            clients = [StreamlitClient(server.url, f"follower-{n}", follower_address(n)) for n in range(followers)]
            await asyncio.gather(*(join(client) for client in clients))
            if browser is not None:
                for _ in range(browsers):
                    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
                    pages.append(await context.new_page())
                    await pages[-1].goto(f"{server.url}/")
            first_page = lesson()[0][0]
            wanted = shown_by(teacher)
            joined = await asyncio.gather(
                *(
                    client.wait_for(lambda c: shows_view(c, c.pages.get(first_page, "?"), wanted, 0), 300)
                    for client in clients
                )
            )
            row["joined"] = sum(joined)
            # The polls alone: the class follows a teacher who does not move.
            await asyncio.sleep(2)
            cpu_before, began = monitor.cpu_seconds(), time.monotonic()
            await asyncio.sleep(IDLE_FOLLOW_S)
            idle_cpu = monitor.cpu_seconds() - cpu_before
            row["idle_cpu_per_follower_minute"] = (
                idle_cpu / max(followers + browsers, 1) / ((time.monotonic() - began) / 60)
            )
            row["idle_seconds"] = time.monotonic() - began

            lesson_cpu, lesson_began = monitor.cpu_seconds(), time.monotonic()
            for number, (page, params) in enumerate(lesson()[1:] + lesson()[:1], start=1):
                opened_at = time.monotonic()
                teacher = await lead(page, params)
                moved_at = teacher.finished_at
                wanted = shown_by(teacher)
                page_hash = teacher.pages.get(page, "?")
                arrived = await asyncio.gather(
                    # A follower's run that shows the view counts from the teacher opening it: the view is published
                    # at the end of the teacher's run, before the teacher's client hears of that end, and a follower
                    # woken by the publish may finish its run in between (0 s; counted from moved_at, such a run was
                    # missed and the follower counted at its next poll, 2 s later).
                    *(light_on_view(client, page_hash, wanted, opened_at) for client in clients),
                    *(browser_on_view(p, page, wanted, FOLLOW_TIMEOUT_S) for p in pages),
                )
                light = [None if at is None else max(at - moved_at, 0.0) for at in arrived[: len(clients)]]
                for client, at in zip(clients, light, strict=True):
                    if at is None:  # what this follower shows instead, for the log
                        shown = client.params()
                        differs = {k: (v, shown.get(k)) for k, v in wanted.items() if shown.get(k) != v}
                        print(f"    {client.name} not on the view: {differs or 'same address, run not finished'}")
                real = [None if at is None else max(at - moved_at, 0.0) for at in arrived[len(clients) :]]
                for index, (p, at) in enumerate(zip(pages, real, strict=True)):
                    if at is None:  # what this browser shows instead, for the log and a look
                        with contextlib.suppress(Exception):
                            idle = await p.evaluate(f"({APP_IDLE_JS})()")
                            shot = OUT / f"class-browser-missed-move{number}-{index}.png"
                            await p.screenshot(path=str(shot))
                            print(f"    browser {index} not on the view: {p.url} (idle {idle}; {shot})")
                woken = [next((at - moved_at for at in c.woken_at if at >= moved_at - 0.5), None) for c in clients]
                row["moves"].append(
                    {"move": number, "page": page, "light_s": light, "browser_s": real, "woken_s": woken}
                )
                late = StreamlitClient(server.url, f"late-{number}", follower_address(followers + number))
                await join(late)
                if await late.wait_for(lambda c: c.runs_finished >= 1, FOLLOW_TIMEOUT_S):
                    first_drawn = late.finished_at
                    on_view = await light_on_view(late, page_hash, wanted, 0)
                    row["late_joiners_s"].append(None if on_view is None else max(on_view - first_drawn, 0.0))
                else:
                    row["late_joiners_s"].append(None)
                await late.close()
                missed = sum(value is None for value in light + real)
                done = [value for value in light + real if value is not None]
                print(
                    f"  move {number} ({page}): p95 {percentile(done, 95) or 0:.2f} s, missed {missed}",
                    flush=True,
                )
                slowest = max(
                    (pair for pair in zip(light, clients, strict=True) if pair[0] is not None),
                    key=lambda pair: pair[0],
                    default=None,
                )
                if slowest is not None and slowest[0] > FOLLOW_GOAL_S:
                    print(late_follow(slowest[1], moved_at, slowest[0]), flush=True)
                if page == "classroom":
                    row["questions"].append(await question(store, session, teacher, clients, token))
            row["lesson_seconds"] = time.monotonic() - lesson_began
            row["lesson_cpu_per_follower_minute"] = (
                (monitor.cpu_seconds() - lesson_cpu) / max(followers + browsers, 1) / (row["lesson_seconds"] / 60)
            )
            row["errors"] = sum(len(client.errors) for client in clients)
            row["load_average_end"] = os.getloadavg()
        finally:
            for client in [*clients, *([teacher] if teacher else [])]:
                with contextlib.suppress(Exception):
                    await client.close()
            if browser is not None:
                await browser.close()
            monitor.close()


# How long a follower whose page shows no answer buttons yet (a run of it under way) waits for them, as a student would.
BUTTONS_WAIT_S = 10.0
REPLIES = ("Wait for the teacher", "click your answer again", "already answered", "needs the class's cookie")


def answer_buttons(client: StreamlitClient, key: str) -> str | None:
    return client.widget(f"class_pick_{key}")


def events_around(client: StreamlitClient, at: float, before: float, after: float) -> list[str]:
    """``client``'s runs and requests from ``before`` seconds before ``at`` to ``after`` seconds after it, a line each
    (seconds from ``at``), for the log."""
    return [
        f"      {when - at:+.3f} {what} {detail}" for when, what, detail in client.events if -before < when - at < after
    ]


def no_reveal(client: StreamlitClient, revealed_at: float) -> str:
    """What a follower that shows no reveal shows instead, and its runs and requests around the reveal, for the log."""
    return "\n".join(
        [
            f"    {client.name} shows no reveal: runs {client.runs_finished} (full {client.full_runs_finished}), the last "
            f"{client.finished_at - revealed_at:+.1f} s after the reveal, timers {len(client.fragments())}, address "
            f"{client.params()}, last texts {[text[:60] for text in client.texts[-4:]]}, errors {client.errors[-2:]}",
            *events_around(client, revealed_at, 2, 4),
        ]
    )


def late_follow(client: StreamlitClient, moved_at: float, took: float) -> str:
    """The slowest follower of a move over the goal: its runs and requests from just before the teacher's run ended
    until it showed the view, for the log."""
    return "\n".join(
        [
            f"    {client.name} on the view after {took:.2f} s; its runs and requests (seconds from the teacher's run end):",
            *events_around(client, moved_at, 1.5, took + 0.2),
        ]
    )


async def question(store, session: str, teacher: StreamlitClient, clients, token: str) -> dict:
    """Every follower answers the question the teacher's step asks (then replays another click); the teacher
    reveals; the store is checked."""
    key = store.latest_question(session)
    # Pills send the label of the option clicked (the page's format: the option, escaped for Markdown).
    labels = [md_escape(option) for option in store.question(session, key).options]
    options = len(labels)
    first = {client.name: random.randrange(options) for client in clients}
    busy = slow = waited = 0
    acks: list[float] = []

    async def answer(client: StreamlitClient) -> str:
        nonlocal busy, slow, waited
        shown = answer_buttons(client, key)
        if shown is None:  # a run of the page under way (its elements are drawn again): a student waits for them
            waited += 1
            if not await client.wait_for(lambda c: answer_buttons(c, key) is not None, BUTTONS_WAIT_S):
                return "no answer buttons"
            shown = answer_buttons(client, key)
        for _ in range(10):
            client.texts = []
            sent = time.monotonic()
            await client.click(shown, string_array_value=[labels[first[client.name]]])
            replied = await client.wait_for(lambda c: any(c.shows(reply) for reply in REPLIES), 30)
            if replied:
                acks.append(time.monotonic() - sent)
            if client.shows("Wait for the teacher"):
                # A second click on another answer (a double click, or a forged message): refused.
                await client.click(shown, string_array_value=[labels[(first[client.name] + 1) % options]])
                return "answered"
            if client.shows("click your answer again"):
                busy += 1
            elif not replied:  # no reply within 30 s (a starved server): the student clicks again
                slow += 1
            await asyncio.sleep(1.0)
        return "busy"

    began = time.monotonic()
    outcomes = await asyncio.gather(*(answer(client) for client in clients))
    answered_s = time.monotonic() - began
    await asyncio.sleep(1.0)  # the replayed clicks reach the server
    counts = store.counts(session, key)
    stored = store.answers(session, key)
    lost = twice = 0
    for client in clients:
        student = student_of(client, token)
        kept = stored.get(student) if student else None
        if kept is None:
            lost += 1
        elif len(kept) > 1 or kept[0] != first[client.name]:
            twice += 1
    # The teacher reveals; every follower's screen shows the class's answers.
    revealed_at = time.monotonic()
    await teacher.click(teacher.widget(f"class_reveal_{key}"), trigger_value=True)

    async def reveal_shown(client: StreamlitClient) -> float | None:
        """Seconds from the click until ``client`` shows the reveal (None: not within 60 s), taken when it does:
        a follower's last finished run, read after every follower was waited for, is a later poll's."""
        if await client.wait_for(lambda c: c.shows("answer(s), the model"), 60):
            return time.monotonic() - revealed_at
        return None

    seconds = await asyncio.gather(*(reveal_shown(client) for client in clients))
    shown = [s is not None for s in seconds]
    for client, at in zip(clients, seconds, strict=True):
        if at is None:
            print(no_reveal(client, revealed_at), flush=True)
    reveal_s = [s for s in seconds if s is not None]
    late_acks = sum(ack > ACK_GOAL_S for ack in acks)
    print(
        f"    question {key}: {sum(counts)} answers, lost {lost}, accepted twice {twice}, "
        f"answer buttons waited for {waited} (not shown within {BUTTONS_WAIT_S:.0f} s: "
        f"{outcomes.count('no answer buttons')}), "
        f"asked to click again {busy}, clicked again after 30 s without a reply {slow}, "
        f"clicks acknowledged p95 {percentile(acks, 95) or 0:.2f} s (after more than {ACK_GOAL_S:.0f} s: "
        f"{late_acks}), reveal shown on {sum(shown)}",
        flush=True,
    )
    return {
        "key": key,
        "answers": sum(counts),
        "outcomes": {outcome: outcomes.count(outcome) for outcome in set(outcomes)},
        "lost": lost,
        "accepted_twice": twice,
        "buttons_waited_for": waited,
        "busy_retries": busy,
        "unconfirmed_retries": slow,
        "acks_s": acks,
        "answering_s": answered_s,
        "reveal_shown": sum(shown),
        "reveal_s": reveal_s,
        "reveal_p95_s": percentile(reveal_s, 95),
    }


def report(row: dict, markdown) -> list[str]:
    light = [v for move in row["moves"] for v in move["light_s"]]
    real = [v for move in row["moves"] for v in move["browser_s"]]
    every = light + real
    done = [v for v in every if v is not None]
    woken = [max(v, 0.0) for move in row["moves"] for v in move.get("woken_s", []) if v is not None]
    questions = row["questions"]
    acks = [a for q in questions for a in q.get("acks_s", [])]
    out = [
        "",
        f"### A teacher leads ({row['followers']} lightweight followers + {row['browsers']} Chromium followers, "
        f"{len(row['moves'])} moves, {len(questions)} questions; served: {row.get('root', 'this checkout')}, "
        f"{row.get('script', 'app.py')}; load average {_load(row.get('load_average_start'))} at the start, "
        f"{_load(row.get('load_average_end'))} at the end)",
        "",
        markdown(
            ["measure", "value", "goal"],
            [
                ["followers on the view, p95 over every move (s)", _f(percentile(done, 95)), f"<= {FOLLOW_GOAL_S}"],
                [
                    "median / max (s)",
                    f"{_f(statistics.median(done) if done else None)} / {_f(max(done, default=None))}",
                    "",
                ],
                ["Chromium followers p95 (s)", _f(percentile([v for v in real if v is not None], 95)), ""],
                [
                    "lightweight followers' wake-up answered after the teacher's run ended, median / p95 (s)",
                    _f(statistics.median(woken) if woken else None) + " / " + _f(percentile(woken, 95)),
                    "",
                ],
                ["follows missed (not on the view within 60 s)", sum(v is None for v in every), "0"],
                [
                    "move with the worst p95 (s)",
                    _f(
                        max(
                            (percentile([v for v in m["light_s"] + m["browser_s"] if v is not None], 95) or 0)
                            for m in row["moves"]
                        )
                        if row["moves"]
                        else None
                    ),
                    f"<= {FOLLOW_GOAL_S}",
                ],
                [
                    "late joiners on the view, from their first page drawn, max (s)",
                    _f(max((v for v in row.get("late_joiners_s", []) if v is not None), default=None)),
                    f"<= {FOLLOW_GOAL_S}",
                ],
                [
                    "late joiners not on the view within 60 s",
                    sum(v is None for v in row.get("late_joiners_s", [])),
                    "0",
                ],
                ["answers lost", sum(q["lost"] for q in questions), "0"],
                [
                    f"answer buttons not drawn yet when the follower looked (then waited for, at most {BUTTONS_WAIT_S:.0f} s)",
                    sum(q.get("buttons_waited_for", 0) for q in questions),
                    "",
                ],
                ["answers accepted twice", sum(q["accepted_twice"] for q in questions), "0"],
                [
                    "answers stored / expected",
                    f"{sum(q['answers'] for q in questions)} / {len(questions) * row['followers']}",
                    "",
                ],
                [
                    "answers the page asked to click again, then sent again",
                    sum(q["busy_retries"] for q in questions),
                    "",
                ],
                [
                    "clicks acknowledged, p95 / max (s)",
                    f"{_f(percentile(acks, 95))} / {_f(max(acks, default=None))}",
                    f"<= {ACK_GOAL_S}",
                ],
                [f"clicks acknowledged after more than {ACK_GOAL_S:.0f} s", sum(a > ACK_GOAL_S for a in acks), "0"],
                [
                    "answers clicked again after 30 s without a reply",
                    sum(q.get("unconfirmed_retries", 0) for q in questions),
                    "",
                ],
                [
                    "reveal shown on the followers' screens",
                    f"{sum(q['reveal_shown'] for q in questions)} / {len(questions) * row['followers']}",
                    "",
                ],
                [
                    "reveal reached the followers, p95 (s)",
                    _f(percentile([v for q in questions for v in q.get("reveal_s", [])], 95)),
                    "",
                ],
                [
                    "server CPU per follower per minute, following an unmoving teacher (s)",
                    _f(row.get("idle_cpu_per_follower_minute"), 3),
                    "",
                ],
                [
                    "server CPU per follower per minute, over the lesson (s)",
                    _f(row.get("lesson_cpu_per_follower_minute"), 3),
                    "",
                ],
                ["errors shown to followers", row.get("errors", "-"), "0"],
            ],
        ),
    ]
    return out


def _load(values) -> str:
    return " / ".join(f"{v:.1f}" for v in values) if values else "-"


def _f(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"
