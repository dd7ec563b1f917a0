"""Headscope as the server runs it: ``streamlit run serve.py`` (``scripts/app.sh`` does).

``app.py`` is the app; this file adds its HTTP side (``ui.class_http``) through Streamlit's ``st.App``, which takes
ASGI middleware where ``streamlit run app.py`` takes none: ``ClassCookies`` (in a class: the teacher key out of the
address before the page loads, HttpOnly cookies for the teacher's proof and the students' identities; outside a
class it passes every request through) and ``StalePageGuard`` (a fragment timer's request waits while a script of
the session runs and is dropped if it names a page the server has moved the session away from, so that it cannot
move the session back).
"""

from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from ui import class_http, follow

app = st.App(
    Path(__file__).with_name("app.py"),
    middleware=[Middleware(class_http.ClassCookies, token=follow.teacher_token), Middleware(class_http.StalePageGuard)],
)
