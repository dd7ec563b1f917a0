"""What the command line says about the model it loads: the warnings the app shows (a config naming code of its own,
which never runs) as ``warning:`` lines on stderr, and a GGUF file named for what it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import mha_core as mc
from mha_core.__main__ import main
from mha_core.errors import ModelLoadError
from tests.model_fixtures import build_tiny_bert

CUSTOM_CODE = "names code of its own (auto_map in config.json); Headscope never runs it"
GGUF = "names a GGUF file: Headscope reads GGUF only for the embedded SmolLM2 (name it smollm2)"


@pytest.fixture(scope="module")
def custom_code_bert(tmp_path_factory):
    """A tiny BERT whose config asks for code of its own (a file that would leave a marker if it ever ran)."""
    folder = build_tiny_bert(tmp_path_factory.mktemp("custom-bert"))
    marker = folder / "code-ran"
    (folder / "custom_model.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "custom_model.CustomModel"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder, marker


def test_the_command_line_warns_of_a_config_with_its_own_code_as_the_app_does(custom_code_bert, capsys, tmp_path):
    folder, marker = custom_code_bert
    out = tmp_path / "run.npz"
    assert main(["extract", "--model", str(folder), "--text", "the cat sat", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    (expected,) = mc.load_model(str(folder)).warnings  # the message the app's sidebar shows
    assert CUSTOM_CODE in expected and warnings == [f"warning: {expected}"]
    assert out.is_file() and not marker.exists()


def test_a_checkpoint_without_warnings_prints_none(tmp_path, capsys):
    folder = build_tiny_bert(tmp_path / "plain-bert")
    assert main(["extract", "--model", str(folder), "--text", "the cat"]) == 0
    assert "warning:" not in capsys.readouterr().err


@pytest.mark.parametrize("exists", [True, False], ids=["a GGUF file", "a missing GGUF file"])
def test_a_gguf_file_is_named_as_one_whether_or_not_it_exists(tmp_path, capsys, exists):
    path = tmp_path / "SmolLM2-135M-Instruct.Q4_1.GGUF"
    if exists:
        path.write_bytes(b"GGUF\x03\x00\x00\x00")
    assert main(["extract", "--model", str(path), "--text", "hi"]) == 2
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()  # refused before anything loads: one line
    assert line.startswith("error: ") and GGUF in line and "No checkpoint" not in line
    with pytest.raises(ModelLoadError, match="names a GGUF file"):
        mc.load_model(str(path))


def test_the_command_line_process_says_both(custom_code_bert, tmp_path):
    folder, _ = custom_code_bert
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HEADSCOPE_DEBUG", None)

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mha_core", *argv], capture_output=True, text=True, env=env, timeout=600
        )

    done = run("extract", "--model", str(folder), "--text", "the cat sat")
    assert done.returncode == 0 and f"warning: {CUSTOM_CODE}" in done.stderr.replace(f"'{folder}' ", "")
    done = run("extract", "--model", str(tmp_path / "model.gguf"), "--text", "hi")
    assert done.returncode == 2 and done.stderr.startswith("error: ") and GGUF in done.stderr
