"""The joint query-key section's helpers (ui/widgets/joint_qk.py): the clicked point's row, its sentence with the
token marked and escaped, the link to Explore, the axes' titles."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pandas as pd

from mha_core.interventions.joint_qk import JointQK
from ui.widgets.joint_qk import axis_titles, clicked_row, explore_link, marked_context


def test_clicked_row_reads_the_first_customdata_in_either_form():
    assert clicked_row({"selection": {"points": [{"customdata": [4, 0, 3]}]}}, 10) == 4
    assert clicked_row({"selection": {"points": [{"customdata": {"0": 7, "1": 1, "2": 2}}]}}, 10) == 7
    assert clicked_row({"selection": {"points": []}}, 10) is None
    assert clicked_row({"selection": {"points": [{"customdata": [12, 0, 0]}]}}, 10) is None  # an older view's point
    assert clicked_row(None, 10) is None


def test_the_context_marks_the_token_and_escapes_every_token():
    text = marked_context(["[CLS]", "*bold*", "<b>x</b>", "[SEP]"], 1)
    assert text == r"\[CLS\] **[\*bold\*]** \<b\>x\</b\> \[SEP\]"


def test_the_explore_link_opens_the_sentence_on_the_head():
    link = explore_link("minilm", "A & B? yes", (3, 7), focus=2)
    parsed = urlparse(link)
    assert parsed.path == "/explore"
    assert parse_qs(parsed.query) == {
        "model": ["minilm"],
        "text": ["A & B? yes"],
        "layer": ["3"],
        "head": ["7"],
        "focus": ["2"],
    }
    assert "focus" not in parse_qs(urlparse(explore_link("minilm", "x", (0, 0), None)).query)


def view(method: str, explained) -> JointQK:
    return JointQK("m", 0, 0, method, True, pd.DataFrame(), explained, 1.0, 0.0, (), ())


def test_axis_titles():
    assert axis_titles(view("pca", (0.234, 0.1))) == ("PC 1 (23% of the variance)", "PC 2 (10%)")
    assert axis_titles(view("tsne", None)) == ("t-SNE 1", "t-SNE 2")
