"""Every benchmark imports (``python -m bench.x`` from the repository root): a renamed module or function in
the library or the app breaks a benchmark at its import, which no other test would notice."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import ROOT

BENCHMARKS = sorted(path.stem for path in (ROOT / "bench").glob("*.py"))


def test_there_are_benchmarks():
    assert {"classroom", "class_teacher", "circuits", "long", "seq2seq", "extract"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_imports(name):
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench/{name}.py says what it measures in its docstring"
    if name not in ("class_teacher", "streamlit_client", "timing"):  # helpers of the other benchmarks
        assert callable(getattr(module, "main", None)), f"bench/{name}.py has a main()"
