#!/usr/bin/env bash
# README command 2: set up if needed, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export WANDB_MODE=disabled
exec .venv/bin/python -m pytest -q "$@"
