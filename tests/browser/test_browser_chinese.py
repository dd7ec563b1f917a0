"""The interface in Chinese in Debian Chromium (``lang=zh``): the page says it is Chinese (``<html lang="zh-CN">``,
from its first paint and after the sidebar's switch), the translated pages have no serious or critical axe-core
violation in Chinese, the head view's own words are Chinese (what a screen reader reads of it too), and the
screenshots (tests/artifacts: the Classroom, Explore, Circuits, Head roles, Ablate, the Lab and Deeper whole) show CJK
glyphs from the font scripts/setup.sh --test installs (fonts-noto-cjk)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.browser.test_browser_a11y import AT_REST_JS, HEAD_DRAWN_JS, requirements, serious_violations
from tests.conftest import require
from tools.browser import chromium_page, streamlit_server, wait_for_address, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HTML_LANG_JS = "() => document.documentElement.lang"
# The translated pages, the link's settings and a heading each shows in Chinese (the shared chrome, navigation, sidebar
# and messages on every one). Circuits reads SmolLM2's next-token prediction: its logit lens is computed first.
TRANSLATED = {
    "explore": ("", "我在看什么？"),
    "compare": ("", "比较"),
    "circuits": ("&model=smollm2", "logit 透镜"),
    "roles": ("&causal=1&colour_by=role", "每个头的角色"),
    "ablate": ("&heads=L1H2,L2H0", "2. 对这个句子的影响"),
    "lab": ("", "实验室：看注意力头如何诞生"),
    "deeper": ("", "1. 注意力展开（rollout）：每个 token 的表示汲取了哪些输入"),
    "classroom": ("", "第 1 步：输入和权重"),  # last: the language switch below starts from it
}
# What the head view's own script shows in Chinese (headview.js, given its words by the app).
HEAD_VIEW_WORDS = ("头视图", "模型视图", "热力图", "连线")


def cjk_font_installed() -> bool:
    fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, check=False).stdout
    return "Noto Sans CJK" in fonts


def test_the_classroom_in_chinese_is_chinese_to_a_screen_reader_and_to_axe(artifacts_dir):
    requirements()
    require(cjk_font_installed(), "Debian's fonts-noto-cjk (bash scripts/setup.sh --test)")
    report = {}
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        for path, (settings, heading) in TRANSLATED.items():
            page.goto(f"{url}/{path}?lang=zh{settings}")
            assert page.evaluate(HTML_LANG_JS) == "zh-CN"  # the server's page, before any script ran
            wait_for_app(page, timeout_ms=300_000)
            page.get_by_text(heading, exact=True).first.wait_for(timeout=300_000)
            if path == "explore":
                page.wait_for_function(HEAD_DRAWN_JS, timeout=300_000)
                view = page.evaluate("() => document.querySelector('.hs-headview').innerText")
                assert all(word in view for word in HEAD_VIEW_WORDS), view
                assert "Heatmap" not in view and "Model view" not in view
            report[path] = serious_violations(page)
            assert page.evaluate(HTML_LANG_JS) == "zh-CN"
            page.screenshot(
                path=str(artifacts_dir / f"zh-{path}.png"),
                full_page=path in ("explore", "circuits", "roles", "ablate", "lab", "deeper"),
            )
        page.get_by_text("课堂：手算多头注意力").wait_for(timeout=60_000)
        # A step with a figure, its answer revealed: its words in Chinese too (a screenshot to look at).
        page.goto(f"{url}/classroom?lang=zh&step=4")
        wait_for_app(page, timeout_ms=300_000)
        page.get_by_text("揭晓答案").first.click()
        page.get_by_text("**答案：**".strip("*")).first.wait_for(timeout=60_000)
        page.wait_for_function(AT_REST_JS, timeout=60_000)
        page.screenshot(path=str(artifacts_dir / "zh-classroom-step4.png"), full_page=True)
        assert "注意力权重" in page.evaluate(
            "() => document.body.innerText + [...document.querySelectorAll('svg text')].map(t => t.textContent).join(' ')"
        )
        # The switch: English, and the page says so; the link drops lang.
        page.get_by_text("English", exact=True).click()
        page.get_by_text("Classroom: multi-head attention by hand").wait_for(timeout=60_000)
        page.wait_for_function("() => document.documentElement.lang === 'en'", timeout=60_000)
        page.wait_for_function("() => !window.location.search.includes('lang=')", timeout=60_000)
        page.get_by_text("中文", exact=True).click()
        page.get_by_text("课堂：手算多头注意力").wait_for(timeout=60_000)
        page.wait_for_function("() => document.documentElement.lang === 'zh-CN'", timeout=60_000)
        wait_for_address(page, "lang=zh")
    (artifacts_dir / "zh-axe.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    assert not any(report.values()), report


def test_the_head_view_read_from_the_keyboard_in_chinese(artifacts_dir):
    """What a screen reader reads of the head view in Chinese: the heads' labels, the live region's announcements,
    the focused cell and its row's top tokens, the text alternative of the head and the model view's row and column
    headers are Chinese; the tokens and the weights stay as they are (the model's own, checked against it)."""
    import re
    from urllib.parse import quote

    import numpy as np

    import mha_core as mc
    from tests.browser.test_browser_a11y import FOCUSED_JS, said, tab_to, top_words

    requirements()
    text = "The cat sat on the mat."
    run = mc.load_model("minilm").run(text)
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/explore?lang=zh&text={quote(text)}")
        wait_for_app(page, timeout_ms=300_000)
        page.wait_for_function(HEAD_DRAWN_JS, timeout=300_000)
        assert tab_to(page, "hs-tile") == "第 0 层 头 0"
        for key in ("ArrowRight", "ArrowDown", "ArrowRight"):
            page.keyboard.press(key)
        assert page.evaluate(FOCUSED_JS)[1] == "第 1 层 头 2"
        assert said(page, ".hs-headview .hs-live").startswith("已选中第 1 层，头 2。按 Enter 打开它")
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':1:2')")
        page.keyboard.press("Enter")
        cls, label = page.evaluate(FOCUSED_JS)
        assert "hs-big-canvas" in cls and label.startswith("选中的头，") and "方向键" in label
        for key in ("ArrowDown", "ArrowDown", "ArrowRight"):
            page.keyboard.press(key)
        tokens = run.tokens
        live = said(page, ".hs-headview .hs-live")
        assert live.startswith(f'从查询 2 "{tokens[2]}" 到键 1 "{tokens[1]}": '), live
        shown = float(re.match(r".*?: (\d\.\d{3})\.", live).group(1))
        assert shown == pytest.approx(float(run.attentions[1, 2][2, 1]), abs=0.5 / 255 + 5e-4)
        page.keyboard.press("Enter")
        row = said(page, ".hs-headview .hs-live")
        assert row.startswith(f'查询 2 "{tokens[2]}" 关注最多的是 '), row
        got = re.findall(r'"([^"]*)" \((\d\.\d\d)\)', row.split("关注最多的是", 1)[1])
        expected = top_words(np.asarray(run.attentions[1, 2])[2], tokens, 5)
        np.testing.assert_allclose([float(v) for _, v in got], [v for _, v in expected], atol=0.006)
        words = said(page, ".hs-headview .hs-words").split("\n")
        assert words[0] == "第 1 层，头 2：每个查询 token，以及它关注最多的键 token。"
        assert len(words) == len(tokens) + 1 and all("关注最多的是" in line for line in words[1:])
        assert said(page, ".hs-headview .hs-bar-title") == "权重"  # the colour bar's title
        page.screenshot(path=str(artifacts_dir / "zh-keyboard-head-view.png"))
        # The model view's table of heads: its row and column headers.
        page.goto(f"{url}/explore?lang=zh&view=model&text={quote(text)}")
        wait_for_app(page, timeout_ms=300_000)
        page.wait_for_function(
            "() => (document.querySelector('.hs-headview')?.dataset.drawn || '').endsWith(':model')", timeout=300_000
        )
        view = page.evaluate("() => document.querySelector('.hs-headview').innerText")
        assert "第 0 层" in view and "头 11" in view and "layer 0" not in view and "head 11" not in view, view
        assert "attends most" not in said(page, ".hs-headview .hs-words")


# The label boxes of the lines chart's tokens (Plotly text points): [left, top, width, height, text], keys last.
TOKEN_LABELS_JS = """() => [...document.querySelectorAll('.js-plotly-plot g.textpoint text')].map((node) => {
  const r = node.getBoundingClientRect();
  return [r.left, r.top, r.width, r.height, node.textContent];
})"""


def test_a_figures_hover_in_chinese(artifacts_dir):
    """A Plotly figure's hover in Chinese: the lines view with a query in focus, a key's label hovered; the hover's
    words are the catalog's (``ui.i18n.translate_hover``), its token and its weight the figure's own."""
    import re
    from urllib.parse import quote

    import mha_core as mc

    requirements()
    text = "The cat sat on the mat."
    run = mc.load_model("minilm").run(text)
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/explore?lang=zh&shape=lines&focus=3&text={quote(text)}")
        wait_for_app(page, timeout_ms=300_000)
        page.wait_for_function(f"() => ({TOKEN_LABELS_JS})().length >= {2 * len(run.tokens)}", timeout=300_000)
        page.locator(".js-plotly-plot g.textpoint text").last.scroll_into_view_if_needed()
        labels = page.evaluate(TOKEN_LABELS_JS)
        right = max(label[0] for label in labels)
        keys = sorted((label for label in labels if label[0] > right - 40), key=lambda label: label[1])
        key = 1
        left, top, _, height, token = keys[key]
        assert token == run.tokens[key]
        page.mouse.move(left - 30, top + height / 2)
        page.mouse.move(left - 3, top + height / 2, steps=5)
        hover = page.locator(".hoverlayer .hovertext").first
        try:
            hover.wait_for(timeout=30_000)
        finally:
            page.screenshot(path=str(artifacts_dir / "zh-hover-lines.png"))
        lines = hover.evaluate("(node) => [...node.querySelectorAll('tspan.line')].map((line) => line.textContent)")
        said = " ".join(" ".join(lines).split())
        match = re.fullmatch(rf"键 {key} (.+) 权重 \(查询 3\): (\d\.\d{{4}})", said)
        assert match is not None, said
        assert match[1] == run.tokens[key]
        assert float(match[2]) == pytest.approx(float(run.attentions[0, 0][3, key]), abs=5e-4)
