"""The lab's figures on numbers: what goes in is what the browser gets."""

from __future__ import annotations

import numpy as np

from mha_core.lab import history_frame
from ui.figures.lab import loss_curve, score_curves


def history():
    records = [
        {
            "step": step,
            "seconds": 0.1 * step,
            "loss": 3.0 - 0.01 * step,
            "repeated_loss": 3.5 if step < 100 else 0.4,
            "scores": {
                "previous_token": np.array([[0.1 + step / 1000, 0.1], [0.1, 0.1]]),
                "induction": np.array([[0.05, 0.05], [0.05, 0.05 + step / 250]]),
            },
        }
        for step in (0, 50, 100, 150)
    ]
    return history_frame(records)


def test_loss_curve_has_both_losses_per_step_and_marks_the_phase_change():
    fig = loss_curve(history(), phase_step=100)
    loss, repeated = fig.data
    np.testing.assert_array_equal(loss.x, [0, 50, 100, 150])
    np.testing.assert_allclose(loss.y, [3.0, 2.5, 2.0, 1.5])
    np.testing.assert_allclose(repeated.y, [3.5, 3.5, 0.4, 0.4])
    (line,) = fig.layout.shapes
    assert line.x0 == line.x1 == 100
    assert "step 100" in fig.layout.annotations[0].text
    assert not loss_curve(history(), phase_step=None).layout.shapes


def test_score_curves_draw_every_head_and_stress_the_leader():
    fig = score_curves(history(), "induction", threshold=0.4)
    assert [trace.name for trace in fig.data] == ["L0H0", "L0H1", "L1H0", "L1H1"]
    leader = fig.data[3]
    np.testing.assert_allclose(leader.y, [0.05, 0.25, 0.45, 0.65])
    np.testing.assert_array_equal(leader.x, [0, 50, 100, 150])
    assert leader.line.width > fig.data[0].line.width
    assert fig.layout.shapes[0].y0 == 0.4
    previous = score_curves(history(), "previous_token")
    np.testing.assert_allclose(previous.data[0].y, [0.1, 0.15, 0.2, 0.25])
    assert previous.data[0].line.width == 3 and not previous.layout.shapes
