"""The class server's HTTP side (ui/class_http.py), as plain ASGI: requests in, responses out, no server.

The teacher link is answered with a redirect without its key and an HttpOnly proof; every page a browser loads
carries one HttpOnly student identity the server signed (set once per browser), Secure over HTTPS; one client
address gets at most a set number of identities; outside a class nothing changes."""

from __future__ import annotations

import asyncio

from ui import class_http, class_session

TOKEN = "http-teacher-" + "t" * 24


def request(
    page: str = "", fragment: str = "", auto: bool = False, pick: str | None = None, trigger: str | None = None
) -> bytes:
    """A browser's rerun request (``BackMsg``) naming ``page`` and ``fragment``; ``auto``: a fragment timer's;
    ``pick``: the value of the widget ``pick``; ``trigger``: the key of a component (v2) whose event it sends."""
    from streamlit.proto.BackMsg_pb2 import BackMsg

    message = BackMsg()
    message.rerun_script.page_script_hash = page
    message.rerun_script.fragment_id = fragment
    message.rerun_script.is_auto_rerun = auto
    if pick is not None:
        state = message.rerun_script.widget_states.widgets.add(id="pick")
        state.string_array_value.data.append(pick)
    if trigger is not None:
        state = message.rerun_script.widget_states.widgets.add(id=f"$$ID-0f3a9c-{trigger}__events")
        state.json_trigger_value = '[{"event": "woke", "value": 7}]'
    return message.SerializeToString()


def through_the_guard(script, read) -> tuple[list, list]:
    """``script`` played through ``class_http.StalePageGuard`` around a stand-in for Streamlit's server, each step
    ``(what the server sends or None, what the browser sends meanwhile)``. Returns ``(steps, sent)``: per step,
    ``read(rerun_script)`` of each request that passed the guard by then (a receive waits 0.2 s for more), and
    every message of the server that reached the browser."""
    from streamlit.proto.BackMsg_pb2 import BackMsg

    steps, sent = [], []

    async def run() -> None:
        queue: asyncio.Queue = asyncio.Queue()

        async def send(message):
            sent.append(message)

        async def app(scope, receive, send):
            for from_server, from_browser in script:
                if from_server is not None:
                    await send({"type": "websocket.send", "bytes": from_server})
                for data in from_browser:
                    queue.put_nowait({"type": "websocket.receive", "bytes": data})
                got = []
                while True:
                    try:
                        message = await asyncio.wait_for(receive(), 0.2)
                    except TimeoutError:
                        break
                    got.append(read(BackMsg.FromString(message["bytes"]).rerun_script))
                steps.append(got)

        await class_http.StalePageGuard(app)({"type": "websocket"}, queue.get, send)

    asyncio.run(run())
    return steps, sent


def page_app(content_type: bytes = b"text/html; charset=utf-8"):
    """A stand-in for Streamlit's server: every GET is its page (or another kind of file)."""

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        await send({"type": "http.response.body", "body": b"<html></html>"})

    return app


def get(middleware, path: str = "/", query: str = "", cookie: str = "", scheme: str = "http", client="10.0.0.5"):
    scope = {
        "type": "http",
        "method": "GET",
        "scheme": scheme,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(b"cookie", cookie.encode())] if cookie else [],
        "client": (client, 50000),
    }
    sent = []

    async def receive():
        return {"type": "http.request"}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    start = sent[0]
    headers = [(k.decode(), v.decode()) for k, v in start.get("headers", [])]
    return start["status"], headers


def set_cookies(headers) -> dict[str, str]:
    return {v.split("=", 1)[0]: v for k, v in headers if k == "set-cookie"}


def cookie_value(set_cookie: str) -> str:
    return set_cookie.split(";")[0].split("=", 1)[1]


def test_the_teacher_link_is_redirected_without_its_key():
    middleware = class_http.ClassCookies(page_app(), token=lambda: TOKEN)
    status, headers = get(middleware, "/explore", f"layer=3&teacher={TOKEN}&text=a+b")
    assert status == 303
    assert dict(headers)["location"] == "/explore?layer=3&text=a+b"  # the rest of the link kept, the key gone
    proof = set_cookies(headers)[class_http.TEACHER_COOKIE]
    assert "HttpOnly" in proof and "SameSite=Strict" in proof and "Path=/" in proof and "Secure" not in proof
    assert class_session.proof_matches(cookie_value(proof), TOKEN) and TOKEN not in proof
    assert dict(headers)["cache-control"] == "no-store"
    # Over HTTPS the cookie is Secure; a link with only the key goes to the bare page.
    status, headers = get(middleware, "/", f"teacher={TOKEN}", scheme="https")
    assert (status, dict(headers)["location"]) == (303, "/")
    assert "; Secure" in set_cookies(headers)[class_http.TEACHER_COOKIE]
    # A wrong key is the page's to report: no redirect, no proof.
    status, headers = get(middleware, "/explore", "teacher=wrong")
    assert status == 200 and class_http.TEACHER_COOKIE not in set_cookies(headers)


def test_one_signed_student_identity_per_browser():
    middleware = class_http.ClassCookies(page_app(), token=lambda: TOKEN)
    status, headers = get(middleware, "/classroom")
    identity = set_cookies(headers)[class_http.STUDENT_COOKIE]
    assert status == 200 and "HttpOnly" in identity and "SameSite=Strict" in identity and "Secure" not in identity
    student = class_session.verified_student(cookie_value(identity), TOKEN)
    assert student is not None
    # The browser sends it back: no new one (its tabs and reloads keep the one it has).
    _, headers = get(middleware, "/explore", cookie=f"{class_http.STUDENT_COOKIE}={cookie_value(identity)}")
    assert class_http.STUDENT_COOKIE not in set_cookies(headers)
    # One the server did not sign is no identity: the browser gets a real one.
    forged = f"{class_session.new_student_id()}.{'0' * 32}"
    _, headers = get(middleware, "/", cookie=f"{class_http.STUDENT_COOKIE}={forged}")
    assert class_session.verified_student(cookie_value(set_cookies(headers)[class_http.STUDENT_COOKIE]), TOKEN)
    _, headers = get(middleware, "/", scheme="https", client="10.0.0.6")
    assert "; Secure" in set_cookies(headers)[class_http.STUDENT_COOKIE]
    # Files that are not a page (scripts, images) carry no identity.
    _, headers = get(class_http.ClassCookies(page_app(b"text/javascript"), token=lambda: TOKEN), "/static/app.js")
    assert not set_cookies(headers)
    _, headers = get(middleware, "/", cookie="a=b; =;;; junk")  # a malformed Cookie header: a new identity
    assert class_http.STUDENT_COOKIE in set_cookies(headers)


def test_one_client_address_gets_a_bounded_number_of_identities():
    joins = class_session.ClientLimits(3, window_s=3600)
    middleware = class_http.ClassCookies(page_app(), token=lambda: TOKEN, joins=joins)
    minted = [class_http.STUDENT_COOKIE in set_cookies(get(middleware, "/", client="10.0.0.9")[1]) for _ in range(40)]
    assert minted == [True] * 3 + [False] * 37  # 40 page loads without cookies: 3 identities, then none
    assert class_http.STUDENT_COOKIE in set_cookies(get(middleware, "/", client="10.0.0.10")[1])  # another address
    assert class_http.joins_per_client() >= 1


def test_outside_a_class_nothing_changes():
    middleware = class_http.ClassCookies(page_app(), token=lambda: None)
    status, headers = get(middleware, "/explore", f"teacher={TOKEN}")
    assert status == 200 and not set_cookies(headers)


def test_a_timer_request_waits_while_a_script_runs_and_never_moves_the_page():
    """The server starts a full run of page A; while it runs, the browser's fragment timers send requests naming
    page B (sent before it took in the move to A): they are held, and once the run has finished only those naming A
    go on. With no script running, a timer's request naming B is dropped and one naming A passes at once; a click in
    a fragment and a full rerun naming B always pass (a person may move, a timer never does)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def server(kind: str, page: str = "") -> bytes:
        message = ForwardMsg()
        if kind == "start":
            message.new_session.page_script_hash = page
            message.metadata.run.script_run_id = "run"
        elif kind == "fragment-start":  # a fragment's run of another page: not a page change
            message.new_session.page_script_hash = page
            message.metadata.run.fragment_ids.append("poll")
        else:
            message.script_finished = 0
        return message.SerializeToString()

    script = [  # (what the server sends, then what the browser sends meanwhile)
        (server("start", "page-a"), [request("page-b", "poll", auto=True), request("page-b", "live", auto=True)]),
        (server("fragment-start", "page-b"), [request("page-a", "live", auto=True)]),
        (server("finished"), []),
        (server("start", "page-a"), []),  # the run that takes in the request let through (a full one here)
        (server("finished"), []),
        (None, [request("page-b", "poll", auto=True), request("page-a", "poll", auto=True)]),
        (None, [request("page-b", "answers"), request("page-b")]),
    ]

    def read(rerun):
        return rerun.page_script_hash, rerun.fragment_id or "app", "timer" if rerun.is_auto_rerun else "person"

    steps, sent = through_the_guard(script, read)
    assert steps == [
        [],  # the run of A has started: both timers' requests are held
        [],  # a fragment's run is still a run: the live timer's newer request is held in place of the older
        [("page-a", "live", "timer")],  # the run finished: the held request naming A goes on, B's never does
        [],
        [],  # its run finished
        [("page-a", "poll", "timer")],  # no script runs: the one naming A passes at once, B's is dropped
        [("page-b", "answers", "person"), ("page-b", "app", "person")],  # a person's requests always pass
    ]
    assert len(sent) == 5  # every message of the server reaches the browser


def test_a_class_wake_up_is_held_like_a_timer_and_never_moves_the_page():
    """The wake-up a student's page sends when the class moved (a trigger of the ``WAKE_KEY`` component in the
    poll's fragment) is nobody's click: while a run of page A goes it is held, and once the run finished only the one
    naming A goes on; a trigger of another component (a head clicked in the head view) is a person's."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def server(kind: str, page: str = "") -> bytes:
        message = ForwardMsg()
        if kind == "start":
            message.new_session.page_script_hash = page
        else:
            message.script_finished = 0
        return message.SerializeToString()

    wake = class_http.WAKE_KEY
    script = [
        (server("start", "page-a"), [request("page-b", "poll", trigger=wake), request("page-a", "live", trigger=wake)]),
        (server("finished"), []),
        (server("start", "page-a"), []),  # the run of the wake-up let through (here a full one), and its end
        (server("finished"), []),
        (None, [request("page-b", "poll", trigger=wake)]),  # no run goes: a stale page's wake-up is dropped
        (None, [request("page-a", "poll", trigger=wake)]),  # ... and this page's passes at once
    ]

    def read(rerun):
        woke = any(class_http.WAKE_KEY in w.id for w in rerun.widget_states.widgets)
        return rerun.page_script_hash, rerun.fragment_id, "wake" if woke else "person"

    steps, _ = through_the_guard(script, read)
    assert steps == [
        [],  # a run goes: both wake-ups are held
        [("page-a", "live", "wake")],  # it finished: the one naming B, which the server left, is dropped, not run
        [],
        [],
        [],
        [("page-a", "poll", "wake")],
    ]
    assert class_http.timer_fragment(request("page-a", "poll", trigger=wake)) == "poll"
    assert class_http.timer_fragment(request("page-a", "", trigger=wake)) is None  # a whole page's: a person's
    assert class_http.timer_fragment(request("page-a", "poll", trigger="headscope_head_view")) is None


def test_one_timed_request_at_a_time_its_run_and_the_full_run_it_asks_for_end_first():
    """A student's wake-up passes at once (nothing runs), and the poll timer's tick follows before the server (loaded)
    has started the wake-up's run: the tick is held while the poll's run goes, stops for the full run it asks for
    (the class moved: ``st.rerun``), and that full run goes; it passes once the full run has ended. Let through at
    once, it made Streamlit run the poll in the middle of that full run, which stopped half drawn (a student's
    screen never showed the teacher's reveal)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def server(kind: str) -> bytes:
        message = ForwardMsg()
        if kind == "poll-start":
            message.new_session.page_script_hash = "page-a"
            message.metadata.run.fragment_ids.append("poll")
        elif kind == "full-start":
            message.new_session.page_script_hash = "page-a"
        elif kind == "stopped-for-rerun":
            message.script_finished = ForwardMsg.FINISHED_EARLY_FOR_RERUN
        else:
            message.script_finished = ForwardMsg.FINISHED_SUCCESSFULLY
        return message.SerializeToString()

    script = [  # (what the server sends, then what the browser sends meanwhile)
        (None, [request("page-a", "poll", trigger=class_http.WAKE_KEY)]),
        (None, [request("page-a", "poll", auto=True)]),
        (server("poll-start"), []),
        (server("stopped-for-rerun"), []),
        (server("full-start"), []),
        (server("finished"), []),
    ]

    def read(rerun):
        woke = any(class_http.WAKE_KEY in w.id for w in rerun.widget_states.widgets)
        return rerun.fragment_id, "wake" if woke else "timer"

    steps, sent = through_the_guard(script, read)
    assert steps == [
        [("poll", "wake")],  # nothing runs: the wake-up passes at once
        [],  # the tick waits for the wake-up's run
        [],
        [],  # the poll's run stopped for the next run: not the end
        [],
        [("poll", "timer")],  # the full run ended: the tick passes
    ]
    assert len(sent) == 4


def test_a_click_passes_at_once_and_the_timers_wait_for_its_run():
    """While a run goes, the poll's timer sends a request (the answer not clicked yet), then the student clicks: the
    click passes at once, and the held request, older than the click, is never let through after it (its widget
    values, Streamlit's newer ones, would undo the click). The timer's next request waits until the run that takes
    the click in (its fragment's) has been seen to end, not just the run that was going (Streamlit, given a request
    just after a short run ended, drops that run's unsent output: the click's reply); then it passes."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    def server(fragments: list[str] | None) -> bytes:
        message = ForwardMsg()
        if fragments is None:
            message.script_finished = 0
        else:
            message.new_session.page_script_hash = "page-a"
            message.metadata.run.fragment_ids.extend(fragments)
        return message.SerializeToString()

    script = [  # (what the server sends, then what the browser sends meanwhile)
        (server([]), [request("page-a", "poll", auto=True), request("page-a", "answers", pick="cat")]),
        (server(None), [request("page-a", "poll", auto=True, pick="cat")]),
        (server(["answers"]), []),
        (server(None), []),
    ]

    def read(rerun):
        return rerun.fragment_id, [list(w.string_array_value.data) for w in rerun.widget_states.widgets]

    steps, _ = through_the_guard(script, read)
    assert steps == [
        [("answers", [["cat"]])],  # the click passes at once; the poll's older request is held, then dropped
        [],  # the run that was going finished: the timer's next request waits for the click's run
        [],  # the click's run started
        [("poll", [["cat"]])],  # ... and finished: the timer's request, with the click's value, passes
    ]


def test_the_timers_wait_for_a_click_s_run_a_bounded_time(monkeypatch):
    """A person's request that starts no run (Streamlit ignores one naming a fragment it no longer holds): the
    timers' requests wait ``PERSON_RUN_WAIT_S``, then pass."""
    from streamlit.proto.BackMsg_pb2 import BackMsg

    monkeypatch.setattr(class_http, "PERSON_RUN_WAIT_S", 0.5)

    got = []

    async def run() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def app(scope, receive, send):
            sent_at = loop.time()
            queue.put_nowait({"type": "websocket.receive", "bytes": request(fragment="gone")})
            queue.put_nowait({"type": "websocket.receive", "bytes": request(fragment="poll", auto=True)})
            for _ in range(2):
                message = await asyncio.wait_for(receive(), 60)
                got.append((BackMsg.FromString(message["bytes"]).rerun_script.fragment_id, loop.time() - sent_at))

        async def send(message):
            pass

        await class_http.StalePageGuard(app)({"type": "websocket"}, queue.get, send)

    asyncio.run(run())
    assert [fragment for fragment, _ in got] == ["gone", "poll"]  # the click at once, the timer's request after it
    assert got[1][1] >= 0.5  # ... not before the bound (a timer fires late on a loaded machine, never early)


class Version:
    """The class's version number as ``ClassWake`` reads it (counted), changed by the test."""

    def __init__(self, value: int | None = 3):
        self.value, self.reads = value, 0

    def __call__(self) -> int | None:
        self.reads += 1
        return self.value


async def wake_request(middleware, query: str, client: str = "10.0.0.5", gone_after_s: float | None = None):
    """One GET of the wake-up address; returns (status, JSON body or None, headers); (None, None, []) when the
    browser went away (after ``gone_after_s``) before an answer."""
    import json

    scope = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "path": "/base" + class_http.WAKE_PATH,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [],
        "client": (client, 50000),
    }
    sent, asked = [], []

    async def receive():
        asked.append(1)
        if len(asked) == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        if gone_after_s is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(gone_after_s)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await middleware(scope, receive, send)
    if not sent:
        return None, None, []
    body = b"".join(m.get("body", b"") for m in sent[1:])
    headers = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    return sent[0]["status"], (json.loads(body) if body else None), headers


def test_a_wake_up_is_answered_when_the_class_moves_not_before():
    """Requests that name the version their screen has seen wait; the moment the number rises, every one of them is
    answered with the new number, and not one before (the order of events is recorded); one already behind is
    answered at once; with no change an answer comes after the wait bound, with the number as it is."""
    version = Version(3)
    middleware = class_http.ClassWake(page_app(), version, wait_s=60.0, watch_s=0.05)
    events = []

    async def run() -> None:
        async def student(number: int) -> None:
            status, body, headers = await wake_request(middleware, "after=3", client=f"10.0.0.{number}")
            events.append(("answered", status, body, headers.get("cache-control")))

        waiting = [asyncio.ensure_future(student(n)) for n in range(1, 21)]
        await asyncio.sleep(0.5)
        assert not any(task.done() for task in waiting)  # nothing moved: they all wait
        assert sum(middleware.clients.values()) == 20
        events.append(("moved",))
        version.value = 4
        await asyncio.wait_for(asyncio.gather(*waiting), 30)
        assert await wake_request(middleware, "after=2") == (
            200,
            {"version": 4},
            {"content-type": "application/json", "cache-control": "no-store", "content-length": "14"},
        )

    asyncio.run(run())
    assert events[0] == ("moved",)
    assert events[1:] == [("answered", 200, {"version": 4}, "no-store")] * 20
    assert middleware.clients == {}  # nobody holds a request any more

    quiet = class_http.ClassWake(page_app(), Version(5), wait_s=0.3, watch_s=0.05)
    assert asyncio.run(wake_request(quiet, "after=5"))[:2] == (200, {"version": 5})  # the bound: no news


def test_one_watcher_reads_the_number_however_many_wait():
    """Fifty waiting requests cost the class file one read each on arrival, then one read per ``watch_s`` in all
    (a bound from the time measured here: under load the reads only come later, never more often)."""
    import time

    version = Version(1)
    middleware = class_http.ClassWake(page_app(), version, wait_s=0.6, watch_s=0.1)

    async def run() -> float:
        started = time.monotonic()
        await asyncio.gather(*(wake_request(middleware, "after=1", client=f"10.0.1.{n}") for n in range(50)))
        return time.monotonic() - started

    elapsed = asyncio.run(run())
    assert version.reads >= 50 + 1  # each request's own read, and the watcher's
    assert version.reads <= 50 + elapsed / 0.1 + 1


def test_wake_ups_outside_a_class_bad_numbers_too_many_and_browsers_gone():
    """Outside a class the address is the app's (which knows no such page); ``after`` that is no whole number is a
    400; one client address holds at most ``per_client`` requests (429 after that, others unaffected); a request
    whose browser went away stops waiting and is answered with nothing."""
    status, _ = get(class_http.ClassWake(page_app(), Version(None)), "/base" + class_http.WAKE_PATH, "after=1")
    assert status == 200  # passed to the app: the stand-in answers every GET
    status, _ = get(class_http.ClassWake(page_app(), Version(1)), "/explore", "after=1")
    assert status == 200  # another address: the app's
    middleware = class_http.ClassWake(page_app(), Version(1), wait_s=60.0, watch_s=0.05, per_client=2)

    async def run() -> None:
        for query in ("after=x", "after=", "", "after=1.5"):
            status, body, _ = await wake_request(middleware, query)
            assert status == 400 and "whole number" in body["error"]
        held = [asyncio.ensure_future(wake_request(middleware, "after=1", gone_after_s=0.4)) for _ in range(2)]
        await asyncio.sleep(0.2)
        status, _, headers = await wake_request(middleware, "after=1")
        assert status == 429 and headers["retry-after"] == "5"
        other = asyncio.ensure_future(wake_request(middleware, "after=1", client="10.0.0.6", gone_after_s=0.4))
        assert await asyncio.wait_for(asyncio.gather(*held, other), 30) == [(None, None, [])] * 3  # went away
        assert middleware.clients == {}

    asyncio.run(run())
