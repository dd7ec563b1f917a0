"""Sinusoidal positional encoding (course notes 001) and the relative-shift property PE[p + k] = PE[p] @ M_k."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mha_core as mc
from mha_core.positional import channel_frequencies, relative_shift_check, sinusoidal_frequencies


def test_values_follow_the_seed_formula_entry_by_entry():
    pe = mc.sinusoidal_encoding(50, 16)
    assert pe.shape == (50, 16) and pe.dtype == np.float64
    for pos in range(50):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-12)


def test_known_values():
    pe = mc.sinusoidal_encoding(3, 4)
    # pos 1, pair 1: angle 1 / 10000^(2/4) = 0.01
    np.testing.assert_allclose(pe[0], [0.0, 1.0, 0.0, 1.0], atol=1e-15)
    np.testing.assert_allclose(pe[1], [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)], atol=1e-15)
    np.testing.assert_allclose(pe[2], [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)], atol=1e-15)


def test_odd_d_model_keeps_the_formula_and_drops_the_last_cosine():
    odd, even = mc.sinusoidal_encoding(20, 7), mc.sinusoidal_encoding(20, 8)
    assert odd.shape == (20, 7)
    pos = np.arange(20)
    np.testing.assert_allclose(odd[:, 6], np.sin(pos / 10000 ** (6 / 7)), atol=1e-12)
    np.testing.assert_allclose(odd[:, 1], np.cos(pos / 10000 ** (0 / 7)), atol=1e-12)
    assert not np.allclose(odd[:, 2], even[:, 2])  # frequencies depend on d_model


def test_frequencies_fall_from_fast_to_slow():
    w = sinusoidal_frequencies(8)
    np.testing.assert_allclose(w, [1.0, 10000**-0.25, 10000**-0.5, 10000**-0.75])
    np.testing.assert_allclose(channel_frequencies(5), [1.0, 1.0, 10000**-0.4, 10000**-0.4, 10000**-0.8])


@pytest.mark.parametrize("d_model", [2, 4, 16, 64, 512])
def test_relative_shift_holds_for_many_positions_and_offsets(d_model):
    pe = mc.sinusoidal_encoding(600, d_model)
    for k in (-100, -7, -1, 0, 1, 2, 3, 10, 50, 99, 250):
        shift = mc.relative_shift_matrix(k, d_model)
        p = np.arange(max(0, -k), min(600, 600 - k))
        np.testing.assert_allclose(pe[p] @ shift, pe[p + k], rtol=0, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(0, 2000), k=st.integers(-500, 500), half=st.integers(1, 64))
def test_relative_shift_property(p, k, half):
    d_model = 2 * half
    if p + k < 0:
        k = -p
    check = relative_shift_check(p, k, d_model)
    assert check["max_abs_diff"] < 1e-6
    np.testing.assert_allclose(check["pe_p_times_m_k"], check["pe_p_plus_k"], rtol=0, atol=1e-6)


def test_shift_matrices_are_rotations_that_compose():
    m3, m4, m7 = (mc.relative_shift_matrix(k, 10) for k in (3, 4, 7))
    np.testing.assert_allclose(m3 @ m4, m7, atol=1e-12)
    np.testing.assert_allclose(m3 @ m3.T, np.eye(10), atol=1e-12)
    np.testing.assert_allclose(mc.relative_shift_matrix(0, 10), np.eye(10), atol=0)
    np.testing.assert_allclose(mc.relative_shift_matrix(-3, 10), m3.T, atol=1e-12)
    assert np.count_nonzero(m3) == 2 * 10  # block-diagonal: 2x2 blocks only


def test_dot_similarity_depends_only_on_distance():
    pe = mc.sinusoidal_encoding(64, 32)
    table = mc.similarity_by_distance(pe)
    assert list(table.columns) == ["distance", "mean", "min", "max", "pairs"]
    assert len(table) == 64 and table["pairs"].tolist() == list(range(64, 0, -1))
    w = sinusoidal_frequencies(32)
    expected = np.array([np.cos(k * w).sum() for k in range(64)])  # sum_i cos(k w_i)
    np.testing.assert_allclose(table["mean"], expected, atol=1e-9)
    np.testing.assert_allclose(table["min"], table["max"], atol=1e-9)
    assert table["mean"].iloc[0] == pytest.approx(16.0)  # |PE[p]|^2 = number of pairs


def test_position_similarity_matrix_and_cosine():
    vectors = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(mc.position_similarity(vectors), vectors @ vectors.T)
    cosine = mc.position_similarity(vectors, metric="cosine")
    np.testing.assert_allclose(cosine[0, 1], 0.6)
    assert cosine[2, 2] == 0.0  # a zero vector stays zero instead of dividing by zero
    table = mc.similarity_by_distance(vectors, metric="cosine", max_distance=1)
    assert table["distance"].tolist() == [0, 1]
    np.testing.assert_allclose(table["mean"], [2 / 3, 0.3])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: mc.sinusoidal_encoding(0, 8), "num_positions"),
        (lambda: mc.sinusoidal_encoding(10, 0), "d_model"),
        (lambda: mc.sinusoidal_encoding(10.5, 8), "integer"),
        (lambda: mc.sinusoidal_encoding(True, 8), "integer"),
        (lambda: mc.relative_shift_matrix(1, 7), "even"),
        (lambda: mc.relative_shift_matrix(1.5, 8), "integer"),
        (lambda: relative_shift_check(2, -3, 8), "p \\+ k"),
        (lambda: relative_shift_check(5, 5, 8, num_positions=8), "below"),
        (lambda: mc.position_similarity(np.zeros(3)), "positions, dims"),
        (lambda: mc.position_similarity(np.zeros((3, 2)), metric="l2"), "metric"),
    ],
)
def test_bad_arguments_raise_value_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_wavelengths_grow_from_the_first_channel_to_the_last():
    from mha_core.positional import channel_wavelengths

    wavelengths = channel_wavelengths(64)
    assert wavelengths[0] == pytest.approx(2 * math.pi)
    assert wavelengths[62] == pytest.approx(2 * math.pi * 10000 ** (62 / 64))
    assert np.all(np.diff(wavelengths) >= 0)
