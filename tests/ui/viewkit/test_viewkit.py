"""The view kit (ui/viewkit): one colour for one weight in the app's Plotly figures, the head view and the long view;
the views' scripts built with the kit's module in them; the packing helpers on numbers.

The colours: Python computes each weight's colour from a figure's own colour scale (``plotly.colors``, the linear
RGB interpolation Plotly uses), node computes it with the views' own JavaScript (``ui/viewkit/viewkit.js``,
``headview.js``'s ``headPixels`` on the bytes ``headview.pack`` sends, ``longview.js``'s ``valuePixels`` on the
values and palette ``longview.pack_layer`` sends), and the two must agree.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import numpy as np
import plotly.colors
import pytest

import mha_core as mc
from mha_core.models.long import run_long
from mha_core.views import assets
from tests.conftest import ROOT, require
from tests.model_fixtures import build_tiny_llama
from ui import figures, headview, longview, viewkit
from ui.figures.common import MASKED_COLOR

NODE = shutil.which("node")


def node_pixels(head: dict, long: dict) -> tuple[np.ndarray, np.ndarray]:
    """The head view's pixels of layer 0, head 0 of ``head`` (``headview.pack``'s data) and the long view's pixels
    of ``long`` (``longview.pack_layer``'s data, its zoomed values), as RGB ``[rows, cols, 3]``."""
    script = """
import { readFileSync } from "node:fs";
import { headPixels } from "./mha_core/views/assets/headview/headview.js";
import { valuePixels } from "./mha_core/views/assets/longview/longview.js";
import { decodeBytes, decodeFloats, paletteOf } from "./mha_core/views/assets/viewkit/viewkit.js";
const { head, long } = JSON.parse(readFileSync(0, "utf-8"));
const palette = paletteOf(head);
const nq = head.tokens.length, nk = (head.key_tokens || head.tokens).length;
const s = { ...palette, bytes: decodeBytes(head.weights), nq, nk, heads: head.num_heads, causal: head.causal,
            layerIndex: new Map(head.layers_sent.map((l, i) => [l, i])) };
const headPx = Array.from(headPixels(s, head.layers_sent[0], 0));
const longPx = Array.from(valuePixels(decodeFloats(long.values), long.row_edges, long.col_edges, long.causal,
                                      paletteOf(long), 1));
process.stdout.write(JSON.stringify({ headPx, longPx }));
"""
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        input=json.dumps({"head": head, "long": long}),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    out = json.loads(done.stdout)
    rgb = lambda px, rows: np.asarray(px, dtype=float).reshape(rows, -1, 4)[..., :3]  # noqa: E731
    return rgb(out["headPx"], len(head["tokens"])), rgb(out["longPx"], len(long["row_edges"]) - 1)


def figure_colours(fig, weights: np.ndarray) -> np.ndarray:
    """RGB of ``weights`` on the first trace's colour scale of ``fig`` (its zmin..zmax), as Plotly interpolates."""
    trace = fig.data[0]
    scale = [[float(at), colour] for at, colour in trace.colorscale]
    t = np.clip((np.asarray(weights, dtype=float) - trace.zmin) / (trace.zmax - trace.zmin), 0, 1)
    sampled = plotly.colors.sample_colorscale(scale, list(t.ravel()), colortype="tuple")  # channels in 0..1
    return (np.asarray(sampled) * 255).reshape(*t.shape, 3)


@pytest.fixture(scope="module")
def tiny_long(tmp_path_factory):
    model = mc.load_model(str(build_tiny_llama(tmp_path_factory.mktemp("llama"), max_positions=64, randomised=True)))
    return run_long(model, "The cat sat on the mat because it was tired. " * 8)


def test_one_weight_is_one_colour_in_the_figures_the_head_view_and_the_long_view(tiny_long):
    require(NODE is not None, "node (apt-get install nodejs)")
    run = tiny_long
    n = min(24, run.num_tokens)
    # The long view at token level: a region of exact weights of a decoder (the upper triangle hidden).
    long = longview.pack_layer(run, longview.Zoom(1, 2, 0, n, 0, n))
    assert long["token_level"] and long["causal"] and long["colour"] == "absolute"
    values = longview.decode_values(long).astype(np.float32)
    # The weights of the issue (0.390: indigo in the head view, pale blue in the old long view; 0.0014: white, once
    # painted the darkest colour at token level) put in the lower triangle, with every step of the scale.
    rows, cols = np.tril_indices(n, k=-2)
    values[rows, cols] = np.linspace(0, 1, len(rows), dtype=np.float32)
    values[1, 0], values[2, 1] = 0.390, 0.0014
    long["values"] = viewkit.float32_base64(values)
    tokens = [f"t{i}" for i in range(n)]
    head = headview.pack(values[None, None], tokens, 0, 0, causal=True)
    head_rgb, long_rgb = node_pixels(head, long)
    visible = ~np.triu(np.ones((n, n), dtype=bool), k=1)
    # The app's Plotly figures of one head, a layer's heads and the whole model, computed here.
    for fig in (
        figures.head_heatmap(values, tokens, tokens, causal=True),
        figures.head_grid(values[None], tokens, causal=True),
        figures.model_grid(values[None, None], tokens, causal=True),
    ):
        # The head view sends a weight as round(w * 255) and the long view paints step round(w * 255): each paints
        # Plotly's colour of that step, rounded to whole channel values...
        stepped = figure_colours(fig, viewkit.steps(values) / 255)
        np.testing.assert_allclose(head_rgb[visible], stepped[visible], atol=0.5 + 1e-9)
        np.testing.assert_allclose(long_rgb[visible], stepped[visible], atol=0.5 + 1e-9)
        # ...which is within 2 of Plotly's colour of the weight itself on any channel: the scale's steepest stretch
        # (white to #dbe4ff over 0.05) moves 2.8 a step, so half a step is 1.4, and the rounding 0.5.
        expected = figure_colours(fig, values)
        np.testing.assert_allclose(head_rgb[visible], expected[visible], atol=2)
        np.testing.assert_allclose(long_rgb[visible], expected[visible], atol=2)
        shapes = [shape for shape in fig.layout.shapes if shape.fillcolor]
        assert shapes and all(shape.fillcolor == MASKED_COLOR for shape in shapes)  # the causal mask's grey
    np.testing.assert_array_equal(head_rgb[visible], long_rgb[visible])  # the same steps, the same colours
    masked = tuple(int(MASKED_COLOR[k : k + 2], 16) for k in (1, 3, 5))
    assert (head_rgb[~visible] == masked).all() and (long_rgb[~visible] == masked).all()
    # The two weights: 0.390 is the scale's indigo in both views (between #4263eb at 0.35 and #2b3a9c at
    # 0.6), 0.0014 is white to within a unit (not the darkest colour).
    indigo = figure_colours(figures.head_heatmap(values, tokens, tokens), np.float32([0.390]))[0]
    np.testing.assert_allclose(long_rgb[1, 0], indigo, atol=2)
    np.testing.assert_allclose(head_rgb[1, 0], indigo, atol=2)
    assert long_rgb[2, 1].min() >= 254 and head_rgb[2, 1].min() >= 254


def test_a_view_script_is_one_module_with_the_kit_in_it(tmp_path, monkeypatch):
    require(NODE is not None, "node (apt-get install nodejs)")
    kit_names = {"colorBar", "decodeBytes", "lookupTable", "paletteOf"}
    for view in ("headview", "longview"):
        text = assets.script(view)
        assert not any(line.startswith("import ") for line in text.splitlines())  # the import line is gone...
        assert all(f"function {name}(" in text for name in kit_names)  # ...and the kit is in its place
        # The one module the browser gets loads and exports the view's default function (as Streamlit calls it).
        path = tmp_path / f"{view}.mjs"
        path.write_text(text, encoding="utf-8")
        done = subprocess.run(
            [
                NODE,
                "--input-type=module",
                "-e",
                f"const m = await import({json.dumps(str(path))}); console.log(typeof m.default)",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.stdout.strip() == "function", done.stderr
        css = assets.style(view)
        kit_css = (assets.ASSETS / "viewkit" / "viewkit.css").read_text()
        assert css.startswith(kit_css) and (assets.ASSETS / view / f"{view}.css").read_text() in css
    # A file added to a view's list is in its one module, in the list's order, its import line taken out.
    for folder in ("kit", "view"):
        (tmp_path / folder).mkdir()
    (tmp_path / "kit" / "a.js").write_text("export const A = 1;\n", encoding="utf-8")
    (tmp_path / "kit" / "b.js").write_text('import { A } from "../kit/a.js";\nexport function b() { return A + 1; }\n')
    (tmp_path / "view" / "v.js").write_text(
        'import { b } from "../kit/b.js";\nimport { A } from "../kit/a.js";\nexport default function () { return b() + A; }\n'
    )
    monkeypatch.setattr(assets, "ASSETS", tmp_path)
    monkeypatch.setattr(assets, "VIEW_FILES", {"v": ("kit/a.js", "kit/b.js", "view/v.js"), "w": ("view/v.js",)})
    module = tmp_path / "v.mjs"
    module.write_text(assets.script("v"), encoding="utf-8")
    done = subprocess.run(
        [
            NODE,
            "--input-type=module",
            "-e",
            f"const m = await import({json.dumps(str(module))}); console.log(m.default())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "3", done.stderr
    with pytest.raises(RuntimeError, match=r"imports kit/b\.js, which is not before it"):
        assets.script("w")
    (tmp_path / "kit" / "a.js").write_text("const A = 1;\nexport { A };\n", encoding="utf-8")
    with pytest.raises(RuntimeError, match="one by one"):
        assets.script("v")
    with pytest.raises(ValueError, match="there is no view 'x'"):
        assets.script("x")


def test_packing_helpers_round_trip():
    weights = np.array([[0.0, 0.0014, 0.390, 0.5, 1.0, np.nan]], dtype=np.float32)
    packed = viewkit.weight_base64(weights)
    raw = np.frombuffer(base64.b64decode(packed), dtype=np.uint8)
    assert raw.tolist() == [0, 0, 99, 128, 255, 0]  # round(w * 255): 0.357 -> 0, 99.45 -> 99, 127.5 -> 128
    np.testing.assert_array_equal(viewkit.weight_decoded(packed, (1, 6)), np.float32([[0, 0, 99, 128, 255, 0]]) / 255)
    # Halves go up, as the browser rounds (numpy's rint would send 126.5 to 126): float32 of 126.5 / 255 times 255.
    assert viewkit.steps(np.float32([126.5 / 255, 0.5 / 255, 2.0, -1.0])).tolist() == [127, 1, 255, 0]
    images = np.array([[[0.0, 0.002], [0.001, 0.0005]], [[0.0, 0.0], [0.0, 0.0]]], dtype=np.float32)
    packed, tops = viewkit.scaled_bytes(images)
    assert tops == [pytest.approx(0.002), 0.0]
    back = viewkit.unscaled(packed, tops, (2, 2))
    np.testing.assert_allclose(back, images, atol=0.5 / 255 * 0.002 + 1e-9)  # small values keep their precision
    values = np.array([[1e-7, 0.0014], [0.39, 1.0]], dtype=np.float32)
    np.testing.assert_array_equal(viewkit.float32_decoded(viewkit.float32_base64(values), (2, 2)), values)
    assert viewkit.palette()["colorscale"] == figures.ATTENTION_COLORSCALE
