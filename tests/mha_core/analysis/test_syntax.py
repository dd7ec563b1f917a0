"""Dependency trees and the Clark et al. (2019) word-level dependency accuracy, with hand-worked answers."""

from __future__ import annotations

import numpy as np
import pytest

from mha_core.analysis.syntax import (
    best_dependency_heads,
    dependency_scores,
    load_conllu,
    parse_text,
    ud_ewt_dev,
    word_argmax,
)
from mha_core.errors import HeadscopeError, InputTextError
from mha_core.run import AttentionRun

SAMPLE = """# sent_id = s1
# text = The cat sat.
1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

# sent_id = s2
# text = big red dogs bark
1\tbig\tbig\tADJ\t_\t_\t3\tamod\t_\t_
2\tred\tred\tADJ\t_\t_\t3\tamod\t_\t_
3\tdogs\tdog\tNOUN\t_\t_\t4\tnsubj:pass\t_\t_
4\tbark\tbark\tVERB\t_\t_\t0\troot\t_\t_

"""

TRICKY = """# newdoc id = d1
# sent_id = t1
# text = I didn't go.
# a free comment line
1\tI\tI\tPRON\t_\t_\t4\tnsubj\t_\t_
2-3\tdidn't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdid\tdo\tAUX\t_\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\t_\t_\t4\tadvmod\t_\t_
4\tgo\tgo\tVERB\t_\t_\t0\troot\t_\tSpaceAfter=No
4.1\tgo\tgo\tVERB\t_\t_\t_\t_\t4:conj\t_
5\t.\t.\tPUNCT\t_\t_\t4\tpunct\t_\t_

"""


def build_run(unit_texts, pieces, word_attention):
    """A token-level run whose ``to_words()`` is exactly ``word_attention``.

    ``unit_texts``: "[CLS]", words..., "[SEP]"; ``pieces[u]``: how many tokens unit u has.
    Attention to a unit is split equally over its pieces and every piece repeats the unit's row.
    """
    word_attention = np.asarray(word_attention, dtype=np.float64)
    unit_of_token = np.repeat(np.arange(len(unit_texts)), pieces)
    share = 1.0 / np.asarray(pieces, dtype=np.float64)
    attention = word_attention[..., unit_of_token, :][..., unit_of_token] * share[unit_of_token]
    special = np.array([unit_texts[u].startswith("[") for u in unit_of_token])
    word_index = np.cumsum([not t.startswith("[") for t in unit_texts]) - 1
    words = [t for t in unit_texts if not t.startswith("[")]
    tokens = [
        unit_texts[u] if pieces[u] == 1 else f"{unit_texts[u]}#{k}"
        for u in range(len(unit_texts))
        for k in range(pieces[u])
    ]
    return AttentionRun(
        model_name="toy",
        family="toy",
        is_causal=False,
        tokens=tokens,
        attentions=attention.astype(np.float32),
        special_mask=special,
        word_ids=np.where(special, -1, word_index[unit_of_token]),
        words=words,
        segment_ids=np.zeros(len(tokens), dtype=np.int64),
    )


def row(units, **weights):
    """A word-level attention row over ``units`` from {unit text: weight}; the rest shares what is left."""
    values = np.array([weights.get(u.strip("[]"), 0.0) for u in units])
    rest = [i for i, u in enumerate(units) if u.strip("[]") not in weights]
    if rest:
        values[rest] = (1.0 - values.sum()) / len(rest)
    assert abs(values.sum() - 1.0) < 1e-9
    return values


# Sentence 1 units: [CLS] The cat sat . [SEP]; "cat" is two word pieces.
UNITS_1 = ["[CLS]", "The", "cat", "sat", ".", "[SEP]"]
PIECES_1 = [1, 1, 2, 1, 1, 1]
# Head 0 ("parent-like", with [CLS]/[SEP]/self carrying the largest weights so the exclusions matter)
HEAD0_1 = [
    row(UNITS_1),
    row(UNITS_1, CLS=0.5, The=0.2, cat=0.15, sat=0.1, **{".": 0.05}, SEP=0),
    row(UNITS_1, CLS=0.1, The=0.1, cat=0.4, sat=0.3, **{".": 0.05}, SEP=0.05),
    row(UNITS_1, SEP=0.6, sat=0.2, cat=0.1, The=0.05, **{".": 0.05}, CLS=0),
    row(UNITS_1, CLS=0.3, **{".": 0.3}, sat=0.25, The=0.1, cat=0.05, SEP=0),
    row(UNITS_1),
]
# Head 1 (previous word; the first word looks at the last)
HEAD1_1 = [
    row(UNITS_1),
    row(UNITS_1, **{".": 0.9}),
    row(UNITS_1, The=0.9),
    row(UNITS_1, cat=0.9),
    row(UNITS_1, sat=0.9),
    row(UNITS_1),
]
# Head 2: "The" gives 0.3 to "sat" but 0.2 to each piece of "cat": only the word-level sum (0.4) finds cat.
# Its other rows give 0.9 to [SEP] and 0.1 to one wrong word (all other words 0).
HEAD2_1 = [
    row(UNITS_1),
    row(UNITS_1, cat=0.4, sat=0.3, CLS=0.3),
    row(UNITS_1, SEP=0.9, **{".": 0.1}),
    row(UNITS_1, SEP=0.9, The=0.1),
    row(UNITS_1, SEP=0.9, The=0.1),
    row(UNITS_1),
]

UNITS_2 = ["[CLS]", "big", "red", "dogs", "bark", "[SEP]"]
PIECES_2 = [1] * 6
HEAD0_2 = [
    row(UNITS_2),
    row(UNITS_2, dogs=0.5),
    row(UNITS_2, big=0.5),
    row(UNITS_2, bark=0.5),
    row(UNITS_2, red=0.5),
    row(UNITS_2),
]
HEAD1_2 = [
    row(UNITS_2),
    row(UNITS_2, bark=0.9),
    row(UNITS_2, big=0.9),
    row(UNITS_2, red=0.9),
    row(UNITS_2, dogs=0.9),
    row(UNITS_2),
]
HEAD2_2 = [
    row(UNITS_2),
    row(UNITS_2, SEP=0.9, bark=0.1),
    row(UNITS_2, SEP=0.9, bark=0.1),
    row(UNITS_2, SEP=0.9, big=0.1),
    row(UNITS_2, SEP=0.9, red=0.1),
    row(UNITS_2),
]


def sample_runs():
    """One layer x three heads for each SAMPLE sentence."""
    return [
        build_run(UNITS_1, PIECES_1, [[HEAD0_1, HEAD1_1, HEAD2_1]]),
        build_run(UNITS_2, PIECES_2, [[HEAD0_2, HEAD1_2, HEAD2_2]]),
    ]


@pytest.fixture
def sample():
    return load_conllu(SAMPLE), sample_runs()


def accuracy_table(scores):
    return {(r.relation, r.direction, r.head): r.accuracy for r in scores.itertuples()}


def test_hand_built_runs_convert_back_to_the_intended_word_attention(sample):
    _, runs = sample
    np.testing.assert_allclose(
        runs[0].to_words().attentions[0, 0], np.array(HEAD0_1), rtol=0, atol=1e-6
    )  # float32 sums of two or three numbers
    assert runs[0].num_tokens == 7 and runs[0].tokens[2:4] == ["cat#0", "cat#1"]


def test_word_argmax_excludes_special_tokens_and_self(sample):
    _, runs = sample
    prediction, has_word = word_argmax(runs[0])
    assert prediction.shape == (1, 3, 4) and has_word.all()
    # head 0: The -> cat (not [CLS] 0.5, not itself 0.2); cat -> sat (not itself 0.4); sat -> cat (not [SEP]);
    # . -> sat ([CLS] and itself tie at 0.3 above it)
    assert prediction[0, 0].tolist() == [1, 2, 1, 2]
    assert prediction[0, 1].tolist() == [3, 0, 1, 2]
    assert prediction[0, 2, 0] == 1  # word-level sum over the two pieces of "cat"
    # The same from the word-level run
    word_prediction, _ = word_argmax(runs[0].to_words())
    np.testing.assert_array_equal(word_prediction, prediction)


def test_dependency_accuracy_known_answers(sample):
    sentences, runs = sample
    scores = dependency_scores(runs, sentences)
    acc = accuracy_table(scores)
    expected = {
        ("det", "parent"): (1, [1.0, 0.0, 1.0]),
        ("nsubj", "parent"): (2, [1.0, 0.0, 0.0]),
        ("punct", "parent"): (1, [1.0, 1.0, 0.0]),
        ("amod", "parent"): (2, [0.5, 0.0, 0.0]),
        ("det", "child"): (1, [0.0, 1.0, 0.0]),
        ("nsubj", "child"): (2, [0.5, 1.0, 0.0]),
        ("punct", "child"): (1, [0.0, 0.0, 0.0]),
        # dogs has two amod children; the case counts once and the previous-word head finds "red"
        ("amod", "child"): (1, [0.0, 1.0, 1.0]),
    }
    assert set(zip(scores.relation, scores.direction)) == set(expected)
    assert len(scores) == len(expected) * 3
    for (relation, direction), (count, per_head) in expected.items():
        assert [acc[(relation, direction, h)] for h in range(3)] == per_head, (relation, direction)
        assert set(scores[(scores.relation == relation) & (scores.direction == direction)]["count"]) == {count}
    baselines = scores.drop_duplicates(["relation", "direction"]).set_index(["relation", "direction"])
    expected_baselines = {
        ("det", "parent"): (1, 1.0),
        ("nsubj", "parent"): (1, 1.0),
        ("punct", "parent"): (-1, 1.0),
        ("amod", "parent"): (1, 0.5),  # +1 and +2 both score 1/2; the nearer offset wins the tie
        ("det", "child"): (-1, 1.0),
        ("nsubj", "child"): (-1, 1.0),
        ("punct", "child"): (1, 1.0),
        ("amod", "child"): (-1, 1.0),
    }
    for key, (offset, accuracy) in expected_baselines.items():
        assert (baselines.loc[key, "baseline_offset"], baselines.loc[key, "baseline_accuracy"]) == (offset, accuracy), (
            key
        )


def test_full_relations_keep_subtypes(sample):
    sentences, runs = sample
    scores = dependency_scores(runs, sentences, full_relations=True)
    assert {"nsubj", "nsubj:pass"} <= set(scores.relation)
    assert scores[(scores.relation == "nsubj:pass") & (scores.direction == "parent")]["count"].iloc[0] == 1


def test_accumulators_of_separate_sentences_merge_and_survive_their_arrays(sample):
    import pandas as pd

    from mha_core.analysis.syntax import DependencyAccumulator

    sentences, runs = sample
    first, second = DependencyAccumulator(), DependencyAccumulator()
    first.add(runs[0], sentences[0])
    second.add(runs[1], sentences[1])
    for order in ((first, second), (second, first)):  # integer counts: the order of merging does not matter
        merged = DependencyAccumulator()
        for accumulator in order:
            merged.merge(DependencyAccumulator.from_arrays(accumulator.to_arrays()))
        assert merged.num_sentences == 2
        pd.testing.assert_frame_equal(merged.result(), dependency_scores(runs, sentences), check_exact=True)
    empty = DependencyAccumulator.from_arrays(DependencyAccumulator().to_arrays())
    assert empty.shape is None and empty.result().empty
    with pytest.raises(HeadscopeError, match="full relations"):
        first.merge(DependencyAccumulator(full_relations=True))


def test_best_dependency_heads_picks_the_most_accurate_head(sample):
    sentences, runs = sample
    best = best_dependency_heads(dependency_scores(runs, sentences))
    picked = {(r.relation, r.direction): (r.head, r.accuracy) for r in best.itertuples()}
    assert picked[("nsubj", "child")] == (1, 1.0)
    assert picked[("amod", "parent")] == (0, 0.5)
    assert len(best) == 8


def test_a_word_without_tokens_is_not_scored(sample):
    sentences, runs = sample
    run = runs[1]
    # Drop the tokens of "red" (as a tokenizer drops a zero-width word): only its own arc disappears.
    keep = np.array([t != "red" for t in run.tokens])
    attention = run.attentions[:, :, keep][:, :, :, keep]
    attention = attention / attention.sum(-1, keepdims=True)
    dropped = AttentionRun(
        model_name="toy",
        family="toy",
        is_causal=False,
        tokens=[t for t, k in zip(run.tokens, keep) if k],
        attentions=attention,
        special_mask=run.special_mask[keep],
        word_ids=run.word_ids[keep],
        words=run.words,
        segment_ids=run.segment_ids[keep],
    )
    _, has_word = word_argmax(dropped)
    assert has_word.tolist() == [True, False, True, True]
    scores = dependency_scores([dropped], [sentences[1]])
    counts = scores.drop_duplicates(["relation", "direction"]).set_index(["relation", "direction"])["count"]
    assert counts.to_dict() == {
        ("amod", "parent"): 1,
        ("amod", "child"): 1,
        ("nsubj", "parent"): 1,
        ("nsubj", "child"): 1,
    }


def test_mismatched_runs_and_trees_raise(sample):
    sentences, runs = sample
    with pytest.raises(HeadscopeError, match="2 runs for 1 sentences"):
        dependency_scores(runs, sentences[:1])
    with pytest.raises(HeadscopeError, match=r"model\.run"):
        dependency_scores(
            [build_run(["[CLS]", "a", "b", "[SEP]"], [1] * 4, np.full((1, 1, 4, 4), 0.25))], sentences[:1]
        )


def test_load_conllu_skips_ranges_empty_nodes_and_comments():
    (sentence,) = load_conllu(TRICKY)
    assert sentence.words == ["I", "did", "n't", "go", "."]
    assert sentence.heads == [4, 4, 4, 0, 4]
    assert sentence.relations == ["nsubj", "aux", "advmod", "root", "punct"]
    assert sentence.sent_id == "t1" and sentence.text == "I didn't go."


def test_load_conllu_base_relation_and_full_label():
    sentences = load_conllu(SAMPLE)
    assert sentences[1].relations[2] == "nsubj" and sentences[1].full_relations[2] == "nsubj:pass"


def test_load_conllu_reads_a_path(tmp_path):
    path = tmp_path / "two.conllu"
    path.write_text(SAMPLE, encoding="utf-8")
    assert [s.words for s in load_conllu(path)] == [s.words for s in load_conllu(str(path))]
    with pytest.raises(HeadscopeError, match="no such CoNLL-U file"):
        load_conllu(str(tmp_path / "missing.conllu"))


def test_load_conllu_rejects_broken_heads():
    with pytest.raises(HeadscopeError, match="head index"):
        load_conllu("1\ta\ta\tX\t_\t_\t7\tdep\t_\t_\n\n")


def test_shipped_ud_ewt_dev_split():
    sentences = ud_ewt_dev()
    assert len(sentences) == 2001
    assert sum(len(s) for s in sentences) == 25147
    first = sentences[0]
    assert first.words == ["From", "the", "AP", "comes", "this", "story", ":"]
    assert first.heads == [3, 3, 4, 0, 6, 4, 4]
    assert [len(s) for s in ud_ewt_dev(max_sentences=3)] == [len(s) for s in sentences[:3]]


def test_parse_text_with_spacy():
    sentence = parse_text("The  cat sat on the mat.")
    assert sentence.scheme == "clearnlp"
    assert sentence.words == ["The", "cat", "sat", "on", "the", "mat", "."]  # the double space is dropped
    assert sentence.relations[sentence.words.index("sat")] == "ROOT"
    assert sentence.heads[sentence.words.index("sat")] == 0
    assert sentence.heads[1] == 3 and sentence.relations[1] == "nsubj"  # cat <- sat
    assert sentence.heads[0] == 2 and sentence.relations[0] == "det"  # The <- cat
    with pytest.raises(InputTextError):
        parse_text("   ")
