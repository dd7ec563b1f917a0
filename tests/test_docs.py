"""The docs say what the code does: every threshold docs/metrics.md states equals the code's constant."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from mha_core.analysis import long_roles, metrics, roles, streamed, syntax
from mha_core.models import long
from tests.conftest import ROOT

METRICS_DOC = ROOT / "docs" / "metrics.md"
# `NAME_OF_CONSTANT = value` inside backticks: how docs/metrics.md states a constant (formulas such as
# `R = ...` have one letter and no underscore).
STATED = re.compile(r"`([A-Z][A-Z0-9]*_[A-Z0-9_]+) = ([^`]+)`")
MODULES = (roles, metrics, syntax, long_roles, streamed, long)


def stated_constants() -> list[tuple[str, str]]:
    return STATED.findall(METRICS_DOC.read_text(encoding="utf-8"))


def code_value(name: str):
    for module in MODULES:
        if hasattr(module, name):
            return getattr(module, name)
    raise AssertionError(f"docs/metrics.md states {name}, which no module defines")


def threshold_constants() -> set[str]:
    """The numeric module-level constants of roles.py, metrics.py and long_roles.py that decide a role or a pattern."""
    names = set()
    for module in (roles, metrics, long_roles):
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        for node in tree.body:
            numeric = (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, (int, float))
                and not isinstance(node.value.value, bool)
            )
            if numeric:
                names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names - {"ROW_EPS"}  # documented in words ("t_i <= 1e-6"), not a threshold of a role


@pytest.mark.parametrize("name, text", stated_constants())
def test_each_stated_threshold_equals_the_code(name, text):
    value = code_value(name)
    if isinstance(value, str):
        assert text.strip().strip('"') == value
    else:
        assert float(text) == pytest.approx(float(value), rel=0, abs=0), (name, text, value)


def test_every_threshold_of_the_code_is_stated():
    stated = {name for name, _ in stated_constants()}
    missing = sorted(threshold_constants() - stated)
    assert not missing, f"docs/metrics.md does not state {missing}"
    # The parse itself found the numbers this test rests on.
    assert {"SINK_MIN_MASS", "DELIMITER_MIN_MASS", "SYNTACTIC_MIN_COUNT", "SYNTACTIC_MIN_MARGIN"} <= stated


def test_the_roles_the_code_assigns_are_the_roles_documented():
    text = METRICS_DOC.read_text(encoding="utf-8")
    table = text[text.index("| role | group |") : text.index("### The held-out test")]
    cells = [re.split(r"(?<!\\)\|", row) for row in table.splitlines()[2:] if row.startswith("| `")]
    documented_groups = {row[2].strip() for row in cells}
    assert documented_groups == set(roles.ROLE_GROUP_PRIORITY)
    assert "`ROLE_GROUP_PRIORITY`" in text and ", ".join(roles.ROLE_GROUP_PRIORITY) in text
    for column in roles.ROLE_COLUMNS:
        assert f"`{column}`" in text, column
    for column in syntax.DEPENDENCY_COLUMNS:
        assert f"`{column}`" in text, column


def findings_script():
    """scripts/findings.py as a module (scripts/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("findings_script", ROOT / "scripts" / "findings.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_findings_quote_the_tables_the_script_makes_from_the_shipped_files():
    import pandas as pd

    findings = findings_script()
    text = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    comparison = []
    for name in ("minilm", "mpnet"):
        dependency = pd.read_csv(findings.FINDINGS / f"{name}_ud_ewt_dev_heads.dependency.csv")
        heads = pd.read_csv(findings.FINDINGS / f"{name}_ud_ewt_dev_heads.csv")
        for direction in ("parent", "child"):
            assert findings.relation_table(dependency, direction) in text, (name, direction)
        assert findings.layer_table(heads) in text, name
        comparison += findings.rule_comparison(name, dependency, heads)
    for row in comparison:
        assert "| " + " | ".join(row) + " |" in text, row
    for name in ("minilm", "smollm2"):
        table = findings.pruning_table(pd.read_csv(findings.FINDINGS / f"{name}_pruning.csv"))
        assert "\n".join(table.splitlines()[2:]) in text, name  # the rows (the header is the doc's own)
    for name in ("smollm2", "minilm"):  # section 11: the token-attribution tables, as the written files give them
        per_text = pd.read_csv(findings.FINDINGS / f"{name}_token_attribution.csv")
        summary = pd.read_csv(findings.FINDINGS / f"{name}_token_attribution_summary.csv")
        assert findings.attribution_table(summary) in text, name
        assert findings.attribution_pairs(per_text) in text, name
    # Every command the doc shows is a target's command, word for word.
    flat = " ".join(text.replace("\\\n", " ").split())
    for name, target in findings.TARGETS.items():
        if target.command:
            assert "python -m mha_core " + " ".join(target.command) in flat, name
        assert f"Target `{name}`" in text or f"`{name}`" in text, name
    # Every file the doc lists is made by a target of the script.
    made = {file for target in findings.TARGETS.values() for file in target.writes}
    assert made == {path.name for path in findings.FINDINGS.iterdir()}
    for file in made:
        assert f"`findings/{file}`" in text, file
