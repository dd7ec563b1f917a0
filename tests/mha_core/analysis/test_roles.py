"""Head roles with evidence, and the TransformerLens-style decoder scores on hand-built patterns."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from mha_core.analysis.metrics import head_metrics
from mha_core.analysis.roles import (
    copy_target_pattern,
    decoder_scores_from_attention,
    detection_score,
    duplicate_token_pattern,
    head_roles,
    induction_pattern,
    offset_pattern,
    prefix_matching_score,
    previous_token_pattern,
    primary_roles,
    query_mass_score,
    repeated_random_tokens,
)
from mha_core.errors import HeadscopeError
from mha_core.interventions.experiments import decoder_head_scores
from tests.mha_core.analysis.test_metrics import cls_head, make_run, previous_token_head, uniform_head

# BOS, then A B C D repeated: positions 5..8 repeat positions 1..4.
REPEATED = [0, 11, 12, 13, 14, 11, 12, 13, 14]


def induction_head(ids):
    """Query i attends to the token after the earlier copy of token i, else to BOS."""
    n = len(ids)
    head = np.zeros((n, n))
    for i in range(n):
        earlier = [j for j in range(i) if ids[j] == ids[i]]
        head[i, earlier[0] + 1 if earlier else 0] = 1.0
    return head


def test_detection_patterns_match_their_definitions():
    np.testing.assert_array_equal(previous_token_pattern(3), [[0, 0, 0], [1, 0, 0], [0, 1, 0]])
    duplicate = duplicate_token_pattern([7, 8, 7, 8])
    np.testing.assert_array_equal(duplicate, [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(
        induction_pattern([7, 8, 7, 8]), [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    )


def test_scores_on_hand_built_heads():
    n = len(REPEATED)
    heads = np.stack(
        [previous_token_head(n), induction_head(REPEATED), np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]]
    )
    scores = decoder_scores_from_attention(heads[None], REPEATED)
    # sum(A * P) / sum(A): every row sums to 1, so the score is (rows that hit the pattern) / n.
    assert scores["previous_token"][0, 0] == pytest.approx((n - 1) / n)
    assert scores["induction"][0, 1] == pytest.approx(4 / n)  # the four repeated queries
    assert scores["prefix_matching"][0, 1] == pytest.approx(1.0)  # all of them on the right token
    assert scores["prefix_matching"][0, 0] == pytest.approx(0.0)
    assert scores["duplicate_token"][0, 1] == pytest.approx(0.0)
    # Causal uniform head: the induction target of query i (one key) gets 1 / (i + 1).
    expected_prefix = np.mean([1 / (i + 1) for i in range(5, 9)])
    assert scores["prefix_matching"][0, 2] == pytest.approx(expected_prefix)
    assert scores["induction"][0, 2] == pytest.approx(sum(1 / (i + 1) for i in range(5, 9)) / n)


def test_detection_score_exclusions_follow_transformer_lens():
    attention = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.4, 0.4]])
    pattern = previous_token_pattern(3)
    assert detection_score(attention, pattern) == pytest.approx((0.5 + 0.4) / 3)
    assert detection_score(attention, pattern, exclude_bos=True) == pytest.approx((0.0 + 0.4) / 1.3)
    assert detection_score(attention, pattern, exclude_current_token=True) == pytest.approx(0.9 / 1.1)


def test_offset_and_copy_target_patterns():
    np.testing.assert_array_equal(offset_pattern(4, -2), [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0]])
    np.testing.assert_array_equal(offset_pattern(3, -1), previous_token_pattern(3))
    # Query i must output targets[i]; it may read that token only at keys j <= i; -1 = no target.
    copy = copy_target_pattern([5, 9, 5, 2], [5, 9, 9, -1])
    np.testing.assert_array_equal(copy, [[1, 0, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]])
    attention = np.array([[1.0, 0, 0, 0], [0.3, 0.7, 0, 0], [0.2, 0.5, 0.3, 0], [0.25, 0.25, 0.25, 0.25]])
    # Three queries have a target: masses 1.0, 0.7, 0.5.
    assert query_mass_score(attention, copy) == pytest.approx((1.0 + 0.7 + 0.5) / 3)
    assert query_mass_score(attention, induction_pattern([1, 2, 1, 2])) == prefix_matching_score(
        attention, [1, 2, 1, 2]
    )


def test_prefix_matching_without_repeats_is_nan():
    assert np.isnan(prefix_matching_score(np.eye(3)[None, None], [1, 2, 3])[0, 0])


def test_repeated_random_tokens_repeat_and_avoid_special_ids():
    sequences = repeated_random_tokens(50, 10, 3, 4, seed=0, excluded_ids=[0, 1, 2], bos_id=1)
    assert sequences.shape == (4, 31)
    assert (sequences[:, 0] == 1).all()
    body = sequences[:, 1:]
    np.testing.assert_array_equal(body[:, :10], body[:, 10:20])
    np.testing.assert_array_equal(body[:, :10], body[:, 20:])
    assert not np.isin(body, [0, 1, 2]).any()
    assert all(len(set(row[:10])) == 10 for row in body)


class FakeTokenizer:
    bos_token_id = 0
    all_special_ids = (0,)

    def __len__(self):
        return 40


class InductionModel:
    """A two-layer decoder whose layer 0 is a previous-token head and layer 1 an induction head."""

    tokenizer = FakeTokenizer()
    is_causal = True

    def run_ids(self, ids):
        n = len(ids)
        heads = np.stack([previous_token_head(n), induction_head(list(ids))])[:, None]
        return make_run(heads, tokens=[str(i) for i in ids], special=[i == 0 for i in ids], causal=True)


def test_decoder_head_scores_on_a_model_with_known_heads():
    scores = decoder_head_scores(InductionModel(), seq_len=6, repeats=2, batch=3, seed=1)
    n = 13
    assert list(scores.columns[:6]) == [
        "layer",
        "head",
        "previous_token",
        "duplicate_token",
        "induction",
        "prefix_matching",
    ]
    assert set(scores.columns[6:]) == {
        f"{name}_{part}" for name in scores.columns[2:6] for part in ("sd", "uniform")
    } | {"num_sequences"}
    assert (scores["num_sequences"] == 3).all()
    assert scores.loc[0, "previous_token"] == pytest.approx((n - 1) / n)
    assert scores.loc[0, "previous_token_sd"] == pytest.approx(0.0, abs=1e-12)  # the same on every sequence
    # Attention spread evenly over the visible keys: query i gives 1/(i+1) to its previous token.
    assert scores.loc[0, "previous_token_uniform"] == pytest.approx(sum(1 / (i + 1) for i in range(1, n)) / n)
    assert scores.loc[1, "induction"] == pytest.approx(6 / n)
    assert scores.loc[1, "prefix_matching"] == pytest.approx(1.0)
    with pytest.raises(HeadscopeError):
        decoder_head_scores(InductionModel(), repeats=1)


def test_roles_from_hand_built_heads_carry_scores_and_evidence():
    run = make_run([previous_token_head(), uniform_head(), cls_head()])
    roles = head_roles(run)
    by_head = {h: set(group["role"]) for h, group in roles.groupby("head")}
    assert by_head[0] == {"positional:previous"}
    assert by_head[1] == {"broad"}
    assert by_head[2] == {"sink"}  # everything on [CLS]: a no-op, not a delimiter
    prev = roles[roles["role"] == "positional:previous"].iloc[0]
    assert prev["score"] == pytest.approx(1.0) and prev["threshold"] == 0.9 and prev["source"] == "sentence"
    assert prev["n"] == 9  # query 0 has no previous token
    assert "offset -1 in 100% of queries" in prev["evidence"] and "n = 9 queries" in prev["evidence"]
    sink = roles[roles["role"] == "sink"].iloc[0]
    assert sink["score"] == pytest.approx(1.0) and "100% of attention on positions of no content" in sink["evidence"]
    assert sink["baseline"] == pytest.approx(head_metrics(run).loc[2, "sink_mass_uniform"])
    broad = roles[roles["role"] == "broad"].iloc[0]
    assert "normalised entropy 1.00" in broad["evidence"] and np.isnan(broad["baseline"])


def test_syntactic_coreference_decoder_and_semantic_tables_add_roles():
    metrics = head_metrics(make_run([uniform_head(), uniform_head()]))
    dependency = pd.DataFrame(
        {
            "relation": ["nsubj", "nsubj", "det"],
            "direction": ["parent", "child", "parent"],
            "layer": [0, 0, 0],
            "head": [0, 1, 1],
            "accuracy": [0.62, 0.9, 0.8],
            "count": [140, 5, 130],
            "baseline_offset": [1, -1, 1],
            "baseline_accuracy": [0.45, 0.2, 0.75],
            # chosen on the selection half, tested on the held-out half (roles.syntactic_tests)
            "selection_accuracy": [0.64, 0.9, 0.8],
            "selection_count": [70, 3, 65],
            "selection_baseline_offset": [1, -1, 1],
            "selection_baseline_accuracy": [0.45, 0.2, 0.75],
            "heldout_accuracy": [0.62, 0.9, 0.8],
            "heldout_count": [70, 2, 65],
            "heldout_sentences": [40, 2, 30],
            "heldout_baseline_accuracy": [0.45, 0.2, 0.75],
            "heldout_accuracy_se": [0.03, np.nan, 0.04],
            "heldout_margin_se": [0.02, np.nan, 0.05],
        }
    )
    coreference = pd.DataFrame({"layer": [0, 0], "head": [0, 1], "accuracy": [0.7, 0.3], "count": [12, 12]})
    decoder = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "previous_token": [0.1, 0.8],
            "duplicate_token": [0.0, 0.0],
            "induction": [0.5, 0.0],
            "prefix_matching": [0.6, 0.1],
        }
    )
    semantic = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "semantic_correlation": [0.1, 0.45],
            "num_pairs": [400, 400],
            "num_sentences": [30, 30],
        }
    )
    roles = head_roles(
        None, metrics=metrics, dependency=dependency, coreference=coreference, decoder=decoder, semantic=semantic
    )
    head0 = set(roles.loc[roles["head"] == 0, "role"])
    head1 = set(roles.loc[roles["head"] == 1, "role"])
    # nsubj child has too few examples; det does not beat its baseline by 0.10.
    assert head0 == {"broad", "syntactic:nsubj:parent", "coreference", "decoder:induction", "decoder:prefix_matching"}
    assert head1 == {"broad", "decoder:previous_token", "semantic"}
    # nsubj: held-out margin 0.17 with standard error 0.02, t = 3.5 against 0.10 on 40 held-out sentences (39
    # degrees of freedom); two rows tried (count >= 100).
    nsubj = roles[roles["role"] == "syntactic:nsubj:parent"].iloc[0]
    assert (nsubj["score"], nsubj["threshold"], nsubj["baseline"], nsubj["n"]) == pytest.approx((0.62, 0.55, 0.45, 70))
    quantile = scipy.stats.t.ppf(0.975, 39)  # 2.0227: the interval is Student's too
    assert (nsubj["ci_low"], nsubj["ci_high"]) == pytest.approx((0.62 - quantile * 0.03, 0.62 + quantile * 0.03))
    assert nsubj["source"] == "corpus"
    p_value = float(scipy.stats.t.sf(3.5, 39))
    assert (
        f"one-sided p = {p_value:.2g} (t, 39 df)" in nsubj["evidence"] and f"= {2 * p_value:.2g}" in nsubj["evidence"]
    )
    assert "in 62% of 70 held-out cases (95% CI 56% to 68% over 40 sentences)" in nsubj["evidence"]
    assert "vs 45% for the best offset on the held-out half" in nsubj["evidence"]
    assert "Selection half: 64% of 70 cases" in nsubj["evidence"]
    primary = primary_roles(roles, 1, 2)
    assert list(primary["role"]) == ["syntactic:nsubj:parent", "decoder:previous_token"]


def test_coreference_with_a_candidate_test_must_beat_its_baseline():
    metrics = head_metrics(make_run([uniform_head(), uniform_head()]))
    coreference = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "accuracy": [0.6, 0.6],
            "count": [20, 20],
            "candidate_accuracy": [0.9, 0.65],
            "baseline_accuracy": [0.6, 0.6],
        }
    )
    roles = head_roles(None, metrics=metrics, coreference=coreference)
    found = roles[roles["group"] == "coreference"]
    assert list(found["head"]) == [0]
    assert "prefers the antecedent to the distractor in 90% (95% CI" in found["evidence"].iloc[0]
    assert found["baseline"].iloc[0] == pytest.approx(0.6) and found["n"].iloc[0] == 20


def test_intervals_equal_scipy():
    from scipy import stats

    from mha_core.analysis.stats import correlation_interval, mean_interval, wilson_interval

    for successes, n in ((9, 9), (7, 12), (62, 140), (0, 20)):
        low, high = wilson_interval(successes / n, n)
        expected = stats.binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
        assert (float(low), float(high)) == pytest.approx((expected.low, expected.high), abs=1e-9)
    values = np.random.default_rng(0).normal(0.4, 0.2, size=30)
    low, high = mean_interval(values.mean(), values.std(ddof=1), 30)
    half = stats.norm.ppf(0.975) * values.std(ddof=1) / np.sqrt(30)
    assert (float(low), float(high)) == pytest.approx((values.mean() - half, values.mean() + half), abs=1e-12)
    x = np.random.default_rng(1).normal(size=50)
    y = x + np.random.default_rng(2).normal(size=50)
    result = stats.pearsonr(x, y)
    expected = result.confidence_interval(confidence_level=0.95)
    low, high = correlation_interval(result.statistic, 50)
    assert (float(low), float(high)) == pytest.approx((expected.low, expected.high), abs=1e-9)


def test_a_score_chance_could_give_is_no_role():
    """Above its threshold but not clear of its baseline: no role (here a sentence of 4 queries)."""
    metrics = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "num_queries": [4, 40],
            "argmax_offset": [-1, -1],
            "argmax_offset_share": [1.0, 1.0],
            "argmax_offset_queries": [3, 39],
            "argmax_offset_chance": [0.45, 0.45],
            "normalized_entropy": [0.5, 0.5],
        }
    )
    roles = head_roles(None, metrics=metrics)
    assert list(roles["head"]) == [1]  # 3 of 3 is a Wilson interval from 44%, not above a 45% chance level
    single_sentence = pd.DataFrame(
        {"layer": [0], "head": [0], "semantic_correlation": [0.9], "num_pairs": [400], "num_sentences": [1]}
    )
    assert head_roles(None, metrics=metrics.iloc[:0], semantic=single_sentence).empty


def test_primary_roles_fill_heads_without_a_role():
    three_ahead = np.roll(np.eye(10), 3, axis=1)  # offset +3, wrapping: not positional, not broad
    roles = head_roles(make_run([previous_token_head(), three_ahead]))
    primary = primary_roles(roles, 1, 2)
    assert list(primary["role"]) == ["positional:previous", "none"]
    assert primary.loc[1, "evidence"] == "no role passes its threshold"


def test_primary_roles_of_runs_too_short_for_any_role():
    # [CLS] [SEP]: every query row is special, so no sentence test has an observation and no head has a role.
    two_tokens = make_run([np.eye(2), np.array([[0.0, 1.0], [0.0, 1.0]])], tokens=["[CLS]", "[SEP]"])
    roles = head_roles(two_tokens)
    assert roles.empty
    primary = primary_roles(roles, 1, 2)
    assert list(primary["layer"]) == [0, 0] and list(primary["head"]) == [0, 1]
    assert list(primary["role"]) == ["none", "none"] and list(primary["group"]) == ["none", "none"]
    assert list(primary["evidence"]) == ["no role passes its threshold"] * 2
    assert primary["score"].isna().all()
    # A decoder's BOS and one word: whatever roles it has, every head gets exactly one primary role.
    bos_and_word = make_run([np.array([[1.0, 0.0], [0.9, 0.1]])] * 3, tokens=["<s>", "w1"], causal=True)
    primary = primary_roles(head_roles(bos_and_word), 1, 3)
    assert list(primary["head"]) == [0, 1, 2] and primary["role"].map(type).eq(str).all()


def test_head_roles_needs_a_run_or_metrics():
    with pytest.raises(HeadscopeError):
        head_roles(None)


def loop_decoder_scores(attention, ids):
    """TransformerLens "mul" scores and prefix matching, written as loops over one head's matrix."""
    n = len(ids)
    total = attention.sum()
    previous = sum(attention[i, i - 1] for i in range(1, n)) / total
    duplicate = sum(attention[i, j] for i in range(n) for j in range(i) if ids[j] == ids[i]) / total
    targets = {i: [j + 1 for j in range(i) if ids[j] == ids[i] and j + 1 <= i] for i in range(n)}
    induction = sum(attention[i, k] for i in range(n) for k in targets[i]) / total
    prefix = np.mean([sum(attention[i, k] for k in targets[i]) for i in range(n) if targets[i]])
    return previous, duplicate, induction, prefix


def test_decoder_head_scores_on_a_tiny_gpt2_equal_the_loop_reference(tmp_path):
    import mha_core
    from tests.model_fixtures import build_tiny_gpt2

    model = mha_core.load_model(str(build_tiny_gpt2(tmp_path / "gpt2")))
    scores = decoder_head_scores(model, seq_len=8, repeats=3, batch=2, seed=4)
    sequences = repeated_random_tokens(
        len(model.tokenizer),
        8,
        3,
        2,
        seed=4,
        excluded_ids=model.tokenizer.all_special_ids,
        bos_id=model.tokenizer.bos_token_id,
    )
    expected = np.zeros((len(scores), 4))
    for ids in sequences:
        attentions = model.run_ids(ids.tolist()).attentions.astype(np.float64)
        expected += [loop_decoder_scores(attentions[l, h], list(ids)) for l, h in zip(scores["layer"], scores["head"])]
    expected /= len(sequences)
    np.testing.assert_allclose(
        scores[["previous_token", "duplicate_token", "induction", "prefix_matching"]], expected, rtol=1e-5
    )


def test_capped_decoder_scores_use_a_cutoff_scaled_to_their_ceiling():
    # With two copies, a perfect induction head scores 0.5 under TransformerLens's scoring
    # (first-copy queries have no target), so 0.3 is a strong induction head; 0.3 previous-token is not.
    from mha_core.analysis.roles import decoder_min_score

    assert decoder_min_score("induction", repeats=2) == pytest.approx(0.2)
    assert decoder_min_score("induction", repeats=4) == pytest.approx(0.3)
    assert decoder_min_score("previous_token", repeats=2) == pytest.approx(0.4)
    metrics = head_metrics(make_run([uniform_head(), uniform_head()]))
    decoder = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "previous_token": [0.3, 0.0],
            "duplicate_token": [0.0, 0.0],
            "induction": [0.0, 0.3],
            "prefix_matching": [0.0, 0.0],
        }
    )
    decoder.attrs["repeats"] = 2
    roles = head_roles(None, metrics=metrics, decoder=decoder)
    decoder_roles = roles[roles["group"] == "decoder"]
    assert list(zip(decoder_roles["head"], decoder_roles["role"])) == [(1, "decoder:induction")]
    assert decoder_roles.iloc[0]["threshold"] == pytest.approx(0.2)
