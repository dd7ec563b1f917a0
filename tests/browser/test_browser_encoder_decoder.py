"""The cross-attention view in Debian Chromium: a tiny random BART saved here, opened by its folder as a user
opens facebook/bart-base; the target's tokens down the side, the source's along the top, every head painted,
the strongest cell darker than the weakest, the hover naming target and source tokens, a click on a head.

Screenshots go to test-artifacts/."""

from __future__ import annotations

import importlib.util
from urllib.parse import urlencode

import pytest

from tests.conftest import require
from tests.model_fixtures import build_tiny_bart
from tools.browser import chromium_available, chromium_page, head_view_js, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SOURCE = "The quick brown fox jumps over the lazy dog."
TARGET = "A dog chased the cat across the garden."

CROSS_FACTS_JS = """
() => {
  const root = document.querySelector('.hs-headview');
  const texts = (selector) => Array.from(root.querySelectorAll(selector)).map(e => e.textContent);
  return {rows: texts('.hs-row-label'), cols: texts('.hs-col-label'),
          titles: texts('.hs-axis-title'),
          canvases: Array.from(root.querySelectorAll('.hs-tile canvas, .hs-big-canvas')).map(c => [c.width, c.height])};
}
"""

PIXELS_JS = """
(points) => {
  const ctx = document.querySelector('.hs-big-canvas').getContext('2d');
  return points.map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));
}
"""


def test_cross_view_in_chromium(tmp_path, artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    import mha_core as mc

    path = str(build_tiny_bart(tmp_path / "bart"))
    reference = mc.load_model(path).run(SOURCE, TARGET).cross
    n_tgt, n_src = reference.num_tokens, reference.num_keys
    query = {"model": path, "source": SOURCE, "target": TARGET, "write": "0", "layer": "1", "head": "2"}
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/explore?{urlencode(query)}")
        wait_for_app(page)
        page.wait_for_function(head_view_js(4, "dog", layer=1), timeout=120_000)
        facts = page.evaluate(CROSS_FACTS_JS)
        assert facts["rows"] == reference.tokens and facts["cols"] == reference.key_tokens
        assert "target token (attending)" in facts["titles"] and "source token (attended to)" in facts["titles"]
        assert facts["canvases"] == [[n_src, n_tgt]] * 5  # four heads and the enlarged one: n_src wide, n_tgt high
        weights = reference.attentions[1, 2]
        (i, j), (k, m) = divmod(int(weights.argmax()), n_src), divmod(int(weights.argmin()), n_src)
        dark, light = page.evaluate(PIXELS_JS, [[j, i], [m, k]])
        assert sum(dark) < sum(light), (dark, light)
        canvas = page.locator(".hs-big-canvas")
        canvas.scroll_into_view_if_needed()
        box = canvas.bounding_box()
        page.mouse.move(box["x"] + (j + 0.5) * box["width"] / n_src, box["y"] + (i + 0.5) * box["height"] / n_tgt)
        tip = page.locator(".hs-tip").text_content()
        prefix = f'target {i} "{reference.tokens[i]}" -> source {j} "{reference.key_tokens[j]}": '
        assert tip.startswith(prefix), tip
        assert abs(float(tip[len(prefix) :]) - weights[i, j]) <= 0.5 / 255 + 0.0005
        page.wait_for_timeout(300)
        page.screenshot(path=str(artifacts_dir / "explore-cross-view.png"))
        page.locator(".hs-headview").screenshot(path=str(artifacts_dir / "explore-cross-view-canvas.png"))
        # A click on head 0's tile enlarges it, and the address follows.
        page.locator('.hs-tile[data-head="0"]').click()
        page.wait_for_function("() => document.querySelector('.hs-big-title').textContent === 'Layer 1, head 0'")
        page.wait_for_function("() => window.location.search.includes('head=0')", timeout=60_000)
        assert "kind=" not in page.url  # cross-attention is the default kind
        # The encoder's view from the switch: the source's tokens on both axes, and the address holds the kind.
        page.get_by_text("Encoder self-attention", exact=True).click()
        page.wait_for_function("() => window.location.search.includes('kind=encoder')", timeout=60_000)
        page.wait_for_function(head_view_js(4, "The"), timeout=120_000)
        facts = page.evaluate(CROSS_FACTS_JS)
        assert facts["rows"] == facts["cols"] == reference.key_tokens
        assert page.locator('[data-testid="stException"]').count() == 0
