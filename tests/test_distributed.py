"""Multi-process training on this machine: 2 and 4 CPU processes on localhost
(`jax.distributed`, gloo collectives) against one process with the same global batch."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import REPO

from pergrad.train.metrics import read_records

pytestmark = pytest.mark.extended  # see pyproject.toml

BASE = ("train.steps=12", "train.eval_every=6", "train.checkpoint_every=6",
        "logging.log_every=1", "optimizer.lr=1e-2")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(n: int, args, out_dir: Path, tmp: Path) -> list[subprocess.Popen]:
  """n processes of `python -m pergrad.train ARGS` forming one multi-process run."""
  port = _free_port()
  env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
  env.pop("XLA_FLAGS", None)  # one CPU device per process
  procs = []
  for i in range(n):
    dist = ([f"dist.coordinator_address=localhost:{port}", f"dist.num_processes={n}",
             f"dist.process_id={i}"] if n > 1 else [])
    log = open(tmp / f"proc{n}_{i}.log", "w")
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "pergrad.train", *args, *dist, f"train.out_dir={out_dir}",
         f"hydra.run.dir={tmp / f'hydra{n}_{i}'}"], cwd=REPO, env=env, stdout=log,
        stderr=subprocess.STDOUT))
  return procs


def wait(procs, tmp: Path, timeout: float = 300) -> None:
  for i, p in enumerate(procs):
    rc = p.wait(timeout=timeout)
    logs = "\n".join(f.read_text()[-1500:] for f in sorted(tmp.glob("proc*.log")))
    assert rc == 0, f"process {i} exited {rc}:\n{logs}"


def _params(run_dir: Path, step: int):
  """A checkpoint's parameters, restored onto this process's one device (whatever the
  topology it was saved from)."""
  import jax
  path = (run_dir / "checkpoints" / str(step) / "default").absolute()
  ckptr = ocp.StandardCheckpointer()
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
                        ckptr.metadata(path).item_metadata.tree)
  return jax.tree.leaves(ckptr.restore(path, target)["params"])


def _records(run_dir: Path, split: str):
  return [r for r in read_records(run_dir / "metrics.jsonl") if r["split"] == split]


@pytest.fixture(scope="module")
def single(tmp_path_factory, tiny_overrides):
  """One process, one device: the reference, per statistics setting."""
  cache = {}

  def get(stats):
    if stats not in cache:
      tmp = tmp_path_factory.mktemp("single")
      wait(launch(1, [*tiny_overrides, *BASE, *stats], tmp / "run", tmp), tmp)
      cache[stats] = tmp / "run"
    return cache[stats]
  return get


@pytest.mark.parametrize("n,stats", [
    (2, ("stats=vmap", "stats.log_every=6")),                 # per-example, vmap
    (2, ("stats=token", "stats.log_every=6")),                # per-token, surgery
    (4, ("stats=example", "stats.backend=surgery", "stats.log_every=6")),  # per-example surgery
    (2, ("stats=example", "stats.backend=loop", "stats.log_every=6")),  # the reference loop
])
def test_processes_match_one_process(n, stats, single, tmp_path, tiny_overrides):
  ref = single(stats)
  run = tmp_path / "run"
  wait(launch(n, [*tiny_overrides, *BASE, *stats], run, tmp_path), tmp_path)
  assert not list(run.glob("metrics.jsonl.*")) and (run / "summary.json").exists()
  for split in ("train", "eval"):
    got, want = _records(run, split), _records(ref, split)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=2e-5)
  got, want = _records(run, "stats"), _records(ref, "stats")
  assert [r["step"] for r in got] == [1, 6, 12] and got[0].keys() == want[0].keys()
  for g, w in zip(got, want, strict=True):
    keys = [k for k in w if k.startswith("stats/") and "median" not in k]
    assert keys
    np.testing.assert_allclose([g[k] for k in keys], [w[k] for k in keys], rtol=1e-3, atol=1e-7)
  for x, y in zip(_params(run, 12), _params(ref, 12), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-6)


def test_killed_process_resumes_to_the_same_parameters(tmp_path, tiny_overrides):
  args = [*tiny_overrides, "train.steps=60", "train.eval_every=30", "train.checkpoint_every=10",
          "logging.log_every=5", "optimizer.lr=1e-2"]
  ref_dir, ref_tmp = tmp_path / "ref", tmp_path / "ref_logs"
  ref_tmp.mkdir()
  wait(launch(2, args, ref_dir, ref_tmp), ref_tmp)

  run, logs = tmp_path / "run", tmp_path / "logs"
  logs.mkdir()
  procs = launch(2, args, run, logs)
  deadline = time.time() + 240
  while not any(p.name.isdigit() and int(p.name) >= 20
                for p in (run / "checkpoints").glob("*")) and time.time() < deadline:
    time.sleep(0.05)
  procs[1].send_signal(signal.SIGKILL)  # one process dies; the other cannot go on alone
  time.sleep(2)
  for p in procs:
    if p.poll() is None:
      p.send_signal(signal.SIGKILL)
    p.wait()
  assert not (run / "summary.json").exists()

  logs2 = tmp_path / "logs2"
  logs2.mkdir()
  wait(launch(2, args, run, logs2), logs2)
  out = (logs2 / "proc2_0.log").read_text()
  assert "resuming" in out and "from the checkpoint of step" in out, out[-2000:]
  for x, y in zip(_params(run, 60), _params(ref_dir, 60), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))  # bit-exact
  steps = [r["step"] for r in _records(run, "train")]
  assert steps == sorted(set(steps)) and steps[-1] == 60


def test_submitit_local_sweep_end_to_end(tmp_path, tiny_overrides):
  """hydra/launcher=local (submitit's local executor): two runs, read back as a sweep."""
  from pergrad.analysis.runs import aggregate, run_status

  sweep = tmp_path / "sweep"
  fixed = [o for o in tiny_overrides] + ["train.steps=4", "train.eval_every=4"]
  exclude = ",".join(o.split("=")[0] for o in fixed)
  env = {**os.environ, "WANDB_MODE": "disabled"}
  out = subprocess.run(
      [sys.executable, "-m", "pergrad.train", "-m", "hydra/launcher=local", *fixed,
       "optimizer.lr=1e-3,3e-3", f"hydra.sweep.dir={sweep}",
       f"hydra.job.config.override_dirname.exclude_keys=[{exclude}]"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  runs = sorted(p.name for p in sweep.iterdir() if (p / "summary.json").exists())
  assert runs == ["optimizer.lr=0.001", "optimizer.lr=0.003"], runs
  assert all(run_status(sweep / r) == "completed" for r in runs)
  table = aggregate(sweep)
  assert set(table["optimizer.lr"].astype(float)) == {1e-3, 3e-3}
  assert (sweep / ".submitit").is_dir()  # it really went through submitit


def test_missing_peer_stops_after_dist_timeout_in_one_line(tmp_path):
  """Process 0 of 2 alone: after dist.timeout_s it exits with one line naming the
  coordinator and the process count (not a hang, not JAX's C++ abort)."""
  port = _free_port()
  env = {**os.environ, "WANDB_MODE": "disabled"}
  env.pop("HYDRA_FULL_ERROR", None)
  t0 = time.time()
  out = subprocess.run(
      [sys.executable, "-m", "pergrad.train", f"dist.coordinator_address=localhost:{port}",
       "dist.num_processes=2", "dist.process_id=0", "dist.timeout_s=5",
       f"train.out_dir={tmp_path / 'run'}", f"hydra.run.dir={tmp_path / 'h'}"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 1 and time.time() - t0 < 60
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Check failure" not in out.stderr, out.stderr[-3000:]
  assert f"not all 2 processes joined the coordinator at localhost:{port}" in errors[0]
  assert "dist.timeout_s=5 s" in errors[0]
