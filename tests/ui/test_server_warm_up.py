"""The server imports the model code a first page would before it serves (``ui.server.warm_up``): checked in a fresh
interpreter, which has imported none of it before."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import sys
import ui.server
wanted = ui.server.WARM_MODULES
before = [name for name in wanted if name in sys.modules]
imported = ui.server.warm_up(wanted + ("headscope_no_such_module",))
after = [name for name in wanted if name in sys.modules]
print(repr((before, after, imported)))
"""


def test_warm_up_imports_the_model_code_and_skips_what_is_missing():
    done = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=ROOT, capture_output=True, text=True, timeout=900, check=True
    )
    before, after, imported = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert "transformers.models.bert.modeling_bert" not in before  # the server's import does not make them
    assert after == imported == list(__import__("ui.server").server.WARM_MODULES)
