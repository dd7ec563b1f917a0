"""The Deeper page's settings (``DeeperSettings``, declared once: ``ui.page_settings``). ``pages/deeper.py``
draws them; its views are ``ui.figures.deeper``."""

from __future__ import annotations

from dataclasses import dataclass

from mha_core.interventions import search
from ui.page_settings import PageSettings, setting

SEARCH_KINDS = {"representation": "representation (cosine)", "attention": "attention pattern"}
SEARCH_SIZES = (50, 100, 200, 500)


@dataclass(frozen=True)
class DeeperSettings(PageSettings):
    """Every setting of the Deeper page. Its layer (the last one unless asked), head and query token follow
    the model and the sentence."""

    layer: int = setting("deeper_layer", "deeper_layer", "layer", None, label="After layer")
    flow: bool = setting("deeper_flow", "flow", "flag", False, label="Also compute attention flow (max-flow)")
    head: int = setting("deeper_head", "deeper_head", "head", 0, label="Head")
    query: int = setting("deeper_query", "query", "choice", 1, label="Query token")
    search_kind: str = setting(
        "deeper_search_kind",
        "search_by",
        "choice",
        search.KINDS[0],
        label="Compare tokens by",
        options={kind: SEARCH_KINDS[kind] for kind in search.KINDS},
    )
    search_size: int = setting(
        "deeper_search_size",
        "searched",
        "choice",
        100,
        label="Sentences searched",
        options={size: str(size) for size in SEARCH_SIZES},
    )
    search: bool = setting(
        "deeper_search",
        "search",
        "flag",
        False,
        label="Search the corpus",
        help="Indexing takes a few seconds the first time.",
    )
