"""Explore: every head of a layer with one head enlarged (as a heatmap or as lines), or the whole model at once.

Both views are one component drawn in the browser (ui/headview/: headview.js). The page's body is a
fragment that also draws the sidebar's sentence boxes, so Enter reruns the body only; inside it, the view's own
fragment reruns alone when the visitor switches a layer, a head or the view. The sentence boxes, the notes and
toggles above the view (the attention-sink note too) are drawn before it, in their places: nothing arrives later
and pushes the view down."""

import functools

import streamlit as st

from ui import attribution_view, class_questions, encoder_decoder, figures, longdoc, session, shell
from ui.i18n import t
from ui.page_explore import ALL_TOKENS, ExploreSettings, focus_choices
from ui.widgets import charts, decomposition, downloads, messages, pickers, predict, sidebar, views

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

st.title(t("Explore"))
st.markdown(t(messages.INTRO))
with st.expander(t("What am I looking at?"), icon=":material/help:"):
    st.markdown(t(messages.FIRST_TEN_MINUTES))


def explore_run(notices: bool = True):
    """The run this page shows: a model trained on the Lab page (when the visitor opened it here), else
    the sidebar's selection (from the shared cache)."""
    lab = session.lab_run()
    return lab if lab is not None else predict.grown(sidebar.current_run(notices=notices))  # the written tokens too


if session.lab_run() is not None:
    st.info(
        t(
            "Showing the model you trained on the Lab page, on its fixed example (tokens are numbers). "
            "The sidebar's model and sentence come back with the button below."
        ),
        icon=":material/science:",
    )
    st.button(t("Back to the sidebar's model"), on_click=session.close_lab_run, key="explore_close_lab")


@st.fragment
def explore_body(sentence_slot) -> None:
    """Everything the sentence decides, with the sentence boxes drawn into their place in the sidebar
    (``sentence_slot``; None when the sidebar draws them): Enter reruns this fragment only."""
    if sentence_slot is None:
        with messages.error_display():
            explore_view()
        return
    with sidebar.sentences_in_page(sentence_slot, place="explore"), messages.error_display():
        explore_view()


def explore_view() -> None:
    selection = session.selection()
    if session.lab_run() is None and encoder_decoder.encoder_decoder_model(selection.model) is not None:
        encoder_decoder.explore(selection.model, selection.engine)  # three attentions, a source and a target
        return
    run = explore_run()
    if run is None:
        return
    # The notes above the view are drawn before it, the sink note's measurements included (cached with the run):
    # drawn after it, they arrived seconds later on a first visit and pushed the view down.
    st.caption(messages.run_summary(run))
    messages.engine_note(run)
    words, hide_special = pickers.view_toggles(run)
    view = views.shaped_run(run, words, hide_special)
    notes = []
    if view.is_causal:
        notes.append(t("Decoder: grey cells are hidden by the causal mask (a token never sees the tokens after it)."))
    if views.figure_options(view)["segment_ids"] is not None:
        notes.append(t("Sentence pair: the dotted orange line separates the first sentence from the second."))
    if notes:
        st.caption(" ".join(notes))
    views.sink_note(run)
    view_section(words, hide_special)
    predict.section(run)  # the next-token table and the model writing (ui/widgets/predict.py)


S = ExploreSettings.declarations()


def take_pick(pick: dict, words: bool = False, hide_special: bool = False) -> None:
    """The view and the selected head's shape switched in the browser (the component's pick); a cell picked on
    the enlarged head opens its score decomposition, a token's label its distribution (positions of the view the
    toggles ``words`` and ``hide_special`` make)."""
    S["view"].set(pick["view"])
    S["shape"].set(pick["shape"])
    picked = "cell" in pick or "token" in pick
    run = explore_run(notices=False) if picked and session.lab_run() is None else None
    if run is not None and "cell" in pick:
        decomposition.take_cell(run, words, hide_special, (pick["layer"], pick["head"], *pick["cell"]))
    elif run is not None:  # a token's label: the distribution it was drawn from (or the prediction before it)
        predict.take_token(run, decomposition.view_units(run, words, hide_special), pick["token"])


@st.fragment
def view_section(words: bool, hide_special: bool) -> None:
    """The head view (the layer's heads and the enlarged head, as a heatmap or as lines) or the model view.
    The heads, the enlarged heatmap, the layer slider and the switch between the views are one component
    drawn in the browser from every layer's weights (sent once a sentence), so a switch redraws there at
    once; the choice comes back as the selection (and the link) on a rerun of this fragment only.
    Its arguments are small on purpose: a session keeps its fragment's arguments, so the run is looked up
    again (a cache hit) instead of held there, and the server's memory stays within the cache budget."""
    run = explore_run(notices=False)
    if run is None:
        return
    view = views.shaped_run(run, words, hide_special)
    mode, shape = S["view"].start(), S["shape"].start()
    layer = pickers.select_layer(view.num_layers, draw=False)
    head = pickers.select_head(view.num_heads, draw=False)
    if class_questions.explore_question(view, layer, head):  # a class question: the head stays hidden until revealed
        return
    on_pick = functools.partial(take_pick, words=words, hide_special=hide_special)
    written, picks = predict.written_rows(view), predict.writes(run)
    views.attention_view(
        view, mode, layer, head, key="head_view", shape=shape, on_pick=on_pick, written=written, token_picks=picks
    )
    predict.follow_token()  # a token picked: the page again, its distribution shown in the output section
    S["view"].keep()
    S["shape"].keep()
    if mode == "model":
        return
    st.caption(
        t(
            "Move the layer slider or click a head to enlarge it. Rows are queries (the token looking), columns "
            "are keys (the tokens looked at); each row sums to 1. Colours: the scale beside the enlarged head "
            "(white 0, dark blue 1). Hover a cell for its weight."
        )
        + (
            " " + t("Click it (or Enter on it) to see below why the head looks there.")
            if session.lab_run() is None
            else ""
        )
        + (" " + t("Switch to **Lines** for the BertViz-style view of the head.") if shape == "heatmap" else "")
    )
    if shape == "lines":
        lines_view(view, layer, head)
    downloads.downloads(view, layer, head)
    if session.lab_run() is None:  # why the head looks where it does: one cell's score by source
        decomposition.section(run, layer, head, session.selection().model, session.selection().engine)
    views.layer_code(run)


def lines_view(view, layer: int, head: int) -> None:
    """The enlarged head as lines (BertViz-style), for all tokens or one query token in focus."""
    chart, side = st.columns([3, 2])
    # The widget keeps its function for the session's life: it sees the tokens' names, not the run.
    names = focus_choices(view.tokens)
    focus = S["focus"].select(
        side.selectbox,
        list(names),
        default=ALL_TOKENS,  # also when the sentence changed under a focus on a later token
        format_func=lambda i: t(names[i]) if i == ALL_TOKENS else names.get(i, str(i)),
    )
    focus = None if focus == ALL_TOKENS else focus
    with chart:
        charts.show_chart(
            figures.attention_lines(
                view.attentions[layer, head],
                view.tokens,
                focus=focus,
                segment_ids=views.figure_options(view)["segment_ids"],
            ),
            key="lines_view",
            filename=f"headscope-layer{layer}-head{head}-lines",
        )
    side.caption(
        t("Lines from each query (left) to the keys it attends to (right); darker = more weight.")
        + " "
        + (
            t("Every weight of 0.02 or more is drawn.")
            if focus is not None
            else t("For all tokens at once, each query's two strongest keys; pick a token to see all of its lines.")
        )
    )


explore_body(session.sentence_slot())
st.divider()
longdoc.section()
st.divider()
attribution_view.section()  # "What does the prediction depend on?" (ui/attribution_view.py)
