"""The layout's rules (docs/architecture.md), read from the source: which folder may import which, who
may load a model, no private Streamlit internals, no path hacks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

APP_FILES = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "ui").rglob("*.py"))]


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, absolute names (relative imports inside mha_core resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names.add("mha_core" + (f".{node.module}" if node.module else ""))
            else:
                names.add(node.module or "")
                names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def top(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


@pytest.mark.parametrize("path", sorted((ROOT / "mha_core").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_library_imports_nothing_of_the_app(path):
    assert not top(imported_modules(path)) & {"streamlit", "plotly", "ui", "pages", "app", "tests"}


@pytest.mark.parametrize("path", sorted((ROOT / "ui" / "figures").glob("*.py")), ids=lambda p: p.name)
def test_figures_are_plain_plotly(path):
    allowed = {"__future__", "collections", "dataclasses", "html", "itertools", "math", "numpy", "plotly", "ui"}
    modules = imported_modules(path)
    assert top(modules) <= allowed, top(modules) - allowed
    assert not {m for m in modules if m.startswith("ui.")} - {m for m in modules if m.startswith("ui.figures")}


def test_only_ui_state_loads_or_runs_a_model():
    loaders = re.compile(r"\bload_model\(|(?<!navigation)\.run\(|\.run_batch\(|\.run_ids\(|from_pretrained\(")
    offenders = [
        str(path.relative_to(ROOT))
        for path in APP_FILES
        if path.name not in ("state.py", "browser.py") and loaders.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_no_private_streamlit_internals_and_no_path_hacks():
    for path in [*APP_FILES, *sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]:
        if path.name == "test_architecture.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert "streamlit.runtime" not in text, path
        assert not re.search(r"_finished_page_script_hash|widget_ids_this_run|\bst\.\w*\._\w", text), path
        assert "sys.path.insert" not in text and "sys.path.append" not in text, path


def test_bench_never_imports_tests():
    for path in sorted((ROOT / "bench").glob("*.py")):
        assert "tests" not in top(imported_modules(path)), path


def test_state_draws_no_figures_and_pages_reach_no_model_internals():
    assert not top(imported_modules(ROOT / "ui" / "state.py")) & {"plotly"}
    assert not {m for m in imported_modules(ROOT / "ui" / "state.py") if m.startswith(("ui.widgets", "ui.figures"))}
    for path in sorted((ROOT / "pages").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "hf_model" not in text and ".tokenizer" not in text, path


def test_only_the_distributed_executor_imports_ray():
    # The app and the rest of the library never start Ray: corpus.profiling.profile imports ray_executor on demand.
    for path in [*APP_FILES, *sorted((ROOT / "mha_core").rglob("*.py"))]:
        if path.name != "ray_executor.py":
            assert "ray" not in top(imported_modules(path)), path
    corpus_source = (ROOT / "mha_core" / "corpus" / "profiling.py").read_text(encoding="utf-8")
    assert "\nfrom .ray_executor import" not in corpus_source and "\nimport ray" not in corpus_source
