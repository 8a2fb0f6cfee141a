#!/usr/bin/env bash
# README command 1: set everything up, then train the `tiny` preset on the embedded
# Shakespeare corpus (experiment=quickstart). Extra arguments are Hydra overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python scripts/train.py experiment=quickstart "$@"
