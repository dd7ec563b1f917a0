"""Figures every screen of a class draws alike are built once per server, language and display
(``ui.widgets.charts.show_chart(..., memo=...)``): the Classroom's matrices under AppTest, two screens in English
and one in Chinese, with the figure builder counted; and ``memo_key`` tells contents apart."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.page_helpers import open_app, plotly_elements
from ui.figures import teaching
from ui.widgets import charts


def test_memo_key_is_the_content_of_arrays_and_tables():
    a = np.arange(12.0).reshape(3, 4)
    assert charts.memo_key("m", a=a, b={"x": 1}) == charts.memo_key("m", b={"x": 1}, a=a.copy())
    assert charts.memo_key("m", a=a) != charts.memo_key("m", a=a + 1e-9)
    assert charts.memo_key("m", a=a) != charts.memo_key("m", a=a.reshape(4, 3))
    assert charts.memo_key("m", a=a) != charts.memo_key("m", a=a.astype(np.float32))
    assert charts.memo_key("m", a=a) != charts.memo_key("n", a=a)
    frame = pd.DataFrame({"d_k": [8, 16], "weight": [0.5, 0.9]})
    other = frame.copy()
    other.loc[1, "weight"] = 0.91
    assert charts.memo_key("t", t=frame) == charts.memo_key("t", t=frame.copy()) != charts.memo_key("t", t=other)
    hash(charts.memo_key("m", a=a, t=frame, items=[a, "x"], d={"k": a}))  # usable as a dictionary key


def specs(app) -> dict[str, str]:
    return {element.key: element.proto.spec for element in app.get("plotly_chart")}


@pytest.mark.slow
def test_the_classroom_builds_a_matrix_once_for_every_screen_of_one_language_and_display(monkeypatch):
    charts._memo.clear()
    built = []
    original = teaching.matrix_figure

    def counted(*args, **kwargs):
        built.append(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(teaching, "matrix_figure", counted)
    link = {"step": "2", "source": "readable"}
    first = open_app("classroom", link)
    assert not first.exception and not first.error
    matrices = len(built)
    assert matrices >= 3  # step 2 draws W_Q, W_K, W_V and Q, K, V
    second = open_app("classroom", link)  # another screen, the same step
    assert len(built) == matrices
    assert specs(second) == specs(first)  # the same figures, byte for byte

    chinese = open_app("classroom", {**link, "lang": "zh"})
    assert len(built) == 2 * matrices  # built again for the screen's language (a chart's words are translated)
    assert specs(chinese).keys() == specs(first).keys()

    presented = open_app("classroom", {**link, "present": "1"})
    assert len(built) == 3 * matrices  # and again for a projector's larger text
    # Text 1.6 times the default 12 px there, left to the default here: the memo did not hand a projector's
    # figure to a desk's screen, or the reverse.
    assert [spec["layout"]["font"]["size"] for spec in plotly_elements(presented).values()] == [19] * len(specs(first))
    assert all("size" not in spec["layout"].get("font", {}) for spec in plotly_elements(first).values())


def test_a_remembered_figure_is_copied_into_a_dict_once_and_shows_what_a_fresh_one_does():
    """``st.plotly_chart`` copies a figure into a dict on every call; a remembered figure (shared, never changed) gives
    the dict made when it was built, equal to the dict of the same figure built afresh, and Streamlit's spec of it
    is the fresh figure's spec."""
    import plotly.io as pio
    import plotly.tools

    charts._memo.clear()
    values = np.array([[0.5, -1.25], [2.0, 0.125]])

    def build():
        return teaching.matrix_figure(values, "W", row_names=["a", "b"], col_names=None, row_label="token")

    memo = charts.memo_key("frozen-test", values=values)
    fig = charts._remembered(build, memo)
    assert charts._remembered(build, memo) is fig
    first = fig.to_dict()
    assert fig.to_dict() is first  # made once
    fresh = charts._prepared(build()).to_dict()
    assert pio.to_json(first, validate=False) == pio.to_json(fresh, validate=False)
    shown = plotly.tools.return_figure_from_figure_or_data(fig, validate_figure=True)  # what st.plotly_chart does
    assert pio.to_json(shown, validate=False) == pio.to_json(fresh, validate=False)


def test_screens_that_ask_while_a_figure_is_built_wait_for_it_and_a_failed_build_is_built_again():
    """A class's screens reach a step together: the first builds the figure, the others wait and get the same one
    (one build, not one per screen); when the first build fails, a waiting screen builds its own."""
    import threading

    charts._memo.clear()
    values = np.array([[1.0, 2.0]])
    started, release, builds = threading.Event(), threading.Event(), []

    def slow_build():
        builds.append(threading.current_thread().name)
        started.set()
        assert release.wait(10)
        return teaching.matrix_figure(values, "W", row_names=["a"], col_names=None, row_label="token")

    memo = charts.memo_key("single-flight", values=values)
    got = {}

    def screen(name):
        got[name] = charts._remembered(slow_build, memo)

    first = threading.Thread(target=screen, args=("first",), name="first")
    first.start()
    assert started.wait(10)
    others = [threading.Thread(target=screen, args=(f"s{i}",), name=f"s{i}") for i in range(4)]
    for thread in others:
        thread.start()
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert builds == ["first"]
    assert len(got) == 5 and all(fig is got["first"] for fig in got.values())
    assert not charts._building  # nothing left marked as being built

    failing = charts.memo_key("single-flight-fails", values=values)
    started.clear()
    failed = []

    def broken():
        started.set()
        assert release.wait(10)
        raise RuntimeError("no figure")

    def screen_of_broken():
        try:
            charts._remembered(broken, failing)
        except RuntimeError as error:
            failed.append(str(error))

    release.clear()
    first = threading.Thread(target=screen_of_broken)
    first.start()
    assert started.wait(10)
    waiting = {}
    second = threading.Thread(
        target=lambda: waiting.setdefault("fig", charts._remembered(lambda: slow_build(), failing)), name="second"
    )
    second.start()
    release.set()
    first.join(10)
    second.join(10)
    assert failed == ["no figure"]
    assert waiting["fig"].to_dict()["data"][0]["z"] is not None and builds[-1] == "second"
    assert not charts._building
