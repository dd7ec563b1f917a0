"""The Heads page drawn: build a model's head cards (heavy work, started by a button, through ``ui.compute``), and for
a decoder their long part over the long documents (the same way), search them, and show one head's card with its
corpus and long-document contexts and the buttons that open them in Explore. The settings and logic are
``ui.page_heads``; ``pages/heads.py`` calls ``show``."""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

import pandas as pd
import streamlit as st

from mha_core.corpus.card_effects import head_effects
from mha_core.errors import HeadscopeError
from mha_core.models.long import long_documents
from mha_core.operations import Cards, Composition, Importance, LongHeadCards
from ui import address, computations, compute, page_heads, session
from ui.computations import IMPORTANCE_BATCH, PROFILE_BATCH, get_model
from ui.i18n import t
from ui.page_circuits import CircuitsSettings
from ui.page_heads import ABLATION_SENTENCES, HeadsSettings
from ui.settings import settings
from ui.widgets import messages, pickers, sidebar

S = HeadsSettings.declarations()
PAGES = Path(__file__).resolve().parents[1] / "pages"
FOUND_KEY = "heads_found"  # the search table's session key (its selected row)
CONTEXTS_SHOWN = 5  # contexts of each kind drawn at first (the others behind "every context")


def cards_operation(model_name: str, sentences: int) -> Cards:
    return Cards(model_name, max_sentences=int(sentences), batch_size=PROFILE_BATCH)


def long_cards_operation(model_name: str) -> LongHeadCards:
    """The long part of the cards over the shipped long documents (``mc.long_cards``)."""
    return LongHeadCards(model_name)


def ablation_operation(model_name: str) -> Importance:
    """Every head alone zeroed over the first ``ABLATION_SENTENCES`` UD EWT dev sentences (the Ablate page's
    head importance, by ablation)."""
    return Importance(model_name, ABLATION_SENTENCES, method="ablation", batch_size=IMPORTANCE_BATCH)


def circuits_patching(model_name: str) -> tuple[str, object] | None:
    """(task, table) of the patching over heads the Circuits page computed for its current prompts, when the
    server has it; None otherwise (nothing is computed here)."""
    settings = CircuitsSettings.from_session()
    clean, corrupted, answer, foil = settings.prompts()
    try:
        prompts = computations.circuit_prompts(model_name, clean, corrupted)
        if not computations.circuit_patching_ready(model_name, *prompts, answer, foil, method=settings.method):
            return None
        table = computations.circuit_patching(model_name, *prompts, answer, foil, settings.method)
    except HeadscopeError:
        return None  # prompts the Circuits page refuses: nothing was measured
    return t("Circuits page: {clean} -> {answer}", clean=repr(clean), answer=repr(answer)), table


def measured_effects(model_name: str) -> dict:
    """The tables the card's effects are read from (``head_effects``): the heads' ablation, measured on a click
    (or already in the server's cache), and the Circuits page's patching when it was computed."""
    measured = {}
    operation = ablation_operation(model_name)
    # Measured on a click even on one person's own server (a link does not start it: it is L x H passes), or shown
    # when the server has it.
    key = f"heads_ablation_{model_name}"
    started = compute.ready(operation) or key in st.session_state.get(pickers.STARTED, ())
    label = t("Measure every head's ablation effect ({count} UD dev sentences)", count=ABLATION_SENTENCES)
    if not started and st.button(label, key=f"{key}_start"):
        pickers.mark_started(key)
        started = True
    if started:
        importance, _ = compute.compute(operation, get_model(model_name))  # (importance, no pruning curves)
        measured[t("UD EWT dev, {count} sentences", count=ABLATION_SENTENCES)] = importance
    patching = circuits_patching(model_name)
    if patching is not None:
        measured[patching[0]] = patching[1]
    return measured


def open_found_row(found: pd.DataFrame) -> None:
    """The search table's ``on_select``: the clicked row's head becomes the card shown (and the address's
    ``hlayer``/``hhead``), set before the layer and head inputs are drawn."""
    picked = page_heads.picked_head(found, st.session_state[FOUND_KEY]["selection"]["rows"])
    if picked is not None:
        S["layer"].set(picked[0])
        S["head"].set(picked[1])


def open_in_explore(query: dict[str, str]) -> None:
    """Explore, opened as a link to the context (the sidebar takes its settings from the link)."""
    address.take_settings_from_link()
    st.switch_page(st.Page(PAGES / "explore.py", url_path="explore"), query_params=query)


def show_context(cards, card, context, kind: str, *, index: int, selection) -> None:
    left, right = st.columns([5, 1])
    left.markdown(page_heads.marked_tokens(context))
    left.caption(
        t(
            "sentence {sentence}: {caption}",
            sentence=context.sentence,
            caption=page_heads.context_caption(context, kind),
        )
    )
    if right.button(t("Open in Explore"), key=f"heads_open_{kind}_{index}"):
        open_in_explore(page_heads.explore_link(cards, card, context, selection.model, selection.engine))


def show_card(cards, card, selection, measured: dict) -> None:
    st.subheader(t("Head {layer}-{head}", layer=card.layer, head=card.head))
    st.table(pd.DataFrame(page_heads.card_numbers(card), columns=[t("number"), t("value")]).set_index(t("number")))
    st.markdown(f"**{t('Measured effects')}**")
    rows = page_heads.effect_rows(head_effects(card.layer, card.head, measured))
    st.table(
        pd.DataFrame(rows, columns=[t("measured effect"), t("measured on"), t("measured number")]).set_index(
            t("measured effect")
        )
    )
    st.caption(
        t(
            "Tokens: the query on {query}, the key on {key}.",
            query=f":{page_heads.QUERY_MARK}-background[{t('blue')}]",
            key=f":{page_heads.KEY_MARK}-background[{t('orange')}]",
        )
    )
    titles = {
        "attention": "Where it puts the most weight on a key other than a sink (a special token or the first token)",
        "output": "Where its output (the norm of what it writes, z W_O) is largest",
    }
    for kind, title in titles.items():
        st.markdown(f"**{t(title)}**")
        contexts = card.contexts(kind)
        if not contexts:
            st.caption(t("No context: every key of these sentences is a sink."))
        draw = functools.partial(show_context, cards, card, kind=kind, selection=selection)
        show_contexts(contexts, draw, kind)


def show_contexts(contexts, draw, kind: str) -> None:
    """The first ``CONTEXTS_SHOWN`` contexts, each by ``draw(context, index=...)``, and the others behind "every
    context"."""
    for index, context in enumerate(contexts[:CONTEXTS_SHOWN]):
        draw(context, index=index)
    if len(contexts) > CONTEXTS_SHOWN:
        # Drawn only once opened: the card opens with a quarter of its elements, which is most of what a browser
        # spends showing it (docs/benchmarks.md, "a card opened in Chromium").
        every = st.expander(
            t("Every context ({count})", count=len(contexts)), key=f"heads_every_{kind}", on_change="rerun"
        )
        if every.open:
            with every:
                for index, context in enumerate(contexts[CONTEXTS_SHOWN:], start=CONTEXTS_SHOWN):
                    draw(context, index=index)


def show_long_context(long, card, context, *, index: int, selection) -> None:
    left, right = st.columns([5, 1])
    left.markdown(page_heads.long_marked_tokens(context))
    left.caption(page_heads.long_context_caption(long, context))
    if right.button(t("Open in Explore"), key=f"heads_open_long_{index}"):
        open_in_explore(page_heads.long_explore_link(long, card, context, selection.model, selection.engine))


def show_long_card(long, card, selection) -> None:
    """The head's long-document part: its long-context roles, each with its run, and its long contexts."""
    st.markdown(f"**{t('Long documents')}**")
    st.caption(
        t(
            "Sink at length and local heads are measured on each long example (its row statistics), retrieval heads "
            "on the needle prompt (the examples as haystack, the needle repeated as the answer: Wu et al. 2024's "
            "argmax rule). The contexts: each query's largest weight on a key outside the first 4 tokens (what the "
            "sink counts use), the largest over the examples, read from exact blocks; Open in Explore opens the "
            "long document zoomed on the query and key."
        )
    )
    rows = page_heads.long_card_numbers(long, card)
    if rows:
        st.table(pd.DataFrame(rows, columns=[t("long-context role"), t("measured on"), t("value")]))
    else:
        st.caption(t("No long-context role in any run."))
    show_contexts(card.contexts, functools.partial(show_long_context, long, card, selection=selection), "long")


def long_part(model, model_name: str):
    """The long part of the cards when the setting asks for it, the model has one and it was started (a link may
    start it as other heavy work); None otherwise (an encoder says why)."""
    if not S["long"].toggle():
        return None
    if not page_heads.has_long_part(model):
        st.info(
            t(
                "The long part of the cards is for decoders (such as SmolLM2), whose long runs read the long "
                "documents; {model} is not one.",
                model=messages.md_escape(model_name),
            )
        )
        return None
    operation = long_cards_operation(model_name)
    notice = t(
        "Read every head of {model} over the {count} long examples and a needle prompt: one long pass each "
        "(heavy work: it waits its turn).",
        model=messages.md_escape(model_name),
        count=len(long_documents()),
    )
    if not started(t("Read the long documents"), f"heads_long_{model_name}", operation, notice):
        return None
    return compute.compute(operation, get_model(model_name))


def started(label: str, key: str, operation, notice: str, place=None) -> bool:
    """Whether ``operation`` (heavy) may run now: its start button (in ``place``, a column, when given), and
    ``notice`` (what a click would do) while it has not been started."""
    with place if place is not None else contextlib.nullcontext():
        go = pickers.start_button(label, key=key, ready=compute.ready(operation))
    if not go:
        st.info(notice)
    return go


def show() -> None:
    st.title(t("Heads"))
    st.caption(
        t(
            "A card for every head, read over many sentences: its roles with their numbers, the sentences where it "
            "looks hardest at something other than a sink and where it writes the most, and what its weights do "
            "(copying, previous token). Search the cards, open a head, open any of its sentences in Explore."
        )
    )
    selection = session.selection()
    model = sidebar.current_model()
    if model is None:
        st.stop()
    with messages.error_display():
        cols = st.columns([2, 1])
        limit = settings().max_profile_sentences
        sentences = S["sentences"].number(cols[0].number_input, maximum=limit)
        operation = cards_operation(selection.model, sentences)
        notice = t(
            "Build the cards of {model} over {sentences} UD English EWT dev sentences: one pass for the "
            "profile, one for the contexts (heavy work: it waits its turn).",
            model=messages.md_escape(selection.model),
            sentences=sentences,
        )
        if not started(t("Build the cards"), f"heads_cards_{selection.model}_{sentences}", operation, notice, cols[1]):
            return
        cards = compute.compute(operation, get_model(selection.model))
        st.caption(t("Cards over {count} sentences.", count=cards.num_sentences))
        long = long_part(model, selection.model)
        query = S["search"].text(what="search")
        composition = None
        if page_heads.wants_composition(query):
            operation = Composition(selection.model)
            if pickers.start_button(
                t("Compute the composition"), key=f"heads_composition_{selection.model}", ready=compute.ready(operation)
            ):
                composition = compute.compute(operation, get_model(selection.model))
        found, refused = page_heads.search_rows(cards, query, composition, long)
        if refused is not None:
            st.warning(messages.md_escape(page_heads.refusal_shown(refused)))
        else:
            st.caption(t("Click a row to open that head's card."))
            st.dataframe(
                page_heads.found_shown(found),
                hide_index=True,
                key=FOUND_KEY,
                on_select=functools.partial(open_found_row, found),
                selection_mode="single-row",
            )
        cols = st.columns(2)
        layer = S["layer"].number(cols[0].number_input, maximum=cards.num_layers - 1)
        head = S["head"].number(cols[1].number_input, maximum=cards.num_heads - 1)
        show_card(cards, cards.card(layer, head), selection, measured_effects(selection.model))
        if long is not None:
            show_long_card(long, long.card(layer, head), selection)
