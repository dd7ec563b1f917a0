"""The view kit: what every attention view drawn in the browser shares, on the server's side and in the browser's.

Explore's head view, model view and cross-attention view (``ui.headview``) and the long-document view
(``ui.longview``) are Streamlit components v2 whose scripts import one JavaScript module, ``viewkit.js`` beside this
file (the colour scale, the masked colour, decoding of packed arrays, element helpers, the colour bar). This
module packs the arrays they send (``weight_base64``, ``scaled_bytes``, ``float32_base64``, and back: ``weight_decoded``, ``unscaled``,
``float32_decoded``), names the one palette
(``palette``: the app's Plotly figures' colour scale, so one weight is one colour in every view) and registers a
view (``component``) with its script and style read from its package folder.

Why the kit is put into each script here rather than imported by the browser: Streamlit loads a component's inline
script as one module from a ``blob:`` address, from which a relative ``import`` cannot resolve; a component may
instead name a file of an ``asset_dir`` declared in ``[tool.streamlit.component]`` of an installed distribution's
``pyproject.toml``, which Streamlit finds only when the distribution's name is an importable package (``headscope``
is not: its packages are ``mha_core`` and ``ui``), and which it then serves file by file over HTTP. So ``script``
replaces a view's one ``import { ... } from "../viewkit/viewkit.js";`` line (the line node's test runner resolves,
``tests/js/``) with the kit's text: one module, read from the package folder, nothing fetched.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np

from ui.figures.common import ATTENTION_COLORSCALE, MASKED_COLOR, SEGMENT_COLOR

HERE = Path(__file__).resolve().parent
KIT_JS = HERE / "viewkit.js"
KIT_CSS = HERE / "viewkit.css"
LEVELS = 255  # a weight w in [0, 1] is sent as round(w * 255): off by at most 0.5 / 255

# The one line by which a view's script imports the kit (names only, no renaming).
KIT_IMPORT = re.compile(r'^import \{[\w\s,]*\} from "\.\./viewkit/viewkit\.js";[ \t]*\n', flags=re.MULTILINE)


def palette() -> dict:
    """The colours every view paints with, as its data carries them: the weights' colour scale (the app's Plotly
    figures' ``ATTENTION_COLORSCALE``), the colour of cells a causal mask hides, a sentence pair's boundary."""
    return {"colorscale": ATTENTION_COLORSCALE, "masked_color": MASKED_COLOR, "segment_color": SEGMENT_COLOR}


def steps(values: np.ndarray) -> np.ndarray:
    """The colour scale's step of each value in [0, 1]: floor(v * 255 + 0.5) in float32 arithmetic, NaN as 0. The
    browser's ``levelOf`` computes the same (``Math.fround`` after each operation), so a weight sent as a byte (the
    head view) and a weight sent as a float (the long view) get one colour. In place on one float32 copy: 3 M
    weights (MiniLM's layer at 512 tokens) in about 60 ms on this machine."""
    work = np.array(values, dtype=np.float32)  # a copy, worked on in place
    np.nan_to_num(work, copy=False, nan=0.0)
    np.clip(work, 0.0, 1.0, out=work)
    work *= LEVELS
    work += 0.5
    np.floor(work, out=work)
    return work.astype(np.uint8)


def weight_base64(weights: np.ndarray) -> str:
    """Weights in [0, 1] (any shape) as one byte a weight (their ``steps``, C order), in base64."""
    return base64.b64encode(steps(weights).tobytes()).decode("ascii")


def weight_decoded(raw: str, shape: tuple[int, ...]) -> np.ndarray:
    """``weight_base64``'s weights back as the browser decodes them: step / 255, float32, of ``shape``."""
    data = np.frombuffer(base64.b64decode(raw), dtype=np.uint8).reshape(shape)
    return data.astype(np.float32) / np.float32(LEVELS)


def scaled_bytes(images: np.ndarray) -> tuple[str, list[float]]:
    """``[k, a, b]`` non-negative values as base64 bytes, each ``[a, b]`` image scaled to its own largest value
    (small values keep their precision), and those largest values: the browser gets back byte / 255 * top."""
    values = np.nan_to_num(np.asarray(images, dtype=np.float32), nan=0.0)
    tops = values.reshape(len(values), -1).max(axis=1)
    scaled = values / np.where(tops > 0, tops, 1.0)[:, None, None]
    return weight_base64(scaled), [float(t) for t in tops]


def unscaled(raw: str, tops: list[float], shape: tuple[int, int]) -> np.ndarray:
    """``scaled_bytes``' images back as the browser decodes them: ``[k, a, b]`` float32."""
    return weight_decoded(raw, (len(tops), *shape)) * np.asarray(tops, dtype=np.float32)[:, None, None]


def float32_base64(values: np.ndarray) -> str:
    """Values as little-endian float32, C order, in base64 (exact)."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<f4").tobytes()).decode("ascii")


def float32_decoded(raw: str, shape: tuple[int, ...]) -> np.ndarray:
    """``float32_base64``'s values back."""
    return np.frombuffer(base64.b64decode(raw), dtype="<f4").reshape(shape)


def kit_module() -> str:
    """The kit's text as it goes into a view's script: its declarations without ``export``."""
    text = KIT_JS.read_text(encoding="utf-8")
    if re.search(r"^export (default|\{)", text, flags=re.MULTILINE):
        raise RuntimeError("viewkit.js exports its declarations one by one (export function / const), nothing else")
    return re.sub(r"^export ", "", text, flags=re.MULTILINE)


def script(path: Path) -> str:
    """A view's script (an ES module importing the kit by one line) as one module with the kit in it."""
    text = path.read_text(encoding="utf-8")
    found = KIT_IMPORT.findall(text)
    if len(found) != 1:
        raise RuntimeError(f"{path.name} must import the view kit by exactly one line, found {len(found)}")
    return KIT_IMPORT.sub(lambda _: kit_module() + "\n", text, count=1)


def style(path: Path) -> str:
    """A view's style sheet after the kit's."""
    return KIT_CSS.read_text(encoding="utf-8") + "\n" + path.read_text(encoding="utf-8")


def component(name: str, folder: Path, stem: str, root_class: str):
    """Register a view (Streamlit components v2) whose script and style are ``folder/stem.js`` and ``stem.css`` with
    the kit, mounted on ``<div class="root_class">`` in the page's own DOM (no shadow root: the tests and benchmarks
    read its data attributes). Call once per process."""
    import streamlit as st  # streamlit: the packing functions above import without it

    return st.components.v2.component(
        name,
        html=f'<div class="{root_class}"></div>',
        css=style(folder / f"{stem}.css"),
        js=script(folder / f"{stem}.js"),
        isolate_styles=False,
    )
