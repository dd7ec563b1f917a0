"""Head cards: the contexts against an independent computation from ``run_with_cache``, the roles and circuit
scores against their own functions, the cache round trip."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.analysis.roles import head_roles
from mha_core.analysis.syntax import Sentence
from mha_core.corpus import cards as cards_module
from mha_core.corpus.cards import CardsError, HeadCards, head_cards, sentence_text
from tests.model_fixtures import CORPUS, build_tiny_bert, build_tiny_llama

TOP = 4


@pytest.fixture(scope="module", params=["bert", "llama"])
def tiny(request, tmp_path_factory):
    builder = {"bert": build_tiny_bert, "llama": build_tiny_llama}[request.param]
    return mc.load_model(str(builder(tmp_path_factory.mktemp(request.param), randomised=True)))


def output_weights(model) -> list[torch.Tensor]:
    """Each layer's W_O as ``[H, e, d]``, read from the transformers modules directly."""
    hf = model.hf_model
    layers = hf.encoder.layer if hasattr(hf, "encoder") else hf.layers
    weights = []
    for layer in layers:
        linear = layer.attention.output.dense if hasattr(layer, "attention") else layer.self_attn.o_proj
        w = linear.weight.detach().float()  # [d, H * e]
        e = w.shape[1] // model.num_heads
        weights.append(torch.stack([w[:, h * e : (h + 1) * e].T for h in range(model.num_heads)]))
    return weights


def expected_contexts(model, texts: list[str], top: int):
    """``{(layer, head): (attention contexts, output contexts)}``, each a list of (sentence, query, key, weight,
    value), from one ``run_with_cache`` per sentence."""
    w_o = output_weights(model)
    per_head = {(l, h): ([], []) for l in range(model.num_layers) for h in range(model.num_heads)}
    for index, text in enumerate(texts):
        run, cache = model.run_with_cache(text, names=lambda name: name.endswith("attn.hook_z"))
        sink = np.asarray(run.special_mask, dtype=bool).copy()
        sink[0] = True
        for l in range(model.num_layers):
            z = cache[f"blocks.{l}.attn.hook_z"][0].float()  # [n, H, e]
            for h in range(model.num_heads):
                weights = run.attentions[l, h].copy()
                weights[:, sink] = -1.0
                q, k = np.unravel_index(int(np.argmax(weights)), weights.shape)
                if weights[q, k] >= 0:
                    per_head[l, h][0].append((index, q, k, float(weights[q, k]), float(weights[q, k])))
                norms = torch.linalg.vector_norm(z[:, h] @ w_o[l][h], dim=-1).numpy()
                p = int(np.argmax(norms))
                key = int(np.argmax(run.attentions[l, h, p]))
                per_head[l, h][1].append((index, p, key, float(run.attentions[l, h, p, key]), float(norms[p])))
    ranked = {}
    for head, (attention, output) in per_head.items():
        ranked[head] = tuple(sorted(found, key=lambda c: (-c[4], c[0]))[:top] for found in (attention, output))
    return ranked


def test_contexts_equal_an_independent_computation(tiny, cache_dir):
    texts = CORPUS[:7]
    cards = head_cards(tiny, texts, top=TOP, batch_size=3, cache=False)
    expected = expected_contexts(tiny, texts, TOP)
    assert len(cards.cards) == tiny.num_layers * tiny.num_heads and cards.num_sentences == 7
    for card in cards.cards:
        for kind, wanted in zip(("attention", "output"), expected[card.layer, card.head]):
            got = card.contexts(kind)
            assert len(got) == len(wanted) == TOP
            for context, (sentence, query, key, weight, value) in zip(got, wanted):
                assert context.sentence == sentence
                assert (context.query, context.key) == (query, key)
                assert context.weight == pytest.approx(weight, abs=1e-5)
                assert context.value == pytest.approx(value, rel=1e-4, abs=1e-5)
                assert context.text == texts[sentence]
                assert list(context.tokens) == tiny.run(texts[sentence]).tokens
    # the attention contexts never land on a sink: a special token or the first token
    for card in cards.cards:
        for context in card.attention:
            assert context.key != 0 and not tiny.run(context.text).special_mask[context.key]


def test_roles_and_circuit_scores_are_those_of_their_functions(tiny, cache_dir):
    texts = CORPUS
    cards = head_cards(tiny, texts, top=2, cache=False)
    profiled = mc.profile(tiny, texts, cache=False)
    roles = head_roles(None, metrics=profiled.metrics)
    circuits = mc.copying_scores(tiny)
    for card in cards.cards:
        own = roles[(roles["layer"] == card.layer) & (roles["head"] == card.head)]
        assert [r["role"] for r in card.roles] == list(own["role"])
        assert [r["score"] for r in card.roles] == pytest.approx(list(own["score"]))
        row = profiled.metrics[(profiled.metrics["layer"] == card.layer) & (profiled.metrics["head"] == card.head)]
        assert card.metrics["prev_token_mass"] == pytest.approx(float(row["prev_token_mass"].iloc[0]))
        expected = circuits[(circuits["layer"] == card.layer) & (circuits["head"] == card.head)].iloc[0]
        assert card.copying == pytest.approx(float(expected["copying"]))
        assert card.previous_token == pytest.approx(float(expected["previous_token"]))
    table = cards.table()
    assert list(table["layer"]) == [c.layer for c in cards.cards]
    assert table["top_weight"].tolist() == pytest.approx([c.attention[0].value for c in cards.cards])


def test_cache_round_trip(tiny, cache_dir, monkeypatch):
    texts = CORPUS[:5]
    first = head_cards(tiny, texts, top=3, batch_size=2)
    assert not first.from_cache
    assert list((cache_dir.parent / "cards").glob("*.json.gz"))

    def no_build(*args, **kwargs):
        raise AssertionError("the cards were computed although they were cached")

    monkeypatch.setattr(cards_module, "build_cards", no_build)
    second = head_cards(tiny, texts, top=3, batch_size=2)
    assert second.from_cache
    assert second.cards == first.cards
    assert HeadCards.from_json(first.to_json()).cards == first.cards
    with pytest.raises(AssertionError, match="computed although"):  # other settings: another entry
        head_cards(tiny, texts, top=2, batch_size=2)


def test_explore_query_and_bad_input(tiny, cache_dir):
    cards = head_cards(tiny, CORPUS[:3], top=1, cache=False)
    card = cards.card(tiny.num_layers - 1, 1)
    context = card.attention[0]
    query = cards.explore_query(card, context)
    assert query == {
        "model": tiny.name,
        "text": CORPUS[context.sentence],
        "layer": str(tiny.num_layers - 1),
        "head": "1",
        "focus": str(context.query),
    }
    with pytest.raises(CardsError, match="layer must be a whole number from 0"):
        cards.card(tiny.num_layers, 0)
    with pytest.raises(CardsError, match="at least one sentence"):
        head_cards(tiny, [], cache=False)
    with pytest.raises(CardsError, match="top must be"):
        head_cards(tiny, CORPUS[:2], top=0, cache=False)
    with pytest.raises(CardsError, match="non-empty string"):
        head_cards(tiny, ["  "], cache=False)
    with pytest.raises(mc.errors.HeadscopeError, match="executor must be one of local, ray"):  # the profile's
        head_cards(tiny, CORPUS[:2], cache=False, executor={"executor": "threads"})


def test_sentence_text_of_a_tree():
    tree = Sentence(words=["The", "cat", "sat", "."], heads=[2, 3, 0, 3], relations=["det", "nsubj", "root", "punct"])
    assert sentence_text(tree) == "The cat sat ."
    tree.text = "The cat sat."
    assert sentence_text(tree) == "The cat sat."
