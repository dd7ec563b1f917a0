"""The class as one room: the teacher leads, every student screen that follows shows the teacher's view.

In classroom mode with a teacher token (``HEADSCOPE_TEACHER_TOKEN``, set by ``scripts/app.sh --classroom``), the
browser that opened the teacher link (``?teacher=TOKEN``, checked on the server in constant time) leads; everyone
else is a student, anonymous. Served through ``serve.py`` (``ui.class_http``), the key never reaches the page (the
server answers the link with a redirect without it and keeps an HttpOnly proof cookie in the browser), and each
browser carries a student identity signed by the server, which a session reads back from its own connection's
cookies: only such a session answers. A session opened with the key by other means leads too, and takes the key
out of its address at once, in every run it sees it.

The teacher's view is the page and its address (everything a view depends on is in the link): the teacher's
session publishes it to the class store (``ui.class_session``) at the end of each run and from a small fragment
every ``TEACHER_POLL_S``, which also catches moves made inside a page's fragments (a head clicked in Explore).
A student's session polls the store's version number every ``settings().student_poll_s`` (one indexed read),
and its page holds a wake-up request open (``class_wake.mjs``, ``class_http.ClassWake``) that asks for the poll's
run as soon as the number rises: the class moves with the teacher, not at each screen's next timer tick. When the
number rose, it reruns: a follower whose address differs from the teacher's forgets its own view state and switches to the
teacher's page and address, exactly as if it had opened the teacher's link. A student can leave to explore and
come back with one click; a student who moves a Classroom step while following leaves, and is told so.

What made the address depend on the load, and what holds it whatever the load:

* Streamlit's browser code, when the server switches its page (``st.switch_page``: a follower moved, the root
  address opened), writes the new page's path into the address bar from a render callback, with the query it
  holds at that render. On a busy machine that render was started before the new address arrived and ends after
  it: the bar gets the new path with the old query (a follower showing layer 3 under an address of layer 0, the
  teacher's bar keeping ``teacher=TOKEN``) and keeps it until the next address message. So after a run that
  changed its page, and after every move of a follower (within one page too), a session's poll sends the address
  again, as it is, for ``RESEND_POLLS`` polls: a browser whose bar took an older address takes this one (one small
  message; none when the bar already holds it).
* Each poll is a request carrying the address the browser holds, and Streamlit takes the server's address from
  every request: one sent before the browser took in a move carries the address it was moved away from, and a
  write in that run would send it back. The key is removed in every run that sees it; a follower keeps the
  addresses it was moved away from and is moved to the teacher's view again by a request carrying one of them,
  for as long as such requests come in the ``MOVE_WINDOW_S`` after its first move to that view (a count of moves
  ran out on a machine whose browser took in the moves late, and left a follower a step behind); the teacher does
  not publish an address its last run already replaced (the class would step back, then on).
* Such a request also carries the values the browser's widgets held before the move (a presentation switch it
  showed off), and its run writes them into the address: a follower whose address is not the teacher's view in
  the ``SETTLE_S`` after a move is moved again.

After a server restart the browsers reconnect with their addresses and cookies, and the store gives back the
session, its view and its answers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sqlite3
import time
from pathlib import Path

import streamlit as st

from ui import address, class_http, class_session, i18n
from ui.i18n import t
from ui.settings import settings

LOG = logging.getLogger("headscope.app")
TEACHER, STUDENT = "teacher", "student"
TEACHER_POLL_S = 0.5  # how often the teacher's session checks whether its view changed (one session)
PUBLISH_WAIT_S = 1.0  # a publish waits this long for a locked class file; the next poll tries again
POLL_WAIT_S = 0.5
TEACHER_PARAM, TEACHER_COOKIE, STUDENT_COOKIE = (
    class_http.TEACHER_PARAM,
    class_http.TEACHER_COOKIE,
    class_http.STUDENT_COOKIE,
)
SETTLE_S = 30.0  # after a move, a follower whose address is not the teacher's view is moved again (see the module)
KEPT_ADDRESSES = 8  # addresses a follower remembers having been moved away from
RESEND_POLLS = 10  # polls that send the address again after a run that changed the page
MOVE_WINDOW_S = 60.0  # a follower is moved again to one version of the view (a request from before it took in
# the move) for this long after its first move there; a browser that never takes the address is then left

_ROLE, _STUDENT, _FOLLOWING, _SEEN, _PAGE = (
    "_class_role",
    "_class_student",
    "_class_following",
    "_class_seen_version",
    "_class_page",
)
_LEFT, _MOVES, _PUBLISHED, _REPLACED, _NOTICE, _RESEND, _TARGET, _HEAL = (
    "_class_left",
    "_class_moves",
    "_class_published",
    "_class_replaced",
    "_class_notice",
    "_class_resend",
    "_class_target_page",
    "_class_heal",
)
_MOVED_AT = "_class_moved_at"
_WAKE_JS = Path(__file__).with_name("class_wake.mjs")
_wake = None  # the wake-up component, registered at its first use
_pages: dict = {}  # the app's pages by url path (app.py gives them to ``start`` every run), for the poll's moves
# Kept when a follower is moved: the class's own keys and the session's running work; every other key is
# view state, which the teacher's address decides again.
# Each screen's own language (``ui.i18n``: ``lang``, ``_lang``) is no part of the view: a class reads one view in
# its screens' languages.
_KEPT = ("_class_", "_presence", "_jobs", "_last_good_model", "_failed_model", "_link_notices", i18n.LANG_KEY, "_lang")


def teacher_token() -> str | None:
    """The token that leads this server's class, or None (not a classroom server, or no token given)."""
    if not settings().classroom:
        return None
    return os.environ.get(class_session.TOKEN_ENV, "").strip() or None


@functools.cache
def _store(path: str) -> class_session.ClassStore | None:
    try:
        return class_session.ClassStore(path)
    except (OSError, sqlite3.Error, class_session.StoreBusy):  # an unwritable cache directory: no class
        LOG.exception("cannot open the class store; no class session on this server")
        return None


def forget_store() -> None:
    """Open the store again at its next use (a test's restart, or another ``HEADSCOPE_CLASS_DB``)."""
    _store.cache_clear()


def store() -> class_session.ClassStore | None:
    """This server's class store (one per file; the cache directory decides which)."""
    return _store(str(class_session.default_path()))


def class_version() -> int | None:
    """The class's version number, for the wake-ups (``class_http.ClassWake``, in the server's threads); None
    outside a class. Raises ``class_session.StoreBusy`` while the class file is locked."""
    session = session_id()
    return None if session is None else store().version(session, wait_s=POLL_WAIT_S)


def session_id() -> str | None:
    token = teacher_token()
    return class_session.class_id(token) if token and store() is not None else None


def role() -> str | None:
    """``TEACHER``, ``STUDENT`` or None outside a class (decided by ``start``)."""
    return st.session_state.get(_ROLE) if session_id() else None


def is_teacher() -> bool:
    return role() == TEACHER


def following() -> bool:
    """A student whose screen follows the teacher (the default), or the teacher (whose screen is the view)."""
    return role() == TEACHER or (role() == STUDENT and st.session_state.get(_FOLLOWING, True))


def browser_cookie(name: str) -> str:
    """The cookie ``name`` this session's connection brought ("" without one; also under AppTest)."""
    value = st.context.cookies.get(name)
    return value if isinstance(value, str) else ""


def student_id() -> str | None:
    """This student's id: the server-signed identity its connection brought back (``ui.class_http``), or None
    (a client that keeps no cookies, or a server not started through ``serve.py``): then it cannot answer."""
    if role() != STUDENT:
        return None
    if st.session_state.get(_STUDENT) is None:
        st.session_state[_STUDENT] = class_session.verified_student(browser_cookie(STUDENT_COOKIE), teacher_token())
    return st.session_state[_STUDENT]


def _decide_role(token: str) -> str:
    given = st.query_params.get(TEACHER_PARAM)
    if given is not None:
        if class_session.token_matches(str(given), token):
            return TEACHER
        address.link_notice("this link's teacher key is not this class's: you joined as a student.")
    if class_session.proof_matches(browser_cookie(TEACHER_COOKIE), token):
        return TEACHER
    return STUDENT


def _drop_key() -> None:
    """The teacher key out of the server's address, whenever a request brought it back (a browser's request sent
    before it took in the address without it): each removal tells the browser again."""
    if TEACHER_PARAM in st.query_params:
        del st.query_params[TEACHER_PARAM]


def _view_params() -> dict:
    return {key: str(st.query_params.get(key)) for key in st.query_params if key not in (TEACHER_PARAM, i18n.LANG_KEY)}


def _address_key(params: dict) -> str:
    return json.dumps(params, sort_keys=True)


def start(pages: dict, page: str) -> None:
    """app.py, once the page is known and before the sidebar: decide this session's role, take the key out of
    the address, and move a follower to the teacher's view when it changed since this session last looked, or
    when this run came from a request sent before the browser took in the last move."""
    token = teacher_token()
    if session_id() is None:
        return
    _pages.update(pages)
    if _ROLE not in st.session_state:
        st.session_state[_ROLE] = _decide_role(token)
        if st.session_state[_ROLE] == TEACHER:
            with contextlib.suppress(class_session.StoreBusy):  # made by the first publish otherwise
                store().open_session(class_session.class_id(token))
    _drop_key()
    previous = st.session_state.get(_PAGE)
    if previous != page:  # a new page (or the session's first): its address is sent again
        st.session_state[_RESEND] = RESEND_POLLS
    st.session_state[_PAGE] = page
    if st.session_state[_ROLE] != STUDENT or not st.session_state.get(_FOLLOWING, True):
        return
    heal = st.session_state.pop(_HEAL, False)
    if previous not in (None, page) and not heal and page != st.session_state.get(_TARGET):
        leave(  # a page this student opened (a link in the menu, a click that opens Explore)
            t(
                "You opened another page yourself, so this screen no longer follows the teacher. "
                "**Follow the teacher** in the sidebar brings it back to the teacher's view."
            )
        )
        return
    _follow(pages, page, heal)


def _follow(pages: dict, page: str, heal: bool) -> None:
    try:
        view = store().view(session_id())
    except class_session.StoreBusy:
        return  # the class file is locked: the next poll looks again
    here = _view_params()
    stale = heal or _address_key(here) in st.session_state.get(_LEFT, ())
    if view.version <= st.session_state.get(_SEEN, -1) and not stale:
        return
    now = time.monotonic()
    moves = st.session_state.get(_MOVES)
    if moves is None or moves[0] != view.version:
        moves = (view.version, now)  # the version and when this session was first moved to it
    st.session_state[_SEEN] = view.version
    if view.page not in pages or (view.page == page and view.params == here) or now - moves[1] > MOVE_WINDOW_S:
        return
    st.session_state[_MOVES] = moves
    target = _address_key(view.params)
    left = [key for key in st.session_state.get(_LEFT, ()) if key not in (target, _address_key(here))]
    st.session_state[_LEFT] = (left + [_address_key(here)])[-KEPT_ADDRESSES:]
    st.session_state[_TARGET] = view.page
    st.session_state[_RESEND] = RESEND_POLLS  # a move within one page too: its address is sent again
    st.session_state[_MOVED_AT] = now
    _forget_view_state()
    st.switch_page(pages[view.page], query_params=view.params)


def _forget_view_state() -> None:
    for key in list(st.session_state):
        if not str(key).startswith(_KEPT):
            with contextlib.suppress(Exception):  # a widget Streamlit does not let a script change: redrawn anyway
                del st.session_state[key]


def publish() -> None:
    """The teacher's session, at the end of a run: the class's view is now this page and address (no change, no
    new version)."""
    if is_teacher() and _PAGE in st.session_state:
        _publish(_view_params())


def _publish(params: dict) -> None:
    """Publish ``params``; the addresses it replaces are remembered until the browser is seen to hold it: a poll
    sent before that carries one of them, and must not publish it again (the class would step back, then on)."""
    try:
        version = store().publish_view(session_id(), st.session_state[_PAGE], params, wait_s=PUBLISH_WAIT_S)
    except class_session.StoreBusy:
        LOG.warning("the class file is locked: the teacher's view is published at the next poll")
        return
    previous = st.session_state.get(_PUBLISHED)
    if previous is not None and previous != params:
        replaced = st.session_state.get(_REPLACED, [])
        st.session_state[_REPLACED] = (replaced + [_address_key(previous)])[-KEPT_ADDRESSES:]
    st.session_state[_SEEN] = version
    st.session_state[_PUBLISHED] = params


def _resend_address() -> None:
    """After a run that changed the page, the address again as it is, a few polls long (see the module)."""
    left = st.session_state.get(_RESEND, 0)
    if left > 0:
        st.session_state[_RESEND] = left - 1
        st.query_params.from_dict({key: st.query_params.get_all(key) for key in st.query_params})


def _behind() -> bool:
    """This run came from a request the browser sent before it took in this session's last page change: its
    address names another page than the session's (app.py writes ``page=`` into every address). Streamlit runs
    such a request on the page it names."""
    named = st.query_params.get("page")
    return named is not None and named != st.session_state.get(_PAGE)


def _drifted() -> bool:
    """Within ``SETTLE_S`` of this follower's last move, its address is not the teacher's view: a request the
    browser sent before it took in the move carried its widgets' old values (a switch it showed before), and the
    run wrote them into the address."""
    moved = st.session_state.get(_MOVED_AT)
    if moved is None or time.monotonic() - moved > SETTLE_S:
        return False
    try:
        view = store().view(session_id())
    except class_session.StoreBusy:
        return False
    here = _view_params()
    return view.page != st.session_state.get(_PAGE) or any(
        view.params.get(key) != here.get(key)
        for key in {*view.params, *here} - {"page"}  # app.py writes page=
    )


def _poll() -> None:
    _drop_key()
    if is_teacher():
        here = _view_params()
        if _behind() or _address_key(here) in st.session_state.get(_REPLACED, ()):
            return  # a request sent before the browser took in the last published page or address
        if here == st.session_state.get(_PUBLISHED):
            st.session_state[_REPLACED] = []  # the browser holds what was published: no older request is coming
        else:
            _publish(here)  # a move made inside a page's fragment (a head clicked in Explore)
        _resend_address()
        return
    looked = _student_poll()
    _wake_up()
    if looked:
        _resend_address()


def _student_poll() -> bool:
    """A student's look at the class: moved or rerun when the class's version rose (or this request came from
    before the browser took in the last move); False when the class file was locked (the next poll looks again)."""
    try:
        version = store().version(session_id(), wait_s=POLL_WAIT_S)
    except class_session.StoreBusy:
        return False
    stale = following() and (_behind() or _address_key(_view_params()) in st.session_state.get(_LEFT, ()) or _drifted())
    if version > st.session_state.get(_SEEN, -1) or stale:
        if following() and _PAGE in st.session_state:
            # Moved from here at once (one run fewer per follower and move): a new view, or this request came
            # from before the browser took in the last move.
            _follow(_pages, st.session_state[_PAGE], stale)
        # Seen, also by a screen that does not follow (it reruns once for a version, not at every poll after it)
        st.session_state[_SEEN] = max(version, st.session_state.get(_SEEN, -1))
        st.rerun(scope="app")  # the same view: asked, revealed or reset; the whole page shows it
    return True


def _wake_up() -> None:
    """A student's wake-up, drawn inside the poll's fragment: its request asks for the poll's run as soon as the
    class's version rises above the one this session has seen (the module), as the poll's timer would at its next
    tick. Its request and the timer's are one fragment's, which the websocket guard holds as one. (Drawn in a
    fragment of its own without a timer, it cost the polls less, but in two of four benchmark sittings a Chromium
    follower's page went blank and stopped following; the cause was not found.)"""
    global _wake
    if _wake is None:
        _wake = st.components.v2.component(
            class_http.WAKE_KEY, html='<div class="hs-classwake"></div>', js=_WAKE_JS.read_text(), isolate_styles=False
        )
    base = str(st.get_option("server.baseUrlPath") or "").strip("/")
    url = (f"/{base}" if base else "") + class_http.WAKE_PATH
    _wake(key=class_http.WAKE_KEY, data={"after": st.session_state.get(_SEEN, -1), "url": url}, height=0)


def leave(notice: str | None = None) -> None:
    """This student's screen stops following the teacher; ``notice`` says why, once, above the page."""
    st.session_state[_FOLLOWING] = False
    if notice:
        st.session_state[_NOTICE] = notice


def following_student() -> bool:
    """A student whose screen follows the teacher now (the teacher is not one)."""
    return role() == STUDENT and following()


def _come_back() -> None:
    st.session_state[_FOLLOWING] = True
    st.session_state[_SEEN] = -1  # the next run moves this screen to the teacher's view
    st.session_state.pop(_NOTICE, None)


def class_panel() -> None:
    """app.py, in the sidebar: who leads, follow or leave, the teacher's export; and the poll that keeps
    this screen with the class."""
    if role() is None:
        return
    notice = st.session_state.pop(_NOTICE, None)
    if notice:
        st.info(notice, icon=":material/explore:")  # above the page: the student sees why the screen stopped
    with st.sidebar.container(border=True):
        if is_teacher():
            st.markdown(":material/co_present: " + t("**You lead this class.** Students who follow see this view."))
            st.download_button(
                t("Answers (CSV)"),
                data=lambda: store().export_csv(session_id()),
                file_name="headscope-class-answers.csv",
                mime="text/csv",
                key="class_export",
                icon=":material/download:",
            )
        elif following():
            st.markdown(":material/groups: " + t("**Following the teacher.**"))
            st.button(t("Leave to explore"), key="class_leave", on_click=leave, icon=":material/explore:")
        else:
            st.markdown(":material/explore: " + t("**Exploring on your own.**"))
            st.button(t("Follow the teacher"), key="class_follow", on_click=_come_back, icon=":material/groups:")
        st.fragment(run_every=TEACHER_POLL_S if is_teacher() else settings().student_poll_s)(_poll)()
