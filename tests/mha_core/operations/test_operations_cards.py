"""The ``Cards`` and ``LongHeadCards`` operations: their values are ``head_cards`` and ``long_cards`` over the same
inputs, their keys follow their fields, they reserve what their passes hold and are heavy work."""

from __future__ import annotations

import mha_core as mc
from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.operations import HEAVY, Cards, LongHeadCards
from mha_core.operations.base import batch_peak_bytes
from mha_core.operations.long import long_run_bytes
from tests.model_fixtures import CORPUS, build_tiny_bert, build_tiny_llama


def test_cards_operation_is_head_cards(tmp_path, cache_dir):
    path = str(build_tiny_bert(tmp_path / "bert", randomised=True))
    model = mc.load_model(path)
    operation = Cards(path, max_sentences=4, top=2, batch_size=2, cache=False)
    assert operation.work_class is HEAVY and operation.progress_label
    value = operation.run(model)
    expected = mc.head_cards(model, ud_ewt_dev(4), top=2, batch_size=2, cache=False)
    assert value.cards == expected.cards and value.num_sentences == 4
    assert Cards(path, max_sentences=5, top=2, batch_size=2, cache=False).key != operation.key
    assert Cards(path, max_sentences=4, top=2, batch_size=2, cache=False).key == operation.key
    words = [sentence.words for sentence in ud_ewt_dev(4)]
    assert operation.peak_bytes(model) > batch_peak_bytes(model, words, 2)


def test_long_cards_operation_is_long_cards(tmp_path):
    path = str(build_tiny_llama(tmp_path / "llama", max_positions=256, randomised=True))
    model = mc.load_model(path)
    documents = (("short", " ".join(CORPUS[:2])), ("long", " ".join(CORPUS)))
    operation = LongHeadCards(path, documents, top=3, needle_tokens=200, cache=False)
    assert operation.work_class is HEAVY and operation.progress_label
    value = operation.run(model)
    expected = mc.long_cards(model, documents, top=3, needle_tokens=200, cache=False)
    assert value.cards == expected.cards and value.documents == ("short", "long")
    assert LongHeadCards(path, documents, top=2, needle_tokens=200, cache=False).key != operation.key
    assert LongHeadCards(path, documents, top=3, needle_tokens=200, cache=False).key == operation.key
    longest = max(len(model.encode_long(text).input_ids) for _, text in documents)
    assert operation.peak_bytes(model) == long_run_bytes(model, max(longest, 200))
