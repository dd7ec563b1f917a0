"""The app's Plotly figures as PNG and SVG for slides, drawn offline by Debian's Chromium (ui/figure_images.py): the
picture holds the figure's colours and labels, and nothing in it points outside."""

from __future__ import annotations

import importlib.util
import io
import re

import numpy as np
import plotly.colors
import pytest

from mha_core.views.palette import ATTENTION_COLORSCALE
from tests.conftest import require
from tools.browser import chromium_available
from ui import figures
from ui.figure_images import figure_image

pytestmark = [pytest.mark.browser]

TOKENS = ["the", "cat", "<b>sat</b>", "down"]


@pytest.fixture(scope="module")
def heatmap():
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    weights = np.random.default_rng(3).dirichlet(np.ones(4), size=4).astype(np.float32)
    return weights, figures.head_heatmap(weights, TOKENS, TOKENS)


def test_a_figure_as_png_holds_every_weight_s_colour(heatmap):
    from PIL import Image

    weights, fig = heatmap
    picture = Image.open(io.BytesIO(figure_image(fig, "png", width=500, height=450, scale=2)))
    assert picture.format == "PNG" and picture.size == (1000, 900)
    rgb = np.asarray(picture.convert("RGB"), dtype=float).reshape(-1, 3)
    trace = fig.data[0]
    assert (trace.zmin, trace.zmax) == (0, 1)
    expected = plotly.colors.sample_colorscale(
        ATTENTION_COLORSCALE, [float(w) for w in weights.ravel()], colortype="tuple"
    )
    for colour in np.asarray(expected) * 255:  # each cell's colour, as Plotly interpolates it, is in the picture
        assert np.abs(rgb - colour).max(axis=1).min() <= 3, colour


def test_a_figure_as_svg_is_vector_text_with_nothing_outside(heatmap):
    _, fig = heatmap
    svg = figure_image(fig, "svg", width=500, height=450).decode("utf-8")
    assert svg.startswith("<svg") and 'width="500"' in svg and 'height="450"' in svg
    # Labels as text, user text escaped (Plotly escapes it as character references; the tag never appears).
    assert "key (attended to)" in svg and "&#60;b&#62;sat&#60;/b&#62;" in svg and "<b>" not in svg
    links = re.findall(r'(?:href|src)="([^"]*)"', svg)
    assert links and all(link.startswith(("data:image/png;base64,", "#")) for link in links), links
    with pytest.raises(ValueError, match="one of"):
        figure_image(fig, "jpeg")
