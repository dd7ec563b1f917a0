"""The server imports what its first pages would before it serves (``ui.server.warm_up``), then sets it aside from
the cycle collector (``ui.server.settle_heap``): checked in fresh interpreters, which have imported none of it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import pkgutil, sys
import ui, ui.server
wanted = ui.server.WARM_MODULES
before = [name for name in wanted if name in sys.modules]
imported = ui.server.warm_up(wanted + ("headscope_no_such_module",))
after = [name for name in wanted if name in sys.modules]
own = sorted(module.name for module in pkgutil.walk_packages(ui.__path__, "ui."))
from mha_core.analysis import metrics_kernel
print(repr((before, after, imported, own, len(metrics_kernel.measure_batch.signatures))))
"""


def _last_line(code: str):
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900, check=True
    )
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_warm_up_imports_the_model_code_the_app_and_the_kernel_and_skips_what_is_missing():
    before, after, imported, own, signatures = _last_line(CHECK)
    wanted = list(__import__("ui.server").server.WARM_MODULES)
    assert "transformers.models.bert.modeling_bert" not in before  # the server's import does not make them
    assert "mha_core.analysis.metrics_kernel" not in before
    assert after == imported[: len(wanted)] == wanted  # the missing module is skipped, the rest imported
    assert "headscope_no_such_module" not in imported
    assert sorted(imported[len(wanted) :]) == own and "ui.page_classroom" in own  # every module of the app's own
    assert signatures == 1  # the head metrics' kernel is compiled (or loaded from numba's cache) before a page asks


SETTLE = """
import gc, weakref
import ui.server
ui.server.warm_up()
tracked = len(gc.get_objects())
frozen = ui.server.settle_heap()
left = len(gc.get_objects())


class Node:
    pass


freed = []
# An object made before the freeze and dropped afterwards is still freed (reference counting is not the collector).
late = Node()
ui.server.settle_heap()
probe = weakref.ref(late, lambda _: freed.append("late"))
del late
# A cycle made after the freeze is garbage the collector still finds.
a, b = Node(), Node()
a.other, b.other = b, a
cycle = weakref.ref(a, lambda _: freed.append("cycle"))
del a, b
found = gc.collect()
print(repr((tracked, frozen, left, found, sorted(freed))))
"""


def test_settle_heap_sets_the_warm_server_aside_and_garbage_is_still_freed():
    tracked, frozen, left, found, freed = _last_line(SETTLE)
    assert tracked > 100_000  # the warm server: transformers, torch, plotly, numba, streamlit, the app
    assert frozen >= tracked * 0.9  # what survived the full collection, set aside
    assert left < 1_000  # a full collection right after walks next to nothing
    assert found >= 2 and freed == ["cycle", "late"]
