"""The Explore page's settings (``ExploreSettings``, declared once: ``ui.page_settings``): the view (every head of
a layer, or the whole model), the enlarged head's shape, and the query token the lines focus on. The sentence,
the layer and head, and the word and special-token toggles are the app's shared ones (``ui.address``,
``ui.widgets.pickers``)."""

from __future__ import annotations

from dataclasses import dataclass

from ui import headview
from ui.page_settings import PageSettings, setting

ALL_TOKENS = -1  # the lines' focus on every query token (a selectbox shows None as no choice at all)


@dataclass(frozen=True)
class ExploreSettings(PageSettings):
    """Every setting of the Explore page's head view. The focus's choices are the sentence's tokens."""

    view: str = setting("explore_view", "view", "choice", "head", options={v: v for v in headview.VIEWS})
    shape: str = setting("head_shape", "shape", "choice", "heatmap", options={s: s for s in headview.SHAPES})
    focus: int = setting("focus_token", "focus", "choice", ALL_TOKENS, label="Focus on query token")


def focus_choices(tokens) -> dict[int, str]:
    """The lines' focus: every token, or one query token, as the selectbox shows them."""
    return {ALL_TOKENS: "all tokens", **{i: f"{i}: {token}" for i, token in enumerate(tokens)}}
