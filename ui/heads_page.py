"""The Heads page drawn: build a model's head cards (heavy work, started by a button, through ``ui.compute``), search
them, and show one head's card with its corpus contexts and the buttons that open them in Explore. The settings and
logic are ``ui.page_heads``; ``pages/heads.py`` calls ``show``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from mha_core.operations import Cards, Composition
from ui import address, compute, page_heads, session
from ui.computations import PROFILE_BATCH, get_model
from ui.page_heads import HeadsSettings
from ui.settings import settings
from ui.widgets import messages, pickers, sidebar

S = HeadsSettings.declarations()
PAGES = Path(__file__).resolve().parents[1] / "pages"
CONTEXTS_SHOWN = 5  # contexts of each kind drawn at first (the others behind "every context")


def cards_operation(model_name: str, sentences: int) -> Cards:
    return Cards(model_name, max_sentences=int(sentences), batch_size=PROFILE_BATCH)


def open_in_explore(query: dict[str, str]) -> None:
    """Explore, opened as a link to the context (the sidebar takes its settings from the link)."""
    address.take_settings_from_link()
    st.switch_page(st.Page(PAGES / "explore.py", url_path="explore"), query_params=query)


def show_context(cards, card, context, kind: str, *, index: int, selection) -> None:
    left, right = st.columns([5, 1])
    left.markdown(page_heads.marked_tokens(context))
    left.caption(f"sentence {context.sentence}: {page_heads.context_caption(context, kind)}")
    if right.button("Open in Explore", key=f"heads_open_{kind}_{index}"):
        open_in_explore(page_heads.explore_link(cards, card, context, selection.model, selection.engine))


def show_card(cards, card, selection) -> None:
    st.subheader(f"Head {card.layer}-{card.head}")
    st.table(pd.DataFrame(page_heads.card_numbers(card), columns=["number", "value"]).set_index("number"))
    st.caption(
        f"Tokens: the query on :{page_heads.QUERY_MARK}-background[blue], the key on "
        f":{page_heads.KEY_MARK}-background[orange]."
    )
    titles = {
        "attention": "Where it puts the most weight on a key other than a sink (a special token or the first token)",
        "output": "Where its output (the norm of what it writes, z W_O) is largest",
    }
    for kind, title in titles.items():
        st.markdown(f"**{title}**")
        contexts = card.contexts(kind)
        if not contexts:
            st.caption("No context: every key of these sentences is a sink.")
        for index, context in enumerate(contexts[:CONTEXTS_SHOWN]):
            show_context(cards, card, context, kind, index=index, selection=selection)
        if len(contexts) > CONTEXTS_SHOWN:
            with st.expander(f"Every context ({len(contexts)})"):
                for index, context in enumerate(contexts[CONTEXTS_SHOWN:], start=CONTEXTS_SHOWN):
                    show_context(cards, card, context, kind, index=index, selection=selection)


def show() -> None:
    st.title("Heads")
    st.caption(
        "A card for every head, read over many sentences: its roles with their numbers, the sentences where it "
        "looks hardest at something other than a sink and where it writes the most, and what its weights do "
        "(copying, previous token). Search the cards, open a head, open any of its sentences in Explore."
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
        with cols[1]:
            started = pickers.start_button(
                "Build the cards", key=f"heads_cards_{selection.model}_{sentences}", ready=compute.ready(operation)
            )
        if not started:
            st.info(
                f"Build the cards of {messages.md_escape(selection.model)} over {sentences} UD English EWT dev "
                "sentences: one pass for the profile, one for the contexts (heavy work: it waits its turn)."
            )
            return
        cards = compute.compute(operation, get_model(selection.model))
        st.caption(f"Cards over {cards.num_sentences} sentences.")
        query = S["search"].text(what="search")
        composition = None
        if page_heads.wants_composition(query):
            operation = Composition(selection.model)
            if pickers.start_button(
                "Compute the composition", key=f"heads_composition_{selection.model}", ready=compute.ready(operation)
            ):
                composition = compute.compute(operation, get_model(selection.model))
        found, refused = page_heads.search_rows(cards, query, composition)
        if refused is not None:
            st.warning(messages.md_escape(refused))
        else:
            st.dataframe(found, hide_index=True, key="heads_found")
        cols = st.columns(2)
        layer = S["layer"].number(cols[0].number_input, maximum=cards.num_layers - 1)
        head = S["head"].number(cols[1].number_input, maximum=cards.num_heads - 1)
        show_card(cards, cards.card(layer, head), selection)
