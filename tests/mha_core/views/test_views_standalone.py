"""The views outside the app (mha_core.views.standalone): one self-contained HTML file whose data decodes to the run's
weights, nothing fetched, user text kept out of the markup; the notebook widget; the `render` command."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pandas as pd
import pytest

import mha_core as mc
from mha_core.__main__ import main
from mha_core.models.long import run_long
from mha_core.run import AttentionRun
from mha_core.seq2seq_run import CrossAttentionRun
from mha_core.views import heads, long, packing, palette, standalone, tables
from tests.model_fixtures import build_tiny_llama

STEP = 0.5 / 255 + 1e-6  # one byte a weight: off by at most half a step (float32 rounding beside it)


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    return (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def random_run(layers: int = 3, num_heads: int = 4, n: int = 7, causal: bool = False, tokens=None, seed: int = 0):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(layers, num_heads, n, n)) * 3
    if causal:
        scores = np.where(np.triu(np.ones((n, n), dtype=bool), k=1), -np.inf, scores)
    tokens = tokens or [f"tok{i}" for i in range(n)]
    return AttentionRun(
        model_name="tiny",
        family="bert",
        is_causal=causal,
        tokens=list(tokens),
        attentions=softmax_rows(scores),
        special_mask=np.zeros(n, dtype=bool),
        word_ids=np.arange(n),
        words=list(tokens),
        segment_ids=np.zeros(n, dtype=np.int64),
        text=" ".join(tokens),
    )


def page_data(page: str) -> dict:
    """The data a page carries, read back as its script reads it (JSON.parse of the data element's text)."""
    found = re.findall(r'<script type="application/json" id="hs-data">(.*?)</script>', page, flags=re.DOTALL)
    assert len(found) == 1
    return json.loads(found[0])


def test_a_saved_head_view_holds_every_layer_of_the_run_at_one_byte_a_weight(tmp_path):
    run = random_run(layers=3, num_heads=4, n=9, causal=True)
    path = run.to_html(tmp_path / "view.html", layer=2, head=3)
    assert path == tmp_path / "view.html"
    page = path.read_text(encoding="utf-8")
    data = page_data(page)
    assert (data["layer"], data["head"], data["view"], data["causal"]) == (2, 3, "head", True)
    assert data["layers_sent"] == [0, 1, 2] and data["switchable"]  # every layer: the slider and the model view
    assert data["tokens"] == run.tokens
    decoded = heads.unpack(data)
    for layer in range(3):
        np.testing.assert_allclose(decoded[layer], run.attentions[layer], atol=STEP, rtol=0)
    # The text form is the same page; the model view is the same data with the other view first.
    assert run.to_html(layer=2, head=3) == page
    assert page_data(mc.save_html(run, tmp_path / "model.html", view="model").read_text())["view"] == "model"


def test_a_page_fetches_nothing_and_keeps_user_text_out_of_the_markup():
    tokens = ["</script><script>alert(1)</script>", "<b>bold</b>", "&amp;", "x"]
    run = random_run(layers=1, num_heads=2, n=4, tokens=tokens)
    run.model_name = "<i>model</i>"
    page = run.to_html()
    # One data element and one module: no token ends either of them; the title is escaped.
    assert page.count("</script>") == 2 and "<b>bold" not in page and "<i>model" not in page
    assert "&lt;i&gt;model&lt;/i&gt;: &quot;&lt;/script&gt;&lt;script&gt;alert(1)" in page and "(4 tokens)" in page
    assert page_data(page)["tokens"] == tokens
    # Nothing to fetch: no external script, style, image or import, and a policy refusing any request.
    assert not re.search(r"<script[^>]*\bsrc=|<link\b|@import|\bfetch\(|XMLHttpRequest|\bimport\(", page)
    assert not re.search(r"^\s*(import|export)\b", page, flags=re.MULTILINE)  # one module, its exports bound
    assert "Content-Security-Policy\" content=\"default-src 'none'" in page
    assert "const mountView = function" in page and "mountView({" in page


def test_every_file_of_a_view_goes_into_its_page(monkeypatch, tmp_path):
    # A script and a style added to a view's one list (a keyboard module, say) are in the page, in order.
    from mha_core.views import assets

    real = assets.ASSETS
    folder = tmp_path / "extra"
    folder.mkdir()
    (folder / "keys.js").write_text("export function keysMarker() { return 41; }\n", encoding="utf-8")
    (folder / "keys.css").write_text(".hs-keys-marker { color: red; }\n", encoding="utf-8")
    for name in ("viewkit", "headview"):
        (tmp_path / name).symlink_to(real / name)
    monkeypatch.setattr(assets, "ASSETS", tmp_path)
    files = list(assets.VIEW_FILES["headview"])
    monkeypatch.setitem(assets.VIEW_FILES, "headview", (*files[:2], "extra/keys.js", "extra/keys.css", *files[2:]))
    page = random_run(layers=1, num_heads=1, n=3).to_html()
    assert "function keysMarker()" in page and ".hs-keys-marker" in page
    assert page.index("function keysMarker()") < page.index("const mountView = function")


def test_bad_choices_get_clear_errors():
    run = random_run(layers=2, num_heads=3, n=4)
    with pytest.raises(ValueError, match=r"no head \(2, 0\) in this run: layers 0 to 1, heads 0 to 2"):
        run.to_html(layer=2)
    with pytest.raises(ValueError, match="view must be one of"):
        run.to_html(view="grid")
    with pytest.raises(TypeError, match="cannot draw a dict"):
        mc.save_html({"attention": 1}, "x.html")


def test_a_cross_attention_view_has_the_source_along_the_top():
    rng = np.random.default_rng(1)
    target, source = ["a", "b", "c"], ["w", "x", "y", "z", "</s>"]
    weights = softmax_rows(rng.normal(size=(2, 2, 3, 5)))
    run = CrossAttentionRun(
        model_name="tiny-t5",
        family="t5",
        is_causal=False,
        tokens=target,
        attentions=weights,
        special_mask=np.zeros(3, dtype=bool),
        word_ids=np.arange(3),
        words=target,
        segment_ids=np.zeros(3, dtype=np.int64),
        key_tokens=source,
        key_raw_tokens=source,
        key_special_mask=np.array([False] * 4 + [True]),
        key_word_ids=np.array([0, 1, 2, 3, -1]),
        key_words=source[:4],
    )
    data = page_data(run.to_html(layer=1, head=1))
    assert data["tokens"] == target and data["key_tokens"] == source and not data["switchable"]
    np.testing.assert_allclose(heads.unpack(data)[1], weights[1], atol=STEP, rtol=0)


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    model = mc.load_model(str(build_tiny_llama(tmp_path_factory.mktemp("llama"), max_positions=64, randomised=True)))
    return run_long(model, "The cat sat on the mat because it was tired. " * 5)


def test_a_long_run_is_saved_as_its_deep_zoom(tiny_long, tmp_path):
    run = tiny_long
    data = page_data(run.to_html(layer=1, head=2))
    assert (data["view"], data["layer"], data["head"], data["region"]) == ("head", 1, 2, [0, run.num_tokens] * 2)
    # The values drawn are the run's exact weights (at token level here: the document is short).
    assert data["token_level"]
    np.testing.assert_allclose(
        long.decode_values(data), run.attention_block(1, 2, (0, run.num_tokens), (0, run.num_tokens)), atol=1e-7
    )
    model = page_data(run.to_html(tmp_path / "m.html", view="model").read_text())
    assert model["view"] == "model" and model["num_layers"] * model["num_heads"] == len(model["grid_tops"])


def test_show_needs_anywidget_and_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "anywidget", None)  # as if it were not installed
    monkeypatch.setattr(standalone, "_WIDGETS", {})
    with pytest.raises(ImportError, match=r"pip install anywidget==0\.11\.0"):
        mc.show(random_run())


def test_show_is_the_same_view_as_a_widget_with_the_static_page_beside_it(tiny_long):
    pytest.importorskip("anywidget")
    run = random_run(layers=2, num_heads=3, n=5)
    widget = mc.show(run, layer=1, head=2)
    assert widget.data == standalone.view_of(run, layer=1, head=2).data
    assert "const mountView = function" in widget._esm and "render({ model, el })" in widget._esm
    bundle = widget._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert "application/vnd.jupyter.widget-view+json" in data
    assert data["text/html"].startswith("<iframe srcdoc=") and "hs-data" in data["text/html"]
    # The long view asks the kernel for a region, as it asks the app's server: the region pooled from exact blocks.
    view = mc.show(tiny_long, layer=0, head=1)
    view.zoom = {"layer": 1, "head": 3, "r0": 2, "r1": 10, "c0": 0, "c1": 8, "reduce": "max", "view": "head"}
    assert (view.data["layer"], view.data["head"], view.data["region"]) == (1, 3, [2, 10, 0, 8])
    np.testing.assert_allclose(long.decode_values(view.data), tiny_long.attention_block(1, 3, (2, 10), (0, 8)))


def test_render_writes_a_saved_run_as_a_page(tmp_path, capsys):
    run = random_run(layers=2, num_heads=3, n=6)
    saved = run.save(tmp_path / "run.npz")
    out = tmp_path / "out" / "view.html"
    assert main(["render", "--run", str(saved), "--out", str(out), "--layer", "1", "--head", "2"]) == 0
    data = page_data(out.read_text(encoding="utf-8"))
    assert (data["layer"], data["head"]) == (1, 2)
    np.testing.assert_allclose(heads.unpack(data)[1], run.attentions[1], atol=STEP, rtol=0)
    assert "view.html" in capsys.readouterr().out
    # Usage errors are one line, exit status 2, before any work.
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a run")
    assert main(["render", "--run", str(bad), "--out", str(out)]) == 2
    assert "is not a run saved by `extract --out`" in capsys.readouterr().err
    assert main(["render", "--run", str(saved), "--out", str(tmp_path / "view.txt")]) == 2
    assert "--out must end in .html or .htm" in capsys.readouterr().err
    assert main(["render", "--run", str(saved), "--out", str(out), "--layer", "5"]) == 2
    assert "no head (5, 0) in this run" in capsys.readouterr().err


def test_the_packing_helpers_are_the_apps():
    # The app's view kit and the library's files are one: the same functions, the same colours.
    from ui import viewkit
    from ui.figures import common

    assert (
        viewkit.weight_base64 is packing.weight_base64
        and viewkit.palette()["colorscale"] is common.ATTENTION_COLORSCALE
    )


def test_signed_scores_have_one_colour_scale_in_the_app_and_in_the_files():
    # ColorBrewer's RdBu reversed (blue below zero, white at zero, red above), as Plotly ships it, worked out here.
    import plotly.colors

    from ui.figures.causal import head_score_map

    brewer = [plotly.colors.unlabel_rgb(colour) for colour in reversed(plotly.colors.diverging.RdBu)]
    expected = [[k / 10, "#{:02x}{:02x}{:02x}".format(*map(int, rgb))] for k, rgb in enumerate(brewer)]
    assert expected == palette.SIGNED_COLORSCALE
    figure = head_score_map(np.array([[-0.5, 0.2], [0.1, 0.4]]), signed=True)
    assert [list(stop) for stop in figure.data[0].colorscale] == expected and figure.data[0].zmid == 0
    table = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "effect": [-0.5, 0.2]})
    assert page_data(standalone.html(table))["signed_colorscale"] == expected  # the saved page paints with it


def test_a_head_table_is_a_grid_of_its_numbers_with_each_head_in_words():
    frame = pd.DataFrame(
        {
            "layer": [0, 0, 1, 1, 1],
            "head": [0, 2, 0, 1, 1],
            "score": [0.1, 0.5, 0.9, 0.2, 0.7],
            "count": [3, 4, 5, 6, 7],
            "role": ["local", "<b>x</b>", "sink", "delimiter", "previous"],
            "flag": [True, False, True, True, False],
        }
    )
    view = standalone.view_of(frame, column="count", layer=1, head=1)
    data = view.data
    assert view.view == "tableview" and data["columns"] == ["score", "count"] and data["column"] == "count"
    # One cell a head: a head without a row is empty (NaN); a head with two rows shows the larger value.
    expected = np.array([[0.1, np.nan, 0.5], [0.9, 0.7, np.nan]], dtype=np.float32)
    np.testing.assert_array_equal(tables.decode_column(data, "score"), expected)
    np.testing.assert_array_equal(tables.decode_column(data, "count")[1], [5, 7, np.nan])
    assert data["details"][1 * 3 + 1] == [
        "score 0.2, count 6, role delimiter, flag True",
        "score 0.7, count 7, role previous, flag False",
    ]
    page = view.to_html()
    assert page_data(page)["details"][2] == ["score 0.5, count 4, role <b>x</b>, flag False"]
    assert "<b>x</b>" not in page  # the table's text only as escaped JSON
    with pytest.raises(ValueError, match="no numeric column 'role'"):
        standalone.view_of(frame, column="role")
    with pytest.raises(ValueError, match="columns layer and head"):
        tables.pack_table(pd.DataFrame({"layer": []}))


def test_the_head_metrics_table_of_a_run_is_shown_as_its_grid():
    run = random_run(layers=2, num_heads=3, n=6)
    metrics = mc.head_metrics(run)
    data = page_data(standalone.html(metrics, column="entropy"))
    grid = tables.decode_column(data, "entropy")
    for row in metrics.itertuples():
        assert grid[row.layer, row.head] == np.float32(row.entropy)


def test_render_runs_a_text_through_a_model(tmp_path, capsys):
    from tests.model_fixtures import build_tiny_bert

    folder = build_tiny_bert(tmp_path / "bert", randomised=True)
    out = tmp_path / "view.html"
    code = main(["render", "--model", str(folder), "--text", "the cat sat", "--view", "model", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    data = page_data(out.read_text(encoding="utf-8"))
    reference = mc.load_model(str(folder)).run("the cat sat")
    assert data["view"] == "model" and data["tokens"] == reference.tokens
    for layer, weights in heads.unpack(data).items():
        np.testing.assert_allclose(weights, reference.attentions[layer], atol=STEP, rtol=0)
