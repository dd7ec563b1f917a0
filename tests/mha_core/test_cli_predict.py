"""The command line's ``predict`` and ``generate`` (``mha_core.__main__``): the same tables and runs as the library,
and one ``error:`` line for bad settings."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import mha_core as mc
from mha_core.__main__ import main
from tests.model_fixtures import build_tiny_gpt2

TEXT = "the cat sat on the"


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    return str(build_tiny_gpt2(tmp_path_factory.mktemp("gpt2"), head=True, randomised=True))


def test_predict_prints_and_writes_the_librarys_table(gpt2_path, tmp_path, capsys):
    out = tmp_path / "next.csv"
    assert main(["predict", "--model", gpt2_path, "--text", TEXT, "--k", "4", "--out", str(out)]) == 0
    expected = mc.predict(mc.load_model(gpt2_path), TEXT, k=4)
    written = pd.read_csv(out, keep_default_na=False)
    assert written["id"].tolist() == expected["id"].tolist()
    np.testing.assert_allclose(written["probability"], expected["probability"], rtol=1e-5)  # as the CSV writes it
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["1", "2", "3", "4"]


def test_generate_saves_the_librarys_run(gpt2_path, tmp_path, capsys):
    out = tmp_path / "written.npz"
    argv = ["generate", "--model", gpt2_path, "--prompt", TEXT, "--tokens", "4", "--temperature", "0.8"]
    assert main([*argv, "--seed", "5", "--out", str(out)]) == 0
    saved = mc.AttentionRun.load(out)
    expected = mc.generate(mc.load_model(gpt2_path), TEXT, 4, temperature=0.8, seed=5)
    assert saved.metadata["token_ids"] == expected.metadata["token_ids"]
    np.testing.assert_allclose(saved.attentions, expected.attentions, atol=1e-6)
    assert "tokens written" in capsys.readouterr().out


def test_bad_settings_are_one_error_line(gpt2_path, capsys):
    assert main(["generate", "--model", gpt2_path, "--prompt", TEXT, "--temperature", "-1"]) == 2
    assert capsys.readouterr().err.startswith("error: The temperature must be")
    assert main(["predict", "--model", "minilm", "--text", TEXT]) == 2
    assert "no language-model head" in capsys.readouterr().err
