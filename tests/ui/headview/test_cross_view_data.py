"""The cross view's data: ``headview.pack`` of two token lists (target rows, source columns) decoded back, and
the BertViz-style lines with the source's tokens on the right."""

from __future__ import annotations

import numpy as np
import pytest

from ui import figures, headview
from ui.figures.common import plotly_text

TARGET = ["<pad>", "Das", "Haus", "</s>"]
SOURCE = ["The", "house", "is", "small", ".", "</s>"]


def cross_weights(seed: int = 0) -> np.ndarray:
    weights = np.random.default_rng(seed).random((2, 3, len(TARGET), len(SOURCE))).astype(np.float32)
    return weights / weights.sum(-1, keepdims=True)


def test_pack_and_unpack_two_token_lists():
    weights = cross_weights()
    data = headview.pack(weights, TARGET, 1, 2, key_tokens=SOURCE, switchable=True)
    assert data["tokens"] == TARGET and data["key_tokens"] == SOURCE
    unpacked = headview.unpack(data)
    assert sorted(unpacked) == [0, 1] and unpacked[1].shape == (3, len(TARGET), len(SOURCE))
    np.testing.assert_allclose(unpacked[1], weights[1], atol=0.5 / 255 + 1e-7)
    # Self-attention data of the same numbers is another sentence's data: its signature differs.
    square = headview.pack(weights[..., :4], TARGET, 1, 2)
    assert square["key_tokens"] is None and square["sig"] != data["sig"]
    with pytest.raises(ValueError, match="do not fit"):
        headview.pack(weights, TARGET, 0, 0, key_tokens=SOURCE[:-1])


def test_lines_put_the_source_on_the_right():
    weights = cross_weights(1)[0, 0]
    fig = figures.attention_lines(weights, TARGET, key_tokens=SOURCE, strongest=None, min_weight=0.0)
    texts = [trace for trace in fig.data if trace.mode == "text"]
    # Token text is escaped for Plotly (it renders HTML): "<pad>" is shown as written, never as a tag.
    assert list(texts[0].text) == [plotly_text(t) for t in TARGET]
    assert list(texts[1].text) == [plotly_text(t) for t in SOURCE] and texts[1].text[0] == "The"
    assert list(texts[1].x) == [1.0] * len(SOURCE)
    lines = [trace for trace in fig.data if trace.mode == "lines"]
    # One segment (x 0 -> 1) per weight drawn: every target row to every source column.
    segments = sum(list(trace.x).count(0.0) for trace in lines)
    assert segments == weights.size
