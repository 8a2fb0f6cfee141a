"""Shared test setup: W&B off, tiny shapes, and data prepared once per session."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
# The corrupt-checkpoint tests make Orbax's restore fail on purpose; the asyncio futures of
# that failed read are garbage-collected later and would log "Future exception was never
# retrieved" with a page-long tensorstore spec at interpreter exit.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
TRAIN = REPO / "scripts" / "train.py"

# A 1-layer, 32-wide model on byte tokens: every run compiles and trains in seconds.
TINY = (
    "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
    "model.seq_len=32", "data.tokenizer=byte", "data.vocab_size=256", "data.seq_len=32",
    "data.batch_size=8", "data.eval_batch_size=8", "train.eval_batches=2",
    "schedule.warmup_steps=2", "logging=quiet",
)


def compose(overrides=()):
  """The composed Hydra config of configs/config.yaml with `overrides` (no Hydra run)."""
  from hydra import compose as hydra_compose
  from hydra import initialize_config_dir

  from pergrad import config

  config.register()
  with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
    return hydra_compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory) -> Path:
  """A TFDS directory with the TINY data prepared once for the whole session."""
  from pergrad.data import make_data

  d = tmp_path_factory.mktemp("tfds")
  make_data(compose([*TINY, f"data.tfds_dir={d}"]).data)
  return d


@pytest.fixture(scope="session")
def tiny_overrides(tfds_dir) -> tuple[str, ...]:
  return (*TINY, f"data.tfds_dir={tfds_dir}")


def run_cli(args, *, env=None, timeout=300, **kw) -> subprocess.CompletedProcess:
  """`python scripts/train.py ARGS` in a subprocess (W&B disabled)."""
  full_env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1", **(env or {})}
  full_env.pop("HYDRA_FULL_ERROR", None)
  return subprocess.run([sys.executable, str(TRAIN), *args], cwd=REPO, env=full_env,
                        capture_output=True, text=True, timeout=timeout, **kw)
