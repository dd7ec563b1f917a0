"""The Circuits maps saved as one file (``mc.save_html`` of ``mc.copying_scores`` and ``mc.composition``), opened in
Chromium with the network blocked: nothing is requested, each head's cell is painted the colour of the table's value,
and a click on a cell lists that head's rows (a receiver's strongest senders) in words."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import mha_core as mc
from mha_core.views.palette import SIGNED_COLORSCALE
from tests.browser.test_browser_export import colours_of
from tests.conftest import require
from tests.mha_core.views.test_views_tables import in_words
from tests.model_fixtures import build_tiny_llama
from tools.browser import chromium_available, chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CANVAS_PIXELS = """() => { const c = document.querySelector('.hs-table-canvas');
                           return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data); }"""


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    return mc.load_model(str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-maps"), head=True)))


def expected_colours(grid: np.ndarray) -> np.ndarray:
    """The view's colours of a grid: the weights' scale from 0 to the largest value, or for a grid with a value below
    zero the signed scale from -m to m (m its largest magnitude: white at 0), as the app's maps."""
    if np.nanmin(grid) < 0:
        m = float(np.nanmax(np.abs(grid)))
        return colours_of(((grid + m) / (2 * m)).astype(np.float32), SIGNED_COLORSCALE)
    return colours_of((grid / np.nanmax(grid)).astype(np.float32))


def open_offline(page, path, requests: list) -> None:
    address = path.resolve().as_uri()
    page.on("request", lambda request: requests.append(request.url) if request.url != address else None)
    page.route("**/*", lambda route: route.continue_() if route.request.url == address else route.abort())
    page.goto(address)


def drawn_grid(page, layers: int, heads: int) -> np.ndarray:
    return np.asarray(page.evaluate(CANVAS_PIXELS), dtype=float).reshape(layers, heads, 4)[..., :3]


def test_saved_copying_and_previous_token_maps_draw_the_tables_values_offline(tiny_llama, tmp_path):
    scores = mc.copying_scores(tiny_llama)
    layers, heads = tiny_llama.num_layers, tiny_llama.num_heads
    path = mc.save_html(scores, tmp_path / "copying.html")
    requests, signed = [], []
    with chromium_page() as page:
        open_offline(page, path, requests)
        for column in ("copying", "previous_token"):
            page.locator(".hs-table-column").select_option(column)
            page.wait_for_function(f"() => document.querySelector('.hs-tableview').dataset.drawn.endsWith(':{column}')")
            grid = scores.pivot(index="layer", columns="head", values=column).to_numpy(np.float32)
            signed.append(bool(np.nanmin(grid) < 0))
            np.testing.assert_allclose(drawn_grid(page, layers, heads), expected_colours(grid), atol=4)
        box = page.locator(".hs-table-canvas").bounding_box()
        page.mouse.click(box["x"] + box["width"] * (1.5 / heads), box["y"] + box["height"] * (1.5 / layers))
        detail = page.locator(".hs-table-detail").text_content()
    row = scores[(scores["layer"] == 1) & (scores["head"] == 1)].iloc[0]
    assert detail == f"Layer 1, head 1\ncopying {row.copying:.4g}, previous_token {row.previous_token:.4g}"
    assert requests == [], requests
    assert True in signed  # a signed column was drawn on the signed scale (the copying scores here)


def test_a_saved_composition_map_draws_each_receivers_strongest_sender_offline(tiny_llama, tmp_path):
    table = mc.composition(tiny_llama)
    layers, heads = tiny_llama.num_layers, tiny_llama.num_heads
    path = mc.save_html(table, tmp_path / "composition.html", column="k")
    requests = []
    with chromium_page() as page:
        open_offline(page, path, requests)
        page.wait_for_function("() => document.querySelector('.hs-tableview').dataset.drawn.endsWith(':k')")
        drawn = drawn_grid(page, layers, heads)
        box = page.locator(".hs-table-canvas").bounding_box()
        page.mouse.click(box["x"] + box["width"] * (0.5 / heads), box["y"] + box["height"] * (1.5 / layers))
        detail = page.locator(".hs-table-detail").text_content().split("\n")
    strongest = table.groupby(["receiver_layer", "receiver_head"])["k"].max().unstack().to_numpy(np.float32)
    grid = np.vstack([np.full((1, heads), np.nan, dtype=np.float32), strongest])  # layer 0 receives from no one
    masked = np.asarray([233, 236, 239], dtype=float)  # MASKED_COLOR, #e9ecef: a head with no row
    np.testing.assert_allclose(drawn[0], np.broadcast_to(masked, (heads, 3)), atol=1)
    np.testing.assert_allclose(drawn[1:], expected_colours(grid[1:]), atol=4)
    senders = table[(table["receiver_layer"] == 1) & (table["receiver_head"] == 0)].sort_values("k", ascending=False)
    assert detail[0] == "Layer 1, head 0" and len(detail) == 1 + len(senders)  # tiny: every sender listed
    best = senders.iloc[0]
    assert detail[1] == in_words(best)
    assert requests == [], requests
