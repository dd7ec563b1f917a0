"""Every chart of the app has an "SVG for slides" button (ui/widgets/charts.py): the picture is drawn, when clicked, by
the server's Chromium offline, and holds what the chart shows. Checked on the Circuits page under AppTest: the SVG
decoded, its title and colour bar's labels read, and its heatmap's cells (the embedded picture) the colours of the
library's scores."""

from __future__ import annotations

import base64
import importlib.util
import io
import re
import xml.etree.ElementTree as ElementTree

import numpy as np
import plotly.colors
import pytest

import mha_core as mc
from tests.conftest import require
from tests.mha_core.interventions.test_circuits import CLEAN, CORRUPTED, build_decoder, one_token_words
from tests.page_helpers import deferred_downloads, open_app, plotly_elements
from tools.browser import chromium_available
from ui.heads_circuits import grid

pytestmark = [pytest.mark.browser]

XLINK = "{http://www.w3.org/1999/xlink}href"


@pytest.fixture(scope="module")
def tiny_gpt2(tmp_path_factory):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    return str(build_decoder(tmp_path_factory.mktemp("tiny-gpt2-svg"), "gpt2"))


def svg_texts(root) -> list[str]:
    return ["".join(node.itertext()) for node in root.iter() if node.tag.endswith("}text")]


def test_each_chart_downloads_as_an_svg_of_what_it_shows(tiny_gpt2, monkeypatch):
    from PIL import Image

    model = mc.load_model(tiny_gpt2)
    answer, foil = one_token_words(model)
    fetch = deferred_downloads(monkeypatch)
    query = {"model": tiny_gpt2, "task": "custom", "clean": CLEAN, "corrupted": CORRUPTED, "answer": answer}
    app = open_app("circuits", {**query, "foil": foil, "qkov": "1"})
    assert not app.error, [e.value for e in app.error]
    buttons = {button.key: button for button in app.get("download_button")}
    charts = plotly_elements(app)
    assert charts and all(buttons[f"{key}_svg"].proto.label == "SVG for slides" for key in charts)
    svg = fetch(buttons["qkov_previous_svg"]).decode("utf-8")
    assert svg.startswith("<svg") and not re.search(r'(?:href|src)="(?!data:)', svg)  # nothing outside
    root = ElementTree.fromstring(svg)
    texts = svg_texts(root)
    assert "Previous-token score (QK circuit on positions)" in texts and "previous-token" in texts
    assert [str(head) for head in range(model.num_heads)] == [t for t in texts if t.isdigit()][: model.num_heads]
    # The heatmap is one embedded picture: each cell's centre is its score's colour on Viridis, min to max.
    image = next(node for node in root.iter() if node.tag.endswith("}image"))
    href = image.get(XLINK) or image.get("href")
    picture = Image.open(io.BytesIO(base64.b64decode(href.split(",", 1)[1]))).convert("RGB")
    scores = grid(mc.copying_scores(model), "previous_token", model.num_layers, model.num_heads)
    levels = (scores - scores.min()) / (scores.max() - scores.min())
    expected = plotly.colors.sample_colorscale("Viridis", list(levels.ravel()), colortype="tuple")
    expected = (np.asarray(expected) * 255).reshape(model.num_layers, model.num_heads, 3)
    width, height = picture.size
    pixels = np.asarray(picture, dtype=float)
    for layer in range(model.num_layers):
        for head in range(model.num_heads):
            x = int((head + 0.5) * width / model.num_heads)
            y = int((layer + 0.5) * height / model.num_layers)  # layer 0 at the top
            np.testing.assert_allclose(pixels[y, x], expected[layer, head], atol=3)
