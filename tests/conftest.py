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
  from pergrad.configure import compose as _compose

  return _compose(overrides)


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory) -> Path:
  """A TFDS directory with the TINY data prepared once for the whole session."""
  from pergrad.configure import build_plan
  from pergrad.data import make_data

  d = tmp_path_factory.mktemp("tfds")
  make_data(build_plan(compose([*TINY, f"data.tfds_dir={d}"])).data)
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


# --------------------------------------------------------------------------- experiments


def kill_and_restart(cmd, sweep_dir: Path, env=None, timeout=600):
  """Starts `cmd`, kills it once a first run of `sweep_dir` has finished, restarts it.

  Returns ({run name: summary mtime} of the runs finished at the kill, restart's stdout).
  """
  import signal
  import time

  proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  t0 = time.time()
  while not list(sweep_dir.glob("*/summary.json")):
    assert proc.poll() is None, "the sweep ended before any run finished"
    assert time.time() - t0 < timeout
    time.sleep(0.2)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  first = {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob("*/summary.json")}
  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return first, out.stdout


@pytest.fixture(scope="session")
def ci_sweeps(tmp_path_factory) -> dict:
  """ONE sweeps root with the `ci` preset of every experiment (overhead included), read
  by every experiment and notebook test instead of each launching its own.

  Two streams share the 2 cores: sign_placement, killed after its first run finished and
  restarted (the restart must skip exactly the finished runs), then `after_kill`; beside
  it, one `reproduce.py` call runs all the other experiments.
  """
  sys.path.insert(0, str(REPO))
  from experiments.runner import EXPERIMENTS

  after_kill = ("preconditioner", "msq_eps")  # about as long as the other stream's share
  beside = [n for n in EXPERIMENTS if n not in ("sign_placement", *after_kill)]
  root = tmp_path_factory.mktemp("sweeps")
  reproduce = [sys.executable, str(REPO / "scripts" / "reproduce.py")]
  common = ["--preset", "ci", "--sweeps-root", str(root)]
  # One XLA compilation cache for the session's runs: a run whose programs another run
  # compiled already (same model, optimizer and shapes; e.g. another seed, or the resumed
  # run of the killed sweep) loads them instead of compiling (about 10 s of a 14 s run).
  env = {**os.environ, "WANDB_MODE": "disabled",
         "JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
         "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
  other = subprocess.Popen([*reproduce, *beside, *common], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    first, stdout = kill_and_restart([*reproduce, "sign_placement", *common],
                                     root / "sign_placement" / "ci", env=env)
    after = subprocess.run([*reproduce, *after_kill, *common], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900)
    other_out, _ = other.communicate(timeout=900)
  finally:
    if other.poll() is None:
      other.kill()
  assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-3000:]
  assert other.returncode == 0, other_out[-6000:]
  return {"root": root, "killed_first": first, "restart_stdout": stdout}
