"""Searching head cards (``search_cards(cards, query)``): a small query language, each form mapped to one number
of the cards and a stated threshold, answered with the ranked heads and the number that matched.

    "heads that copy", "copying"      the OV circuit's copying score (``HeadCard.copying``) >= ``COPYING_MIN``,
                                      largest first (needs a family whose weights the circuits read)
    "previous token", "previous"      the corpus's mean attention on the token just before
                                      (``metrics["prev_token_mass"]``) >= ``PREVIOUS_MIN_MASS``, largest first
    "key side from 17-3"              the heads 17-3 K-composes with (``mc.composition``: its ``k_excess``, the
    "query side from 2-5"             score above the random baseline) > ``COMPOSITION_MIN_EXCESS``, largest
    "value side from 0-1"             first; ``composition`` must be given (the table of ``mc.composition``)
    "retrieval heads"                 the heads holding a long-context role in the long part of the cards
    "local heads"                     (``long=``: ``mc.long_cards``): retrieval on the needle prompt (score
    "sink at length"                  >= ``RETRIEVAL_MIN_SCORE``), local or sink at length on a long document
                                      (score >= ``LOCAL_MIN_SHARE``, ``SINK_MIN_MASS``), ranked by the largest
                                      score over the runs, which the matched column names
    a role or a part of one           the heads holding that role ("sink", "positional:previous", "nsubj",
                                      a group as "syntactic"), ranked by score / threshold

Case and extra words ("heads that", "whose", "comes") do not matter. A query none of these forms matches raises
``CardSearchError`` with the forms.
"""

from __future__ import annotations

import re

import pandas as pd

from ..analysis.long_roles import LOCAL_MIN_SHARE, RETRIEVAL_MIN_SCORE, SINK_MIN_MASS
from ..analysis.roles import ROLE_GROUPS
from ..errors import HeadscopeError
from .cards import CardsError, HeadCards
from .long_cards import LongCards

COPYING_MIN = 0.5  # more than three quarters of the OV circuit's eigenvalue mass positive
PREVIOUS_MIN_MASS = 0.5  # most of a query's attention on the token just before, over the corpus
COMPOSITION_MIN_EXCESS = 0.0  # above what random matrices of the same shapes give
RESULT_COLUMNS = ["layer", "head", "matched", "value", "threshold", "primary_role"]
SIDES = {"key": "k", "query": "q", "value": "v", "k": "k", "q": "q", "v": "v"}
_SIDE = re.compile(r"\b(key|query|value|k|q|v)\b.*?\bfrom\s+(\d+)\s*[-.:/]\s*(\d+)\b")
QUERY_FORMS = (
    '"heads that copy", "previous token", "key side from L-H" (or query / value side), "retrieval heads", '
    '"local heads", "sink at length", or a role name ("sink", "positional:previous", "nsubj", "syntactic")'
)
# The long-context roles the search finds in the long part of the cards: (pattern, the role's name or its start);
# each role row carries its own threshold (``RETRIEVAL_MIN_SCORE``, ``SINK_MIN_MASS``, ``LOCAL_MIN_SHARE``).
LONG_FORMS = (
    (re.compile(r"\bretrieval\b"), "retrieval"),
    (re.compile(r"\bsinks? at length\b"), "sink at length"),
    (re.compile(r"\blocal\b"), "local"),
)
LONG_THRESHOLDS = {"retrieval": RETRIEVAL_MIN_SCORE, "sink at length": SINK_MIN_MASS, "local": LOCAL_MIN_SHARE}


class CardSearchError(HeadscopeError, ValueError):
    """A query the card search does not understand, or one that needs what was not given (the composition)."""


def needs_composition(query: str) -> bool:
    """Whether ``query`` asks whose key, query or value side comes from a head (``search_cards`` then needs the
    composition)."""
    return isinstance(query, str) and _SIDE.search(" ".join(query.lower().split())) is not None


def search_cards(
    cards: HeadCards, query: str, composition: pd.DataFrame | None = None, long: LongCards | None = None
) -> pd.DataFrame:
    """The heads ``query`` finds in ``cards``, ranked: columns layer, head, matched (the number's name), value,
    threshold (what the value had to pass) and primary_role. ``long``: the long part of the cards
    (``mc.long_cards``), for the long-context roles. The module's docstring gives the query language."""
    if not isinstance(query, str) or not query.strip():
        raise CardSearchError(f"Type a search: {QUERY_FORMS}.")
    text = " ".join(query.lower().split())
    side = _SIDE.search(text)
    if side is not None:
        return _composed(cards, SIDES[side.group(1)], (int(side.group(2)), int(side.group(3))), composition)
    for pattern, role in LONG_FORMS:
        if pattern.search(text):
            return _long_role(cards, long, role)
    if re.search(r"\bcop(y|ies|ying)\b", text):
        rows = [(c, c.copying) for c in cards.cards if c.copying is not None and c.copying >= COPYING_MIN]
        if all(c.copying is None for c in cards.cards):
            raise CardSearchError("These cards have no copying scores: the model's family has no OV circuit here.")
        return _ranked(rows, "copying score (OV circuit)", COPYING_MIN)
    if re.search(r"\bprevious\b", text) and "positional:previous" not in text:
        rows = [(c, c.metrics["prev_token_mass"]) for c in cards.cards]
        return _ranked(
            [r for r in rows if r[1] >= PREVIOUS_MIN_MASS], "attention on the previous token", PREVIOUS_MIN_MASS
        )
    return _by_role(cards, text)


def _ranked(rows: list, matched: str, threshold: float) -> pd.DataFrame:
    rows = sorted(rows, key=lambda row: (-row[1], row[0].layer, row[0].head))
    return pd.DataFrame(
        [(c.layer, c.head, matched, float(value), float(threshold), c.primary_role) for c, value in rows],
        columns=RESULT_COLUMNS,
    )


def _by_role(cards: HeadCards, text: str) -> pd.DataFrame:
    wanted = text.removeprefix("heads that are ").removeprefix("heads ").strip()
    known: set[str] = set(ROLE_GROUPS)  # a role group no head holds finds no head; a word no role has is refused
    rows = []
    for card in cards.cards:
        best = None
        for role in card.roles:
            names = {str(role["role"]), str(role["group"]), *str(role["role"]).split(":")}
            known |= names
            if wanted in names:
                threshold = float(role["threshold"]) or 1.0
                strength = float(role["score"]) / threshold
                if best is None or strength > best[0]:
                    best = (strength, role)
        if best is not None:
            rows.append((card, best[0], best[1]))
    if not rows:
        if wanted in known:
            return pd.DataFrame(columns=RESULT_COLUMNS)
        raise CardSearchError(f"No head has a role {wanted!r}. Search for {QUERY_FORMS}.")
    rows.sort(key=lambda row: (-row[1], row[0].layer, row[0].head))
    return pd.DataFrame(
        [
            (c.layer, c.head, str(role["role"]), float(role["score"]), float(role["threshold"]), c.primary_role)
            for c, _, role in rows
        ],
        columns=RESULT_COLUMNS,
    )


def needs_long(query: str) -> bool:
    """Whether ``query`` asks for a long-context role (``search_cards`` then reads the long part of the cards)."""
    text = " ".join(query.lower().split()) if isinstance(query, str) else ""
    return _SIDE.search(text) is None and any(pattern.search(text) for pattern, _ in LONG_FORMS)


def _long_role(cards: HeadCards, long: LongCards | None, role: str) -> pd.DataFrame:
    if long is None:
        raise CardSearchError(
            f"Which heads are {role} heads is read from the long part of the cards (mc.long_cards(model), "
            "decoders only): build it and search again."
        )
    rows = []
    for card in long.cards:
        held = [r for r in card.roles if str(r["role"]).startswith(role)]
        if held:
            best = max(held, key=lambda r: float(r["score"]))
            rows.append((card, best))
    rows.sort(key=lambda row: (-float(row[1]["score"]), row[0].layer, row[0].head))
    return pd.DataFrame(
        [
            (
                c.layer,
                c.head,
                f"{r['role']} ({r['run']})",
                float(r["score"]),
                float(r["threshold"]),
                cards.card(c.layer, c.head).primary_role,
            )
            for c, r in rows
        ],
        columns=RESULT_COLUMNS,
    )


def _composed(cards: HeadCards, mode: str, sender: tuple[int, int], composition: pd.DataFrame | None) -> pd.DataFrame:
    layer, head = sender
    try:
        cards.card(layer, head)  # a head the model has
    except CardsError as error:
        raise CardSearchError(str(error)) from error
    side = {"k": "key", "q": "query", "v": "value"}[mode]
    if composition is None:
        raise CardSearchError(
            f"Which heads' {side} side comes from {layer}-{head} is read from the composition of every pair of heads "
            "(mc.composition(model)): compute it and search again."
        )
    column = f"{mode}_excess"
    found = composition[
        (composition["sender_layer"] == layer)
        & (composition["sender_head"] == head)
        & (composition[column] > COMPOSITION_MIN_EXCESS)
    ]
    rows = [
        (cards.card(int(r.receiver_layer), int(r.receiver_head)), float(getattr(r, column))) for r in found.itertuples()
    ]
    return _ranked(
        rows, f"{mode.upper()}-composition with {layer}-{head} above the random baseline", COMPOSITION_MIN_EXCESS
    )
