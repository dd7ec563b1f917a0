"""The long part of the head cards: every context's weight against transformers' eager attentions of the same
tokens, the ranking over documents, sinks left out, the roles against ``LongRun.roles``, the cache, encoders
refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.analysis.streamed import SINK_TOKENS
from mha_core.corpus import long_cards as long_module
from mha_core.corpus.cards import CardsError
from mha_core.corpus.long_cards import NEEDLE_RUN, LongCards, LongCardsError, long_cards
from mha_core.models.long import NEEDLE, NEEDLE_QUESTION, needle_prompt, run_long
from tests.conftest import ENGINE_ATOL
from tests.model_fixtures import CORPUS, build_tiny_bert, build_tiny_llama

TOP = 5
NEEDLE_LENGTH = 200
DOCUMENTS = (
    {"label": "first", "text": " ".join(CORPUS[:3])},
    {"label": "second", "text": " ".join(CORPUS[3:])},
    {"label": "nested", "text": " ".join(CORPUS[:3]) + " " + CORPUS[-1]},  # begins with the first, as shipped ones do
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("llama256"), max_positions=256, randomised=True)
    return mc.load_model(str(path))


@pytest.fixture(scope="module")
def built(llama):
    return long_cards(llama, DOCUMENTS, top=TOP, needle_tokens=NEEDLE_LENGTH, cache=False)


def eager_attentions(model, text: str) -> tuple[np.ndarray, np.ndarray]:
    """(``[L, H, n, n]`` from transformers' eager attention, the sink keys) of the tokens the long path reads."""
    encoded = model.encode_long(text)
    with torch.inference_mode():
        out = model.hf_model(input_ids=torch.tensor([encoded.input_ids]), output_attentions=True)
    attentions = torch.stack([a[0] for a in out.attentions]).float().numpy()
    sinks = np.asarray(encoded.special_mask, dtype=bool).copy()
    sinks[:SINK_TOKENS] = True
    return attentions, sinks


# 1000: more than every row of both documents, so each row whose largest weight is on a sink is read from exact
# blocks (with 5, the row statistics alone decide on this model).
@pytest.mark.parametrize("top", [TOP, 1000])
def test_contexts_are_the_largest_non_sink_weights_over_every_document(llama, built, top):
    if top != TOP:
        built = long_cards(llama, DOCUMENTS, top=top, needle_tokens=NEEDLE_LENGTH, cache=False)
    eager = [eager_attentions(llama, document["text"]) for document in DOCUMENTS]
    assert built.documents == ("first", "second", "nested")
    ids = [llama.encode_long(document["text"]).input_ids for document in DOCUMENTS]
    # the rows a document shares with an earlier one (the same tokens up to them) are read in the earlier
    shared = [0]
    for index in range(1, len(ids)):
        common = [
            next((i for i, (a, b) in enumerate(zip(ids[index], ids[j])) if a != b), min(len(ids[index]), len(ids[j])))
            for j in range(index)
        ]
        shared.append(max(common))
    assert shared[2] > 20
    assert built.document_tokens == tuple(a.shape[-1] for a, _ in eager)
    for layer in range(llama.num_layers):
        for head in range(llama.num_heads):
            expected = []  # (value, document, query, key): each row's largest weight on a key that is not a sink
            for index, (attentions, sinks) in enumerate(eager):
                weights = attentions[layer, head].astype(np.float64)
                n = weights.shape[0]
                weights[:, sinks] = -1.0
                weights[np.triu(np.ones((n, n), dtype=bool), 1)] = -1.0
                for query in range(shared[index], n):
                    key = int(weights[query].argmax())
                    if weights[query, key] >= 0:
                        expected.append((weights[query, key], index, query, key))
            expected.sort(key=lambda row: (-row[0], row[1], row[2]))
            card = built.card(layer, head)
            assert len(card.contexts) == min(top, len(expected))
            values = [c.weight for c in card.contexts]
            np.testing.assert_allclose(values, [row[0] for row in expected[:top]], atol=ENGINE_ATOL, rtol=0)
            assert values == sorted(values, reverse=True) or np.all(np.diff(values) <= ENGINE_ATOL)
            for context in card.contexts:
                attentions, sinks = eager[context.document]
                assert not sinks[context.key] and context.key <= context.query
                assert context.weight == pytest.approx(
                    float(attentions[layer, head, context.query, context.key]), abs=ENGINE_ATOL
                )
                assert context.label == DOCUMENTS[context.document]["label"]
                tokens = llama.encode_long(DOCUMENTS[context.document]["text"])
                shown = llama.display.display(tokens.raw_tokens, tokens.word_ids)
                assert context.query_tokens[context.query - context.query_start] == shown[context.query]
                assert context.key_tokens[context.key - context.key_start] == shown[context.key]


def test_roles_are_each_runs_long_roles(llama, built):
    for document in DOCUMENTS:
        roles = run_long(llama, document["text"]).roles()
        for row in roles.itertuples():
            card = built.card(int(row.layer), int(row.head))
            mine = [r for r in card.roles if r["run"] == document["label"] and r["role"] == row.role]
            assert len(mine) == 1 and mine[0]["score"] == pytest.approx(float(row.score), abs=1e-12)
            assert mine[0]["threshold"] == float(row.threshold) and mine[0]["evidence"] == row.evidence
        held = sum(1 for c in built.cards for r in c.roles if r["run"] == document["label"])
        assert held == len(roles)
    ids, copies = needle_prompt(
        llama, "\n\n".join(d["text"] for d in DOCUMENTS[::-1]), NEEDLE, NEEDLE_QUESTION, num_tokens=NEEDLE_LENGTH
    )
    retrieval = run_long(llama, token_ids=ids).roles(copies)
    retrieval = retrieval[retrieval["role"] == "retrieval"]
    held = {(c.layer, c.head): r["score"] for c in built.cards for r in c.roles if r["run"] == NEEDLE_RUN}
    assert held == {(int(r.layer), int(r.head)): pytest.approx(float(r.score)) for r in retrieval.itertuples()}
    assert built.needle_tokens == NEEDLE_LENGTH


def test_the_explore_link_opens_the_document_on_the_context(built):
    card = built.card(1, 2)
    context = card.contexts[0]
    query = built.explore_query(card, context)
    assert query["long"] == str(context.document) and (query["layer"], query["head"]) == ("1", "2")
    layer, head, rows, cols = query["lzoom"].split(".")
    r0, r1 = (int(v) for v in rows.split("-"))
    c0, c1 = (int(v) for v in cols.split("-"))
    assert (layer, head) == ("1", "2") and r0 <= context.query < r1 and c0 <= context.key < c1
    assert r1 - r0 <= 33 and c1 - c0 <= 33  # token level in the zoom
    last = max((c for c in built.cards for c in c.contexts), key=lambda c: c.query)  # near a document's end
    n = built.document_tokens[last.document]
    assert last.zoom(n)[1] == min(n, last.query + 17) <= n


def test_the_cache_is_hit_the_second_time(llama, cache_dir, monkeypatch):
    first = long_cards(llama, DOCUMENTS, top=2, needle_tokens=NEEDLE_LENGTH)
    assert not first.from_cache
    monkeypatch.setattr(long_module, "run_long", None)  # a second build would fail
    second = long_cards(llama, DOCUMENTS, top=2, needle_tokens=NEEDLE_LENGTH)
    assert second.from_cache and second.cards == first.cards and second.documents == first.documents
    assert LongCards.from_json(first.to_json()).cards == first.cards


def test_an_encoder_has_no_long_part(tmp_path):
    bert = mc.load_model(str(build_tiny_bert(tmp_path / "bert", randomised=True)))
    with pytest.raises(LongCardsError, match="encoder"):
        long_cards(bert, DOCUMENTS, cache=False)


def test_bad_documents_and_top_are_refused(llama):
    with pytest.raises(LongCardsError, match="at least one"):
        long_cards(llama, [], cache=False)
    with pytest.raises(LongCardsError, match="top"):
        long_cards(llama, DOCUMENTS, top=0, cache=False)
    with pytest.raises(LongCardsError, match="non-empty"):
        long_cards(llama, ["  "], cache=False)


def test_a_head_the_model_does_not_have_is_refused(built):
    with pytest.raises(CardsError, match="layer must be a whole number from 0 to 1"):
        built.card(2, 0)
    with pytest.raises(CardsError, match="head must be a whole number from 0 to 3"):
        built.card(0, -1)
