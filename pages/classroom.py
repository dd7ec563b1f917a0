"""Classroom: multi-head attention by hand, one step per screen, every number computed live by mha_core.

Three sets of numbers: four words with features you can name (the default), a popular tutorial's worked
example (its printed numbers checked against the arithmetic), or random numbers of any size. Each step
asks the class to predict something before it reveals the answer, computed from the numbers on screen; which
answers are revealed is in the address (``reveal=``), so a copied link opens them revealed.
"""

import functools

import numpy as np
import streamlit as st

import mha_core as mc
from mha_core import walkthrough
from ui import address, attribution_view, class_questions, computations, decoder_lesson, follow, shell
from ui import page_classroom as page
from ui.figures import teaching
from ui.i18n import Text, t
from ui.i18n import text as tt
from ui.page_classroom import ClassroomSettings
from ui.widgets import charts, messages

shell.in_app()  # a page's own address opened on a new server: run it inside app.py
S = ClassroomSettings.declarations()

st.title(t("Classroom: multi-head attention by hand"))


# ---- the numbers --------------------------------------------------------------------------------------
@st.cache_resource(max_entries=64, show_spinner=False)
def numbers(source: str, seq_len: int, d_model: int, num_heads: int, seed: int, score: str, causal: bool):
    """The example, computed once per setting for every screen (read only here; a class's screens all ask)."""
    if source == "random":
        return mc.random_example(seq_len, d_model, num_heads, seed, score, causal)
    if source == "tutorial":
        return mc.worked_example(score=score, causal=causal)
    return mc.readable_example(score=score, causal=causal)


# In presentation mode this folds away, so the step itself fills the screen.
with st.expander(
    t("The numbers, the head to follow, the settings"), expanded=not charts.presenting(), icon=":material/tune:"
):
    source = S["source"].segmented()
    st.markdown(t("**Sizes, score function, causal mask**"))
    cols = st.columns(4)
    random_numbers = source == "random"
    seq_len = S["seq_len"].number(cols[0].slider, disabled=not random_numbers)
    d_model = S["d_model"].select(cols[1].select_slider, disabled=not random_numbers)
    num_heads = S["heads"].select(cols[2].select_slider, disabled=not random_numbers)
    seed = S["seed"].number(cols[3].number_input, disabled=not random_numbers)
    cols = st.columns([3, 2])
    score = S["score"].select(cols[0].radio, horizontal=True)
    causal = S["causal"].toggle(container=cols[1])
    st.caption(
        t(
            {
                "words": "Each word is a vector of 8 numbers you can name: what kind of word it is (dimensions 1-4) and "
                "where it stands (5-8). Head 1 asks 'who does it?' (a verb looks for a noun); head 2 asks 'what came "
                "just before?'.",
                "tutorial": "The numbers of a widely read tutorial's worked example (4 tokens, d_model 8, 2 heads). Its "
                "printed inputs are so large that softmax puts all the weight on one token; and where its printed "
                "results differ from the arithmetic, both are shown and the arithmetic wins.",
                "random": "Random inputs and weights of any size: try a large d_model without scaling to see softmax "
                "saturate.",
            }[source]
        )
    )

    try:
        example = numbers(source, seq_len, d_model, num_heads, int(seed), score, causal)
    except ValueError as error:
        st.error(
            t(
                "These settings do not work: {reason}. Pick a number of heads that divides d_model.",
                reason=messages.md_escape(error),
            )
        )
        st.stop()

    names = example.token_labels
    features = example.notes.get("features")
    all_steps = S["all_steps"].toggle()
    heads = page.head_choices(example.num_heads)
    head = S["head"].select(st.selectbox, list(heads), format_func=heads.get)
h = head + 1
masked = ~example.keep_mask
# The token the questions ask about: "sat" in the words, else the last token.
focus = 2 if source == "words" else example.seq_len - 1
visible_keys = np.flatnonzero(example.keep_mask[focus])


# The revealed answers, in the address as ``reveal=`` (each question's digest): a copied link opens them revealed.
revealed_now: list[str] = []  # the digests of the answers revealed on this screen in this run


def revealed_in_link() -> set[str]:
    raw = address.query_value(page.REVEAL_URL_KEY)
    try:
        return page.revealed_in(raw)
    except ValueError as error:
        st.warning(
            t(
                "The link's {key}={value} is not {reason}; nothing is revealed.",
                key=page.REVEAL_URL_KEY,
                value=messages.md_escape(raw[:40]),
                reason=messages.md_escape(error),
            )
        )
        return set()


def keep_reveals_in_url() -> None:
    address.write_query(**{page.REVEAL_URL_KEY: ",".join(revealed_now) or None})


def ask(question: Text | str, answer: Text | str, shows_answer=None, options=None, correct: int | None = None) -> None:
    """A question to answer before looking; its answer, and ``shows_answer()`` (what would give the answer
    away: the matrix, table or chart that holds it), drawn only once "Reveal the answer" is switched on.
    Nothing of them reaches the browser before (a collapsed expander would send them, hidden). The switch
    belongs to this question and these numbers: another step, head or setting asks again, unrevealed; it starts
    as the link says (``reveal=``) and is kept there. ``options`` (with the ``correct`` one): in a class, every
    screen answers by a click and the teacher reveals (``ui.class_questions``). A question and its answer are
    ``ui.i18n.Text``: shown in the screen's language, named (``reveal=``, the class's question) by their English,
    so that every screen of a class asks the same question whatever its language."""
    question_md, answer_md = str(question), str(answer)
    st.markdown(t("**Predict:** {question}", question=question_md))
    digest = page.question_digest(*(x.english() if isinstance(x, Text) else x for x in (question, answer)))
    if options is not None and class_questions.classroom_question(
        digest, question_md, options, correct, answer_md, shows_answer
    ):
        return
    if st.toggle(t("Reveal the answer"), key=page.start_reveal(digest, revealed_in_link)):
        revealed_now.append(digest)
        st.markdown(t("**Answer:** {answer}", answer=answer_md))
        if shows_answer is not None:
            shows_answer()


def matrix(values: np.ndarray, title: str, key: str, rows: str = "tokens", cols: str = "dims", **kwargs):
    """A matrix with its numbers, rows and columns named by the example where it can."""
    row_names = names if rows == "tokens" else (features if rows == "features" else None)
    col_names = names if cols == "tokens" else (features if cols == "features" else None)
    charts.show_chart(
        lambda: teaching.matrix_figure(
            values,
            t(title),
            row_names=row_names,
            col_names=col_names,
            row_label=t("in") if rows == "in" else "token",
            col_label=t("out") if cols == "out" else t("dim"),
            **kwargs,
        ),
        key=key,
        memo=charts.memo_key(
            "matrix", values=values, title=title, row_names=row_names, col_names=col_names, axes=(rows, cols), **kwargs
        ),
    )


def table(frame, key: str, words=()) -> None:
    """A table with its column names, and the cells of the ``words`` columns, in the screen's language (the
    catalog's words; the data, formulas and numbers as they are)."""
    shown = frame.assign(**{column: frame[column].map(lambda cell: t(str(cell))) for column in words})
    labels = {column: st.column_config.Column(t(column)) for column in frame.columns}
    st.dataframe(shown, hide_index=True, key=key, column_config=labels)


# ---- the steps ---------------------------------------------------------------------------------------------
def step_inputs() -> None:
    messages.explain(
        "Each row of X is one token. The weight matrices are what a model learns; here they are fixed numbers so "
        "that everyone in the room gets the same answers."
    )
    st.latex(
        rf"X \in \mathbb{{R}}^{{{example.seq_len} \times {example.d_model}}}, \quad "
        rf"W_{h}^Q, W_{h}^K, W_{h}^V \in \mathbb{{R}}^{{{example.d_model} \times {example.d_k}}}, \quad "
        rf"W^O \in \mathbb{{R}}^{{{example.num_heads * example.d_k} \times {example.d_model}}}"
    )
    matrix(
        example.x,
        "X (Q = K = V = X: self-attention)",
        "cls_x",
        cols="features" if features else "dims",
        digits=1 if example.from_tutorial else 2,
    )
    cols = st.columns(3)
    for col, (name, values) in zip(cols, (("Q", example.w_q), ("K", example.w_k), ("V", example.w_v))):
        with col:
            matrix(
                values[head],
                f"W_{h}^{name}",
                f"cls_w_{name.lower()}",
                rows="features" if features else "in",
                cols="out",
            )
    matrix(example.w_o, "W^O", "cls_w_o", rows="in", cols="features" if features else "out")
    if example.from_tutorial:
        st.caption(t("W_2^K and W_2^V are not printed in the tutorial.") + " " + t(walkthrough.CHOSEN_MATRICES_REASON))
    ask(
        tt(
            "X has {n} rows and {d_model} columns. How many numbers does one head's query matrix Q_{h} = X W_{h}^Q hold?",
            n=example.seq_len,
            d_model=example.d_model,
            h=h,
        ),
        tt(
            "{n} x {d_k} = **{count}**: one row per token, d_k = {d_k} columns per head.",
            n=example.seq_len,
            d_k=example.d_k,
            count=example.seq_len * example.d_k,
        ),
    )


def step_projections() -> None:
    messages.explain(
        "A query says what a token is looking for, a key says what it offers, a value is what it hands over when "
        "chosen. Each is the token's vector times a weight matrix."
    )
    st.latex(
        rf"Q_{h} = X W_{h}^Q, \quad K_{h} = X W_{h}^K, \quad V_{h} = X W_{h}^V"
        rf"\qquad [{example.seq_len} \times {example.d_model}] \cdot [{example.d_model} \times {example.d_k}] "
        rf"= [{example.seq_len} \times {example.d_k}]"
    )
    cols = st.columns(3)
    for col, (name, values) in zip(cols, (("Q", example.q), ("K", example.k), ("V", example.v))):
        with col:
            matrix(values[head], f"{name}_{h}", f"cls_{name.lower()}")
    if example.from_tutorial and head == 0:
        st.subheader(t("What the tutorial prints for head 1"))
        printed_name = S["printed"].select(st.radio, horizontal=True)
        printed = walkthrough.TUTORIAL_PRINTED[printed_name]
        true = {"Q1": example.q, "K1": example.k, "V1": example.v}[printed_name][0]
        cols = st.columns(3)
        with cols[0]:
            matrix(printed, t("{name} as the tutorial prints it", name=printed_name), "cls_tutorial_printed", digits=1)
        with cols[1]:
            matrix(true, t("{name} computed", name=printed_name), "cls_tutorial_true", digits=1)
        with cols[2]:
            matrix(true - printed, "computed minus printed", "cls_tutorial_difference", digits=1)
        st.caption(
            t(
                "Row 1 of X times column 1 of W_1^{name}: the tutorial prints {printed}, the arithmetic gives {true}.",
                name=printed_name[0],
                printed=f"{printed[0, 0]:g}",
                true=f"{true[0, 0]:.4g}",
            )
        )
    top = int(np.argmax(np.linalg.norm(example.q[head], axis=1)))
    ask(
        tt("Which token's query in head {h} is the longest vector (asks the loudest question)?", h=h),
        tt(
            "**{token}**, length {length}.",
            token=messages.md_escape(names[top]),
            length=f"{np.linalg.norm(example.q[head, top]):.3g}",
        ),
        options=names,
        correct=top,
    )


def step_scores() -> None:
    messages.explain(
        {
            "dot": "The dot product of a query and a key: large when they point the same way. It grows with the "
            "number of dimensions d_k, so with many dimensions the scores get huge.",
            "scaled": "The dot product divided by the square root of d_k, which keeps the scores about the same size "
            "however many dimensions a head has (this is the Transformer's choice).",
            "cosine": "The cosine of the angle between query and key: always between -1 and 1, whatever their length.",
        }[score]
    )
    st.latex(teaching.SCORE_FORMULAS[score])
    # One score of the token the question is about, worked out: its query against its own key (a key every query
    # sees, also under the causal mask). Which key scores highest is the question, so the formula does not pick it.
    st.latex(
        teaching.score_cell_latex(
            example.q[head, focus],
            example.k[head, focus],
            score,
            example.scores[head, focus, focus],
            query=teaching.latex_subscript_name(names[focus], str(focus + 1)),
            key=teaching.latex_subscript_name(names[focus], str(focus + 1)),
        )
    )
    best = visible_keys[np.argmax(example.scores[head, focus, visible_keys])]

    def scores_matrix() -> None:
        matrix(
            example.scores[head],
            t("scores of head {h} (row = query, column = key)", h=h),
            "cls_scores",
            cols="tokens",
            masked=masked,
        )
        if causal:
            st.caption(
                t("Cells marked 'masked' are future tokens: the causal mask sets their score to -inf before softmax.")
            )

    ask(
        tt("In head {h}, which key will **{token}** score highest?", h=h, token=messages.md_escape(names[focus])),
        tt(
            "**{token}**, with score {score}.",
            token=messages.md_escape(names[best]),
            score=f"{example.scores[head, focus, best]:.3g}",
        ),
        scores_matrix,
        options=[names[key] for key in visible_keys],
        correct=int(np.flatnonzero(visible_keys == best)[0]),
    )


def step_softmax() -> None:
    messages.explain(
        "Softmax turns each row of scores into positive weights that add up to 1: how much of its attention a token "
        "gives to every other token. A big gap between scores makes one weight near 1."
    )
    st.latex(r"A_{i}[q, k] = \frac{e^{\mathrm{score}[q, k]}}{\sum_{k'} e^{\mathrm{score}[q, k']}}")
    top = float(example.weights[head, focus].max())

    def weights_figure() -> None:
        charts.show_chart(
            lambda: teaching.weights_figure(example.weights, example.keep_mask, names=names),
            key="cls_weights",
            memo=charts.memo_key("weights", weights=example.weights, keep=example.keep_mask, names=names),
        )
        if example.is_one_hot:
            st.warning(
                t(
                    "Every row is (almost) one-hot: the scores differ by far more than 1, so softmax gives nearly all "
                    "the weight to one key. That is what large scores do; see the last step."
                )
            )

    ask(
        tt(
            "Will **{token}** give its top key in head {h} more or less than half of its attention?",
            token=messages.md_escape(names[focus]),
            h=h,
        ),
        tt(
            "**More**: {top} of it. The rest is spread over the other {others} visible tokens."
            if top > 0.5
            else "**Less**: {top} of it. The rest is spread over the other {others} visible tokens.",
            top=f"{top:.2f}",
            others=len(visible_keys) - 1,
        ),
        weights_figure,
        options=["More", "Less"],  # kept in English by the class; each screen shows its own words
        correct=0 if top > 0.5 else 1,
    )


def step_weighted_values() -> None:
    messages.explain("Each token's new vector is the average of the value vectors, weighted by its attention.")
    st.latex(
        rf"\mathrm{{head}}_{h} = A_{h} V_{h} \qquad [{example.seq_len} \times {example.seq_len}] \cdot "
        rf"[{example.seq_len} \times {example.d_k}] = [{example.seq_len} \times {example.d_k}]"
    )
    source_token = int(np.argmax(example.weights[head, focus]))
    ask(
        tt(
            "Whose value vector contributes most to **{token}**'s new vector in head {h}?",
            token=messages.md_escape(names[focus]),
            h=h,
        ),
        tt(
            "**{token}**'s: it carries weight {weight}.",
            token=messages.md_escape(names[source_token]),
            weight=f"{example.weights[head, focus, source_token]:.2f}",
        ),
        lambda: matrix(example.heads[head], f"head_{h}", "cls_head_output"),
        options=[names[key] for key in visible_keys],
        correct=int(np.flatnonzero(visible_keys == source_token)[0]),
    )


def step_output() -> None:
    messages.explain(
        "The heads' outputs are laid side by side, giving each token one long vector again; W^O mixes "
        "what the heads found and brings it back to d_model numbers per token."
    )
    st.latex(
        rf"\mathrm{{Concat}}(\mathrm{{head}}_1, \dots, \mathrm{{head}}_{{{example.num_heads}}}) \in "
        rf"\mathbb{{R}}^{{{example.seq_len} \times {example.num_heads * example.d_k}}}, \qquad "
        r"\mathrm{MultiHead}(X) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O"
    )
    matrix(example.concat, "Concat(heads)", "cls_concat")
    matrix(example.output, "output", "cls_output", cols="features" if features else "dims")
    st.success(
        t(
            "Headscope's MultiHeadAttention module, run in one call with these weights, gives the same output "
            "(largest difference {diff}).",
            diff=f"{example.module_max_abs_diff:.1e}",
        )
    )
    ask(
        tt("The output has the same shape as X. Why does that matter?"),
        tt("Because the next layer takes the same shape in: layers can be stacked, dozens of them."),
    )


def step_shapes_and_counts() -> None:
    messages.explain(
        "The batch axis holds several sentences at once (here one). Splitting into heads is only a reshape: no "
        "numbers change, they are regrouped. Counting multiplications shows where the work is: the projections "
        "grow with d_model squared, the scores and the weighted values with the sequence length squared."
    )
    trace = example.dimension_trace.assign(shape=example.dimension_trace["shape"].map(str))
    table(trace, "cls_trace", words=("step", "tensor"))
    counts = example.operation_counts
    table(counts[["step", "formula", "kind", "count_formula"]], "cls_count_formulas", words=("step", "formula", "kind"))
    total = example.total_matmul_multiplications
    most = counts[counts["multiplications"] == counts["multiplications"].max()]

    def counted() -> None:
        table(counts, "cls_counts", words=("step", "formula", "kind"))
        st.latex(teaching.matmul_total_latex(counts, total))
        if example.from_tutorial:
            st.warning(
                t(
                    "The tutorial counts 768 + 128 + 256 = 1152 multiplications: it leaves out the weights @ V step, "
                    "which costs as much as the scores. The matrix products need {total}.",
                    total=total,
                )
            )
        if causal:
            st.caption(t(counts.attrs.get("causal_note", "")))
        if example.from_tutorial:  # the tutorial's own counts are among its discrepancies: they tell the answer
            st.subheader(t("Where the tutorial's numbers disagree with the arithmetic"))
            table(walkthrough.discrepancy_summary(), "cls_discrepancy_summary", words=("quantity",))
            discrepancies = example.discrepancies
            table(
                discrepancies.assign(
                    index=discrepancies["index"].map(lambda i: "" if i is None else str(i)),
                    note=discrepancies["note"].map(page.entry_note),
                ),
                "cls_discrepancies",
                words=("quantity",),
            )

    ask(
        tt(
            "With n = {n} tokens, d_model = {d_model} and {heads} heads (d_k = {d_k}), which step needs the most "
            "multiplications? Use the count formulas above.",
            n=example.seq_len,
            d_model=example.d_model,
            heads=example.num_heads,
            d_k=example.d_k,
        ),
        tt(
            "{steps}: {count} multiplications each, of {total} in all the matrix products. The projections grow with "
            "d_model squared, the scores and the weighted values with n squared: long texts make the scores the "
            "costly part."
            if len(most) > 1
            else "{steps}: {count} multiplications, of {total} in all the matrix products. The projections grow with "
            "d_model squared, the scores and the weighted values with n squared: long texts make the scores the "
            "costly part.",
            steps=functools.reduce(
                lambda first, second: tt("{first} and {second}", first=first, second=second),
                [tt("**{step}**", step=tt(step.replace("_", " "))) for step in most["step"]],
            ),
            count=int(most["multiplications"].iloc[0]),
            total=total,
        ),
        counted,
        options=[step.replace("_", " ") for step in counts["step"]],
        correct=int(np.flatnonzero(counts["multiplications"].to_numpy() == counts["multiplications"].max())[0]),
    )


def step_scaling() -> None:
    messages.explain(
        "With random queries and keys, a dot product over d_k dimensions has spread about the square root of d_k. "
        "Without scaling, the scores of a big head are so far apart that softmax picks one key and ignores the rest "
        "(and learning stalls, because the weights stop changing). Scaling keeps the weights spread out at any "
        "size; cosine similarity stays bounded."
    )
    table = computations.saturation_table(16)
    unscaled = table[(table["score"] == "dot") & (table["d_k"] == table["d_k"].max())]["max_weight"].iloc[0]
    ask(
        tt(
            "Without dividing by sqrt(d_k), how large is the biggest weight of a row at d_k = {d_k}?",
            d_k=table["d_k"].max(),
        ),
        tt("About **{weight}**: nearly one-hot. With the scaling it stays far below that.", weight=f"{unscaled:.2f}"),
        lambda: charts.show_chart(
            lambda: teaching.saturation_figure(table, 16),
            key="cls_saturation",
            memo=charts.memo_key("saturation", table=table, columns=list(table.columns)),
        ),
    )


STEPS = [
    ("Step 1. The input and the weights", step_inputs),
    ("Step 2. Project: queries, keys and values", step_projections),
    ("Step 3. Scores: how well does each query match each key?", step_scores),
    ("Step 4. Softmax: scores become weights", step_softmax),
    ("Step 5. Each head's output: a weighted average of values", step_weighted_values),
    ("Step 6. Concatenate the heads and mix them", step_output),
    ("Step 7. Shapes and multiplications", step_shapes_and_counts),
    ("Step 8. Why divide by the square root of d_k?", step_scaling),
    # The decoder lesson (ui/decoder_lesson.py): a real decoder predicts and writes the next word.
    ("Step 9. A decoder predicts the next word", lambda: decoder_lesson.step_decoder(ask)),
    ("Step 10. Is attention explanation?", lambda: attribution_view.classroom_step(ask)),  # ui/attribution_view.py
]

# ---- one step per screen -----------------------------------------------------------------------------------
if all_steps:
    for title, draw in STEPS:
        st.header(t(title))
        draw()
    keep_reveals_in_url()
    st.stop()


STEP = S["step"]
STEP.start()


def move(step: int) -> None:
    """Back or Next, to ``step`` (the step the button was drawn to lead to: a click's callback that runs twice
    moves once). A student following the teacher who moves leaves follow mode, and is told so: the screen no
    longer claims to follow a teacher it has left behind."""
    STEP.set(step)
    if follow.following_student():
        follow.leave(
            t(
                "You moved to step {step} yourself, so this screen no longer follows the teacher. **Follow the "
                "teacher** in the sidebar brings it back to the teacher's step.",
                step=step,
            )
        )


number = ClassroomSettings.from_session().step
back, progress, forward = st.columns([1, 4, 1])
back.button(
    t("Back"),
    key="cls_back",
    on_click=move,
    args=(page.moved(number, -1, len(STEPS)),),
    disabled=number == 1,
    icon=":material/arrow_back:",
)
progress.progress(number / len(STEPS), text=t("Step {number} of {count}", number=number, count=len(STEPS)))
forward.button(
    t("Next"),
    key="cls_next",
    on_click=move,
    args=(page.moved(number, 1, len(STEPS)),),
    disabled=number == len(STEPS),
    icon=":material/arrow_forward:",
)
STEP.keep()
title, draw = STEPS[number - 1]
st.header(t(title))
draw()
keep_reveals_in_url()
