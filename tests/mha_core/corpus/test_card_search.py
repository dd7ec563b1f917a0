"""Searching head cards: each form of the query language on a planted card set."""

from __future__ import annotations

import pandas as pd
import pytest

from mha_core.analysis.long_roles import LOCAL_MIN_SHARE, RETRIEVAL_MIN_SCORE, SINK_MIN_MASS
from mha_core.corpus.card_search import (
    COPYING_MIN,
    PREVIOUS_MIN_MASS,
    CardSearchError,
    needs_composition,
    needs_long,
    search_cards,
)
from mha_core.corpus.cards import CARD_METRICS, HeadCard, HeadCards
from mha_core.corpus.long_cards import NEEDLE_RUN, LongCard, LongCards


def planted(copying=None, previous=None, roles=None) -> HeadCards:
    """2 layers x 3 heads; ``copying``, ``previous`` ({(layer, head): value}) and ``roles`` ({(layer, head): [(role,
    group, score, threshold)]}) planted, everything else neutral."""
    cards = []
    for layer in range(2):
        for head in range(3):
            metrics = dict.fromkeys(CARD_METRICS, 0.0)
            metrics["prev_token_mass"] = (previous or {}).get((layer, head), 0.1)
            own = [
                {"role": r, "group": g, "score": s, "threshold": t, "evidence": ""}
                for r, g, s, t in (roles or {}).get((layer, head), [])
            ]
            cards.append(
                HeadCard(
                    layer,
                    head,
                    own[0]["role"] if own else "none",
                    tuple(own),
                    metrics,
                    (),
                    (),
                    (copying or {}).get((layer, head), -0.2) if copying is not False else None,
                    0.0,
                )
            )
    return HeadCards("planted", 2, 3, 10, tuple(cards))


def heads(found: pd.DataFrame) -> list[tuple[int, int]]:
    return list(zip(found["layer"], found["head"]))


def test_copying_ranks_heads_above_the_threshold():
    cards = planted(copying={(0, 1): 0.6, (1, 2): 0.95, (1, 0): COPYING_MIN - 0.01})
    for query in ("heads that copy", "Copying", "which heads copies"):
        found = search_cards(cards, query)
        assert heads(found) == [(1, 2), (0, 1)]
        assert found["value"].tolist() == pytest.approx([0.95, 0.6])
        assert set(found["threshold"]) == {COPYING_MIN}
    with pytest.raises(CardSearchError, match="no copying scores"):
        search_cards(planted(copying=False), "heads that copy")


def test_previous_token_reads_the_corpus_mass():
    cards = planted(previous={(0, 2): 0.7, (1, 1): 0.9, (0, 0): PREVIOUS_MIN_MASS - 0.01})
    found = search_cards(cards, "heads that attend to the previous token")
    assert heads(found) == [(1, 1), (0, 2)]
    assert found["value"].tolist() == pytest.approx([0.9, 0.7])
    assert found["matched"].iloc[0] == "attention on the previous token"


def test_roles_by_name_group_or_part():
    roles = {
        (0, 0): [("sink", "sink", 0.8, 0.5)],
        (1, 1): [("sink", "sink", 0.6, 0.5), ("syntactic:nsubj:dependent", "syntactic", 0.3, 0.1)],
        (1, 2): [("syntactic:obj:dependent", "syntactic", 0.15, 0.1)],
        (0, 1): [("positional:previous", "positional", 0.95, 0.9)],
    }
    cards = planted(roles=roles)
    assert heads(search_cards(cards, "sink")) == [(0, 0), (1, 1)]  # 0.8/0.5 before 0.6/0.5
    assert heads(search_cards(cards, "nsubj")) == [(1, 1)]
    assert heads(search_cards(cards, "syntactic")) == [(1, 1), (1, 2)]  # 3.0 before 1.5
    found = search_cards(cards, "positional:previous")
    assert heads(found) == [(0, 1)] and found["value"].tolist() == pytest.approx([0.95])
    assert search_cards(cards, "coreference").empty  # a role no head holds here
    with pytest.raises(CardSearchError, match="No head has a role 'banana'"):
        search_cards(cards, "banana")
    with pytest.raises(CardSearchError, match="Type a search"):
        search_cards(cards, "  ")


def test_key_side_reads_the_composition():
    cards = planted()
    composition = pd.DataFrame(
        {
            "sender_layer": [0, 0, 0, 0, 0, 0],
            "sender_head": [2, 2, 2, 1, 1, 1],
            "receiver_layer": [1, 1, 1, 1, 1, 1],
            "receiver_head": [0, 1, 2, 0, 1, 2],
            "k_excess": [0.05, 0.30, -0.02, 0.9, 0.9, 0.9],
            "q_excess": [0.4, 0.0, 0.1, 0.0, 0.0, 0.0],
        }
    )
    found = search_cards(cards, "heads whose key side comes from 0-2", composition=composition)
    assert heads(found) == [(1, 1), (1, 0)]
    assert found["value"].tolist() == pytest.approx([0.30, 0.05])
    assert heads(search_cards(cards, "query side from 0.2", composition=composition)) == [(1, 0), (1, 2)]
    assert needs_composition("Heads whose KEY side comes from 17-3") and not needs_composition("heads that copy")
    with pytest.raises(CardSearchError, match="composition of every pair"):
        search_cards(cards, "key side from 0-2")
    with pytest.raises(CardSearchError, match="layer must be a whole number from 0 to 1"):
        search_cards(cards, "key side from 5-0", composition=composition)


def planted_long(roles: dict) -> LongCards:
    """The long part of ``planted``'s 2 x 3 heads: ``roles`` ({(layer, head): [(run, role, score, threshold)]})."""
    cards = tuple(
        LongCard(
            layer,
            head,
            tuple(
                {"run": run, "role": role, "score": score, "threshold": threshold, "n": 10, "evidence": ""}
                for run, role, score, threshold in roles.get((layer, head), [])
            ),
            (),
        )
        for layer in range(2)
        for head in range(3)
    )
    return LongCards("planted", 2, 3, ("a", "b"), (100, 200), 300, cards)


def test_long_roles_are_found_in_the_long_part_with_their_run():
    cards = planted(roles={(1, 1): [("sink", "sink", 0.9, 0.5)]})
    long = planted_long(
        {
            (0, 2): [(NEEDLE_RUN, "retrieval", 0.4, RETRIEVAL_MIN_SCORE)],
            (1, 0): [(NEEDLE_RUN, "retrieval", 0.8, RETRIEVAL_MIN_SCORE), ("a", "local (window 3)", 0.7, 0.5)],
            (1, 1): [("a", "sink at length", 0.6, SINK_MIN_MASS), ("b", "sink at length", 0.95, SINK_MIN_MASS)],
            (0, 0): [("b", "local (window 5)", 0.55, LOCAL_MIN_SHARE)],
        }
    )
    for query in ("retrieval heads", "Retrieval"):
        found = search_cards(cards, query, long=long)
        assert heads(found) == [(1, 0), (0, 2)] and found["value"].tolist() == pytest.approx([0.8, 0.4])
        assert found["matched"].tolist() == [f"retrieval ({NEEDLE_RUN})"] * 2
        assert set(found["threshold"]) == {RETRIEVAL_MIN_SCORE}
    found = search_cards(cards, "local heads", long=long)
    assert heads(found) == [(1, 0), (0, 0)] and found["matched"].tolist() == [
        "local (window 3) (a)",
        "local (window 5) (b)",
    ]
    assert set(found["threshold"]) == {LOCAL_MIN_SHARE}
    found = search_cards(cards, "heads that are sinks at length", long=long)  # the best of its runs
    assert (
        heads(found) == [(1, 1)] and found["value"].tolist() == [0.95] and found["matched"][0] == "sink at length (b)"
    )
    assert found["primary_role"].tolist() == ["sink"] and found["threshold"].tolist() == [SINK_MIN_MASS]
    assert heads(search_cards(cards, "sink")) == [(1, 1)]  # the corpus role is another form
    assert search_cards(cards, "retrieval", long=planted_long({})).empty
    assert needs_long("local heads") and not needs_long("sink") and not needs_long("key side from 0-1")
    with pytest.raises(CardSearchError, match="long part of the cards"):
        search_cards(cards, "retrieval heads")
