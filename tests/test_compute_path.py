"""Every forward pass the app starts goes through ``ui.compute``'s one gated, budgeted path: an operation of the
library (``mha_core.operations``) run by ``run_admitted``, inside ``admitted(operation.work_class,
operation.peak_bytes(model), ...)``, which takes a compute slot and reserves the operation's peak bytes (README: a
class gets a fair queue and a memory budget for every forward pass).

Checked on the syntax tree, not by matching text: the calls that start a forward pass are derived from
mha_core's own definitions (``LoadedModel``'s public methods, the Lab's passes, and every public mha_core function
or class whose first parameter is the model); in app.py, pages/ and ui/ such a call may only sit in ui/compute.py,
inside a ``with admitted(..., ....peak_bytes(...), ...)`` block. An operation's ``run`` is such a call (a
``LoadedModel`` method of that name), so no page runs an operation itself either.
"""

from __future__ import annotations

import ast
import contextlib
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

from mha_core.operations import Operation, operation
from mha_core.operations.base import NOT_IN_KEY
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
    "hook_names",
}
# The Lab's methods that run its model (``mha_core.lab.Lab``; ``run`` is counted with LoadedModel's).
LAB_PASSES = {"train", "evaluate", "ablation", "attention"}
# Library functions that take the model but run no pass: its tokenizer only, or an estimate of a run's bytes.
NO_PASS_FUNCTIONS = {
    "prompt_ids",
    "encoded_prompt",
    "prompt",
    "needle_prompt",
    "needle_question",
    "long_run_bytes",
    "needle_run_bytes",
    "most_tokens_within",
    "config_sizes",
    "batch_peak_bytes",
    "pass_bytes",
    "vocabulary_size",
    "check_long_model",  # whether the long cards read the model (its family and causal mask)
}
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
    admitted: bool  # inside ``with admitted(..., <...>.peak_bytes(...), ...)``


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


def _admits(node: ast.AST) -> bool:
    """A ``with`` whose items call ``admitted(...)`` with an operation's ``peak_bytes(...)`` as what it reserves."""
    if not isinstance(node, ast.With):
        return False
    for item in node.items:
        call = item.context_expr
        if isinstance(call, ast.Call) and _dotted(call.func) in ("admitted", "compute.admitted"):
            reserved = call.args[1] if len(call.args) > 1 else None
            if reserved is not None and any(
                isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "peak_bytes"
                for n in ast.walk(reserved)
            ):
                return True
    return False


def pass_calls(source: str, path: str, methods: set[str], functions: set[str]) -> list[PassCall]:
    """Every call in ``source`` that starts a forward pass or loads a model, and whether it sits inside a block
    that holds the operation's admission (``_admits``)."""
    tree = ast.parse(source)
    aliases, navigations = _aliases(tree), _navigations(tree)
    found = []

    def visit(node: ast.AST, admitted: bool) -> None:
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
                found.append(PassCall(path, node.lineno, ast.unparse(node.func), admitted))
        inner = admitted or _admits(node)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return found


def offenders(source: str, path: str, methods: set[str], functions: set[str]) -> list[PassCall]:
    """Calls that start a forward pass outside ui/compute.py's admitted blocks (loading a model: outside
    ui/compute.py)."""
    calls = pass_calls(source, path, methods, functions)
    if path != COMPUTE_MODULE:
        return calls
    return [c for c in calls if not c.admitted and c.call.rsplit(".", 1)[-1] not in LOADERS]


@pytest.fixture(scope="module")
def signatures():
    methods, functions = loaded_model_methods(), model_functions()
    # What the derivation must find (if one of these disappears, the derivation or the library changed).
    assert {"run", "run_ids", "run_batch", "forward_encoded", "layer_inputs", "run_with_cache"} <= methods
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
    return (methods - NOT_A_PASS) | LAB_PASSES, functions - NO_PASS_FUNCTIONS


def test_every_forward_pass_of_the_app_is_work_handed_to_compute(signatures):
    methods, functions = signatures
    bad, seen = [], []
    for path in APP_FILES:
        relative = str(path.relative_to(ROOT))
        source = path.read_text(encoding="utf-8")
        bad += offenders(source, relative, methods, functions)
        seen += pass_calls(source, relative, methods, functions)
    assert bad == [], "\n".join(f"{c.path}:{c.line}: {c.call}" for c in bad)
    # The check saw the app's one pass: an operation's run, admitted, in ui/compute.py (and its loader there).
    assert [(c.path, c.call, c.admitted) for c in seen if c.call.rsplit(".", 1)[-1] not in LOADERS] == [
        (COMPUTE_MODULE, "operation.run", True)
    ]


PAGE_RUNNING_A_MODEL = """
import mha_core as mc
from mha_core.interventions import search
from mha_core.operations import Attention
from ui import compute, computations, session

model = compute.get_model(session.selection().model)
run = model.run("The cat sat.")
view = mc.neuron_view(model, run.metadata["token_ids"], 0, 0, 1)
vector = computations.from_run(run, lambda: search.query_vector(model, [1, 2], 0, 0, 0, "attention"))
fine = computations.neuron_view(run, 0, 0, 1)  # the app's own function of that name: no model handed over
again = Attention.of(model, "The cat sat.").run(model)  # an operation run by the page itself, not by compute
lab = session.lab_run().lab.train(10)
"""

COMPUTE_WITH_A_PASS_OUTSIDE_ITS_ADMISSION = """
def run_admitted(operation, model, progress=None, check=None, waiting=None):
    with admitted(operation.work_class, operation.peak_bytes(model), check=check, waiting=waiting):
        return operation.run(model, progress)


def ungated(operation, model):
    return shared().cache.get_or_compute(operation.key, lambda: operation.run(model))


def reserving_nothing(operation, model):
    with admitted(operation.work_class, 0):
        return operation.run(model)
"""


def test_the_check_catches_a_page_that_runs_a_model_itself(signatures):
    methods, functions = signatures
    found = offenders(PAGE_RUNNING_A_MODEL, "pages/bad.py", methods, functions)
    assert sorted((c.line, c.call) for c in found) == [
        (8, "model.run"),
        (9, "mc.neuron_view"),
        (10, "search.query_vector"),
        (12, "Attention.of(model, 'The cat sat.').run"),
        (13, "session.lab_run().lab.train"),
    ]


def test_the_check_catches_a_pass_in_compute_outside_an_admission_that_reserves_the_peak(signatures):
    methods, functions = signatures
    calls = pass_calls(COMPUTE_WITH_A_PASS_OUTSIDE_ITS_ADMISSION, COMPUTE_MODULE, methods, functions)
    assert [(c.line, c.call, c.admitted) for c in calls] == [
        (4, "operation.run", True),
        (8, "operation.run", False),
        (13, "operation.run", False),
    ]
    found = offenders(COMPUTE_WITH_A_PASS_OUTSIDE_ITS_ADMISSION, COMPUTE_MODULE, methods, functions)
    assert [c.line for c in found] == [8, 13]


def test_no_key_is_built_by_hand():
    """A computation's value is cached under its operation's key (derived from its fields: ``key_of``), what is
    computed from a run too (``operations.derived``, named after the run's key); no call of the app hands ``compute``
    anything but an operation, and no computation's value goes into the server's cache under a key written in
    place."""
    keys = []
    for path in APP_FILES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = _dotted(node.func) or ""
            if name in ("compute", "compute.compute"):
                assert not isinstance(node.args[0], (ast.Tuple, ast.Constant, ast.List)), (path, node.lineno)
            into_cache = isinstance(node.func, ast.Attribute) and node.func.attr == "get_or_compute"
            if into_cache and ast.unparse(node.func.value).endswith(".cache"):
                keys.append((path.relative_to(ROOT).as_posix(), ast.unparse(node.args[0])))
    assert sorted(keys) == [("ui/compute.py", "operation.key")]


# ---- what compute does around an operation ----------------------------------------------------------------
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


@operation
class Recorded(Operation):
    """An operation that records what it found held while it ran (``seen``, not part of its key), of ``size`` peak
    bytes."""

    work_class = LIGHT
    name: str
    size: int
    seen: dict = field(metadata=NOT_IN_KEY)

    def peak_bytes(self, model) -> int:
        return self.size

    def run(self, model, progress=None):
        shared = self.seen["shared"]
        self.seen.update(model=model, reserved=shared.cache.reserved_bytes, slots=shared.gate.held, runs=1)
        if self.name == "bad":
            raise ValueError("the work failed")
        return f"value of {self.name}"


@operation
class HeavyRecorded(Recorded):
    work_class = HEAVY


@pytest.fixture
def recording_server(monkeypatch):
    from ui import compute

    shared = SimpleNamespace(
        cache=ByteBudgetCache(10_000, shares={"heavy": 5_000}),
        gate=RecordingGate(1, shares={"heavy": 1}),
        profile_lock=threading.Lock(),
    )
    monkeypatch.setattr(compute, "shared", lambda: shared)
    return compute, shared


def test_compute_reserves_the_peak_and_takes_a_slot_before_the_operation_runs(recording_server):
    compute, shared = recording_server
    model = object()
    seen = {"shared": shared}
    light = Recorded("k", 1_234, seen)
    assert compute.compute(light, model, stoppable=False) == "value of k"
    assert {k: seen[k] for k in ("model", "reserved", "slots")} == {"model": model, "reserved": 1_234, "slots": 1}
    assert shared.cache.reserved_bytes == 0 and shared.gate.held == 0  # both released
    seen.pop("runs")
    same = Recorded("k", 1_234, {"shared": shared})  # equal fields, so an equal key: the cached value
    assert same == light and compute.ready(same) and compute.compute(same, model, stoppable=False) == "value of k"
    assert "runs" not in seen and "runs" not in same.seen  # kept under its key: the second call ran nothing
    heavy = HeavyRecorded("h", 567, seen)
    assert compute.compute(heavy, model, keep=False, stoppable=False) == "value of h"
    assert seen["reserved"] == 567 and seen["slots"] == 1 and len(shared.cache) == 1  # keep=False: not kept
    assert shared.cache.stats()["heavy_reserved_bytes"] == 0 and not compute.ready(heavy)
    with pytest.raises(ValueError):
        compute.compute(Recorded("bad", 99, seen), model, stoppable=False)
    assert shared.cache.reserved_bytes == 0 and shared.gate.held == 0  # released on failure too


def test_an_operation_larger_than_its_share_is_refused_before_it_runs(recording_server):
    from ui.budget import OverBudget

    compute, shared = recording_server
    seen = {"shared": shared}
    with pytest.raises(OverBudget):
        compute.compute(HeavyRecorded("big", 6_000, seen), object(), stoppable=False)  # the heavy share is 5,000
    assert "runs" not in seen and shared.cache.reserved_bytes == 0


def test_a_stop_event_ends_the_operation_at_its_next_progress_report(recording_server):
    compute, _ = recording_server
    stop = threading.Event()
    reports = []

    @operation
    class Reporting(Operation):
        work_class = LIGHT
        steps: int

        def peak_bytes(self, model) -> int:
            return 1

        def run(self, model, progress=None):
            for step in range(self.steps):
                progress(step, self.steps, "")
                reports.append(step)
                if step == 2:
                    stop.set()

    with pytest.raises(compute.Stopped):
        compute.compute(Reporting(10), object(), stoppable=False, stop=stop)
    assert reports == [0, 1, 2]


def operation_classes() -> dict[str, tuple[str, str | None]]:
    """Every operation class of mha_core/operations: name -> (its module, the work class declared in its body)."""
    found = {}
    for path in sorted((ROOT / "mha_core" / "operations").glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and any(ast.unparse(b) == "Operation" for b in node.bases):
                declared = [
                    ast.unparse(n.value)
                    for n in node.body
                    if isinstance(n, ast.Assign) and [ast.unparse(t) for t in n.targets] == ["work_class"]
                ]
                found[node.name] = (path.stem, declared[0] if len(declared) == 1 else None)
    return found


def test_every_operation_declares_its_work_class_once():
    """Light or heavy is said once, where an operation is declared (its class body), never left to a default; the
    heavy ones are those the server's share is for (docs/classroom.md)."""
    classes = operation_classes()
    assert all(declared in ("LIGHT", "HEAVY") for _, declared in classes.values()), classes
    heavy = {name for name, (_, declared) in classes.items() if declared == "HEAVY"}
    light = {name for name, (_, declared) in classes.items() if declared == "LIGHT"}
    assert {
        "LongAttention",
        "NeedleTest",
        "Profile",
        "Importance",
        "SearchIndex",
        "Patching",
        "InductionExperiment",
    } <= heavy
    assert "LabTraining" in heavy
    assert {"Attention", "Neurons", "SearchVector", "Attribution", "LogitLens", "DecoderScores"} <= light
    assert {w.share for w in WorkClass} == {None, "heavy"}
    with pytest.raises(TypeError, match="declares no work_class"):

        class Undeclared(Operation):  # refused where it is defined
            pass


@pytest.mark.parametrize("name", ["compute", "session", "settings", "address", "budget"])
def test_the_app_state_draws_nothing(name):
    """The state modules hold and compute; drawing is left to ui.widgets and ui.figures, which import them."""
    tree = ast.parse((ROOT / "ui" / f"{name}.py").read_text(encoding="utf-8"))
    imported = set(_aliases(tree).values())
    assert not {m for m in imported if m.split(".")[0] == "plotly" or m.startswith(("ui.widgets", "ui.figures"))}
