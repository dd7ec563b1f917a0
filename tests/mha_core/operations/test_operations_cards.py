"""The ``Cards`` operation: its value is ``head_cards`` over the same sentences, its key follows its fields, it
reserves at least a batch's pass and is heavy work."""

from __future__ import annotations

import mha_core as mc
from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.operations import HEAVY, Cards
from mha_core.operations.base import batch_peak_bytes
from tests.model_fixtures import build_tiny_bert


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
