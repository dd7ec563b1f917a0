"""Pictures for slides: a page drawn by Debian's Chromium through Playwright, offline (``in_offline_page``); a view's
page of ``standalone`` photographed as PNG (``view_png``); the app's Plotly figures use the same page
(``ui/figure_images.py``).

The page is given to the browser as it is (``set_content``: no file, no server), every request it would make is
refused (it makes none), and once its view says it has drawn (``data-drawn`` on the view's root) the view is
photographed: PNG of the canvases as they are on screen. Playwright is an optional dependency (the browser tests'),
imported here only when a picture is asked for; Chromium is never downloaded (Playwright's own browser builds are
not used: ``CHROMIUM``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path

from mha_core.views import standalone

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
DRAW_TIMEOUT_MS = 60_000
PLAYWRIGHT_HINT = "pictures are drawn by Chromium through Playwright: pip install playwright, apt-get install chromium"


def chromium_launch_options() -> dict:
    """Keyword arguments for Playwright's ``chromium.launch`` (sync or async): Debian Chromium, headless."""
    return {"executable_path": CHROMIUM, "args": list(CHROMIUM_ARGS)}


def in_offline_page(html: str, action, *, width: int = 1400, height: int = 900, scale: float = 2):
    """``action(page)`` on a Chromium page (Debian's, headless, through Playwright) holding ``html`` as it is, every
    request refused: what a picture is taken of. Its value is returned. Playwright's synchronous API refuses to run in
    a thread with a running asyncio loop (a Jupyter kernel's): there, the page lives in a thread of its own."""
    try:
        from playwright.sync_api import sync_playwright  # playwright: optional, only for pictures
    except ImportError:
        raise ImportError(PLAYWRIGHT_HINT) from None
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"{CHROMIUM} is not installed: {PLAYWRIGHT_HINT}")

    def work():
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(**chromium_launch_options())
            try:
                page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=scale)
                page.set_default_timeout(DRAW_TIMEOUT_MS)
                page.route("**/*", lambda route: route.abort())
                page.set_content(html)
                return action(page)
            finally:
                browser.close()

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return work()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(work).result()


def view_png(obj, path, *, width: int = 1400, **options) -> Path:
    """``obj``'s view (``standalone.view_of``'s options) as a PNG picture at ``path``, drawn offline."""
    view = standalone.view_of(obj, **options)
    path = Path(path)
    root = standalone.ROOT_CLASS[view.view]

    def photograph(page) -> None:
        page.wait_for_function(f"() => (document.querySelector('.{root}')?.dataset.drawn || '') !== ''")
        page.locator("#hs-host").screenshot(path=str(path))

    in_offline_page(standalone.page(view), photograph, width=width)
    return path
