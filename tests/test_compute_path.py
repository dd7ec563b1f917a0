"""Every forward pass the app starts goes through ``ui.compute.compute``, which always takes a compute slot
and always reserves the work's estimated peak bytes (README: a class gets a fair queue and a memory budget
for every forward pass).

Checked on the syntax tree, not by matching text: the calls that start a forward pass are derived from
mha_core's own definitions (``LoadedModel``'s public methods, and every public mha_core function or class
whose first parameter is the model); in app.py, pages/ and ui/ such a call may only sit in ui/compute.py,
inside a function handed to ``compute`` as its work.
"""

from __future__ import annotations

import ast
import contextlib
import threading
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from tests.conftest import ROOT
from ui.budget import HEAVY, LIGHT, ByteBudgetCache, ComputeGate, WorkClass

# LoadedModel's public methods that run no forward pass (the tokenizer, a table look-up, the LM head on given
# hidden states, the list of output projections). Every other public method counts as a pass.
NOT_A_PASS = {
    "encode",
    "encode_long",
    "encode_long_ids",
    "input_embeddings",
    "position_embeddings",
    "logits",
    "output_projections",
}
# Library functions that take the model but run no pass: its tokenizer only, or an estimate of a run's bytes.
NO_PASS_FUNCTIONS = {"prompt_ids", "needle_prompt", "long_run_bytes"}
LOADERS = {"load_model", "from_pretrained"}  # only ui/compute.py loads a model
COMPUTE_MODULE = "ui/compute.py"
APP_FILES = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py")), *sorted((ROOT / "ui").rglob("*.py"))]


def _is_property(node: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list)


def loaded_model_methods() -> set[str]:
    """LoadedModel's public methods, properties left out."""
    tree = ast.parse((ROOT / "mha_core" / "models" / "loaded.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LoadedModel"]
    return {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and not n.name.startswith("_") and not _is_property(n)
    }


def _takes_a_model(function: ast.FunctionDef, skip_self: bool = False) -> bool:
    args = function.args.posonlyargs + function.args.args
    args = args[1:] if skip_self else args
    if not args:
        return False
    first = args[0]
    annotation = ast.unparse(first.annotation) if first.annotation is not None else ""
    return first.arg == "model" or annotation.strip("'\"") == "LoadedModel"


def model_functions() -> set[str]:
    """Names of mha_core's public functions and classes whose first parameter is the model (``profile``,
    ``head_importance``, ``neuron_view``, ``LossProbe``, ...)."""
    names = set()
    for path in sorted((ROOT / "mha_core").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and _takes_a_model(node):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                init = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
                if init and _takes_a_model(init[0], skip_self=True):
                    names.add(node.name)
    return names


@dataclass(frozen=True)
class PassCall:
    path: str
    line: int
    call: str
    in_work: bool


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (every import of the file, wherever it is)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _navigations(tree: ast.Module) -> set[str]:
    """Names bound to ``st.navigation(...)``: their ``run()`` runs a page, not a model."""
    return {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "navigation"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _work_functions(tree: ast.Module) -> set[ast.AST]:
    """The functions handed to ``compute`` as its work: a lambda, a function defined where the call is, or
    the function a module-level factory returns (``compute(key, _run_work(...), ...)``)."""
    defs: dict[str, list[ast.FunctionDef]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            defs.setdefault(node.name, []).append(node)
    works: set[ast.AST] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _dotted(node.func) in ("compute", "compute.compute")):
            continue
        work = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "work"), None)
        if isinstance(work, ast.Lambda):
            works.add(work)
        elif isinstance(work, ast.Name):
            works.update(defs.get(work.id, []))
        elif isinstance(work, ast.Call) and isinstance(work.func, ast.Name):
            for factory in defs.get(work.func.id, []):
                returned = {
                    r.value.id for r in ast.walk(factory) if isinstance(r, ast.Return) and isinstance(r.value, ast.Name)
                }
                works.update(d for d in ast.walk(factory) if isinstance(d, ast.FunctionDef) and d.name in returned)
    return works


def pass_calls(source: str, path: str, methods: set[str], functions: set[str]) -> list[PassCall]:
    """Every call in ``source`` that starts a forward pass or loads a model, and whether it sits directly in a
    function handed to ``compute`` as its work."""
    tree = ast.parse(source)
    aliases, navigations, works = _aliases(tree), _navigations(tree), _work_functions(tree)
    found = []

    def visit(node: ast.AST, function: ast.AST | None) -> None:
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            head = name.split(".")[0] if name else None
            resolved = aliases.get(head, head) + name[len(head) :] if name else None
            last = resolved.rsplit(".", 1)[-1] if resolved else None
            is_method = isinstance(node.func, ast.Attribute) and node.func.attr in methods
            receiver = _dotted(node.func.value) if isinstance(node.func, ast.Attribute) else None
            if is_method and receiver in navigations:
                is_method = False
            if is_method and receiver is not None and receiver.split(".")[0] in aliases:
                is_method = aliases[receiver.split(".")[0]].startswith("mha_core")  # a module's function
            from_library = resolved is not None and resolved.startswith("mha_core.") and last in functions
            if is_method or from_library or last in LOADERS:
                found.append(PassCall(path, node.lineno, ast.unparse(node.func), function in works))
        inner = node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else function
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, None)
    return found


def offenders(source: str, path: str, methods: set[str], functions: set[str]) -> list[PassCall]:
    """Calls that start a forward pass outside ui/compute.py's work functions (loading a model: outside
    ui/compute.py)."""
    calls = pass_calls(source, path, methods, functions)
    if path != COMPUTE_MODULE:
        return calls
    return [c for c in calls if not c.in_work and c.call.rsplit(".", 1)[-1] not in LOADERS]


@pytest.fixture(scope="module")
def signatures():
    methods, functions = loaded_model_methods(), model_functions()
    # What the derivation must find (if one of these disappears, the derivation or the library changed).
    assert {"run", "run_ids", "run_batch", "forward_encoded", "layer_inputs", "final_hidden"} <= methods
    assert methods >= NOT_A_PASS, NOT_A_PASS - methods
    assert {
        "profile",
        "head_importance",
        "pruning_curve",
        "induction_experiment",
        "decoder_head_scores",
        "role_group_ablation",
        "neuron_view",
        "build_corpus_index",
        "query_vector",
        "coreference_scores",
        "LossProbe",
    } <= functions
    assert functions >= NO_PASS_FUNCTIONS, NO_PASS_FUNCTIONS - functions
    return methods - NOT_A_PASS, functions - NO_PASS_FUNCTIONS


def test_every_forward_pass_of_the_app_is_work_handed_to_compute(signatures):
    methods, functions = signatures
    bad, seen = [], []
    for path in APP_FILES:
        relative = str(path.relative_to(ROOT))
        source = path.read_text(encoding="utf-8")
        bad += offenders(source, relative, methods, functions)
        seen += pass_calls(source, relative, methods, functions)
    assert bad == [], "\n".join(f"{c.path}:{c.line}: {c.call}" for c in bad)
    # The check saw the app's passes: the run, the Deeper page's neuron view and search, the profile, ...
    called = {c.call.rsplit(".", 1)[-1] for c in seen if c.path == COMPUTE_MODULE and c.in_work}
    assert {"run", "neuron_view", "query_vector", "build_corpus_index", "profile", "head_importance"} <= called


PAGE_RUNNING_A_MODEL = """
import mha_core as mc
from mha_core.interventions import search
from ui import compute, session

model = compute.get_model(session.selection().model)
run = model.run("The cat sat.")
view = mc.neuron_view(model, run.metadata["token_ids"], 0, 0, 1)
vector = compute.computed_from(run, "x", lambda: search.query_vector(model, [1, 2], 0, 0, 0, "attention"))
fine = compute.neuron_view(run, 0, 0, 1)  # the app's own function of that name: no model handed over
"""

COMPUTE_WITH_A_PASS_OUTSIDE_ITS_WORK = """
def get_run(model, text):
    def forward(model, progress):
        return model.run(text, progress=progress)

    return compute(("run", text), forward, model=model, reserve_bytes=0)


def ungated(model, text):
    return shared().cache.get_or_compute(("run", text), lambda: model.run(text))


def gated(model, text):
    return compute(None, lambda model, progress: model.run_ids([1, 2]), model=model, reserve_bytes=0)
"""


def test_the_check_catches_a_page_that_runs_a_model_itself(signatures):
    methods, functions = signatures
    found = offenders(PAGE_RUNNING_A_MODEL, "pages/bad.py", methods, functions)
    assert sorted((c.line, c.call) for c in found) == [
        (7, "model.run"),
        (8, "mc.neuron_view"),
        (9, "search.query_vector"),
    ]


def test_the_check_catches_a_pass_in_compute_that_bypasses_compute(signatures):
    methods, functions = signatures
    calls = pass_calls(COMPUTE_WITH_A_PASS_OUTSIDE_ITS_WORK, COMPUTE_MODULE, methods, functions)
    assert [(c.line, c.call, c.in_work) for c in calls] == [
        (4, "model.run", True),
        (10, "model.run", False),
        (14, "model.run_ids", True),
    ]
    assert [c.line for c in offenders(COMPUTE_WITH_A_PASS_OUTSIDE_ITS_WORK, COMPUTE_MODULE, methods, functions)] == [10]


# ---- what compute does around its work -------------------------------------------------------------------
class RecordingGate(ComputeGate):
    """A compute gate that counts the slots held."""

    held = 0

    @contextlib.contextmanager
    def slot(self, check=None, waiting=None, share=None):
        with super().slot(check, waiting, share):
            self.held += 1
            try:
                yield
            finally:
                self.held -= 1


def test_compute_reserves_the_peak_and_takes_a_slot_before_the_work(monkeypatch):
    from ui import compute

    shared = SimpleNamespace(
        cache=ByteBudgetCache(10_000, shares={"heavy": 5_000}),
        gate=RecordingGate(1, shares={"heavy": 1}),
        profile_lock=threading.Lock(),
    )
    monkeypatch.setattr(compute, "shared", lambda: shared)
    model = object()
    seen = {}

    def work(given, progress):
        seen.update(model=given, reserved=shared.cache.reserved_bytes, slots=shared.gate.held, progress=progress)
        return "value"

    assert compute.compute(("k",), work, model=model, reserve_bytes=1_234, work_class=LIGHT, stoppable=False) == "value"
    assert seen == {"model": model, "reserved": 1_234, "slots": 1, "progress": None}
    assert shared.cache.reserved_bytes == 0 and shared.gate.held == 0  # both released
    seen.clear()
    assert compute.compute(("k",), work, model=model, reserve_bytes=1_234, work_class=LIGHT, stoppable=False) == "value"
    assert seen == {}  # kept under its key: the second call did not run the work
    assert compute.compute(None, work, model=model, reserve_bytes=lambda: 567, work_class=HEAVY, stoppable=False)
    assert seen["reserved"] == 567 and seen["slots"] == 1 and len(shared.cache) == 1  # key None: not kept
    assert shared.cache.stats()["heavy_reserved_bytes"] == 0

    def failing(given, progress):
        raise ValueError("the work failed")

    with pytest.raises(ValueError):
        compute.compute(("bad",), failing, model=model, reserve_bytes=99, work_class=LIGHT, stoppable=False)
    assert shared.cache.reserved_bytes == 0 and shared.gate.held == 0  # released on failure too


def work_classes(source: str) -> list[tuple[int, str | None]]:
    """Every ``compute(...)`` call of ``source`` with the work class it declares (``work_class=HEAVY``), or None."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _dotted(node.func) in ("compute", "compute.compute"):
            declared = next((k.value for k in node.keywords if k.arg == "work_class"), None)
            found.append((node.lineno, None if declared is None else ast.unparse(declared)))
    return found


def test_every_computation_declares_its_work_class():
    """Light or heavy is said where a computation is declared (its ``compute`` call), never left to a default;
    the heavy ones are those the server's share is for (docs/classroom.md)."""
    for path in APP_FILES:
        found = work_classes(path.read_text(encoding="utf-8"))
        assert all(declared in ("LIGHT", "HEAVY") for _, declared in found), (path, found)
    tree = ast.parse((ROOT / COMPUTE_MODULE).read_text(encoding="utf-8"))
    declared = {}
    for function in tree.body:
        if isinstance(function, ast.FunctionDef):
            for _, work_class in work_classes(ast.unparse(function)):
                declared.setdefault(work_class, set()).add(function.name)
    assert {"long_run", "corpus_profile", "importance_and_pruning", "corpus_index", "circuit_patching"} <= declared[
        "HEAVY"
    ]
    assert {"get_run", "neuron_view", "get_ablated_run", "run_with_norms"} <= declared["LIGHT"]
    assert work_classes("compute(key, work, model=m, reserve_bytes=0)") == [(1, None)]  # the check sees a missing one
    assert {w.share for w in WorkClass} == {None, "heavy"}


@pytest.mark.parametrize("name", ["compute", "session", "settings", "address", "budget"])
def test_the_app_state_draws_nothing(name):
    """The state modules hold and compute; drawing is left to ui.widgets and ui.figures, which import them."""
    tree = ast.parse((ROOT / "ui" / f"{name}.py").read_text(encoding="utf-8"))
    imported = set(_aliases(tree).values())
    assert not {m for m in imported if m.split(".")[0] == "plotly" or m.startswith(("ui.widgets", "ui.figures"))}
