"""The Heads page under AppTest: the cards it shows are the library's, the search finds the library's heads, a
card's contexts show their tokens escaped with the query and key marked, a bad search gets a message, and
"Open in Explore" opens the context there; a decoder's card shows its long part, whose contexts open Explore's
long-document zoom."""

from __future__ import annotations

import dataclasses
import json

import pytest

import mha_core as mc
from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.corpus import long_cards as long_cards_module
from mha_core.corpus.long_cards import NEEDLE_RUN
from mha_core.corpus.reading import corpus_texts
from tests.model_fixtures import build_tiny_llama
from tests.page_helpers import open_app, rerun
from ui.escape import md_escape
from ui.page_heads import long_marked_tokens, long_role_shown, marked_tokens, picked_head

PAGE = "heads"
SENTENCES = 10


@pytest.fixture(scope="module")
def cards(minilm, tmp_path_factory):
    """MiniLM's cards over the first UD dev sentences, in a cache of the module's own (the page reads it too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("cards-cache")))
        yield mc.head_cards(minilm, ud_ewt_dev(SENTENCES), batch_size=16)


def test_card_search_and_contexts_are_the_librarys(cards):
    app = open_app(PAGE, {"hsent": str(SENTENCES), "hlayer": "1", "hhead": "2"})
    assert not app.error, [e.value for e in app.error]
    table = app.dataframe[0].value
    assert list(zip(table["layer"], table["head"])) == [(c.layer, c.head) for c in cards.cards]
    assert table["primary_role"].tolist() == [c.primary_role for c in cards.cards]
    card = cards.card(1, 2)
    markdown = [m.value for m in app.markdown]
    for context in card.attention[:5] + card.output[:5]:
        assert marked_tokens(context) in markdown
    assert any("Head 1-2" in h.value for h in app.subheader)
    # the search: the library's heads in its order
    role = "sink"
    app.text_input(key="heads_search").set_value(role)
    rerun(app)
    found = mc.search_cards(cards, role)
    assert len(found)
    shown = app.dataframe[0].value
    assert list(zip(shown["layer"], shown["head"])) == list(zip(found["layer"], found["head"]))
    app.text_input(key="heads_search").set_value("<b>banana</b>")
    rerun(app)
    assert any("No head has a role" in w.value and "<b>" not in w.value for w in app.warning)


def test_a_cards_further_contexts_are_drawn_once_their_expander_is_opened(cards):
    app = open_app(PAGE, {"hsent": str(SENTENCES), "hlayer": "1", "hhead": "2"})
    card = cards.card(1, 2)
    assert len(card.attention) > 5
    buttons = {button.key for button in app.button}
    assert "heads_open_attention_4" in buttons and "heads_open_attention_5" not in buttons
    assert marked_tokens(card.attention[5]) not in [m.value for m in app.markdown]
    app.session_state["heads_every_attention"] = True  # the expander opened
    rerun(app)
    assert "heads_open_attention_5" in {button.key for button in app.button}
    markdown = [m.value for m in app.markdown]
    assert all(marked_tokens(context) in markdown for context in card.attention)


def test_open_in_explore_carries_the_context(cards):
    app = open_app(PAGE, {"hsent": str(SENTENCES), "hlayer": "0", "hhead": "1"})
    context = cards.card(0, 1).attention[0]
    app.button(key="heads_open_attention_0").click()
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["text"] == context.text
    assert app.query_params.get("focus") in (str(context.query), [str(context.query)])


def test_marked_tokens_escape_and_mark():
    context = mc.CardContext(0, "a *b* c", ("a", "*b*", "[c]"), query=1, key=2, weight=0.5, value=0.5)
    shown = marked_tokens(context)
    assert shown == f"a :blue-background[**{md_escape('*b*')}**] :orange-background[**{md_escape('[c]')}**]"


def test_key_side_search_reads_the_composition(minilm, cards):
    app = open_app(PAGE, {"hsent": str(SENTENCES), "find": "key side from 0-3"})
    assert not app.error, [e.value for e in app.error]
    found = mc.search_cards(cards, "key side from 0-3", composition=mc.composition(minilm))
    shown = app.dataframe[0].value
    # the same heads with the same numbers (to float32 rounding, which thread counts change), largest first
    assert len(found) and set(zip(shown["layer"], shown["head"])) == set(zip(found["layer"], found["head"]))
    expected = {(l, h): v for l, h, v in zip(found["layer"], found["head"], found["value"])}
    for l, h, v in zip(shown["layer"], shown["head"], shown["value"]):
        assert v == pytest.approx(expected[l, h], rel=1e-4, abs=1e-6)
    assert shown["value"].is_monotonic_decreasing


def test_effects_say_not_measured_until_the_ablation_is_measured(minilm, cards, monkeypatch):
    """No number before a measurement; after the click, the head's ablation effect is the library's (the mean
    change over the sentences of ``head_importance(method="ablation")``: tests/mha_core/corpus/test_card_effects.py
    checks that number against an independent computation)."""
    from ui import heads_page

    monkeypatch.setattr(heads_page, "ABLATION_SENTENCES", 3)  # the page's table over 3 sentences, quickly
    app = open_app(PAGE, {"hsent": str(SENTENCES), "hlayer": "2", "hhead": "4"})
    assert not app.error, [e.value for e in app.error]
    effects = app.table[1].value
    assert effects.iloc[:, -1].tolist() == ["not measured", "not measured"]
    (button,) = [b for b in app.button if b.key.startswith("heads_ablation_")]
    button.click()
    rerun(app)
    assert not app.exception, [e.value for e in app.exception]
    effects = app.table[1].value
    table = mc.head_importance(minilm, corpus_texts(ud_ewt_dev(3)), method="ablation")
    raw = table[(table["layer"] == 2) & (table["head"] == 4)]["raw"].iloc[0]
    assert float(effects.iloc[0, -1]) == pytest.approx(raw / 3, rel=1e-3, abs=1e-6)  # shown to 4 digits
    assert "UD EWT dev, 3 sentences" in effects.iloc[0].tolist()
    assert effects.iloc[-1, -1] == "not measured"  # patching: the Circuits page computed none


def test_the_search_table_opens_the_clicked_rows_card(cards):
    """The table selects one row, and a selected row names the head the page then shows (the click itself:
    tests/browser/test_browser_heads.py, AppTest has no table selection)."""
    from streamlit.proto.Dataframe_pb2 import Dataframe

    app = open_app(PAGE, {"hsent": str(SENTENCES), "find": "sink"})
    table = app.dataframe[0]
    assert list(table.proto.selection_mode) == [Dataframe.SelectionMode.SINGLE_ROW]
    found = mc.search_cards(cards, "sink")
    assert len(found) > 1
    last = len(found) - 1
    assert picked_head(table.value, [last]) == (found["layer"].iloc[last], found["head"].iloc[last])
    assert picked_head(table.value, []) is None and picked_head(table.value, [len(found)]) is None


@pytest.fixture(scope="module")
def tiny_decoder(tmp_path_factory):
    """A tiny randomly initialised Llama (256 positions: the long examples are read to their first 256 tokens, the
    needle prompt is 256 long) and its cards with their long part, in a cache of the module's own."""
    path = str(build_tiny_llama(tmp_path_factory.mktemp("llama-heads"), max_positions=256, randomised=True))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path_factory.mktemp("long-cards-cache")))
        model = mc.load_model(path)
        long = mc.long_cards(model)
        # A random model holds no long-context role: two planted on head 1-2, in the cache the page reads.
        planted = (
            {"run": NEEDLE_RUN, "role": "retrieval", "score": 0.25, "threshold": 0.1, "n": 8, "evidence": ""},
            {
                "run": long.documents[1],
                "role": "local (window 3)",
                "score": 0.625,
                "threshold": 0.5,
                "n": 9,
                "evidence": "",
            },
        )
        cards = list(long.cards)
        cards[long.num_heads + 2] = dataclasses.replace(long.card(1, 2), roles=planted)
        long = dataclasses.replace(long, cards=tuple(cards))
        key = long_cards_module.long_cards_key(
            model, long_cards_module.document_entries(None), 20, long_cards_module.needle_length(model, None)
        )
        long_cards_module.store_long_cards(key, long)
        yield path, mc.head_cards(model, ud_ewt_dev(SENTENCES), batch_size=16), long


def test_a_decoders_card_shows_its_long_part_and_opens_its_contexts_in_explore(tiny_decoder):
    path, cards, long = tiny_decoder
    card = long.card(1, 2)
    query = {"model": path, "hsent": str(SENTENCES), "hlayer": str(card.layer), "hhead": str(card.head), "hlong": "1"}
    app = open_app(PAGE, query)
    assert not app.error, [e.value for e in app.error]
    assert app.session_state["heads_long"] is True
    assert len(card.contexts) == 20
    markdown = [m.value for m in app.markdown]
    assert "**Long documents**" in markdown
    for context in card.contexts[:5]:
        assert long_marked_tokens(context) in markdown
    assert long_marked_tokens(card.contexts[5]) not in markdown  # behind "every context"
    (roles,) = [table.value for table in app.table if "long-context role" in table.value.columns]
    assert roles.iloc[:, 0].tolist() == [long_role_shown(r["role"]) for r in card.roles]
    assert roles.iloc[:, 0].tolist() == ["retrieval", "local (window 3)"]
    assert roles.iloc[:, 1].tolist() == [
        f"the needle prompt, teacher-forced ({long.needle_tokens} tokens)",
        f"long example 2 ({long.document_tokens[1]} tokens)",
    ]
    assert roles.iloc[:, 2].tolist() == ["0.25 (threshold 0.1)", "0.625 (threshold 0.5)"]
    # the search reads the long part: the library's heads in its order
    app.text_input(key="heads_search").set_value("retrieval heads")
    rerun(app)
    found = mc.search_cards(cards, "retrieval heads", long=long)
    shown = app.dataframe[0].value
    assert list(zip(shown["layer"], shown["head"])) == list(zip(found["layer"], found["head"])) == [(1, 2)]
    assert shown["value"].tolist() == [0.25] and shown["matched"].tolist() == [f"retrieval ({NEEDLE_RUN})"]
    # a context opens Explore's long-document zoom on its document, head and region
    context = card.contexts[0]
    app.button(key="heads_open_long_0").click()
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    link = long.explore_query(card, context)
    assert app.session_state["long_doc"] == link["long"] == str(context.document)
    assert (app.session_state["layer"], app.session_state["head"]) == (card.layer, card.head)
    # the link opens the zoom at once (one person's own server): the query's rows against the key's columns
    (view,) = [e for e in app.get("bidi_component") if e.proto.component_name == "headscope_long_view"]
    data = json.loads(view.proto.json)
    r0, r1, c0, c1 = context.zoom(long.document_tokens[context.document])
    assert (data["layer"], data["head"], data["region"]) == (card.layer, card.head, [r0, r1, c0, c1])
    assert app.query_params["lzoom"] == link["lzoom"]


def test_an_encoder_says_it_has_no_long_part(cards):
    app = open_app(PAGE, {"hsent": str(SENTENCES), "hlong": "1"})
    assert not app.error, [e.value for e in app.error]
    assert any("is for decoders" in info.value for info in app.info)
    assert not [b for b in app.button if b.key.startswith("heads_open_long_")]
    app = open_app(PAGE, {"hsent": str(SENTENCES), "find": "retrieval heads"})
    assert any("long part of the cards" in w.value for w in app.warning)
