"""The class server's HTTP side: what only the server's HTTP and websocket layer can do (ASGI middleware; of
Streamlit only its protocol messages).

``serve.py`` (what ``scripts/app.sh`` runs) wraps the app in ``ClassCookies``, a middleware Streamlit's ``st.App``
allows. A script cannot: Streamlit 1.67 gives a script no way to set a cookie, so a cookie a page script sets
(``document.cookie``) is readable by every page script, and the teacher link's key would reach the page and its
address bar before any script could take it out. Here, before the page exists:

* A GET whose address carries the teacher's key (``?teacher=TOKEN``, checked in constant time) is answered with a
  redirect to the same address without it (303): the key never reaches the page or a projected address bar. With
  the redirect the browser gets the teacher's proof (``class_session.teacher_proof``: a random nonce and its HMAC
  under the token, so a new token makes it worthless) in an HttpOnly cookie. A wrong key is left to the page, which
  says so and drops it.
* Every page a browser loads in a class carries a student identity, signed by the server
  (``class_session.signed_student``), in an HttpOnly cookie, set when the browser has none that verifies: one per
  browser, however many tabs it opens. A session answers only with the identity its own connection brought back
  (``ui.follow``), so a client that keeps no cookies cannot answer, and one client address gets at most
  ``joins_per_client()`` new identities an hour: a script cannot make voters for free.
* The cookies are ``SameSite=Strict``, and ``Secure`` when the page came over HTTPS.

And one thing for every session, on its websocket (``StalePageGuard``): a browser's fragment timers (the class
poll) keep sending while the server moves the session to another page (``st.switch_page``: a follower moved to
the teacher's page), until the browser has taken the new page in, each request naming the page the browser still
shows. Streamlit queues such a request behind the run that moves the page and then runs it on the old page: the
session's page flips back, and the browser, told of a run of another page than the one it shows, clears the page
(a follower's screen went blank, its follow "never arrived", until the teacher's next move; more often the more
the machine is loaded). Here a timer's request waits while a script of the session runs and goes on only if it
names the page the server last ran the session on: a timer never changes the page. A person's request (a click)
passes at once, the timers' requests held before it are dropped (let through after it, their older widget values
would undo the click's), and the timers' next requests wait until the run that takes the click in has been seen
to end (a request reaching Streamlit just after a short run ended dropped that run's output: the click's reply).

And the class's wake-up (``ClassWake``): a following student's page holds one request to ``WAKE_PATH`` open, which
the server answers as soon as the class's version number rises (the teacher moved), and the page's own script then
asks for its poll's run at once (``ui.follow``): a follower moves when the teacher does, not at its poll timer's
next tick, and every run is one the browser asked for (a run the server makes up on its own confused the browser's
page). The guard holds such a wake-up like a timer's request: it never moves the page either.
"""

from __future__ import annotations

import asyncio
import json
import os
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, quote, urlencode

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from ui import class_session

TEACHER_PARAM = "teacher"
TEACHER_COOKIE, STUDENT_COOKIE = "headscope_teacher", "headscope_student"
COOKIE_MAX_AGE_S = int(class_session.EXPIRE_AFTER_S)
JOINS_ENV = "HEADSCOPE_CLASS_JOINS_PER_CLIENT"
JOINS_PER_CLIENT = 10  # new student identities one client address may get an hour (a class on a LAN: one each)
JOIN_WINDOW_S = 3600.0
WAKE_PATH = "/_headscope/class/version"  # under the server's base path
WAKE_KEY = "headscope_class_wake"  # the key of the wake-up component (ui.follow); its trigger names it
WAKE_WAIT_S = 25.0  # a wake-up request is answered after at most this long, risen or not (proxies close idle ones)
WAKE_WATCH_S = 0.1  # while requests wait, the class's version number is read this often (one indexed read)
WAKES_PER_CLIENT = 8  # wake-up requests one client address may hold open at once (a tab each)
WAKES_AT_ONCE = 2000  # and the whole server


def joins_per_client() -> int:
    """``HEADSCOPE_CLASS_JOINS_PER_CLIENT`` (default 10): raise it for a class whose browsers share one address
    (behind one NAT)."""
    try:
        return max(1, int(os.environ.get(JOINS_ENV, "") or JOINS_PER_CLIENT))
    except ValueError:
        return JOINS_PER_CLIENT


def set_cookie(name: str, value: str, secure: bool) -> bytes:
    """A ``Set-Cookie`` value: HttpOnly (no page script reads it), SameSite=Strict, for the whole site, 12 hours."""
    flags = f"; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")
    return f"{name}={value}{flags}".encode("latin-1")


def request_cookies(scope) -> dict[str, str]:
    jar = SimpleCookie()
    for key, value in scope.get("headers", ()):
        if key == b"cookie":
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed Cookie header counts as no cookie
                return {}
    return {name: morsel.value for name, morsel in jar.items()}


def client_address(scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class ClassCookies:
    """ASGI middleware: the teacher key out of the address, the class's HttpOnly cookies (see the module).
    ``token()`` gives the class's teacher token (None: not a class, the middleware passes everything through)."""

    def __init__(self, app, token, joins: class_session.ClientLimits | None = None):
        self.app, self.token = app, token
        self.joins = joins or class_session.ClientLimits(joins_per_client(), JOIN_WINDOW_S)

    async def __call__(self, scope, receive, send):
        token = self.token() if scope.get("type") == "http" and scope.get("method") in ("GET", "HEAD") else None
        if not token:
            await self.app(scope, receive, send)
            return
        secure = scope.get("scheme") == "https"
        query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        keys = [value for name, value in query if name == TEACHER_PARAM]
        if keys and class_session.token_matches(keys[-1], token):
            rest = urlencode([(name, value) for name, value in query if name != TEACHER_PARAM])
            path = scope.get("root_path", "") + quote(scope.get("path", "/"))
            headers = [
                (b"location", (path + (f"?{rest}" if rest else "")).encode("latin-1")),
                (b"set-cookie", set_cookie(TEACHER_COOKIE, class_session.teacher_proof(token), secure)),
                (b"cache-control", b"no-store"),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 303, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        has_identity = class_session.verified_student(request_cookies(scope).get(STUDENT_COOKIE), token) is not None

        async def sending(message):
            if message.get("type") == "http.response.start" and not has_identity:
                headers = list(message.get("headers", ()))
                page = any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers)
                if page and self.joins.allow(client_address(scope)):
                    headers.append(
                        (b"set-cookie", set_cookie(STUDENT_COOKIE, class_session.signed_student(token), secure))
                    )
                    message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


def _respond(status: int, body: bytes, extra=()) -> list[dict]:
    headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
    headers += [*extra, (b"content-length", str(len(body)).encode())]
    return [
        {"type": "http.response.start", "status": status, "headers": headers},
        {"type": "http.response.body", "body": body},
    ]


class ClassWake:
    """ASGI middleware: ``GET WAKE_PATH?after=N`` is answered with ``{"version": V}`` as soon as the class's version
    number ``V`` (``version()``; None: not a class, the request passes to the app, which knows no such address) is
    above ``N``, or after ``wait_s`` with the number as it is then. One watcher reads the number every ``watch_s``
    while any request waits, however many wait; a request whose browser went away stops waiting. One client address
    holds at most ``per_client`` requests open (429 after that), the server ``at_once``."""

    def __init__(
        self,
        app,
        version,
        wait_s: float = WAKE_WAIT_S,
        watch_s: float = WAKE_WATCH_S,
        per_client: int = WAKES_PER_CLIENT,
        at_once: int = WAKES_AT_ONCE,
    ):
        self.app, self.version = app, version
        self.wait_s, self.watch_s, self.per_client, self.at_once = wait_s, watch_s, per_client, at_once
        self.latest: int | None = None  # the number the watcher read last
        self.clients: dict[str, int] = {}  # client address -> requests it holds open
        self._risen: asyncio.Event | None = None  # set (and replaced) each time the watcher sees the number change
        self._watcher: asyncio.Task | None = None

    async def _read(self) -> int | None:
        try:
            return await asyncio.to_thread(self.version)
        except Exception:  # a locked or unreadable class file: as if unchanged, read again at the next watch
            return self.latest

    async def _watch(self) -> None:
        while sum(self.clients.values()):
            await asyncio.sleep(self.watch_s)
            self._saw(await self._read())
        self._watcher = None

    def _saw(self, latest: int | None) -> None:
        if latest != self.latest:
            self.latest = latest
            if self._risen is not None:
                self._risen.set()  # every waiting request looks
            self._risen = asyncio.Event()

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "")
        if scope.get("type") != "http" or scope.get("method") != "GET" or not path.endswith(WAKE_PATH):
            await self.app(scope, receive, send)
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        try:
            after = int(query.get("after", ""))
        except ValueError:
            for message in _respond(400, b'{"error": "after: a whole number"}'):
                await send(message)
            return
        latest = await self._read()
        if latest is None:  # not a class
            await self.app(scope, receive, send)
            return
        self._saw(latest)
        client = client_address(scope)
        holding = self.clients.get(client, 0)
        if latest <= after and (holding >= self.per_client or sum(self.clients.values()) >= self.at_once):
            for message in _respond(429, b'{"error": "too many wake-ups at once"}', [(b"retry-after", b"5")]):
                await send(message)
            return
        if latest <= after and not await self._wait(client, after, receive):
            return  # the browser went away
        for message in _respond(200, json.dumps({"version": self.latest or 0}).encode()):
            await send(message)

    async def _wait(self, client: str, after: int, receive) -> bool:
        """Until the number is above ``after`` or ``wait_s`` passed (True), or the browser went away (False)."""
        loop = asyncio.get_running_loop()
        if self._risen is None:
            self._risen = asyncio.Event()
        self.clients[client] = self.clients.get(client, 0) + 1
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(self._watch())
        gone = asyncio.ensure_future(_disconnected(receive))
        until = loop.time() + self.wait_s
        try:
            while (self.latest or 0) <= after and loop.time() < until:
                risen = asyncio.ensure_future(self._risen.wait())
                await asyncio.wait({risen, gone}, timeout=until - loop.time(), return_when=asyncio.FIRST_COMPLETED)
                risen.cancel()
                if gone.done():
                    return False
            return True
        finally:
            gone.cancel()
            self.clients[client] -= 1
            if not self.clients[client]:
                del self.clients[client]


async def _disconnected(receive) -> None:
    while (await receive()).get("type") != "http.disconnect":
        pass


PERSON_RUN_WAIT_S = 5.0  # the timers wait at most this long for the run of a person's request to finish
SMALL_MESSAGE = 64 * 1024  # a run's new_session or status message is a few bytes to kB; figures are not read here


class StalePageGuard:
    """ASGI middleware on the app's websocket (see the module): a fragment timer's rerun request is held while a
    script of the session runs and let through once none does, then only if it names the page the server last
    started a full run of (a request sent before a page change, held while the run that made the change ran, would
    be run on the old page after it). Every other request (a person's) passes at once, and:

    * drops the timers' requests held before it: each carries the browser's widget values as they were when it was
      sent, and Streamlit lets a later request's values win (folded into a pending run, or run after): let through
      after a click, a held request would undo the click's value (the timers send again at their next tick);
    * holds the timers' requests until the run that takes it in (one of its fragment's, or a full run, started
      after it) has been seen to finish, at most ``PERSON_RUN_WAIT_S``: Streamlit runs a request that arrives when
      the session's script thread has stopped on a new thread, and drops whatever of the stopped thread's output
      it has not sent yet. A poll arriving just as a click's short run ended made the click's reply vanish (its
      answer stored, the screen never told).

    A timer's request it lets through is waited for in the same way: the next one is held until the run it started
    (and the full run that run asked for, the poll's ``st.rerun``) has been seen to end. Two let through before the
    first one's run started (a wake-up, then the timer's tick, on a loaded server) made Streamlit run the second
    fragment in the middle of the full run the first one asked for, which stopped half drawn: in the classroom
    benchmark 1 to 14 of 30 students never saw some reveals.

    Reads only the small messages the server sends (a run's new_session, its running status) and the requests the
    browser sends (small)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "websocket":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        # awaited: the fragment of the person's last request ("" for a full run), until the run that takes it in
        # is seen to finish; started: that run was seen to start; until: when the timers stop waiting for it.
        state = {"page": None, "running": False, "awaited": None, "started": False, "until": 0.0}
        held: dict[str, dict] = {}  # fragment id -> its timer's latest request, while a script runs
        passed: asyncio.Queue = asyncio.Queue()

        def waiting() -> bool:
            if state["awaited"] is not None and loop.time() >= state["until"]:
                state["awaited"] = None  # never seen (a request Streamlit ignored): the timers wait no longer
            return state["running"] or state["awaited"] is not None

        def await_run(fragment: str) -> None:
            """The timers wait for the run that takes in the request just let through (``fragment``'s, "" for a full
            run) until it is seen to finish, at most ``PERSON_RUN_WAIT_S``."""
            state.update(awaited=fragment, started=False, until=loop.time() + PERSON_RUN_WAIT_S)
            loop.call_later(PERSON_RUN_WAIT_S, release)

        def release() -> None:
            if waiting():
                return
            for fragment, message in held.items():
                if not stale_timer_request(message["bytes"], state["page"]):
                    passed.put_nowait(message)
                    # One timed request at a time: a second one let through before the first one's run (or the full
                    # run that run asks for: the poll's st.rerun) has ended started a fragment run in the middle of
                    # that full run, which stopped it half drawn (a student's screen never showed the reveal).
                    await_run(fragment)
            held.clear()

        async def sending(message):
            data = message.get("bytes") if message.get("type") == "websocket.send" else None
            if data and len(data) < SMALL_MESSAGE:
                page, running, fragments = server_news(data)
                state["page"] = page or state["page"]
                if fragments is not None and state["awaited"] is not None:
                    state["started"] = state["started"] or not fragments or state["awaited"] in fragments
                if running is not None:
                    state["running"] = running
                    if not running:
                        if state["started"]:
                            state["awaited"], state["started"] = None, False
                        release()
            await send(message)

        async def pump() -> None:
            while True:
                message = await receive()
                data = message.get("bytes") if message.get("type") == "websocket.receive" else None
                fragment = timer_fragment(data) if data else None
                if fragment:
                    held[fragment] = message  # a timer's latest request stands for its earlier ones
                    release()
                    continue
                request = _rerun_request(data) if data else None
                if request is not None:
                    held.clear()  # sent before this request: let through after it, their older values would win
                    await_run(request.fragment_id)
                passed.put_nowait(message)
                if message.get("type") == "websocket.disconnect":
                    return

        reader = asyncio.ensure_future(pump())
        try:
            await self.app(scope, passed.get, sending)
        finally:
            reader.cancel()


EARLY_FOR_RERUN = ForwardMsg.FINISHED_EARLY_FOR_RERUN  # a run stopped because another starts at once


def server_news(data: bytes) -> tuple[str | None, bool | None, list[str] | None]:
    """From a server message: the page a full run starts (its ``new_session``), whether a script runs now (True
    when one starts, False when one finished with nothing after it: a run stopped for the next one, e.g. the poll's
    ``st.rerun``, is not the end, a request let through then would meet the run that follows), and the fragments
    a run that starts runs ([] for a full run; None: no run starts)."""
    try:
        message = ForwardMsg.FromString(data)
    except Exception:  # not a message of this protocol: nothing to learn from it
        return None, None, None
    kind = message.WhichOneof("type")
    if kind == "new_session":
        fragments = list(message.metadata.run.fragment_ids)
        return (None if fragments else message.new_session.page_script_hash or None), True, fragments
    if kind == "script_finished":
        return None, None if message.script_finished == EARLY_FOR_RERUN else False, None
    return None, None, None


def _rerun_request(data: bytes):
    try:
        message = BackMsg.FromString(data)
    except Exception:  # left for Streamlit to refuse
        return None
    return message.rerun_script if message.WhichOneof("type") == "rerun_script" else None


def _timed(request) -> bool:
    """A fragment's rerun request that no person asked for: its timer's (``run_every``), or the class's wake-up
    (a trigger of the ``WAKE_KEY`` component, which the page sends when the class's version rose)."""
    if request is None or not request.fragment_id:
        return False
    return request.is_auto_rerun or any(
        WAKE_KEY in state.id and state.WhichOneof("value") == "json_trigger_value"
        for state in request.widget_states.widgets
    )


def timer_fragment(data: bytes) -> str | None:
    """The fragment of a timer's rerun request (``run_every``) or of a class wake-up; None for anything else (a
    person's request)."""
    request = _rerun_request(data)
    return request.fragment_id if _timed(request) else None


def stale_timer_request(data: bytes, page: str | None) -> bool:
    """True for a fragment timer's (or wake-up's) rerun request naming another page than ``page`` (None: not known
    yet)."""
    request = _rerun_request(data)
    if not _timed(request):
        return False
    return bool(page and request.page_script_hash not in ("", page))
