"""The server: ``streamlit run serve.py`` (scripts/app.sh, tools/browser.py) serves app.py, as ``streamlit run
app.py`` does, with ``ui.server.BackendBaseUrl``: a page opened at its own address (``/explore``) asks the server's
root at once, instead of its own address first (two 404s in the browser's console on every page)."""

import streamlit as st
from starlette.middleware import Middleware

from ui.server import BackendBaseUrl

app = st.App("app.py", middleware=[Middleware(BackendBaseUrl)])
