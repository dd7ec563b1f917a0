"""What the server adds to Streamlit's own (plain ASGI, no Streamlit): ``BackendBaseUrl``, the middleware
``serve.py`` hands ``st.App``, and ``warm_up``, the imports a first page would otherwise make while a class waits.

Every page has its own address (``/explore``). Opened there, Streamlit's page does not know where the server's
root is: it tries the page's address first as the root, asking ``/explore/_stcore/health`` and
``/explore/_stcore/host-config`` (two 404s in the browser's console, on every page, every time one is opened
or reloaded), then ``/``. ``BackendBaseUrl`` tells it, in the page's HTML, before Streamlit's script runs:
``window.__streamlit.BACKEND_BASE_URL`` is the address's origin, so it asks the root at once. The HTML is the
same for every page (Streamlit serves ``index.html`` for any address that is no file); nothing else changes.
"""

from __future__ import annotations

import importlib

from ui.class_http import WAKE_KEY

# Streamlit reads window.__streamlit once, as its script loads (a classic script in <head> runs before it, a
# module script, does). The origin is the browser's own: the same HTML serves 127.0.0.1 and a class's address.
BASE_URL_SCRIPT = b"<script>window.__streamlit={BACKEND_BASE_URL:window.location.origin+'/'}</script>"
_HEAD = b"<head>"
# The page's language for screen readers from its first paint: a link with ``lang=zh`` (``ui.i18n``) is served as
# Chinese; the sidebar's switch sets it again on every run (``ui.widgets.sidebar.language_switch``).
_HTML_EN = b'<html lang="en">'
_HTML_ZH = b'<html lang="zh-CN">'

# Every page, from its first paint (so before the script's first run draws anything): captions dark enough for WCAG
# AA (Streamlit draws them at 60 % opacity, 3.9:1 on white; here 6:1), the labels of disabled widgets as readable,
# and a visible keyboard focus on every control.
PAGE_CSS = """
  [data-testid="stCaptionContainer"] { opacity: 1 !important; }
  [data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p { color: #5c636a !important; }
  [data-testid="stWidgetLabel"] [data-testid="stMarkdownContainer"] p { color: inherit; }
  [data-testid="stWidgetLabel"]:has(+ * [aria-disabled="true"], + * [disabled]) p,
  .stSlider:has([aria-disabled="true"], [disabled]) [data-testid="stWidgetLabel"] p { color: #5c636a !important; }
  [data-testid="stMain"] :focus-visible, [data-testid="stSidebar"] :focus-visible {
    outline: 3px solid #1c2a6b !important; outline-offset: 2px;
  }
  .st-key-WAKE,
  [data-testid="stLayoutWrapper"]:has(.st-key-WAKE):not(
    :has([data-testid="stElementContainer"]:not(.st-key-WAKE))) { display: none !important; }
""".replace("WAKE", WAKE_KEY)  # the class's wake-up (ui.follow) takes no room, nor does its fragment's empty wrapper
PAGE_STYLE = b"<style>" + PAGE_CSS.encode() + b"</style>"


def is_page_request(scope) -> bool:
    """A GET of a page's address (``/``, ``/explore``): not a file (its last part has no dot), not Streamlit's
    own endpoints (``/_stcore/...``), not media or static files."""
    if scope.get("type") != "http" or scope.get("method") != "GET":
        return False
    path = scope.get("path", "")
    return "." not in path.rsplit("/", 1)[-1] and not path.startswith(("/_stcore/", "/media/", "/app/", "/component"))


def with_base_url(html: bytes, chinese: bool = False) -> bytes:
    """The page's HTML with ``BASE_URL_SCRIPT`` and ``PAGE_STYLE`` first in its head (unchanged when it has no head,
    or has them); ``chinese``: its ``<html lang>`` is ``zh-CN``."""
    if _HEAD not in html or BASE_URL_SCRIPT in html:
        return html
    if chinese:
        html = html.replace(_HTML_EN, _HTML_ZH, 1)
    return html.replace(_HEAD, _HEAD + BASE_URL_SCRIPT + PAGE_STYLE, 1)


def asks_chinese(scope) -> bool:
    """The request's address holds ``lang=zh``."""
    return b"lang=zh" in scope.get("query_string", b"").split(b"&")


class BackendBaseUrl:
    """ASGI middleware: a page's HTML says where the server's root is (``with_base_url``); any other response,
    or a page's that is not HTML, passes unchanged. The page's HTML is asked for uncompressed (it is 2 KB) so that
    it can be read; the rest keeps its compression."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if not is_page_request(scope):
            await self.app(scope, receive, send)
            return
        scope = {**scope, "headers": [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]}
        start: dict = {}
        body: list[bytes] = []

        async def rewrite(message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            content = b"".join(body)
            headers = list(start.get("headers", []))
            if dict(headers).get(b"content-type", b"").startswith(b"text/html"):
                content = with_base_url(content, asks_chinese(scope))
                headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(content)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": content})

        await self.app(scope, receive, rewrite)


# What the first page that shows a model would import while every other session waits: transformers' model code
# (BERT's pulls in torch.distributed and sympy: about 3 s of one core on a quiet machine, 10 s under load, nearly all
# of it holding the interpreter's lock, so that a class's other screens stopped with it; a sampling profile of the
# server during bench/class_teacher.py) and plotly's figure classes. Imported once, before the server serves: in a
# thread of their own beside the first pages they raced those pages' own imports of transformers, whose lazy module
# then refused "cannot import name 'AutoConfig'" (seen once in a test run).
WARM_MODULES = (
    "transformers.models.bert.modeling_bert",
    "transformers.models.llama.modeling_llama",
    "transformers.models.mpnet.modeling_mpnet",
    "plotly.graph_objects",
)


def warm_up(modules: tuple[str, ...] = WARM_MODULES) -> list[str]:
    """Imports ``modules`` (serve.py, as the server starts, before it serves a page); a module that cannot be imported
    is left to the page that needs it, which says why. Returns the modules imported."""
    imported = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        imported.append(name)
    return imported
