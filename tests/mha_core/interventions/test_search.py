"""Corpus search: the vectors against transformers and explicit loops, the neighbours against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha_core as mc
from mha_core.errors import HeadscopeError
from mha_core.interventions import search
from tests.conftest import ATTENTION_ATOL
from tests.model_fixtures import CORPUS, build_tiny_bert


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return mc.load_model(str(build_tiny_bert(tmp_path_factory.mktemp("bert"))))


SENTENCES = [text.rstrip(".!?").split() for text in CORPUS]


def test_attention_signature_equals_a_loop():
    rng = np.random.default_rng(0)
    n, window = 13, 3
    attention = rng.random((n, n)).astype(np.float32)
    special = np.zeros(n, bool)
    special[[0, n - 1]] = True
    expected = np.zeros((n, 2 * window + 2))
    for i in range(n):
        for j in range(n):
            if special[j]:
                expected[i, -1] += attention[i, j]
            else:
                expected[i, min(max(j - i, -window), window) + window] += attention[i, j]
    np.testing.assert_allclose(search.attention_signature(attention, special, window), expected, rtol=1e-6)


@pytest.mark.parametrize("kind", search.KINDS)
def test_every_corpus_token_finds_itself_first(tiny, kind):
    index = search.build_corpus_index(tiny, SENTENCES, layer=1, head=2, kind=kind, batch_size=4)
    assert len(index) == sum(
        int((~tiny.encode(words).special_mask).sum()) for words in SENTENCES
    )  # every non-special token, once
    for entry in (0, 17, len(index) - 1):
        sentence, position = int(index.sentence[entry]), int(index.position[entry])
        ids = tiny.encode(SENTENCES[sentence]).input_ids
        vector = search.query_vector(tiny, ids, position, 1, 2, kind)
        # A batch of one gives the vector the padded corpus batch gave.
        np.testing.assert_allclose(vector, index.vectors[entry], atol=1e-4)
        found = index.search(vector, k=3)
        assert found.loc[0, "distance"] == pytest.approx(0.0, abs=1e-4)
        hit = (index.sentence == found.loc[0, "sentence"]) & (index.position == found.loc[0, "position"])
        np.testing.assert_allclose(index.vectors[hit][0], index.vectors[entry], atol=1e-4)
        assert found.loc[0, "token"] == index.sentences[found.loc[0, "sentence"]][found.loc[0, "position"]]
    # Neighbours are the brute-force nearest, in order.
    query = index.vectors[5] + 0.01
    if kind == "representation":
        unit = index.vectors / np.linalg.norm(index.vectors, axis=1, keepdims=True)
        distances = 1 - unit @ (query / np.linalg.norm(query))
    else:
        distances = np.linalg.norm(index.vectors - query, axis=1)
    found = index.search(query, k=5)
    np.testing.assert_allclose(found["distance"], np.sort(distances)[:5], rtol=1e-4, atol=1e-5)


def test_vectors_are_the_models_own(tiny):
    ids = tiny.encode(SENTENCES[2]).input_ids
    with torch.inference_mode():
        out = tiny.hf_model(input_ids=torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    for position in (1, 4):
        representation = search.query_vector(tiny, ids, position, 1, 0, "representation")
        np.testing.assert_allclose(representation, out.hidden_states[1][0, position].numpy(), atol=1e-5)
        pattern = search.query_vector(tiny, ids, position, 1, 3, "attention")
        assert pattern.sum() == pytest.approx(1.0, abs=1e-5)  # the whole row, binned
        row = out.attentions[1][0, 3, position].numpy()
        np.testing.assert_allclose(pattern[-1], row[[0, len(ids) - 1]].sum(), atol=ATTENTION_ATOL)
        np.testing.assert_allclose(pattern[search.OFFSET_WINDOW], row[position], atol=ATTENTION_ATOL)  # itself


def test_bad_requests_are_clear(tiny):
    with pytest.raises(HeadscopeError, match="Unknown kind"):
        search.build_corpus_index(tiny, SENTENCES, 0, 0, kind="colour")
    with pytest.raises(HeadscopeError, match="No head"):
        search.build_corpus_index(tiny, SENTENCES, 9, 0)
    with pytest.raises(HeadscopeError, match="no sentences"):
        search.build_corpus_index(tiny, [], 0, 0)
    with pytest.raises(HeadscopeError, match="No token"):
        search.query_vector(tiny, tiny.encode("the cat").input_ids, 50, 0, 0, "attention")
