"""A lightweight Streamlit browser for load tests: the websocket protocol a browser speaks, without drawing.

It opens a session (``/_stcore/stream``), asks for a run of a page with a query string, keeps the address the
server gives it (``page_info_changed``; ``st.switch_page`` and ``st.query_params`` changes), reruns a fragment every
``interval`` as the browser does for ``st.fragment(run_every=...)`` (``auto_rerun``), holds the class's wake-up
request open and asks for its fragment's run when it is answered with a newer version, as a student's page does
(``ui/class_wake.mjs``: a component drawn with ``WAKE_KEY``), and sends widget values
(a click) as the browser does: a widget drawn inside a fragment reruns that fragment, and every request carries
every widget value the client holds (its clicks', and those the server set), as the browser's widget manager
sends them. Streamlit folds a request that arrives before the run of an earlier one started into it, the newer
request's values winning: a timer's request without the value a click just sent would undo the click (the click
got no reply). ``join()`` first loads the page over HTTP, as a browser does before it opens its websocket, and
keeps the cookies the server sets, which the websocket then carries; ``source`` connects from another loopback
address (127.0.0.N), so that many clients are many addresses to the server, as many students' machines are. The
server does the same work for it as for a browser (the same script runs, the same data is sent); only the
drawing, which happens on each student's own machine, is left out. Loopback only; every wait is bounded by its caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import time
from http.cookies import SimpleCookie
from urllib.parse import parse_qsl, urlsplit

from streamlit.proto.BackMsg_pb2 import BackMsg
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
from streamlit.proto.WidgetStates_pb2 import WidgetState
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

WAKE_KEY = "headscope_class_wake"  # ui.class_http.WAKE_KEY (the bench imports nothing of the app)
WAKE_PACE_S, WAKE_RETRY_S = 1.0, 2.0  # as ui/class_wake.mjs: PACE_MS, RETRY_MS
TRIGGERS = ("trigger_value", "string_trigger_value", "chat_input_value", "json_trigger_value")  # sent once


EVENTS = 200  # the run lifecycle messages and requests a client remembers (bench/class_teacher.py prints them)
LIFECYCLE = ("new_session", "script_finished", "session_status_changed", "page_info_changed")


def _detail(message, kind: str) -> str:
    if kind == "new_session":
        return f"fragments {[f[:6] for f in message.metadata.run.fragment_ids]}"
    if kind == "script_finished":
        return ForwardMsg.ScriptFinishedStatus.Name(message.script_finished)
    if kind == "session_status_changed":
        return f"running {message.session_status_changed.script_is_running}"
    return ""


class StreamlitClient:
    def __init__(self, base_url: str, name: str = "client", source: str | None = None):
        assert base_url.startswith("http://127.0.0.1:"), "loopback only"
        assert source is None or source.startswith("127."), "loopback only"
        self.base_url, self.source = base_url, source
        self.url = base_url.replace("http://", "ws://") + "/_stcore/stream"
        self.name = name
        self.cookies: dict[str, str] = {}  # what the server set on ``join``; sent with the websocket
        self.addresses: list[str] = []  # every address the server gave this client, in order
        self.widget_fragments: dict[str, str] = {}  # widget id -> the fragment that drew it
        self.widget_values: dict[str, WidgetState] = {}  # widget id -> the value held and sent with every request
        self.auto_reruns = True  # False: the fragments' timers and the wake-up send nothing (a test sends by hand)
        self.query = ""
        self.page_hash = ""
        self.pages: dict[str, str] = {}  # url path -> page script hash
        # Ids of the widgets and texts (markdown, alerts, HTML) received: a fragment's run also starts with a
        # ``new_session``, so nothing is forgotten there; a caller clears ``texts`` before what it waits for.
        self.widgets: set[str] = set()
        self.texts: list[str] = []
        self.finished_at = 0.0  # when the last script run (or fragment run) finished
        self.runs_finished = 0
        self.full_runs_finished = 0  # of them, runs of the whole page (not a fragment's)
        self.events: list[tuple[float, str, str]] = []  # the last EVENTS: (when, what, detail), runs' and requests
        self.query_changed_at = 0.0
        self.running = False
        self._full_run = False  # the run going on is a full run (not a fragment's)
        self._drawn: set[str] = set()  # the widgets the current full run drew
        self._timers: dict[str, asyncio.Task] = {}
        self.wake_ups = True  # False: the class's wake-up asks for no run (the timers alone, as before it)
        self.timer_reruns = True  # False: the timers alone send nothing (the wake-up alone)
        self.woken = 0  # runs the wake-up asked for
        self.woken_at: list[float] = []  # when (time.monotonic) each answer with a newer version came
        self._wake: dict | None = None  # the wake-up component last drawn: its trigger id, fragment, url, version
        self._waker: asyncio.Task | None = None
        self._fragments_page = ""  # the page whose fragments the timers rerun
        self._connection = None
        self._reader: asyncio.Task | None = None
        self.changed = asyncio.Event()
        self.errors: list[str] = []

    # ---- connection ---------------------------------------------------------------------------------------
    def join(self, page: str = "", query: str = "") -> int:
        """Load the page over HTTP as a browser does first (from ``source``), keeping the cookies the server sets;
        returns the HTTP status (a redirect is followed once, as a browser follows the teacher link's)."""
        parts = urlsplit(self.base_url)
        path = f"/{page}" + (f"?{query}" if query else "")
        for _ in range(2):
            connection = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=60, source_address=(self.source, 0) if self.source else None
            )
            try:
                headers = {"Cookie": self.cookie_header()} if self.cookies else {}
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                response.read()
                for header in response.headers.get_all("Set-Cookie") or []:
                    jar = SimpleCookie()
                    jar.load(header)
                    self.cookies.update({name: morsel.value for name, morsel in jar.items()})
                if response.status in (301, 302, 303, 307) and response.getheader("Location"):
                    path = response.getheader("Location")
                    continue
                return response.status
            finally:
                connection.close()
        return response.status

    def cookie_header(self) -> str:
        return "; ".join(f"{name}={value}" for name, value in self.cookies.items())

    async def open(self, page: str = "", query: str = "") -> None:
        extra = {"additional_headers": {"Cookie": self.cookie_header()}} if self.cookies else {}
        if self.source:
            extra["local_addr"] = (self.source, 0)
        self._connection = await connect(
            self.url, subprotocols=["streamlit"], max_size=None, ping_interval=None, **extra
        )
        self._reader = asyncio.create_task(self._read())
        self.query = query
        await self.rerun(page_name=page)

    async def close(self) -> None:
        for timer in [*self._timers.values(), self._waker]:
            if timer is not None:
                timer.cancel()
        if self._connection is not None:
            await self._connection.close()
        if self._reader is not None:
            self._reader.cancel()

    async def rerun(
        self,
        *,
        page_name: str = "",
        fragment_id: str = "",
        widget_states=(),
        query: str | None = None,
        as_if: tuple[str, str] | None = None,
    ):
        """Ask for a run, with every widget value held and ``widget_states`` (a click's) over them. ``query``: this
        address from now on; ``as_if=(page_hash, query)``: this one request as a browser sends it before it took
        in the server's last messages (its older page and address), the client's own record left as it is."""
        if query is not None:
            self.query = query
        page_hash, query_string = as_if or (self.page_hash, self.query)
        message = BackMsg()
        state = message.rerun_script
        state.query_string = query_string
        state.page_script_hash = page_hash
        state.page_name = page_name
        if fragment_id:
            state.fragment_id = fragment_id
            state.is_auto_rerun = not widget_states
        values = dict(self.widget_values)
        values.update({widget_state.id: widget_state for widget_state in widget_states})
        state.widget_states.widgets.extend(values.values())
        self._event("rerun request", f"fragment {fragment_id[:6]} states {len(widget_states)}")
        await self._connection.send(message.SerializeToString())

    def _event(self, what: str, detail: str, at: float | None = None) -> None:
        self.events.append((time.monotonic() if at is None else at, what, detail))
        del self.events[:-EVENTS]

    def fragments(self) -> list[str]:
        """The ids of the fragments the server asked this client to rerun on a timer (the class poll)."""
        return list(self._timers)

    def widget(self, key_suffix: str) -> str | None:
        """The id of the widget shown now whose id ends with ``key_suffix`` (the script's ``key=``), or None."""
        return next((wid for wid in self.widgets if wid.endswith(key_suffix)), None)

    async def click(self, widget_id: str, **value) -> None:
        """Set the widget ``widget_id`` (e.g. ``string_array_value=[label]`` for pills, ``trigger_value=True`` for a
        button) and rerun, as a click does: the fragment that drew it, or the app; an id no longer shown is sent
        all the same (a replayed message). A value is held from then on; a trigger (a button) is sent once."""
        state = WidgetState(id=widget_id)
        for field, given in value.items():
            if field in ("int_array_value", "string_array_value"):
                getattr(state, field).data.extend(given)
            else:
                setattr(state, field, given)
        if not any(field in TRIGGERS for field in value):
            self.widget_values[widget_id] = state
        await self.rerun(widget_states=[state], fragment_id=self.widget_fragments.get(widget_id, ""))

    def params(self) -> dict:
        return dict(parse_qsl(self.query, keep_blank_values=True))

    # ---- the class's wake-up ----------------------------------------------------------------------------------
    def _wake_drawn(self, component, fragment_id: str) -> None:
        try:
            data = json.loads(component.json)
        except ValueError:
            return
        seen = int(data.get("after", -1))
        after = max(seen, self._wake["after"]) if self._wake else seen
        self._wake = {
            "trigger": f"$$STREAMLIT_INTERNAL_KEY_{component.id}__events",
            "fragment": fragment_id,
            "url": str(data.get("url", "")),
            "after": after,
        }
        if self._waker is None or self._waker.done():
            self._waker = asyncio.create_task(self._watch_wake())

    async def _wake_answer(self, url: str, after: int) -> tuple[int, int | None]:
        """One wake-up request, held until the server answers: (status, version or None)."""
        parts = urlsplit(self.base_url)
        reader, writer = await asyncio.open_connection(
            parts.hostname, parts.port, local_addr=(self.source, 0) if self.source else None
        )
        try:
            cookie = f"Cookie: {self.cookie_header()}\r\n" if self.cookies else ""
            writer.write(
                f"GET {url}?after={after} HTTP/1.1\r\nHost: {parts.netloc}\r\n{cookie}Connection: close\r\n\r\n".encode(
                    "latin-1"
                )
            )
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else 0
        try:
            return status, int(json.loads(body)["version"]) if status == 200 else None
        except (ValueError, KeyError, TypeError):
            return 0, None

    async def _watch_wake(self) -> None:
        while self._wake is not None:
            started = time.monotonic()
            try:
                status, version = await self._wake_answer(self._wake["url"], self._wake["after"])
            except OSError:
                status, version = 0, None
            if status == 404:
                return
            if version is not None and version > self._wake["after"]:
                self._wake["after"] = version
                self.woken_at.append(time.monotonic())
                if self.wake_ups and self.auto_reruns:
                    state = WidgetState(id=self._wake["trigger"])
                    state.json_trigger_value = json.dumps([{"event": "woke", "value": version}])
                    self.woken += 1
                    await self.rerun(widget_states=[state], fragment_id=self._wake["fragment"])
            elif status != 200:
                await asyncio.sleep(WAKE_RETRY_S)
            else:
                await asyncio.sleep(max(0.0, WAKE_PACE_S - (time.monotonic() - started)))

    # ---- what the server sends ------------------------------------------------------------------------------
    async def _auto_rerun(self, fragment_id: str, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if not self.running and self.auto_reruns and self.timer_reruns:
                await self.rerun(fragment_id=fragment_id)

    async def _read(self) -> None:
        while True:
            try:
                raw = await self._connection.recv()
            except ConnectionClosed:
                return
            if isinstance(raw, str):
                continue
            message = ForwardMsg.FromString(raw)
            kind = message.WhichOneof("type")
            now = time.monotonic()
            if kind in LIFECYCLE:
                self._event(kind, _detail(message, kind), now)
            if kind == "new_session":
                self._full_run = not message.metadata.run.fragment_ids
                if self._full_run:  # a full run, as the browser reads it: its page, and
                    self._drawn = set()
                    self.page_hash = message.new_session.page_script_hash  # its fragment timers stopped (the run
                    for timer in self._timers.values():  # registers the ones it keeps again); a fragment's run
                        timer.cancel()  # changes neither
                    self._timers = {}
            elif kind == "navigation":
                self.pages = {page.url_pathname: page.page_script_hash for page in message.navigation.app_pages}
                if message.navigation.page_script_hash != self._fragments_page:  # another page: its own fragments
                    for timer in self._timers.values():
                        timer.cancel()
                    self._timers = {}
                    self._fragments_page = message.navigation.page_script_hash
                self.page_hash = message.navigation.page_script_hash
            elif kind == "page_info_changed":
                self.query = message.page_info_changed.query_string
                self.addresses.append(self.query)
                self.query_changed_at = now
            elif kind == "auto_rerun":
                fragment_id, interval = message.auto_rerun.fragment_id, message.auto_rerun.interval
                if fragment_id not in self._timers:
                    self._timers[fragment_id] = asyncio.create_task(self._auto_rerun(fragment_id, interval))
            elif kind == "session_status_changed":
                self.running = message.session_status_changed.script_is_running
            elif kind == "delta" and message.delta.WhichOneof("type") == "new_element":
                element = message.delta.new_element
                which = element.WhichOneof("type")
                if which == "markdown":
                    self.texts.append(element.markdown.body)
                elif which == "alert":
                    self.texts.append(element.alert.body)
                elif which == "html":
                    self.texts.append(element.html.body)
                elif which == "progress":  # a job's progress bar: its place in a queue while it waits
                    self.texts.append(element.progress.text)
                elif which == "exception":
                    self.errors.append(element.exception.message)
                elif which == "bidi_component" and WAKE_KEY in element.bidi_component.id:
                    self._wake_drawn(element.bidi_component, message.delta.fragment_id)
                else:
                    widget_id = getattr(getattr(element, which), "id", "") if which else ""
                    if isinstance(widget_id, str) and widget_id:
                        self.widgets.add(widget_id)
                        self._drawn.add(widget_id)
                        self.widget_fragments[widget_id] = message.delta.fragment_id
                        self._take_value(widget_id, which, getattr(element, which))
            elif kind == "script_finished":
                self.finished_at = now
                self.runs_finished += 1
                self.full_runs_finished += self._full_run
                self.running = False
                if self._full_run and message.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                    # as the browser does: the values of widgets a full run no longer draws are dropped
                    self.widget_values = {k: v for k, v in self.widget_values.items() if k in self._drawn}
            self.changed.set()

    def _take_value(self, widget_id: str, kind: str, proto) -> None:
        """A widget drawn with a value the server set (``set_value``): the browser holds that value from then on
        (pills and segmented controls, the widgets these clients click; for others the value is dropped, the
        server's own kept)."""
        if not getattr(proto, "set_value", False):
            return
        if kind == "button_group":
            state = WidgetState(id=widget_id)
            state.string_array_value.data.extend(proto.raw_values)
            self.widget_values[widget_id] = state
        else:
            self.widget_values.pop(widget_id, None)

    async def wait_for(self, predicate, timeout_s: float) -> bool:
        """Until ``predicate(self)`` holds (checked after every message), at most ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.5))
        return True

    def shows(self, text: str) -> bool:
        return any(text in shown for shown in self.texts)
