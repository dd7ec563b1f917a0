"""The Positions page's settings (``PositionsSettings``, declared once: ``ui.page_settings``) and the dimensions
its wave chart draws unless asked. ``pages/positions.py`` draws them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mha_core import positional
from ui.page_settings import PageSettings, setting

D_MODELS = (8, 16, 32, 64, 128, 256, 512)
SIMILARITY_LABELS = {"dot": "dot product", "cosine": "cosine"}


def default_channels(d_model: int) -> list[int]:
    """The dimensions the waves show unless asked: the first pair, a quarter, half way, and the last pair."""
    return sorted({0, 1, d_model // 4, d_model // 2, d_model - 2})


@dataclass(frozen=True)
class PositionsSettings(PageSettings):
    """Every setting of the Positions page. The dimensions drawn are those of ``d_model``; the offset k starts
    at -p; the learned table's positions follow the model."""

    positions: int = setting("pe_positions", "positions", "number", 100, label="Positions", minimum=8, maximum=512)
    d_model: int = setting(
        "pe_d_model", "d_model", "choice", 64, label="d_model (dimensions)", options={d: str(d) for d in D_MODELS}
    )
    channels: Sequence[int] = setting(
        "pe_channels", "dims", "choices", default_channels(64), label="Dimensions to draw"
    )
    metric: str = setting(
        "pe_metric",
        "similarity",
        "choice",
        positional.SIMILARITY_METRICS[0],
        label="Similarity",
        options={name: SIMILARITY_LABELS[name] for name in positional.SIMILARITY_METRICS},
    )
    p: int = setting("pe_p", "p", "number", 5, label="Position p", minimum=0, maximum=100_000)
    k: int = setting("pe_k", "k", "number", 3, label="Offset k", maximum=100_000)
    learned: int = setting("pe_learned_positions", "learned", "number", 128, label="Positions to compare", minimum=2)
