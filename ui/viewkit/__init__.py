"""The view kit in the app: every attention view drawn in the browser registered as a Streamlit component.

The views' scripts and styles, the one list of the files each view needs (``VIEW_FILES``) and the packing of their
arrays are the library's (``mha_core.views``: ``assets``, ``packing``, ``palette``), so that a saved file and a
notebook widget draw with the same files as the app; this module re-exports the packing helpers under their old names
and registers a view (``component``).

Why the kit is put into each script rather than imported by the browser: Streamlit loads a component's inline
script as one module from a ``blob:`` address, from which a relative ``import`` cannot resolve; a component may
instead name a file of an ``asset_dir`` declared in ``[tool.streamlit.component]`` of an installed distribution's
``pyproject.toml``, which Streamlit finds only when the distribution's name is an importable package (``headscope``
is not: its packages are ``mha_core`` and ``ui``), and which it then serves file by file over HTTP. So
``mha_core.views.assets.script`` makes the view's files one module, read from the package folder, nothing fetched.
"""

from __future__ import annotations

from mha_core.views.assets import ASSETS, VIEW_FILES, script, style
from mha_core.views.packing import (
    LEVELS,
    float32_base64,
    float32_decoded,
    scaled_bytes,
    steps,
    unscaled,
    weight_base64,
    weight_decoded,
)
from mha_core.views.palette import palette

__all__ = [
    "ASSETS",
    "LEVELS",
    "VIEW_FILES",
    "component",
    "float32_base64",
    "float32_decoded",
    "palette",
    "scaled_bytes",
    "script",
    "steps",
    "style",
    "unscaled",
    "weight_base64",
    "weight_decoded",
]


def component(name: str, view: str, root_class: str):
    """Register a view (Streamlit components v2) whose script and style are its files (``VIEW_FILES[view]``),
    mounted on ``<div class="root_class">`` in the page's own DOM (no shadow root: the tests and benchmarks read its
    data attributes). Call once per process."""
    import streamlit as st  # streamlit: the packing functions above import without it

    return st.components.v2.component(
        name,
        html=f'<div class="{root_class}"></div>',
        css=style(view),
        js=script(view),
        isolate_styles=False,
    )
