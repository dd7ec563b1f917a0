"""What the server adds to Streamlit's own (plain ASGI, no Streamlit): ``BackendBaseUrl``, the middleware
``serve.py`` hands ``st.App``, ``warm_up``, the imports a first page would otherwise make while a class waits, and
``settle_heap``, which sets what the warm server holds aside from the cycle collector.

Every page has its own address (``/explore``). Opened there, Streamlit's page does not know where the server's
root is: it tries the page's address first as the root, asking ``/explore/_stcore/health`` and
``/explore/_stcore/host-config`` (two 404s in the browser's console, on every page, every time one is opened
or reloaded), then ``/``. ``BackendBaseUrl`` tells it, in the page's HTML, before Streamlit's script runs:
``window.__streamlit.BACKEND_BASE_URL`` is the address's origin, so it asks the root at once. The HTML is the
same for every page (Streamlit serves ``index.html`` for any address that is no file); nothing else changes.
"""

from __future__ import annotations

import gc
import importlib
import logging
import pkgutil
import sys

from mha_core.analysis import metrics
from ui.class_http import WAKE_KEY

LOG = logging.getLogger(__name__)

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
# server during bench/class_teacher.py), its tokenizers', plotly's figure classes, the head metrics' compiled
# kernel (numba), and what the pages draw tables (pyarrow) and the class's QR code (segno, PIL) with. Imported once,
# before the server serves: in a thread of their own beside the first pages they raced those pages' own imports of
# transformers, whose lazy module then refused "cannot import name 'AutoConfig'" (seen once in a test run).
WARM_MODULES = (
    "transformers.models.bert.modeling_bert",
    "transformers.models.llama.modeling_llama",
    "transformers.models.mpnet.modeling_mpnet",
    "transformers.models.auto.tokenization_auto",
    "transformers.convert_slow_tokenizer",
    "plotly.graph_objects",
    "plotly.subplots",
    "mha_core.analysis.metrics_kernel",
    "pyarrow",
    "segno",
    "PIL.Image",
)
# The app's own modules, every one of them (the pages import most of them on their first run).
WARM_PACKAGES = ("ui",)


def warm_up(modules: tuple[str, ...] = WARM_MODULES, packages: tuple[str, ...] = WARM_PACKAGES) -> list[str]:
    """Imports ``modules`` and every module of ``packages`` (serve.py, as the server starts, before it serves a
    page), draws one figure of each kind of trace the pages draw (plotly makes each kind's classes on first use) and
    readies the head metrics' kernel; a module that cannot be imported is left to the page that needs it, which says
    why. Returns the modules imported, ``modules`` first."""
    imported = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        imported.append(name)
    # Streamlit's loggers stay quiet meanwhile: each cached function of the app warns that no runtime exists yet
    # (its cache is made at its first call, in the runtime).
    quiet = {logging.getLogger(name) for name in list(logging.root.manager.loggerDict) if name.startswith("streamlit")}
    levels = {logger: logger.level for logger in quiet}
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        for package in packages:
            for module in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
                importlib.import_module(module.name)
                imported.append(module.name)
    finally:
        for logger, level in levels.items():
            logger.setLevel(level)
    if "plotly.graph_objects" in sys.modules:
        _draw_each_kind()
    if "mha_core.analysis.metrics_kernel" in sys.modules:
        try:
            metrics.warm_up()
        except Exception:  # the first measurement compiles it again, and says what failed
            LOG.warning("the head metrics' kernel could not be readied now", exc_info=True)
    return imported


def _draw_each_kind() -> None:
    go = sys.modules["plotly.graph_objects"]
    figure = go.Figure(
        [go.Heatmap(z=[[0.0]]), go.Bar(y=[0], marker={"color": "#000"}), go.Scatter(y=[0], mode="lines+markers")],
        layout={"title": {"text": "-"}, "annotations": [{"text": "-"}], "xaxis": {"title": {"text": "-"}}},
    )
    figure.to_json()


def settle_heap() -> int:
    """What the server holds once it is warm (modules, classes, functions: hundreds of thousands of objects that are
    never garbage) is set aside from the cycle collector (``gc.freeze``, after one full collection): each of its
    full collections then walks what the sessions made since, not everything imported. Before this, a class server
    stopped every screen for 0.36-0.59 s at each full collection, several times a lesson (bench/class_teacher.py,
    docs/benchmarks.md). Objects set aside are still freed when nothing refers to them. Returns how many objects the
    collector has set aside."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
