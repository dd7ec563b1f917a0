"""The Lab page under AppTest: a real (short) training, its curves decoded from the browser payload."""

from __future__ import annotations

import re

import numpy as np
import pytest

from mha_core.lab import ROLE_THRESHOLD, phase_change_step, role_appearance
from tests.model_fixtures import build_tiny_bert
from tests.page_helpers import head_view_data, plotly_elements, rerun, run_page, trained
from ui.lab_runner import appearance_table

FASTEST = "2x2"  # pages/lab.py SIZES: 2 layers x 2 heads, d_model 32


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(build_tiny_bert(tmp_path_factory.mktemp("tiny-bert")))


def test_training_on_the_page_draws_the_labs_own_numbers(tiny_bert):
    app = run_page("lab", {"model": tiny_bert}, lab_task="positional", lab_size=FASTEST, lab_steps=100)
    assert not plotly_elements(app)  # nothing trained yet: no curves
    runner = app.session_state["lab_runner"]
    assert runner.status == "new" and runner.config.task == "positional" and runner.config.num_heads == 2
    runner = trained(app)
    assert runner.lab.step == 100
    charts = plotly_elements(app)
    history = runner.lab.history()
    per_step = history.drop_duplicates("step")
    loss, repeated = charts["lab_loss"]["data"]
    np.testing.assert_allclose(repeated["y"], per_step["repeated_loss"], rtol=1e-6)
    np.testing.assert_array_equal(loss["x"], [0, 25, 50, 75, 100])
    np.testing.assert_allclose(loss["y"], per_step["loss"], rtol=1e-6)
    # Every head's offset score curve is the lab's history for that head.
    curves = {trace["name"]: trace for trace in charts["lab_scores_offset_-3"]["data"]}
    assert sorted(curves) == ["L0H0", "L0H1", "L1H0", "L1H1"]
    expected = history[(history["layer"] == 1) & (history["head"] == 0)]["score"]
    np.testing.assert_allclose(curves["L1H0"]["y"], expected, rtol=1e-6)
    # The attention grid shows the example's attention of the last scored step.
    grid = charts["lab_attention"]["data"][0]["z"]
    attention = runner.lab.example_attention
    n = attention.shape[-1]
    tile = np.asarray(grid[:n, :n], dtype=float)
    np.testing.assert_array_equal(np.isnan(tile), np.triu(np.ones((n, n), dtype=bool), k=1))  # the causal mask
    np.testing.assert_allclose(np.nan_to_num(tile), attention[0, 0], atol=1e-6)
    # The task is learnt: loss far below its start; the ablation metrics are the lab's own.
    assert per_step["loss"].iloc[-1] < 0.5 * per_step["loss"].iloc[0]
    metrics = {m.label: m for m in app.metric}
    assert len(metrics) == 2
    ablated_label = next(label for label in metrics if "off" in label)
    layer, head = int(ablated_label.split("layer ")[1].split()[0]), int(ablated_label.split("head ")[1].split()[0])
    result = runner.lab.ablation(layer, head)
    assert metrics[ablated_label].value == f"{result['ablated_loss']:.3f}"
    assert result["ablated_loss"] > result["loss"]
    assert phase_change_step(history) is None or "lab_loss" in charts  # positional task: no phase line drawn
    assert not charts["lab_loss"]["layout"].get("shapes")
    # The table of which head took each role is the lab's own, one type per column (Arrow-compatible).
    expected_table = appearance_table(role_appearance(history), ROLE_THRESHOLD)
    assert len(app.dataframe) == 1
    assert app.dataframe[0].value.to_dict("records") == expected_table.to_dict("records")
    # The trained model opens in Explore: its head view is the lab's own attention on the fixed example.
    app.button(key="lab_open_explore").click()
    rerun(app)
    assert [t.value for t in app.title] == ["Explore"]
    assert any("trained on the Lab page" in info.value for info in app.info)
    one_head = head_view_data(app)["enlarged_head"]  # one byte a weight: within half a step of 1/255
    expected = runner.lab.run(0).attentions[0, 0]
    np.testing.assert_allclose(one_head, expected, atol=0.5 / 255 + 1e-6)
    # A caption is markdown: the run's summary reaches it escaped (``engine\=lab`` shows as engine=lab).
    shown = [re.sub(r"\\(.)", r"\1", c.value) for c in app.caption]
    assert any("engine=lab" in c for c in shown)
    app.button(key="explore_close_lab").click()
    rerun(app)
    assert not any("trained on the Lab page" in info.value for info in app.info)
    app.switch_page("../pages/lab.py")
    rerun(app)
    # Reset: a fresh model, nothing drawn.
    app.button(key="lab_reset").click()
    rerun(app)
    assert app.session_state["lab_runner"].lab.step == 0 and not plotly_elements(app)


def test_changed_settings_ask_for_a_reset_once_trained(tiny_bert):
    app = run_page("lab", {"model": tiny_bert}, lab_size=FASTEST, lab_steps=100)
    app.button(key="lab_start").click()
    rerun(app)
    app.button(key="lab_pause").click()
    rerun(app)
    runner = app.session_state["lab_runner"]
    runner.join(timeout=60)
    assert runner.status in ("paused", "done")
    app.selectbox(key="lab_task").set_value("largest")
    rerun(app)
    assert app.session_state["lab_runner"] is runner  # the trained model is kept until Reset
    assert any("press **Reset**" in caption.value for caption in app.caption)
