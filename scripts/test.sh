#!/usr/bin/env bash
# README command 2: set up if needed, then run the whole test suite, one pytest-xdist worker
# per core (compiles are single-threaded); `-n 0` after it runs it in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE=disabled
exec .venv/bin/python -m pytest -q -n auto --dist worksteal "$@"
