"""The score decomposition's heatmap (ui/figures/decomposition.py): the cells, their labels and numbers, and a colour
scale symmetric about 0, checked on the figure's data."""

from __future__ import annotations

import numpy as np

from ui.figures.decomposition import decomposition_heatmap


def test_cells_labels_and_a_scale_symmetric_about_zero():
    matrix = np.array([[0.5, -2.0, 0.0], [1.25, 0.1, -0.3]])
    fig = decomposition_heatmap(matrix, ["token embedding", "3-1"], ["biases", "MLP 0", "<other>"], title="t")
    trace = fig.data[0]
    np.testing.assert_array_equal(np.asarray(trace.z), matrix)
    assert (trace.zmin, trace.zmax) == (-2.0, 2.0)  # the largest part's magnitude on both sides
    assert [list(row) for row in trace.text] == [["+0.50", "-2.00", "+0.00"], ["+1.25", "+0.10", "-0.30"]]
    assert list(fig.layout.yaxis.ticktext) == ["token embedding", "3-1"]
    assert list(fig.layout.xaxis.ticktext) == ["biases", "MLP 0", "&lt;other&gt;"]  # shown literally
    assert list(trace.customdata[1][0]) == ["3-1", "biases"]


def test_all_zero_parts_still_draw():
    fig = decomposition_heatmap(np.zeros((1, 1)), ["biases"], ["biases"])
    assert (fig.data[0].zmin, fig.data[0].zmax) == (-1.0, 1.0)
