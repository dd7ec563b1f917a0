"""The command line's ``joint-qk`` (``mha_core.__main__``): the library's table written, and one ``error:`` line for
a bad setting."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import mha_core as mc
from mha_core.__main__ import main
from tests.model_fixtures import CORPUS, build_tiny_llama


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return str(build_tiny_llama(tmp_path_factory.mktemp("llama"), randomised=True))


def test_joint_qk_writes_the_librarys_table(llama_path, tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS[:3]) + "\n", encoding="utf-8")
    out = tmp_path / "points.csv"
    argv = ["joint-qk", "--model", llama_path, "--layer", "1", "--head", "3", "--corpus", str(corpus)]
    assert main([*argv, "--max-points", "20", "--out", str(out)]) == 0
    expected = mc.joint_qk(mc.load_model(llama_path), CORPUS[:3], 1, 3, max_points=20)
    written = pd.read_csv(out, keep_default_na=False)
    assert list(written.columns) == list(expected.table.columns)
    assert written["token"].tolist() == expected.table["token"].tolist()
    assert written["kind"].tolist() == ["query"] * 20 + ["key"] * 20
    size = np.abs(expected.table[["x", "y"]].to_numpy()).max()  # the CSV keeps about 6 significant digits
    np.testing.assert_allclose(written[["x", "y"]], expected.table[["x", "y"]], rtol=0, atol=1e-5 * size)
    printed = capsys.readouterr().out
    assert "head 1-3: 20 queries and as many keys by pca" in printed and "wrote" in printed


def test_joint_qk_refuses_a_head_outside_the_model(llama_path, tmp_path, capsys):
    out = tmp_path / "points.csv"
    argv = ["joint-qk", "--model", llama_path, "--layer", "0", "--head", "9", "--max-sentences", "2"]
    assert main([*argv, "--out", str(out)]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert errors == ["error: Head 9 is outside the layer's 4 heads (0-3)."]
    assert not out.exists()
