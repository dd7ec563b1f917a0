#!/usr/bin/env bash
# Install everything (if needed) and start Headscope on the embedded MiniLM model.
#   bash scripts/app.sh                   one user, on this machine: http://localhost:8501
#   bash scripts/app.sh --classroom       a class: serves on every interface of this machine, prints the
#                                         link (and shows it with a QR code in the app), safe settings on
#                                         (docs/classroom.md). HEADSCOPE_PORT picks the port (default 8501).
# Any further arguments go to `streamlit run` (e.g. --server.port 8600). The app runs through serve.py: app.py with
# its HTTP side (in a class, the teacher key out of the address and the class's HttpOnly cookies).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

if [ "${1:-}" = "--classroom" ]; then
  shift
  port=${HEADSCOPE_PORT:-8501}
  host=$(hostname -I 2>/dev/null | awk '{print $1}')
  export HEADSCOPE_CLASSROOM=1
  export HEADSCOPE_PUBLIC_URL=${HEADSCOPE_PUBLIC_URL:-http://${host:-localhost}:${port}/}
  # The teacher's secret: HEADSCOPE_TEACHER_TOKEN, else the one kept in the cache for 12 h (a restart keeps the
  # teacher link), else a new one (ui/class_session.py). Only its holder leads the class.
  HEADSCOPE_TEACHER_TOKEN=$(.venv/bin/python -m ui.class_session token)
  export HEADSCOPE_TEACHER_TOKEN
  case "$HEADSCOPE_PUBLIC_URL" in *\?*) teacher_link="${HEADSCOPE_PUBLIC_URL}&teacher=${HEADSCOPE_TEACHER_TOKEN}" ;;
    *) teacher_link="${HEADSCOPE_PUBLIC_URL}?teacher=${HEADSCOPE_TEACHER_TOKEN}" ;; esac
  echo
  echo "  Headscope for a class. Students open:  ${HEADSCOPE_PUBLIC_URL}"
  echo "  The teacher opens (keep it to yourself): ${teacher_link}"
  echo "  (the sidebar's 'Join this class' panel shows the same link as a QR code)"
  # The default list is the server's own (mha_core.models.sources.CLASSROOM_MODELS), read from the code.
  classroom_models='from mha_core.models.sources import CLASSROOM_MODELS; print(", ".join(CLASSROOM_MODELS))'
  offered=${HEADSCOPE_ALLOWED_MODELS:-$(.venv/bin/python -c "$classroom_models")}
  echo "  Models offered: ${offered}; cache budget ${HEADSCOPE_CACHE_BUDGET_MB:-2048} MB."
  echo
  exec .venv/bin/python -m streamlit run serve.py --server.address 0.0.0.0 --server.port "$port" \
    --browser.serverAddress "${host:-localhost}" "$@"
fi
exec .venv/bin/python -m streamlit run serve.py "$@"
