#!/usr/bin/env bash
# Install everything (Chromium included, if needed), check the code style, and run the whole test suite
# (the views' JavaScript tests with node, then pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The views' JavaScript (ui/viewkit, ui/headview, ui/longview): its pure parts, with node's built-in test runner.
if command -v node >/dev/null 2>&1; then
  node --test tests/js/
elif [ "${CI:-}" = "true" ]; then
  echo "node is missing: the views' JavaScript tests cannot run (apt-get install nodejs)" >&2
  exit 1
else
  echo "node not found: skipping the views' JavaScript tests (tests/js/)" >&2
fi
exec .venv/bin/python -m pytest "$@"
