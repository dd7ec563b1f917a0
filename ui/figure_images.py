"""The app's Plotly figures as pictures for slides, PNG or SVG, drawn offline.

Plotly's static export needs a browser: the figure's page (``plotly.io.to_html`` with plotly.js from the plotly
package inlined, nothing fetched) is drawn by Debian's Chromium through Playwright with every request refused
(``mha_core.views.images.in_offline_page``), and plotly.js' own ``Plotly.toImage`` makes the picture (PNG at ``scale``
times the figure's size, or SVG: vector, for slides at any size). No kaleido, no browser download.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import urllib.parse
from pathlib import Path

import plotly.io as pio

from mha_core.views import images

FORMATS = ("png", "svg")
DIV_ID = "headscope-figure"


@functools.cache
def available() -> bool:
    """Whether this machine can draw pictures: Playwright installed and Debian's Chromium at ``images.CHROMIUM``.
    Looked up once per server (every chart asks, on every screen's every run)."""
    return importlib.util.find_spec("playwright") is not None and Path(images.CHROMIUM).exists()


def figure_image(fig, fmt: str = "png", *, width: int | None = None, height: int | None = None, scale: float = 2):
    """``fig`` as the bytes of a PNG or an SVG picture (``fmt``), ``width`` x ``height`` CSS pixels (default: the
    figure's layout size, else 900 x 600), PNG at ``scale`` times that."""
    if fmt not in FORMATS:
        raise ValueError(f"a figure's picture is one of {FORMATS}, not {fmt!r}")
    width = int(width or fig.layout.width or 900)
    height = int(height or fig.layout.height or 600)
    page = pio.to_html(fig, include_plotlyjs=True, full_html=True, div_id=DIV_ID, config={"staticPlot": True})

    def draw(browser_page) -> str:
        browser_page.wait_for_function(f"() => !!document.getElementById('{DIV_ID}')?._fullLayout")
        picture = browser_page.evaluate_handle(  # the promise's value: a data: URL
            "([id, format, width, height, scale]) => Plotly.toImage(id, {format, width, height, scale})",
            [DIV_ID, fmt, width, height, scale if fmt == "png" else 1],  # SVG: vector, at the figure's size
        )
        return picture.json_value()

    url = images.in_offline_page(page, draw, width=width + 40, height=height + 40, scale=1)
    head, _, body = url.partition(",")
    return base64.b64decode(body) if head.endswith(";base64") else urllib.parse.unquote(body).encode("utf-8")
