"""Circuits: what each head writes towards an answer (logit attribution), which heads carry the difference between
two prompts (activation patching), and what the residual stream says after each layer (the logit lens).

The computations are ``mha_core.interventions`` through ``ui.circuits``; the figures ``ui.figures``.
"""

from pathlib import Path

import streamlit as st

from mha_core.interventions.attribution import head_grid
from mha_core.interventions.prompts import SMOLLM2_FAILURES, TASKS_BY_NAME
from ui import address, circuits, computations, heads_circuits, page_circuits, page_state, session, shell
from ui.figures.causal import head_score_map
from ui.figures.circuits import estimate_against_exact, logit_lens_table
from ui.i18n import t
from ui.page_circuits import CircuitsSettings
from ui.widgets import charts, downloads, messages, pickers, sidebar

shell.in_app()  # a page's own address opened on a new server: run it inside app.py

MAPS = ("circuits_attribution_map", "circuits_patching_map")
S = CircuitsSettings.declarations()
SMOLLM2 = "smollm2"  # the model whose failures the page lists (measured on its shipped weights)


def open_in_explore(chart_key: str):
    """A click on a heads map: that head opens in Explore on the clean prompt (on the next run)."""

    def callback() -> None:
        clicked = pickers.clicked_head(chart_key)
        if clicked is not None and clicked[0] is not None:
            page_state.put(page_state.CIRCUITS_OPEN_EXPLORE, clicked)

    return callback


def switch_to_explore(layer: int, head: int, text: str) -> None:
    """Explore, opened as a link to this head on this text with this model: Streamlit starts the other page with
    its widgets at their defaults, so the sidebar takes its settings from the link."""
    selection = session.selection()
    link = {"model": selection.model, "engine": selection.engine, "text": text, "layer": layer, "head": head}
    address.take_settings_from_link()
    st.switch_page(st.Page(Path(__file__).with_name("explore.py"), url_path="explore"), query_params=link)


st.title(t("Circuits"))
st.caption(
    t(
        "Ablation tells whether a head matters. These tools say what it does for one answer: direct logit "
        "attribution says what each head writes towards the answer; activation patching says which heads carry the "
        "difference between two prompts; the logit lens shows what the model would predict after each layer."
    )
)
selection = session.selection()
model = sidebar.current_model()
if model is None:
    st.stop()
if model.lm_head_kind != "causal":
    st.info(
        t(
            "{model} has {head}. Circuits read a next-token prediction: choose SmolLM2 (or another decoder with its "
            "language-model head) in the sidebar.",
            model=messages.md_escape(selection.model),
            head=model.head_description,
        )
    )
    st.stop()

with messages.error_display():
    task_name = S["task"].select(st.selectbox)
    task = TASKS_BY_NAME.get(task_name)
    if task is not None:
        st.caption(messages.md_escape(t(task.story)))
    else:
        st.caption(
            t(
                "Two prompts of the same number of tokens; the answer is the clean prompt's right next token (one "
                "token, mind its leading space) and the foil the one the corrupted prompt leads to."
            )
        )
        cols = st.columns(2)
        S["clean"].text(container=cols[0])
        S["corrupted"].text(container=cols[1])
        S["answer"].text(container=cols[0])
        S["foil"].text(container=cols[1])
    clean, corrupted, answer, foil = CircuitsSettings.from_session().prompts()
    # Quoted, not in code spans: markdown shows a code span's backslashes, so escaped text there read "apples\.".
    st.markdown(
        f"**{t('Clean:')}** “{messages.md_escape(clean)}” → {messages.md_escape(repr(answer))}  \n"
        f"**{t('Corrupted:')}** “{messages.md_escape(corrupted)}” → {messages.md_escape(repr(foil))}"
    )
    prompts = computations.circuit_prompts(selection.model, clean, corrupted)  # tokenized once, for all of them
    tokens = {
        "clean": circuits.prompt_tokens(model, prompts[0], "clean prompt"),
        "corrupted": circuits.prompt_tokens(model, prompts[1], "corrupted prompt"),
    }
    same_length = len(tokens["clean"]) == len(tokens["corrupted"])
    if not same_length:
        st.warning(
            t(
                "The clean prompt has {clean} tokens and the corrupted one {corrupted}: patching replaces activations "
                "position by position, so it needs two prompts of the same number of tokens (change a name for "
                "another name of one token). Attribution and the logit lens below read the clean prompt alone; the "
                "tokens of both are listed here.",
                clean=len(tokens["clean"]),
                corrupted=len(tokens["corrupted"]),
            )
        )
    with st.expander(t("The tokens of both prompts"), expanded=not same_length):
        st.dataframe(circuits.token_table(tokens["clean"], tokens["corrupted"]), hide_index=True, width="stretch")

    # How heads work together (ui/heads_circuits.py): weight circuits and path patching, each behind a toggle.
    def open_head(layer: int, head: int) -> None:
        switch_to_explore(layer, head, clean)

    heads_circuits.weights_section(selection.model, model, open_head)
    if same_length:
        heads_circuits.path_patching_section(
            selection.model, model, prompts=prompts, answer=answer, foil=foil, open_head=open_head
        )
    method = S["method"].select(st.radio, horizontal=True)
    messages.explain(
        "Patching asks: if this one head computed what it computes on the clean prompt, while everything else runs "
        "on the corrupted one, how much of the clean answer comes back? 0 means none (the corrupted run's logit "
        "difference), 1 means all of it (the clean run's)."
    )

    if not pickers.start_button(
        t("Compute attribution, patching and the logit lens"),
        key="circuits_patching",
        ready=computations.circuit_patching_ready(selection.model, *prompts, answer, foil, method=method),
    ):
        st.stop()
    attribution = computations.circuit_attribution(selection.model, prompts[0], answer, foil)
    patched = None
    if same_length:
        with messages.error_display():  # a pair patching refuses (the same tokens) leaves attribution and the lens
            patched = computations.circuit_patching(selection.model, *prompts, answer, foil, method)
    cols = st.columns(3)
    clean_difference = attribution.attrs["logit_difference"]
    cols[0].metric(
        t("Logit difference, clean ({model})", model=messages.md_escape(model.name)), f"{clean_difference:.3f}"
    )
    cols[1].metric(
        t("Logit difference, corrupted"), "-" if patched is None else f"{patched.attrs['corrupted_metric']:.3f}"
    )
    heads_total = attribution["contribution"][attribution["component"] == "head"].sum()
    cols[2].metric(t("Written by all heads (attribution)"), f"{heads_total:.3f}")
    if clean_difference <= 0:
        st.warning(
            t(
                "{model} does not get this one right: it prefers the foil on the clean prompt.",
                model=messages.md_escape(model.name),
            )
        )

    st.subheader(t("Which heads: attribution and patching"))
    maps = [
        (
            MAPS[0],
            head_grid(attribution, model.num_layers, model.num_heads),
            t("logit difference"),
            t("Direct logit attribution: what each head writes (clean)"),
        )
    ]
    if patched is not None:
        maps.append(
            (
                MAPS[1],
                head_grid(patched, model.num_layers, model.num_heads, "score"),
                t("patching score") if method == "exact" else t("estimated score"),
                t("Patching: 0 = corrupted, 1 = clean") + (" " + t("(estimate)") if method == "attribution" else ""),
            )
        )
    cols = st.columns(2)
    for col, (chart_key, grid, label, title) in zip(cols, maps):
        with col:
            charts.show_chart(
                head_score_map(grid, label=label, title=title, signed=True),
                key=chart_key,
                filename=f"headscope-{chart_key.replace('_', '-')}",
                on_select=open_in_explore(chart_key),
                selection_mode="points",
            )
    downloads.table_view_download(
        attribution if patched is None else circuits.head_scores(attribution, patched),
        f"headscope-{downloads.model_slug(selection.model)}-attribution-patching.html",
        "circuits_maps_html",
    )
    st.caption(t("Click a head to open it in Explore on the clean prompt."))
    clicked = page_state.take(page_state.CIRCUITS_OPEN_EXPLORE)
    if clicked is not None:
        switch_to_explore(*clicked, clean)
    if patched is not None and method == "attribution":
        exact = patched[patched["exact"].notna()]
        names = [f"L{r.layer}H{r.head}" for r in exact.itertuples()]
        left, right = st.columns([3, 2])
        with left:
            charts.show_chart(
                estimate_against_exact(
                    names, exact["score"].to_numpy(), exact["exact"].to_numpy(), title=t("Where the estimate holds")
                ),
                key="circuits_estimate",
                filename="headscope-attribution-patching",
            )
        with right:
            st.dataframe(
                exact[["layer", "head", "score", "exact"]]
                .rename(columns={"score": "estimate"})
                .sort_values("exact", ascending=False, key=abs),
                hide_index=True,
                width="stretch",
            )
        st.caption(
            t(
                "The {count} heads of largest estimated score, patched exactly: on the dotted line the linear "
                "estimate (one forward and one backward pass for every head) equals the real patched score.",
                count=len(exact),
            )
        )
    with st.expander(t("Every component's attribution (embeddings, heads, MLPs, biases)")):
        st.caption(
            t(
                "The rows add up to the model's own logit difference, {difference}: each is the component's output "
                "through the final norm (its scale frozen from the run) and the unembedding of the answer minus the "
                "foil's.",
                difference=f"{attribution.attrs['logit_difference']:.4f}",
            )
        )
        st.dataframe(attribution, hide_index=True, width="stretch")
        st.download_button(
            t("Attribution (CSV)"),
            attribution.to_csv(index=False).encode(),
            f"headscope-{downloads.model_slug(selection.model)}-attribution.csv",
            "text/csv",
            key="circuits_attribution_csv",
        )
    if patched is not None:
        with st.expander(t("Patching scores")):
            st.dataframe(patched.sort_values("score", ascending=False), hide_index=True, width="stretch")

    st.subheader(t("The logit lens"))
    table = computations.circuit_lens(selection.model, prompts[0])
    lens = page_circuits.lens_view(table)
    charts.show_chart(
        logit_lens_table(
            lens.labels,
            lens.grid("shown"),
            lens.grid("probability"),
            title=t("Top next token after each layer"),
            decoded=lens.grid("token"),
        ),
        key="circuits_lens",
        filename="headscope-logit-lens",
    )
    st.caption(
        t(
            "Each layer's residual stream read through the model's own final norm and unembedding, as if the layers "
            "after it were not there. After the last layer it is the model's own prediction. Tokens are written as "
            "in the head view: a leading space is dropped, a token of white space shows as ␣ (space), ⍽ (no-break "
            "space) or ⏎ (new line); hover a cell for the token's exact text."
        )
        + (" " + t("The last {count} positions are shown.", count=page_circuits.LENS_POSITIONS) if lens.cut else "")
    )
    if (
        selection.model == SMOLLM2
    ):  # measured on SmolLM2's shipped weights (tests/mha_core/interventions/test_circuits.py)
        with st.expander(t("Where SmolLM2 fails (measured)")):
            for text, right, wrong, difference, note in SMOLLM2_FAILURES:
                # A formula (symbols and tokens, the same in every language), then the note in the session's.
                formula = f"logit({messages.md_escape(repr(right))}) − logit({messages.md_escape(repr(wrong))})"
                st.markdown(
                    f"- “{messages.md_escape(text)}”: {formula} = {difference:+.2f}; {messages.md_escape(t(note))}"
                    + t(".")
                )
