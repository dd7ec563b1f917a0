"""Headscope as the server runs it: ``streamlit run serve.py`` (``scripts/app.sh`` does).

``app.py`` is the app; this file adds its HTTP side, ``ui.class_http.ClassCookies`` (in a class: the teacher key
out of the address before the page loads, HttpOnly cookies for the teacher's proof and the students' identities),
through Streamlit's ``st.App``, which takes ASGI middleware where ``streamlit run app.py`` takes none. Outside a
class the middleware passes every request through.
"""

from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from ui import class_http, follow

app = st.App(
    Path(__file__).with_name("app.py"),
    middleware=[Middleware(class_http.ClassCookies, token=follow.teacher_token)],
)
