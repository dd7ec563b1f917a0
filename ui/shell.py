"""The app's shell around every page: app.py (page setup, the shared sidebar, navigation) runs each page.

Every page file starts with ``shell.in_app()``. A page's own address (``/compare?...``) opened on a server
where no visitor has opened the root address yet runs the page file by itself: Streamlit sees the
``pages/`` folder beside app.py and, until the first ``st.navigation`` call of the server's life, runs a
page of that folder as a script of its own (its older folder-based navigation), without app.py, so
without the sidebar and the selection the page reads. ``in_app`` notices that the page runs outside
app.py in this script run and runs app.py instead: its ``st.navigation`` ends the folder-based mode for
the whole server and runs this same page inside the shell, with the link's settings; then the bare run
stops. Public Streamlit calls only (``st.navigation``, ``st.stop``).
"""

from __future__ import annotations

import contextlib
import contextvars
import runpy
from pathlib import Path

import streamlit as st

APP = Path(__file__).resolve().parents[1] / "app.py"

# True while app.py runs the page (``page_in_app``); a context variable, so it belongs to one script run's
# thread and is reset when the page ends, however it ends (a stop, a rerun, an error).
_inside_app = contextvars.ContextVar("headscope_page_inside_app", default=False)


@contextlib.contextmanager
def page_in_app():
    """app.py runs the page inside this block (``navigation.run()``)."""
    token = _inside_app.set(True)
    try:
        yield
    finally:
        _inside_app.reset(token)


def in_app() -> None:
    """A page's first call: returns at once when app.py runs the page; otherwise runs app.py around it
    (which runs the page) and stops the page's own, bare run."""
    if _inside_app.get():
        return
    runpy.run_path(str(APP), run_name="__main__")
    st.stop()
