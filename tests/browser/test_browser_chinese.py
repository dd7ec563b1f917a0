"""The interface in Chinese in Debian Chromium (``lang=zh``): the page says it is Chinese (``<html lang="zh-CN">``,
from its first paint and after the sidebar's switch), the translated pages have no serious or critical axe-core
violation in Chinese, the head view's own words are Chinese, and the screenshots (tests/artifacts: the Classroom,
Explore, Circuits, Head roles and Ablate whole) show CJK glyphs from the font scripts/setup.sh --test installs
(fonts-noto-cjk)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.browser.test_browser_a11y import AT_REST_JS, HEAD_DRAWN_JS, requirements, serious_violations
from tests.conftest import require
from tools.browser import chromium_page, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

HTML_LANG_JS = "() => document.documentElement.lang"
# The translated pages, the link's settings and a heading each shows in Chinese (the shared chrome, navigation, sidebar
# and messages on every one). Circuits reads SmolLM2's next-token prediction: its logit lens is computed first.
TRANSLATED = {
    "explore": ("", "我在看什么？"),
    "compare": ("", "比较"),
    "circuits": ("&model=smollm2", "logit 透镜"),
    "classroom": ("", "第 1 步：输入和权重"),
    "roles": ("&causal=1&colour_by=role", "每个头的角色"),
    "ablate": ("&heads=L1H2,L2H0", "2. 对这个句子的影响"),
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
                path=str(artifacts_dir / f"zh-{path}.png"), full_page=path in ("explore", "circuits", "roles", "ablate")
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
        assert "lang=zh" in page.url
    (artifacts_dir / "zh-axe.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    assert not any(report.values()), report
