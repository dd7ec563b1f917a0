"""Charts drawn the same way on every page: Headscope's colours (no Streamlit theme), PNG export from the
modebar (no server, no CDN), an SVG download beside it (a vector picture for slides, drawn when clicked by the
server's Chromium, offline: ``ui.figure_images``), and presentation mode's larger text for a projector."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np
import pandas as pd
import streamlit as st

from ui import figure_images, figures, i18n


def chart_config(filename: str) -> dict:
    """Plotly config: PNG export from the modebar (drawn in the browser, no server, no CDN)."""
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": filename, "scale": 2},
        "modeBarButtonsToRemove": ["lasso2d", "select2d", "autoScale2d"],
    }


PRESENTATION_SCALE = 1.6  # text in presentation mode: 9 px tick labels become 14 px, readable from the back row


def presenting() -> bool:
    """Presentation mode (the sidebar toggle, ``?present=1``): large text for a projector."""
    return bool(st.session_state.get("present"))


def presenting_at_start() -> bool:
    """Presentation mode as a run starts, before the sidebar's toggle is drawn: the toggle's value from the last
    run, else the link's ``present=1`` (app.py sets the page up with it: the sidebar folded on a projector)."""
    if "present" in st.session_state:
        return presenting()
    return st.query_params.get("present") == "1"


PRESENTATION_CSS = """<style>
  [data-testid="stMainBlockContainer"] { padding-top: 2.5rem !important; }
  [data-testid="stMain"] p, [data-testid="stMain"] li, [data-testid="stMain"] label,
  [data-testid="stCaptionContainer"], [data-testid="stMarkdownContainer"] p { font-size: 1.35rem !important; }
  [data-testid="stMain"] h1 { font-size: 3rem !important; }
  [data-testid="stMain"] h2 { font-size: 2.3rem !important; }
  [data-testid="stMain"] h3 { font-size: 1.9rem !important; }
</style>"""


# The projector theme (sidebar switch, ``?contrast=1``): black text, thicker rules and frames, the views' labels
# black; the data's colours stay the one colour scale.
HIGH_CONTRAST_CSS = """<style>
  :is([data-testid="stMain"], [data-testid="stSidebar"]) :is(p, li, label, h1, h2, h3, h4):not(button *, [data-baseweb="tag"] *),
  [data-testid="stCaptionContainer"], [data-testid="stCaptionContainer"] p, .hs-label, .hs-note, .hs-title,
  .hs-big-title, .hs-lv-legend, .hs-lv-gridnote, .hs-tick, .hs-bar-title { color: #000000 !important; }
  [data-testid="stMain"] a:not(button *) { color: #001a80 !important; text-decoration: underline !important; }
  [data-testid="stExpander"] details, [data-testid="stAlert"] { border: 2px solid #000000 !important; }
  .hs-tile.hs-selected, .hs-lv-selected { border-color: #000000 !important; border-width: 3px !important; }
  .hs-ramp, .hs-big-canvas, .hs-lv-big { border: 2px solid #000000 !important; }
</style>"""


def high_contrast() -> bool:
    """The high-contrast projector theme (the sidebar toggle, ``?contrast=1``)."""
    return bool(st.session_state.get("contrast"))


def presentation_styles() -> None:
    """The page's style sheets (fixed texts: no user text reaches them): larger text in presentation mode, the
    high-contrast theme when it is on. Every page's base style (readable captions, visible focus) is in the page's
    head from its first paint (``ui.server.PAGE_CSS``, put there by serve.py's middleware)."""
    if presenting():
        st.html(PRESENTATION_CSS)
    if high_contrast():
        st.html(HIGH_CONTRAST_CSS)


# A figure every screen of a class draws alike (the Classroom's matrices, a question's chart of answers) is built
# once per server, language and display: building plotly figures was about a third of a Classroom page's run (a
# sampling profile of the server during bench/class_teacher.py), and a class's 30 screens run the page at once,
# one at a time under the interpreter's lock. Small figures only (the callers'); the oldest go first.
FIGURE_MEMO_ENTRIES = 256
_memo: OrderedDict = OrderedDict()
_memo_lock = threading.Lock()
# Figures being built now, by key: screens that ask for one wait for its builder (``_remembered``).
_building: dict[tuple, threading.Event] = {}
BUILD_WAIT_S = 5.0


def memo_key(name: str, **parts) -> tuple:
    """A hashable key of the figure ``name`` drawn from ``parts``: arrays and tables by their shape, type and a
    digest of their bytes, the rest as they are (strings, numbers, tuples)."""

    def part(value):
        if isinstance(value, pd.DataFrame):
            value = value.to_numpy()
            return ("frame", part(value))
        if isinstance(value, np.ndarray):
            data = np.ascontiguousarray(value)
            return (data.shape, data.dtype.str, hashlib.blake2b(data.tobytes(), digest_size=16).hexdigest())
        if isinstance(value, (list, tuple)):
            return tuple(part(item) for item in value)
        if isinstance(value, dict):
            return tuple(sorted((key, part(item)) for key, item in value.items()))
        return value

    return (name, part(parts))


def _prepared(fig):
    """``fig`` as this screen shows it: its words in the session's language, presentation mode's text, the
    projector theme."""
    i18n.translate_figure(fig)
    if presenting():
        figures.enlarge_text(fig, PRESENTATION_SCALE)
    if high_contrast():
        figures.high_contrast(fig)
    return fig


def _freeze(fig) -> None:
    """A shared figure's dict, made once: ``st.plotly_chart`` copies a figure into a dict (``to_dict``) on every
    screen's every run (a quarter of a Classroom step's page run); a remembered figure is never changed, so its
    dict is the same each time."""
    frozen = fig.to_dict()
    object.__setattr__(fig, "to_dict", lambda: frozen)


def _remembered(build, memo: tuple):
    """The figure of ``memo`` for this screen's language and display, built by the first screen that asks; a screen
    that asks while it is being built waits for it (a class's thirty screens reach a step together, and each built
    it again before), at most ``BUILD_WAIT_S``; if the build failed or is still going, it builds its own."""
    key = (memo, i18n.language(), presenting(), high_contrast())
    with _memo_lock:
        fig = _memo.get(key)
        if fig is not None:
            _memo.move_to_end(key)
            return fig
        building = _building.get(key)
        first = building is None
        if first:
            building = _building[key] = threading.Event()
    if not first:
        building.wait(BUILD_WAIT_S)
        with _memo_lock:
            fig = _memo.get(key)
        return fig if fig is not None else _built(build)
    try:
        fig = _built(build)  # outside the lock: other figures are read and remembered meanwhile
        with _memo_lock:
            _memo[key] = fig
            while len(_memo) > FIGURE_MEMO_ENTRIES:
                _memo.popitem(last=False)
        return fig
    finally:
        with _memo_lock:
            del _building[key]
        building.set()


def _built(build):
    fig = _prepared(build())
    _freeze(fig)
    return fig


def show_chart(fig, key: str, filename: str | None = None, memo: tuple | None = None, **kwargs):
    """``st.plotly_chart`` with Headscope's colours kept (no Streamlit theme), PNG export configured, and
    every text enlarged in presentation mode, its words in the session's language (``ui.i18n``).

    ``memo`` (``memo_key`` of everything the figure is drawn from): ``fig`` is then a function that builds it, called
    once per server for that key, language and display; the figure is shared, so nothing may change it afterwards."""
    fig = _prepared(fig) if memo is None else _remembered(fig, memo)
    shown = st.plotly_chart(fig, key=key, theme=None, config=chart_config(filename or key), width="stretch", **kwargs)
    svg_download(fig, key, filename or key)
    return shown


def svg_download(fig, key: str, filename: str) -> None:
    """A button under a chart: the figure as it is shown, as an SVG picture (vector: sharp at any size on a slide),
    drawn only when clicked (``figure_images.figure_image``); offered where the server can draw pictures."""
    if not figure_images.available():
        return
    st.download_button(
        i18n.t("SVG for slides"),
        data=lambda: figure_images.figure_image(fig, "svg"),
        file_name=f"{filename}.svg",
        mime="image/svg+xml",
        key=f"{key}_svg",
        type="tertiary",
        icon=":material/download:",
        help=i18n.t("This chart as a vector picture (SVG), drawn offline; the modebar's camera saves it as PNG."),
    )


# Per-layer curves show these measurements (numeric columns of mha_core.head_metrics).
CURVE_METRICS = {
    "normalized_entropy": "normalised entropy (0 = one key, 1 = uniform)",
    "mean_distance": "mean distance |i - j| in tokens",
    "confidence": "confidence (largest weight of a row)",
    "special_mass": "attention on special tokens",
    "prev_token_mass": "attention on the previous token",
    "local_mass": "attention within two tokens",
}
