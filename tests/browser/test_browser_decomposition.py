"""Explore's "Why does this head look there?" in Debian Chromium on MiniLM's real weights: a link with the cell opens
the section, and the heatmap the browser draws is mha_core's decomposition of that cell; the sentence for a class is
on the page."""

from __future__ import annotations

import importlib.util
from urllib.parse import urlencode

import numpy as np
import pytest

import mha_core as mc
from tests.browser.test_browser_circuits import drawn
from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app
from ui.widgets.decomposition import TOP_SOURCES

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TEXT = "The cat sat on the mat because it was warm."
LAYER, HEAD, QUERY, KEY = 2, 8, 2, 3  # MiniLM's nsubj head (docs/findings.md): "cat" -> "sat"


def test_decomposition_section_in_chromium(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    model = mc.load_model("minilm")
    parts = mc.score_decomposition(model, TEXT, LAYER, HEAD, QUERY, KEY)
    matrix, rows, columns = parts.grouped(TOP_SOURCES)
    link = {
        "model": "minilm",
        "text": TEXT,
        "layer": LAYER,
        "head": HEAD,
        "decompose": 1,
        "score_query": QUERY,
        "score_key": KEY,
    }
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/explore?{urlencode(link)}")
        wait_for_app(page)
        shown = drawn(page, f"Head {LAYER}-{HEAD}: its score")
        np.testing.assert_allclose(np.array(shown["z"], dtype=np.float64), matrix, rtol=1e-4, atol=1e-4)
        assert [row[0][0] for row in shown["hover"]] == rows
        assert [cell[1] for cell in shown["hover"][0]] == columns
        assert page.get_by_text(f"Head {LAYER}-{HEAD} looks from").count() >= 1
        section = page.locator(".js-plotly-plot").filter(has_text="query-side source")
        section.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "explore-decomposition.png"), full_page=False)
