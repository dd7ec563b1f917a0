"""The class as one room: the teacher leads, every student screen that follows shows the teacher's view.

In classroom mode with a teacher token (``HEADSCOPE_TEACHER_TOKEN``, set by ``scripts/app.sh --classroom``), the
browser that opened the teacher link (``?teacher=TOKEN``, checked on the server in constant time, then taken out
of the address and kept as a cookie proof) leads; everyone else is a student, anonymous, known by a random
per-browser id kept in a cookie.

The teacher's view is the page and its address (everything a view depends on is in the link): the teacher's
session publishes it to the class store (``ui.class_session``) at the end of each run and from a small fragment
every ``TEACHER_POLL_S``, which also catches moves made inside a page's fragments (a head clicked in Explore).
A student's session polls the store's version number every ``STUDENT_POLL_S`` (one indexed read) and, when it
rose, reruns: a follower whose address differs from the teacher's forgets its own view state and switches to the
teacher's page and address, exactly as if it had opened the teacher's link. A student can leave to explore and
come back with one click. After a server restart the browsers reconnect with their addresses and cookies, and
the store gives back the session, its view and its answers.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3

import streamlit as st

from ui import address, class_session
from ui.settings import settings

LOG = logging.getLogger("headscope.app")
TEACHER, STUDENT = "teacher", "student"
TEACHER_POLL_S = 0.5  # how often the teacher's session checks whether its view changed (one session)
STUDENT_POLL_S = 1.0  # how often a student's session reads the version number
TEACHER_PARAM = "teacher"
TEACHER_COOKIE, STUDENT_COOKIE = "headscope_teacher", "headscope_student"
COOKIE_MAX_AGE_S = int(class_session.EXPIRE_AFTER_S)

_ROLE, _STUDENT, _FOLLOWING, _SEEN, _PAGE, _COOKIE = (
    "_class_role",
    "_class_student",
    "_class_following",
    "_class_seen_version",
    "_class_page",
    "_class_cookie",
)
# Kept when a follower is moved: the class's own keys and the session's running work; every other key is
# view state, which the teacher's address decides again.
_KEPT = ("_class_", "_presence", "_jobs", "_last_good_model", "_failed_model", "_link_notices")


def teacher_token() -> str | None:
    """The token that leads this server's class, or None (not a classroom server, or no token given)."""
    if not settings().classroom:
        return None
    return os.environ.get(class_session.TOKEN_ENV, "").strip() or None


@functools.cache
def _store(path: str) -> class_session.ClassStore | None:
    try:
        return class_session.ClassStore(path)
    except (OSError, sqlite3.Error):  # an unwritable cache directory: the app works, without a class
        LOG.exception("cannot open the class store; no class session on this server")
        return None


def forget_store() -> None:
    """Open the store again at its next use (a test's restart, or another ``HEADSCOPE_CLASS_DB``)."""
    _store.cache_clear()


def store() -> class_session.ClassStore | None:
    """This server's class store (one per file; the cache directory decides which)."""
    return _store(str(class_session.default_path()))


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


def student_id() -> str | None:
    return st.session_state.get(_STUDENT) if role() == STUDENT else None


def _set_cookie(name: str, value: str) -> None:
    """Keep ``value`` in a cookie of this browser (``value`` is hex made here: no visitor text reaches the script)."""
    st.session_state[_COOKIE] = (name, value)


def _write_cookie() -> None:
    cookie = st.session_state.get(_COOKIE)
    if cookie is None:
        return
    name, value = cookie
    st.html(
        f"<script>document.cookie = '{name}={value}; path=/; max-age={COOKIE_MAX_AGE_S}; SameSite=Strict';</script>",
        unsafe_allow_javascript=True,
    )


def _cookie(name: str) -> str:
    """The browser's cookie ``name`` ("" without one; also where there are no browser cookies, as under AppTest)."""
    value = st.context.cookies.get(name)
    return value if isinstance(value, str) else ""


def _decide_role(token: str) -> str:
    given = st.query_params.get(TEACHER_PARAM)
    if given is not None:
        del st.query_params[TEACHER_PARAM]  # out of the address: a projected address bar does not show it
        if class_session.token_matches(str(given), token):
            _set_cookie(TEACHER_COOKIE, class_session.teacher_proof(token))
            return TEACHER
        address.link_notice("this link's teacher key is not this class's: you joined as a student.")
    proof = _cookie(TEACHER_COOKIE)
    if class_session.proof_matches(proof, token):
        return TEACHER
    kept = _cookie(STUDENT_COOKIE)
    if class_session.STUDENT_ID.fullmatch(kept):
        st.session_state[_STUDENT] = kept
    else:
        st.session_state[_STUDENT] = class_session.new_student_id()
        _set_cookie(STUDENT_COOKIE, st.session_state[_STUDENT])
    return STUDENT


def _view_params() -> dict:
    return {key: str(st.query_params.get(key)) for key in st.query_params if key != TEACHER_PARAM}


def start(pages: dict, page: str) -> None:
    """app.py, once the page is known and before the sidebar: decide this session's role, and move a follower
    to the teacher's view when it changed since this session last looked."""
    token = teacher_token()
    if session_id() is None:
        return
    if _ROLE not in st.session_state:
        st.session_state[_ROLE] = _decide_role(token)
        if st.session_state[_ROLE] == TEACHER:
            store().open_session(class_session.class_id(token))
    st.session_state[_PAGE] = page
    if st.session_state[_ROLE] == STUDENT and st.session_state.get(_FOLLOWING, True):
        view = store().view(session_id())
        if view.version <= st.session_state.get(_SEEN, -1):
            return
        st.session_state[_SEEN] = view.version
        if view.page in pages and (view.page != page or view.params != _view_params()):
            _forget_view_state()
            st.switch_page(pages[view.page], query_params=view.params)


def _forget_view_state() -> None:
    for key in list(st.session_state):
        if not str(key).startswith(_KEPT):
            with contextlib.suppress(Exception):  # a widget Streamlit does not let a script change: redrawn anyway
                del st.session_state[key]


def publish() -> None:
    """The teacher's session: the class's view is now this page and address (no change, no new version)."""
    if not is_teacher() or _PAGE not in st.session_state:
        return
    version = store().publish_view(session_id(), st.session_state[_PAGE], _view_params())
    st.session_state[_SEEN] = version


def _poll() -> None:
    if is_teacher():
        publish()
        return
    if store().version(session_id()) > st.session_state.get(_SEEN, -1):
        st.rerun(scope="app")  # the teacher moved, asked, revealed or reset: ``start`` decides what to do


def _leave() -> None:
    st.session_state[_FOLLOWING] = False


def _come_back() -> None:
    st.session_state[_FOLLOWING] = True
    st.session_state[_SEEN] = -1  # the next run moves this screen to the teacher's view


def class_panel() -> None:
    """app.py, in the sidebar: who leads, follow or leave, the teacher's export; and the poll that keeps
    this screen with the class."""
    if role() is None:
        return
    _write_cookie()
    with st.sidebar.container(border=True):
        if is_teacher():
            st.markdown(":material/co_present: **You lead this class.** Students who follow see this view.")
            st.download_button(
                "Answers (CSV)",
                data=lambda: store().export_csv(session_id()),
                file_name="headscope-class-answers.csv",
                mime="text/csv",
                key="class_export",
                icon=":material/download:",
            )
        elif following():
            st.markdown(":material/groups: **Following the teacher.**")
            st.button("Leave to explore", key="class_leave", on_click=_leave, icon=":material/explore:")
        else:
            st.markdown(":material/explore: **Exploring on your own.**")
            st.button("Follow the teacher", key="class_follow", on_click=_come_back, icon=":material/groups:")
        st.fragment(run_every=TEACHER_POLL_S if is_teacher() else STUDENT_POLL_S)(_poll)()
