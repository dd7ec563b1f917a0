"""The Head roles page's joint query-key view under AppTest: off until switched on; on (from the link), its figure
carries exactly the library's projection of the chosen head over the first sentences of the UD EWT dev split, with
the explained variance on the axes; the colouring switch and the settings are in the address."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from mha_core.analysis.syntax import ud_ewt_dev
from tests.model_fixtures import build_tiny_bert
from tests.page_helpers import open_app, plotly_elements, rerun, widget
from ui.widgets.joint_qk import APP_MAX_POINTS, CHART_KEY


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert-joint-qk"), randomised=True))


def drawn_points(figure) -> np.ndarray:
    """Every point's (row, x, y), in the order of the rows."""
    rows = []
    for trace in figure["data"]:
        custom = np.asarray(trace["customdata"])
        rows += [(int(c[0]), float(x), float(y)) for c, x, y in zip(custom, trace["x"], trace["y"])]
    return np.asarray(sorted(rows))


def test_off_by_default(tiny_bert):
    app = open_app("roles", {"model": tiny_bert, "layer": "1", "head": "2"})
    assert not app.error, [e.value for e in app.error]
    assert CHART_KEY not in plotly_elements(app)
    assert any(subheader.value == "Its queries and keys over a corpus" for subheader in app.subheader)
    assert any("AttentionViz" in caption.value for caption in app.caption)


def test_the_section_draws_the_librarys_projection(tiny_bert):
    app = open_app("roles", {"model": tiny_bert, "layer": "1", "head": "2", "qk": "1", "qk_sentences": "3"})
    assert not app.error, [e.value for e in app.error]
    view = mc.joint_qk(mc.load_model(tiny_bert), ud_ewt_dev(3), 1, 2, max_points=APP_MAX_POINTS)
    figure = plotly_elements(app)[CHART_KEY]
    points = drawn_points(figure)
    np.testing.assert_array_equal(points[:, 0], np.arange(len(view.table)))
    size = np.abs(view.table[["x", "y"]].to_numpy()).max()
    np.testing.assert_allclose(points[:, 1:], view.table[["x", "y"]].to_numpy(), atol=1e-5 * size)
    assert [trace["name"] for trace in figure["data"]] == ["queries", "keys"]
    first, second = view.explained_variance
    assert figure["layout"]["xaxis"]["title"]["text"] == f"PC 1 ({first:.0%} of the variance)"
    assert figure["layout"]["yaxis"]["title"]["text"] == f"PC 2 ({second:.0%})"
    assert any("Circles are queries, diamonds keys" in caption.value for caption in app.caption)
    # Coloured by POS tag: one trace per tag of the trees, and the address follows.
    widget(app, "roles_qk_colour").set_value("pos")
    rerun(app)
    assert app.query_params["qk_colour"] in ("pos", ["pos"])
    names = [trace["name"] for trace in plotly_elements(app)[CHART_KEY]["data"]]
    tags = set(view.table["pos"]) - {""}
    assert set(names) == tags | {"special / untagged"}
    # t-SNE: every point, axes without a variance.
    widget(app, "roles_qk_method").set_value("tsne")
    rerun(app)
    assert not app.error, [e.value for e in app.error]
    figure = plotly_elements(app)[CHART_KEY]
    assert len(drawn_points(figure)) == len(view.table)
    assert figure["layout"]["xaxis"]["title"]["text"] == "t-SNE 1"


def test_the_points_cap_cuts_the_corpus_and_says_so(tiny_bert):
    app = open_app("roles", {"model": tiny_bert, "layer": "0", "head": "0", "qk": "1", "qk_sentences": "200"})
    assert not app.error, [e.value for e in app.error]
    model = mc.load_model(tiny_bert)
    lengths = np.cumsum([len(model.encode(sentence.words)) for sentence in ud_ewt_dev(200)])
    assert lengths[-1] > APP_MAX_POINTS  # the cap is reached
    used = int(np.searchsorted(lengths, APP_MAX_POINTS)) + 1  # the sentence the cap falls in is the last, cut
    assert len(drawn_points(plotly_elements(app)[CHART_KEY])) == 2 * APP_MAX_POINTS
    assert any(
        caption.value.startswith(f"The first {used} sentences only: the view keeps at most {APP_MAX_POINTS:,}")
        for caption in app.caption
    )
