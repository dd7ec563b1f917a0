"""Headscope as the server runs it: ``streamlit run serve.py`` (``scripts/app.sh`` and ``tools/browser.py`` do).

``app.py`` is the app; this file adds its HTTP side through Streamlit's ``st.App``, which takes ASGI middleware where
``streamlit run app.py`` takes none:

- ``ui.server.BackendBaseUrl``: a page opened at its own address (``/explore``) asks the server's root at once,
  instead of its own address first (two 404s in the browser's console on every page);
- ``ui.class_http.ClassCookies``: in a class, the teacher key out of the address before the page loads, HttpOnly
  cookies for the teacher's proof and the students' identities (outside a class it passes every request through);
- ``ui.class_http.ClassWake``: in a class, a student's page holds one request open that the server answers as soon
  as the teacher moves, and the page then asks for its class poll's run (the class moves with the teacher, not at
  each screen's next poll);
- ``ui.class_http.StalePageGuard``: a fragment timer's request waits while a script of the session runs and is
  dropped if it names a page the server has moved the session away from, so that it cannot move the session back.

Before it serves, the server imports the model code and the app's modules the first pages would (``ui.server.warm_up``),
then sets all it holds aside from the cycle collector (``ui.server.settle_heap``: no full collection walks it again).
"""

from pathlib import Path

import streamlit as st
from starlette.middleware import Middleware

from ui import class_http, follow
from ui.server import BackendBaseUrl, settle_heap, warm_up

warm_up()
settle_heap()
app = st.App(
    Path(__file__).with_name("app.py"),
    middleware=[
        Middleware(BackendBaseUrl),
        Middleware(class_http.ClassWake, version=follow.class_version),
        Middleware(class_http.ClassCookies, token=follow.teacher_token),
        Middleware(class_http.StalePageGuard),
    ],
)
