"""A chart's "SVG for slides" button in the running app (ui/widgets/charts.py): clicked in Chromium, it downloads the
chart as an SVG picture drawn by the server, holding the chart's title and labels; screenshot of a chart with its
button (charts-svg-button.png)."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ElementTree
from urllib.parse import urlencode

import pytest

from tests.conftest import require
from tests.mha_core.interventions.test_circuits import CLEAN, CORRUPTED, build_decoder
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_a_charts_svg_button_downloads_the_chart_as_svg(artifacts_dir, tmp_path):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    folder = build_decoder(tmp_path / "tiny-gpt2", "gpt2")
    query = {"model": str(folder), "task": "custom", "clean": CLEAN, "corrupted": CORRUPTED, "qkov": "1"}
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/circuits?{urlencode(query)}")
        wait_for_app(page)
        button = page.locator(".st-key-qkov_copying_svg").get_by_role("button", name="SVG for slides")
        button.wait_for()
        column = page.locator("[data-testid='stColumn']").filter(has=button)
        column.screenshot(path=str(artifacts_dir / "charts-svg-button.png"))
        with page.expect_download() as download:
            button.click()
        svg = download.value.path().read_text(encoding="utf-8")  # while the browser is open: its file goes with it
        name = download.value.suggested_filename
    assert name == "headscope-qkov-copying.svg"
    texts = ["".join(node.itertext()) for node in ElementTree.fromstring(svg).iter() if node.tag.endswith("}text")]
    assert "Copying score (OV circuit's eigenvalues)" in texts and "copying score" in texts
    assert "layer" in texts and "head" in texts
