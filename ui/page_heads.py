"""The Heads page's settings (``HeadsSettings``, declared once: ``ui.page_settings``) and its logic: the search's
rows, a context's tokens with its query and key marked, the Explore address of a context, and the same for the long
part of a decoder's cards (``mha_core.long_cards``). ``pages/heads.py`` draws them (through ``ui.heads_page``)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from mha_core.corpus.card_effects import HeadEffect
from mha_core.corpus.card_search import QUERY_FORMS, CardSearchError, needs_composition, search_cards
from mha_core.corpus.cards import CardContext, HeadCard, HeadCards
from mha_core.corpus.long_cards import NEEDLE_RUN, LongCard, LongCards, LongCardsError, LongContext, check_long_model
from ui.escape import md_escape
from ui.i18n import chinese, t
from ui.page_roles import role_shown, shown_by_templates
from ui.page_settings import PageSettings, setting

# The heads' ablation effect the page measures on a click: each head alone zeroed over this many UD EWT dev
# sentences (``mha_core.head_importance(method="ablation")``: layers x heads passes over them).
ABLATION_SENTENCES = 20
CARD_SENTENCES = 100  # UD EWT dev sentences the cards read by default (the whole split: 2,002)
SEARCH_EXAMPLES = ("heads that copy", "previous token", "sink", "nsubj")
QUERY_MARK, KEY_MARK = "blue", "orange"  # the colours that mark a context's query and key tokens


@dataclass(frozen=True)
class HeadsSettings(PageSettings):
    """Every setting of the Heads page: how many UD dev sentences the cards read, the search, the chosen head."""

    sentences: int = setting(
        "heads_sentences", "hsent", "number", CARD_SENTENCES, label="UD dev sentences", minimum=10, maximum=2002
    )
    search: str | None = setting(
        "heads_search",
        "find",
        "text",
        label="Search the heads",
        help='"heads that copy", "previous token", "key side from 3-4", or a role such as "sink" or "nsubj".',
    )
    layer: int = setting("heads_layer", "hlayer", "number", 0, label="Layer", minimum=0)
    head: int = setting("heads_head", "hhead", "number", 0, label="Head", minimum=0)
    # A decoder's cards over the long documents too (``mha_core.long_cards``: heavy, started through ui.compute).
    long: bool = setting("heads_long", "hlong", "flag", False, label="and the long documents")


# ---- what the page shows -------------------------------------------------------------------------------------
def search_rows(
    cards: HeadCards, query: str | None, composition: pd.DataFrame | None = None, long: LongCards | None = None
) -> tuple[pd.DataFrame, str | None]:
    """(the heads the search finds, the search's refusal in words or None); every head without a search.
    ``composition``: ``mc.composition``'s table, for a search of whose key / query / value side comes from a head;
    ``long``: the long part of the cards, for the long-context roles."""
    if not query or not query.strip():
        table = cards.table()[["layer", "head", "primary_role", "copying", "previous_token", "prev_token_mass"]]
        return table, None
    try:
        return search_cards(cards, query, composition=composition, long=long), None
    except CardSearchError as error:
        return pd.DataFrame(), str(error)


def picked_head(found: pd.DataFrame, rows) -> tuple[int, int] | None:
    """The head of the search table's selected row (``rows``: the selection's row positions in ``found``), or None
    when no row (or a row the table no longer has) is selected."""
    if not rows or not 0 <= int(rows[0]) < len(found):
        return None
    row = found.iloc[int(rows[0])]
    return int(row["layer"]), int(row["head"])


def wants_composition(query: str | None) -> bool:
    return bool(query) and needs_composition(query)


def marked_tokens(context: CardContext) -> str:
    """The context's tokens as markdown, each escaped (``md_escape``), the query on a blue background and the key on
    an orange one (one token both: the query's colour, the key's in words after it)."""
    shown = []
    for position, token in enumerate(context.tokens):
        text = md_escape(token)
        if position == context.query:
            text = f":{QUERY_MARK}-background[**{text}**]"
        elif position == context.key:
            text = f":{KEY_MARK}-background[**{text}**]"
        shown.append(text)
    return " ".join(shown)


def context_caption(context: CardContext, kind: str) -> str:
    """What a context's numbers say, in words."""
    query, key = md_escape(context.tokens[context.query]), md_escape(context.tokens[context.key])
    if kind == "attention":
        return t(
            "query {query} ({query_token}) puts {weight} on key {key} ({key_token})",
            query=context.query,
            query_token=query,
            weight=f"{context.weight:.0%}",
            key=context.key,
            key_token=key,
        )
    return t(
        "output norm {norm} at {query} ({query_token}), which looks most at {key} ({key_token}, {weight})",
        norm=f"{context.value:.3g}",
        query=context.query,
        query_token=query,
        key=context.key,
        key_token=key,
        weight=f"{context.weight:.0%}",
    )


def card_numbers(card: HeadCard) -> list[tuple[str, str]]:
    """(name, value in words) of the card's numbers, for its table."""
    rows = [(t("primary role"), role_shown(card.primary_role))]
    for role in card.roles:
        rows.append(
            (
                t("role {role}", role=role_shown(role["role"])),
                t(
                    "{score} (threshold {threshold})",
                    score=f"{role['score']:.3g}",
                    threshold=f"{role['threshold']:.3g}",
                ),
            )
        )
    if card.copying is not None:
        rows.append((t("copying score (OV circuit)"), f"{card.copying:.3f}"))
        rows.append((t("previous-token score (QK circuit)"), f"{card.previous_token:.3f}"))
    for name, value in card.metrics.items():
        rows.append((name, f"{value:.3f}"))
    return rows


# The measured effects' words as ``mha_core.corpus.card_effects`` writes them (``shown_by_templates``).
EFFECT_TEMPLATES = (
    "{loss} change when the head alone is zeroed (mean over {texts} texts)",
    "importance (Michel et al. 2019, gradient) normalised per layer",
    "importance (Michel et al. 2019, gradient)",
    "path into {receivers} through their {via}: share of the logit difference ({pair})",
    "share of the logit difference restored, exact ({pair})",
    "share of the logit difference restored, attribution estimate ({pair})",
)
EFFECT_WORDS = ("next-token loss", "masked-token loss", "output change", "query", "key", "value")


def effect_measure_shown(measure: str) -> str:
    """A measured effect's words in the session's language (its answer and foil stay as written)."""
    return shown_by_templates(measure, EFFECT_TEMPLATES, EFFECT_WORDS)


def found_shown(found: pd.DataFrame) -> pd.DataFrame:
    """The search's table as shown: its columns named, and its roles, in the session's language."""
    if not chinese():
        return found
    shown = found.copy()
    for column in ("primary_role", "matched"):
        if column in shown:
            shown[column] = [role_shown(str(role)) for role in shown[column]]
    return shown.rename(columns={column: t(column) for column in shown.columns})


def effect_rows(effects: tuple[HeadEffect, ...]) -> list[tuple[str, str, str]]:
    """(what, task, value in words) of a card's measured effects: an ablation and a patching row say "not
    measured" when no table measured them (never a number made up)."""
    rows = [(f"{t(e.kind)}: {effect_measure_shown(e.measure)}", e.task, f"{e.value:+.4g}") for e in effects]
    if not any(e.kind in ("ablation", "importance") for e in effects):
        rows.append((t("ablation effect"), "", t("not measured")))
    if not any(e.kind in ("patching", "path patching") for e in effects):
        rows.append((t("patching effect"), "", t("not measured")))
    return rows


def explore_link(cards: HeadCards, card: HeadCard, context: CardContext, model: str, engine: str) -> dict[str, str]:
    """The Explore address of ``context``: the library's query with the sidebar's model (as the sidebar names it)
    and engine."""
    return {**cards.explore_query(card, context), "model": model, "engine": engine}


# The search's refusals as ``mha_core.corpus.card_search`` words them (``shown_by_templates``); the search words they
# quote stay English (a search is typed in English).
REFUSAL_TEMPLATES = (
    "Type a search: {forms}.",
    "No head has a role {wanted}. Search for {forms}.",
    "These cards have no copying scores: the model's family has no OV circuit here.",
    "Which heads' {side} side comes from {layer}-{head} is read from the composition of every pair of heads "
    "(mc.composition(model)): compute it and search again.",
    "Which heads are {role} heads is read from the long part of the cards (mc.long_cards(model), decoders only): "
    "build it and search again.",
)


def refusal_shown(refusal: str) -> str:
    """The search's refusal in the session's language."""
    return shown_by_templates(refusal, REFUSAL_TEMPLATES, (QUERY_FORMS, "key", "query", "value"))


# ---- the long part of the cards ------------------------------------------------------------------------------
def has_long_part(model) -> bool:
    """Whether ``model``'s cards have a long part (a decoder the long path reads, such as SmolLM2)."""
    try:
        check_long_model(model)
    except LongCardsError:
        return False
    return True


def long_role_shown(role: str) -> str:
    """A long-context role's name in the session's language."""
    if role.startswith("local (window "):
        return t("local (window {window})", window=role.removeprefix("local (window ").removesuffix(")"))
    return {"retrieval": t("retrieval"), "sink at length": t("sink at length")}.get(role, role)


def long_run_shown(long: LongCards, run: str) -> str:
    """Which run a number is from, in words: the needle prompt or a long example (numbered as Explore's)."""
    if run == NEEDLE_RUN:
        return t("the needle prompt, teacher-forced ({count} tokens)", count=f"{long.needle_tokens:,}")
    index = long.documents.index(run) if run in long.documents else None
    if index is None:
        return run
    return t("long example {number} ({count} tokens)", number=index + 1, count=f"{long.document_tokens[index]:,}")


def long_card_numbers(long: LongCards, card: LongCard) -> list[tuple[str, str, str]]:
    """(role, run, score with its threshold) of the head's long-context roles, for its table."""
    return [
        (
            long_role_shown(str(role["role"])),
            long_run_shown(long, str(role["run"])),
            t("{score} (threshold {threshold})", score=f"{role['score']:.3g}", threshold=f"{role['threshold']:.3g}"),
        )
        for role in card.roles
    ]


def long_marked_tokens(context: LongContext) -> str:
    """The tokens around a long context's key and query as markdown, each escaped, the query on a blue background and
    the key on an orange one; the two windows joined with "…" when they do not meet."""
    spans = [(context.key_start, context.key_tokens), (context.query_start, context.query_tokens)]
    pieces = {}
    for start, tokens in spans:
        for offset, token in enumerate(tokens):
            pieces[start + offset] = token
    shown, last = [], None
    for position in sorted(pieces):
        if last is not None and position > last + 1:
            shown.append("…")
        text = md_escape(pieces[position])
        if position == context.query:
            text = f":{QUERY_MARK}-background[**{text}**]"
        elif position == context.key:
            text = f":{KEY_MARK}-background[**{text}**]"
        shown.append(text)
        last = position
    return " ".join(shown)


def long_context_caption(long: LongCards, context: LongContext) -> str:
    query = md_escape(context.query_tokens[context.query - context.query_start])
    key = md_escape(context.key_tokens[context.key - context.key_start])
    return t(
        "{document}: query {query} ({query_token}) puts {weight} on key {key} ({key_token})",
        document=long_run_shown(long, context.label),
        query=context.query,
        query_token=query,
        weight=f"{context.weight:.0%}",
        key=context.key,
        key_token=key,
    )


def long_explore_link(long: LongCards, card: LongCard, context: LongContext, model: str, engine: str) -> dict[str, str]:
    """The Explore address that opens the long-document zoom on ``context``, with the sidebar's model and engine."""
    return {**long.explore_query(card, context), "model": model, "engine": engine}
