"""Explore's cell picked on the head view, as the run's token positions (``ui.widgets.decomposition.run_cell``): the
view the toggles make (words, special tokens hidden) has its own positions; the decomposition needs the run's. The
expected positions are written out here from the tokens (a word's last token is the query; of the key word's
tokens, the one the head weighs most), and the units are checked against the view the app draws (``View``)."""

from __future__ import annotations

import numpy as np
import pytest

import mha_core as mc
from mha_core.operations.derived import View
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2
from ui.widgets.decomposition import run_cell, view_units

TEXT = "The catalogue was unbelievable."


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    return mc.load_model(str(build_tiny_bert(tmp_path_factory.mktemp("bert-cells"), randomised=True))).run(TEXT)


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    return mc.load_model(str(build_tiny_gpt2(tmp_path_factory.mktemp("gpt2-cells"), randomised=True))).run(TEXT)


def test_tokens_and_hidden_special_tokens(bert_run):
    # [CLS] the cat ##a ##l ##o ##g ##u ##e was un ##believ ##able . [SEP]
    assert bert_run.tokens[0] == "[CLS]" and bert_run.tokens[-1] == "[SEP]" and len(bert_run.tokens) == 15
    assert run_cell(bert_run, False, False, (1, 2, 4, 9)) == (4, 9)
    assert run_cell(bert_run, False, True, (1, 2, 4, 9)) == (5, 10)  # [CLS] hidden: every position one later
    assert run_cell(bert_run, False, True, (1, 2, 13, 0)) is None  # 13 positions without [CLS] and [SEP]
    assert run_cell(bert_run, False, False, (1, 2, 0, 15)) is None


def test_words_pick_the_last_query_token_and_the_most_weighed_key_token(bert_run):
    units = view_units(bert_run, True, True)
    assert [list(unit) for unit in units] == [[1], [2, 3, 4, 5, 6, 7, 8], [9], [10, 11, 12], [13]]
    # "unbelievable" (row 3) looking at "catalogue" (column 1): query "##able" (12), key the piece weighed most.
    row = np.asarray(bert_run.attentions[1, 2, 12])
    expected_key = 2 + int(np.argmax(row[2:9]))
    assert run_cell(bert_run, True, True, (1, 2, 3, 1)) == (12, expected_key)
    # The units are the view's: a word's weight is the mean over its query tokens of the sum over its key tokens.
    words = View.of(bert_run, words=True, hide_special=False).run(bert_run)
    all_units = view_units(bert_run, True, False)
    assert len(all_units) == len(words.tokens) == 7
    for r, c in ((4, 2), (2, 4), (3, 3)):
        by_hand = bert_run.attentions[0, 1][np.ix_(all_units[r], all_units[c])].sum(axis=1).mean()
        assert words.attentions[0, 1, r, c] == pytest.approx(by_hand, rel=1e-5)


def test_a_decoders_key_is_one_its_query_sees(gpt2_run):
    # <|endoftext|> The cat ##a ##l ##og ##u ##e was ␣ ##u ##n ##be ##liev ##able .
    units = view_units(gpt2_run, True, False)
    assert list(units[2]) == [2, 3, 4, 5, 6, 7]
    row = np.asarray(gpt2_run.attentions[1, 0, 7])
    assert run_cell(gpt2_run, True, False, (1, 0, 2, 2)) == (7, 2 + int(np.argmax(row[2:8])))
    assert run_cell(gpt2_run, True, False, (1, 0, 1, 2)) is None  # "The" sees no token of "catalogue"
    assert run_cell(gpt2_run, False, False, (1, 0, 3, 5)) is None  # above the diagonal
