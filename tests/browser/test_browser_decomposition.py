"""Explore's "Why does this head look there?" in Debian Chromium on MiniLM's real weights: a link with the cell opens
the section, and the heatmap the browser draws is mha_core's decomposition of that cell; the sentence for a class is
on the page. A click on a cell of the enlarged head (its pixel position computed from the drawn layout), and Enter
on the keyboard's cell, open that cell's decomposition: its query, its key and its sentence."""

from __future__ import annotations

import importlib.util
from urllib.parse import quote, urlencode

import numpy as np
import pytest

import mha_core as mc
from tests.browser.test_browser_circuits import drawn
from tests.conftest import require
from tools.browser import (
    WIDGET_VALUES_JS,
    chromium_available,
    chromium_page,
    streamlit_server,
    wait_for_address,
    wait_for_app,
)
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
        section = page.locator(".js-plotly-plot").filter(has_text="key-side source")
        section.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "explore-decomposition.png"), full_page=False)


def shown_cell(page, parts) -> None:
    """Wait until the section shows ``parts``' cell: its question, its sentence, its query and key selected."""
    page.get_by_text(parts.question()).first.wait_for(timeout=600_000)
    assert page.get_by_text(parts.why()).count() >= 1
    values = dict(page.evaluate(WIDGET_VALUES_JS))
    assert values["Query (the token looking)"] == f"{parts.query}: {parts.tokens[parts.query]}"
    assert values["Key (the token looked at)"].startswith(f"{parts.key}: {parts.tokens[parts.key]}  (")
    wait_for_address(page, f"score_query={parts.query}", f"score_key={parts.key}")


def test_a_clicked_cell_and_the_keyboards_cell_open_their_decomposition(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    model = mc.load_model("minilm")
    run = model.run(TEXT)
    n = run.num_tokens
    clicked = mc.score_decomposition(model, TEXT, LAYER, HEAD, QUERY, KEY)  # "cat" -> "sat"
    keyed = mc.score_decomposition(model, TEXT, LAYER, HEAD, QUERY + 1, KEY - 1)  # "sat" -> "cat"
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/explore?model=minilm&text={quote(TEXT)}&layer={LAYER}&head={HEAD}")
        wait_for_app(page)
        page.wait_for_function(
            "(want) => (document.querySelector('.hs-headview') || {dataset: {}}).dataset.drawn?.endsWith(want)",
            arg=f":{LAYER}:{HEAD}",
            timeout=300_000,
        )
        assert page.get_by_text(clicked.question()).count() == 0  # the section starts switched off
        canvas = page.locator(".hs-headview .hs-big-canvas")
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        # The drawn layout (headview.js's bigLayout): n square cells of min(28, max(9, floor(560 / n))) px a side.
        cell = min(28, max(9, 560 // n))
        assert box["width"] == pytest.approx(n * cell, abs=1) and box["height"] == pytest.approx(n * cell, abs=1)
        page.mouse.click(box["x"] + (KEY + 0.5) * cell, box["y"] + (QUERY + 0.5) * cell)
        assert page.evaluate("() => document.querySelector('.hs-headview').dataset.cursor") == f"{QUERY},{KEY}"
        shown_cell(page, clicked)
        page.screenshot(path=str(artifacts_dir / "explore-click-cell.png"), full_page=False)
        section = page.get_by_text(clicked.question()).first
        section.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "explore-click-decomposition.png"), full_page=False)
        # The keyboard: the heatmap's cell moves down one and left one from the clicked cell, Enter picks it.
        canvas.focus()
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowLeft")
        assert page.evaluate("() => document.querySelector('.hs-headview').dataset.cursor") == f"{QUERY + 1},{KEY - 1}"
        page.keyboard.press("Enter")
        shown_cell(page, keyed)
        page.get_by_text(keyed.question()).first.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "explore-enter-decomposition.png"), full_page=False)
