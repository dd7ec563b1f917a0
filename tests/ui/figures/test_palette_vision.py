"""The one colour scale stays readable for the three common colour-vision deficiencies.

Each colour is simulated as a protanope, a deuteranope and a tritanope sees it (Machado, Oliveira & Fernandes 2009,
severity 1, applied in linear RGB), then compared in CIELAB (CIE76 delta-E; about 2.3 is a just-noticeable
difference). The matrices, the sRGB transfer function and the Lab conversion are written here from their
published definitions, independently of the app's code, which only supplies the colour stops.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ui.figures.common import ATTENTION_COLORSCALE, DIFFERENCE_COLORSCALE, SEGMENT_COLOR
from ui.viewkit import palette

MACHADO = {
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]],
    "normal vision": np.eye(3).tolist(),
}


def srgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[k : k + 2], 16) for k in (1, 3, 5)]) / 255.0


def on_scale(scale, t: float) -> np.ndarray:
    """The colour at t of a Plotly colour scale: linear between the two stops around t (as Plotly draws it)."""
    for (a, low), (b, high) in itertools.pairwise(scale):
        if a <= t <= b:
            f = (t - a) / (b - a)
            return srgb(low) + f * (srgb(high) - srgb(low))
    raise AssertionError(f"{t} is outside the scale")


def seen_as(colour: np.ndarray, deficiency: str) -> np.ndarray:
    """The CIELAB colour a viewer with ``deficiency`` sees for an sRGB colour."""
    linear = np.where(colour <= 0.04045, colour / 12.92, ((colour + 0.055) / 1.055) ** 2.4)
    simulated = np.clip(np.array(MACHADO[deficiency]) @ linear, 0.0, 1.0)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ simulated
    xyz = xyz / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def delta_e(a: np.ndarray, b: np.ndarray, deficiency: str) -> float:
    return float(np.linalg.norm(seen_as(a, deficiency) - seen_as(b, deficiency)))


DEFICIENCIES = list(MACHADO)


def test_the_views_paint_with_the_scale_checked_here():
    assert palette()["colorscale"] == ATTENTION_COLORSCALE


@pytest.mark.parametrize("deficiency", DEFICIENCIES)
def test_weights_a_tenth_apart_stay_distinguishable(deficiency):
    # Eleven weights 0, 0.1, ..., 1: each next one at least 5 delta-E away (twice a just-noticeable difference),
    # and the scale's lightness falls all the way, so order is read from lightness alone.
    weights = np.linspace(0.0, 1.0, 11)
    colours = [on_scale(ATTENTION_COLORSCALE, float(w)) for w in weights]
    steps = [delta_e(a, b, deficiency) for a, b in itertools.pairwise(colours)]
    assert min(steps) >= 5.0, [round(s, 1) for s in steps]
    lightness = [seen_as(c, deficiency)[0] for c in colours]
    assert all(later < earlier for earlier, later in itertools.pairwise(lightness)), lightness


@pytest.mark.parametrize("deficiency", DEFICIENCIES)
def test_a_difference_and_its_opposite_look_different(deficiency):
    # The difference map's two sides: +d and -d must not collapse into one colour.
    for d, least in ((0.1, 10.0), (0.3, 40.0), (1.0, 60.0)):
        plus = on_scale(DIFFERENCE_COLORSCALE, 0.5 + d / 2)
        minus = on_scale(DIFFERENCE_COLORSCALE, 0.5 - d / 2)
        assert delta_e(plus, minus, deficiency) >= least, (d, deficiency)


@pytest.mark.parametrize("deficiency", DEFICIENCIES)
def test_the_sentence_boundary_stands_out_from_every_weight(deficiency):
    boundary = srgb(SEGMENT_COLOR)
    nearest = min(
        delta_e(boundary, on_scale(ATTENTION_COLORSCALE, float(w)), deficiency) for w in np.linspace(0, 1, 101)
    )
    assert nearest >= 20.0, nearest
