"""The Classroom page under AppTest: every figure, decoded from the browser payload, against mha_core."""

from __future__ import annotations

import numpy as np

import mha_core as mc
from mha_core import walkthrough as seed_example
from tests.page_helpers import plotly_elements, rerun, run_page
from ui import page_classroom

PAGE = "classroom"
REVEAL = "Reveal the answer"


def reveal_every_answer(app):
    """Switch on every step's "Reveal the answer" (the figures that give an answer away are drawn only then)."""
    switches = [t for t in app.toggle if t.label == REVEAL]
    assert switches
    for switch in switches:
        switch.set_value(True)
    return rerun(app)


def run_classroom(query: dict | None = None, **widgets):
    """The Classroom with every step on one page (``?all=1``) and every answer revealed, so every figure can
    be checked at once."""
    return reveal_every_answer(run_page(PAGE, {"all": "1", **(query or {})}, **widgets))


def heatmap(charts, key) -> np.ndarray:
    return np.asarray(charts[key]["data"][0]["z"], dtype=np.float64)


def assert_figures_match(charts, example, head=0):
    for h in range(example.num_heads):
        np.testing.assert_allclose(charts["cls_weights"]["data"][h]["z"], example.weights[h], rtol=0, atol=1e-12)
    assert len(charts["cls_weights"]["data"]) == example.num_heads
    np.testing.assert_allclose(heatmap(charts, "cls_x"), example.x, rtol=0, atol=1e-12)
    for name, array in (("q", example.q), ("k", example.k), ("v", example.v), ("head_output", example.heads)):
        np.testing.assert_allclose(heatmap(charts, f"cls_{name}"), array[head], rtol=0, atol=1e-9)
    np.testing.assert_allclose(heatmap(charts, "cls_w_q"), example.w_q[head], rtol=0, atol=1e-12)
    np.testing.assert_allclose(heatmap(charts, "cls_scores"), example.scores[head], rtol=0, atol=1e-9)
    np.testing.assert_allclose(heatmap(charts, "cls_concat"), example.concat, rtol=0, atol=1e-9)
    np.testing.assert_allclose(heatmap(charts, "cls_output"), example.output, rtol=0, atol=1e-9)


def test_the_words_example_is_readable_and_named():
    app = run_classroom()
    charts = plotly_elements(app)
    example = mc.readable_example()
    assert_figures_match(charts, example)
    # Words on the axes, and softmax far from one-hot: "sat" gives "cat" most, not all, of head 1's attention.
    assert charts["cls_scores"]["data"][0]["y"][2].startswith("sat")
    assert charts["cls_x"]["data"][0]["x"][1].startswith("noun")
    weights = example.weights[0, 2]
    assert int(np.argmax(weights)) == 1 and 0.5 < weights.max() < 0.7
    assert not example.is_one_hot
    # Every prediction has its answer, computed from the numbers on screen.
    assert any("which key will **sat** score highest" in m.value for m in app.markdown)
    assert any("**Answer:** **cat**, with score 1.5" in m.value for m in app.markdown)
    # The page speaks of "a popular tutorial", never of seeds.
    for element in [*app.markdown, *app.caption, *app.info, *app.warning, *app.header]:
        assert "seed" not in str(element.value).lower()


def steps_shown(app) -> list[str]:
    return [h.value for h in app.header if h.value.startswith("Step")]


def test_one_step_per_screen_with_next_and_back():
    app = run_page(PAGE)
    assert steps_shown(app) == ["Step 1. The input and the weights"]
    app.button(key="cls_next").click().run()
    app.button(key="cls_next").click().run()
    assert steps_shown(app) == ["Step 3. Scores: how well does each query match each key?"]
    assert app.query_params["step"] == "3" and "cls_scores" not in plotly_elements(app)  # not before the reveal
    app.button(key="cls_back").click().run()
    assert steps_shown(app) == ["Step 2. Project: queries, keys and values"]
    # A link opens the step it names; a step that does not exist says so and opens step 1.
    assert steps_shown(run_page(PAGE, {"step": "8"})) == ["Step 8. Why divide by the square root of d_k?"]
    wrong = run_page(PAGE, {"step": "99"})
    assert steps_shown(wrong) == ["Step 1. The input and the weights"] and wrong.warning
    # The last step is reachable by its link (the step setting's range is the page's steps).
    assert steps_shown(run_page(PAGE, {"step": str(page_classroom.STEP_COUNT)})) == [
        "Step 10. Is attention explanation?"
    ]


def test_tutorial_example_step_by_step():
    app = run_classroom({"numbers": "tutorial"})
    charts = plotly_elements(app)
    example = mc.worked_example()
    assert_figures_match(charts, example)
    assert heatmap(charts, "cls_q")[0, 0] == 20.4
    np.testing.assert_array_equal(heatmap(charts, "cls_tutorial_printed"), seed_example.TUTORIAL_PRINTED["Q1"])
    np.testing.assert_allclose(
        heatmap(charts, "cls_tutorial_difference"), example.q[0] - seed_example.TUTORIAL_PRINTED["Q1"], atol=1e-9
    )
    counts = next(d.value for d in app.dataframe if "multiplications" in d.value.columns)
    assert counts["multiplications"].tolist() == [768, 128, 32, 32, 128, 256]
    assert any("768 + 128 + 128 + 256 = 1280" in latex.value for latex in app.latex)
    assert any("1152" in warning.value for warning in app.warning)
    discrepancies = next(d.value for d in app.dataframe if "printed_value" in d.value.columns)
    assert len(discrepancies) == len(mc.printed_discrepancies())
    trace = next(d.value for d in app.dataframe if "axes" in d.value.columns)
    assert trace.set_index("tensor").loc["Q", "shape"] == "[1, 2, 4, 4]"
    # The worked score is one of the token the step asks about: the last token's query (the tutorial has no words)
    # against its own key, from the printed inputs and weights: (X W^Q)[3] . (X W^K)[3] / sqrt(d_k).
    q = example.x @ example.w_q[0]
    k = example.x @ example.w_k[0]
    worked = float(q[3] @ k[3] / np.sqrt(q.shape[1]))
    formula = next(latex.value for latex in app.latex if r"q_{\text{token 4}}" in latex.value)
    assert formula.strip("$\n").endswith(f"= {worked:.6g}") and r"k_{\text{token 4}}" in formula

    saturation = mc.softmax_saturation(n_keys=16)
    dot = saturation[saturation["score"] == "dot"]
    trace = next(t for t in charts["cls_saturation"]["data"] if t["name"] == "dot product" and t["showlegend"])
    np.testing.assert_allclose(trace["y"], dot["max_weight"], rtol=0, atol=1e-12)


def test_printed_matrix_choice_and_head_two():
    app = run_classroom({"numbers": "tutorial"}, cls_printed="V1")
    np.testing.assert_array_equal(
        heatmap(plotly_elements(app), "cls_tutorial_printed"), seed_example.TUTORIAL_PRINTED["V1"]
    )
    app = run_classroom({"numbers": "tutorial"}, cls_head=1)
    charts = plotly_elements(app)
    assert_figures_match(charts, mc.worked_example(), head=1)
    np.testing.assert_allclose(heatmap(charts, "cls_w_k"), seed_example.CHOSEN_W2_K, rtol=0, atol=1e-12)
    assert "cls_tutorial_printed" not in charts  # the course notes print values for head 1 only


def test_score_and_causal_controls_change_the_numbers():
    app = run_classroom({"numbers": "tutorial"}, cls_score="cosine", cls_causal=True)
    charts = plotly_elements(app)
    example = mc.worked_example(score="cosine", causal=True)
    assert_figures_match(charts, example)
    assert not np.allclose(example.weights, mc.worked_example().weights)
    assert charts["cls_scores"]["data"][0]["text"][0][1] == "masked"


def test_random_example_controls():
    app = run_classroom(
        {"numbers": "random"},
        cls_seq_len=6,
        cls_d_model=12,
        cls_heads=3,
        cls_seed=7,
        cls_score="dot",
        cls_causal=True,
        cls_head=2,
    )
    charts = plotly_elements(app)
    example = mc.random_example(6, 12, 3, 7, "dot", True)
    assert_figures_match(charts, example, head=2)
    assert "cls_tutorial_printed" not in charts
    assert not any("printed_value" in d.value.columns for d in app.dataframe)


def test_impossible_settings_show_a_message_not_a_traceback():
    app = run_page(PAGE, {"all": "1", "numbers": "random"}, cls_d_model=12, cls_heads=8)
    assert any("divisible" in error.value for error in app.error)
    assert not plotly_elements(app)


def test_large_sizes_drop_cell_numbers_but_keep_values():
    app = run_classroom({"numbers": "random"}, cls_d_model=128, cls_seq_len=12, cls_heads=4)
    charts = plotly_elements(app)
    example = mc.random_example(12, 128, 4, 0, "scaled", False)
    w_o = charts["cls_w_o"]["data"][0]
    assert w_o.get("text") is None and w_o["z"].dtype == np.float32
    np.testing.assert_allclose(w_o["z"], example.w_o, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(charts["cls_weights"]["data"][3]["z"], example.weights[3], rtol=0, atol=1e-12)
    assert charts["cls_w_o"]["layout"]["height"] <= 520


def page_content(app) -> str:
    """Everything the page sent to the browser, as text: every element's message, tables as CSV."""
    parts = []
    for node in app.main:
        if node.type == "arrow_data_frame":
            parts.append(node.value.to_csv())
        elif isinstance(getattr(node, "value", None), str):  # text as written (the message escapes quotes)
            parts.append(node.value)
        elif getattr(node, "proto", None) is not None:
            parts.append(str(node.proto))
    return "\n".join(parts)


# Per step: the charts that hold its answer, and a text only its answer has (the words example, head 1).
def hidden_answers(example) -> dict[int, tuple[list[str], list[str]]]:
    focus = 2  # "sat"
    weights = example.weights[0, focus]
    top = int(np.argmax(weights))
    counts = example.operation_counts.set_index("step")["multiplications"]
    unscaled = mc.softmax_saturation(n_keys=16)
    unscaled = unscaled[(unscaled["score"] == "dot") & (unscaled["d_k"] == unscaled["d_k"].max())]["max_weight"]
    longest = int(np.argmax(np.linalg.norm(example.q[0], axis=1)))
    return {
        1: ([], [f"= **{example.seq_len * example.d_k}**"]),
        2: ([], [f"**{example.token_labels[longest]}**, length {np.linalg.norm(example.q[0, longest]):.3g}"]),
        3: (["cls_scores"], ["**cat**, with score 1.5", "1.50"]),
        4: (["cls_weights"], [f"{weights.max():.2f} of it"]),
        5: (["cls_head_output"], [f"**{example.token_labels[top]}**'s: it carries weight {weights[top]:.2f}"]),
        6: ([], ["layers can be stacked"]),
        7: ([], [f"{counts['projections']} multiplications", f"= {example.total_matmul_multiplications}"]),
        8: (["cls_saturation"], [f"About **{unscaled.iloc[0]:.2f}**"]),
    }


def test_every_answer_stays_hidden_until_revealed():
    """Predict, then reveal: on every step nothing that gives the answer away (its chart, its numbers, its
    words) reaches the browser before "Reveal the answer", and all of it does after."""
    example = mc.readable_example()
    for step, (charts, answer_texts) in hidden_answers(example).items():
        app = run_page(PAGE, {"step": str(step)})
        before = page_content(app)
        assert "Predict:" in before, step
        assert "Answer:" not in before, step
        assert not set(charts) & set(plotly_elements(app)), step
        for text in answer_texts:
            assert text not in before, (step, text)
        switches = [t for t in app.toggle if t.label == REVEAL]
        assert len(switches) == 1 and switches[0].value is False, step
        switches[0].set_value(True)
        rerun(app)
        after = page_content(app)
        assert "Answer:" in after, step
        assert set(charts) <= set(plotly_elements(app)), step
        for text in answer_texts:
            assert text in after, (step, text)
        if step == 3:  # the revealed matrix is the scores, its dark cell sat -> cat
            scores = heatmap(plotly_elements(app), "cls_scores")
            np.testing.assert_allclose(scores, example.scores[0], rtol=0, atol=1e-9)
            assert int(np.argmax(scores[2])) == 1 and round(scores[2, 1], 2) == 1.5
        if step == 7:
            shown = next(d.value for d in app.dataframe if "multiplications" in d.value.columns)
            assert shown["multiplications"].tolist() == example.operation_counts["multiplications"].tolist()


def test_a_revealed_answer_is_hidden_again_for_a_new_question():
    """Another head asks another question: its answer starts hidden, and so does a step opened again."""
    app = run_page(PAGE, {"step": "3"})
    next(t for t in app.toggle if t.label == REVEAL).set_value(True)
    rerun(app)
    assert "cls_scores" in plotly_elements(app)
    app.selectbox(key="cls_head").set_value(1)
    rerun(app)
    assert "cls_scores" not in plotly_elements(app)
    assert [t.value for t in app.toggle if t.label == REVEAL] == [False]
    next(t for t in app.toggle if t.label == REVEAL).set_value(True)
    rerun(app)
    np.testing.assert_allclose(
        heatmap(plotly_elements(app), "cls_scores"), mc.readable_example().scores[1], rtol=0, atol=1e-9
    )
    app.button(key="cls_next").click().run()
    app.button(key="cls_back").click().run()
    assert "cls_scores" not in plotly_elements(app)
    assert [t.value for t in app.toggle if t.label == REVEAL] == [False]


def test_the_worked_score_is_the_one_the_question_asks_about():
    """Step 3 asks which key *sat* scores highest: the worked formula is one of sat's scores (its query against its
    own key), never "The" times "The"; its numbers are recomputed here from X and the weights."""
    app = run_page(PAGE, {"step": "3"})
    example = mc.readable_example()
    assert any("**sat**" in str(m.value) for m in app.markdown)  # the question is about sat
    formula = next(latex.value for latex in app.latex if r"\cdot" in latex.value and "=" in latex.value)
    assert r"q_{\text{sat}}" in formula and r"k_{\text{sat}}" in formula and "The" not in formula
    q = example.x @ example.w_q[0]
    k = example.x @ example.w_k[0]
    terms = "".join(f"({q[2, i]:.4g})({k[2, i]:.4g})" for i in range(2))
    assert terms in formula.replace(" + ", "")  # sat's query and key, term by term
    worked = float(q[2] @ k[2] / np.sqrt(q.shape[1]))
    assert formula.strip("$\n").endswith(f"= {worked:.6g}") and worked != 0  # a score that shows something


def test_a_revealed_answer_is_in_the_address():
    """A copied link at a revealed step opens revealed: the reveal is in the address (``reveal=``, the question's
    digest), a new question drops it, and a link whose reveal is not a list of digests reveals nothing."""
    app = run_page(PAGE, {"step": "3"})
    assert "reveal" not in app.query_params
    next(t for t in app.toggle if t.label == REVEAL).set_value(True)
    rerun(app)
    link = dict(app.query_params)
    assert len(link["reveal"]) == 12 and link["step"] == "3"
    copied = run_page(PAGE, link)  # another browser opens the copied link
    assert [t.value for t in copied.toggle if t.label == REVEAL] == [True]
    np.testing.assert_allclose(
        heatmap(plotly_elements(copied), "cls_scores"), mc.readable_example().scores[0], rtol=0, atol=1e-9
    )
    assert copied.query_params["reveal"] == link["reveal"]
    # The same link with head 2 asks another question: nothing revealed, nothing left in the address.
    other = run_page(PAGE, {**link, "follow": "1"})
    assert [t.value for t in other.toggle if t.label == REVEAL] == [False] and "reveal" not in other.query_params
    copied.button(key="cls_next").click().run()
    assert "reveal" not in copied.query_params and "cls_weights" not in plotly_elements(copied)
    # Every step on one page keeps each revealed answer.
    every = run_page(PAGE, {"all": "1"})
    for switch in [t for t in every.toggle if t.label == REVEAL][:2]:
        switch.set_value(True)
    rerun(every)
    assert len(every.query_params["reveal"].split(",")) == 2
    again = run_page(PAGE, dict(every.query_params))
    assert [t.value for t in again.toggle if t.label == REVEAL].count(True) == 2
    wrong = run_page(PAGE, {"step": "3", "reveal": "[x](http://example.com)"})
    assert [t.value for t in wrong.toggle if t.label == REVEAL] == [False]
    assert any("is not a list of revealed answers" in w.value for w in wrong.warning)
    assert not any("](http" in w.value for w in wrong.warning)  # the link's text is shown inert
