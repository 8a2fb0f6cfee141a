"""Shared test setup: W&B off, tiny shapes, and data prepared once per session."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "disabled")
# Runs' default compilation cache (train.compile_cache) in a temp dir, never the user's
# ~/.cache (subprocesses and xdist workers inherit it; every process sets the same path).
os.environ.setdefault("PERGRAD_COMPILE_CACHE",
                      str(Path(tempfile.gettempdir()) / f"pergrad-tests-jax-{os.getuid()}"))
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
  from pergrad.config import compose as _compose

  return _compose(overrides)


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory) -> Path:
  """A TFDS directory with the TINY data prepared once for the whole session."""
  from pergrad.config import build_plan
  from pergrad.data import make_data

  d = tmp_path_factory.mktemp("tfds")
  make_data(build_plan(compose([*TINY, f"data.tfds_dir={d}"])).data)
  return d


@pytest.fixture(scope="session")
def tiny_overrides(tfds_dir) -> tuple[str, ...]:
  return (*TINY, f"data.tfds_dir={tfds_dir}")


# --------------------------------------------------------------------------- compilation cache

# One persistent XLA compilation cache for the session's training runs (in-process and
# subprocess): a run whose programs another run compiled already (same model, optimizer,
# schedule and shapes; e.g. a resumed run, or a second run of the same config) loads them
# instead of compiling them again (about 10 of a run's 13 s on 2 cores). The executables
# are the ones XLA compiled; only the compile is skipped.
_CACHE_SETTINGS = {"jax_persistent_cache_min_compile_time_secs": 0,
                   "jax_persistent_cache_min_entry_size_bytes": 0}


@pytest.fixture(scope="session")
def jax_cache_dir(tmp_path_factory) -> Path:
  return tmp_path_factory.mktemp("jax_cache")


def cache_env(cache_dir: Path) -> dict:
  """The environment that points a subprocess's JAX at the cache `cache_dir`."""
  return {"JAX_COMPILATION_CACHE_DIR": str(cache_dir),
          **{k.upper(): str(v) for k, v in _CACHE_SETTINGS.items()}}


@pytest.fixture(scope="module")
def compilation_cache(jax_cache_dir):
  """The session's compilation cache, on in this process for the requesting module (off
  elsewhere: tests that read XLA's FLOP count or buffer report compile for themselves);
  returns the environment that turns it on in a subprocess (`cache_env`)."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache as cc

  settings = {"jax_compilation_cache_dir": str(jax_cache_dir), **_CACHE_SETTINGS}
  old = {k: getattr(jax.config, k) for k in settings}
  for k, v in settings.items():
    jax.config.update(k, v)
  cc.reset_cache()  # JAX opens the cache at its next compile, at the new path
  try:
    yield cache_env(jax_cache_dir)
  finally:
    for k, v in old.items():
      jax.config.update(k, v)
    cc.reset_cache()


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


def pytest_collection_modifyitems(config, items):
  """The tests that read `ci_sweeps` run last (a stable sort): the sweeps run in the
  background from the session's first test on, beside the rest of the suite, which leaves
  one of the 2 cores idle much of the time (compiles are single-threaded)."""
  items.sort(key=lambda item: "ci_sweeps" in getattr(item, "fixturenames", ()))


# Not in the ci sweeps: the ladder runs four of them at each of three rungs (~8 min a rung on
# the shared 2 cores, over the extended suite's budget); tests/test_ladder.py tests its parts.
ALONE = ("ladder",)


def streams() -> tuple[tuple[str, ...], ...]:
  """The experiments of each ci stream (`Experiment.stream`): those that need none first (a
  need may run in the other stream), each part in `all`'s order."""
  sys.path.insert(0, str(REPO))
  from pergrad.sweep.record import experiments

  exps = experiments().values()
  return tuple(tuple(e.name for e in sorted((e for e in exps if e.stream == i),
                                            key=lambda e: bool(e.needs)))
               for i in sorted({e.stream for e in exps if e.stream is not None}))


class _CiSweeps:
  """ONE sweeps root with the `ci` preset of every experiment (the benchmarks included), read
  by every experiment test instead of each launching its own: two `reproduce.py` streams, one
  per core (`streams`), started at the session's first test and running beside it; `result()`
  waits."""

  def __init__(self, tmp_path_factory):
    from pergrad.sweep.record import builtin

    self.streams = streams()
    wanted = sorted(n for n in builtin() if n not in ALONE)
    assert sorted(sum(self.streams, ())) == wanted, "give every experiment a stream"
    self.root = root = tmp_path_factory.mktemp("sweeps")
    # Niced: the tests run beside them at full priority. One XLA compilation cache: a run
    # whose programs another run compiled already loads them (about 10 s of a 14 s run).
    env = {**os.environ, "WANDB_MODE": "disabled",
           **cache_env(tmp_path_factory.mktemp("jax_cache"))}
    self.logs, self.procs = [], []
    for i, names in enumerate(self.streams):
      log = root.parent / f"{root.name}-{i}.log"  # a file: nobody reads a pipe meanwhile
      with open(log, "w") as f:
        self.procs.append(subprocess.Popen(
            ["nice", "-n", "10", sys.executable, str(REPO / "scripts" / "reproduce.py"), *names,
             "--preset", "ci", "--sweeps-root", str(root)],
            cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, text=True))
      self.logs.append(log)

  def result(self) -> dict:
    for proc, log in zip(self.procs, self.logs, strict=True):
      proc.wait(timeout=1800)
      assert proc.returncode == 0, log.read_text()[-6000:]
    return {"root": self.root}

  def close(self):
    for proc in self.procs:
      if proc.poll() is None:
        proc.kill()


@pytest.fixture(scope="session", autouse=True)
def _ci_sweeps_job(request, tmp_path_factory):
  """Starts the ci sweeps at the session's first test if a selected test reads them."""
  if not any("ci_sweeps" in getattr(item, "fixturenames", ())
             for item in request.session.items):
    yield None
    return
  job = _CiSweeps(tmp_path_factory)
  try:
    yield job
  finally:
    job.close()


@pytest.fixture(scope="session")
def ci_sweeps(_ci_sweeps_job) -> dict:
  """The ci sweeps of every experiment (`_CiSweeps`), once they are done."""
  return _ci_sweeps_job.result()


def as_planned(out_dir):
  """`out_dir` with a budget.csv beside its constructed finals.csv: every completed run at the
  budget its comparison declares (the steps and warmup it recorded), so that a report's other
  rules are tested alone (tests/test_budget.py tests the `same_budget` guard itself)."""
  import pandas as pd

  from pergrad.analysis.runs import read_csv

  fin = read_csv(Path(out_dir) / "finals.csv")
  if fin.empty:
    return out_dir
  if "run" not in fin:  # a table without run names: one per row
    fin = fin.assign(run=[f"run{i}" for i in range(len(fin))])
  if "status" in fin:
    fin = fin[fin["status"] == "completed"]
  rows = [{"run": r["run"], **{k: r[c] for k, c in (("steps", "final_step"),
                                                       ("warmup_steps", "warmup_steps"))
                                if c in r and pd.notna(r[c])}} for r in fin.to_dict("records")]
  df = pd.DataFrame(rows)
  for k in ("steps", "warmup_steps"):
    if k in df:
      df[f"declared_{k}"] = df[k]
  df.to_csv(Path(out_dir) / "budget.csv", index=False)
  return out_dir
