"""The training system end to end: loop, resume after SIGKILL, corrupt checkpoints,
non-finite loss, config errors, multirun, and a 2-device run.

Runs use the 1-layer, 32-wide model of conftest.TINY on byte tokens, prepared once per
session; runs that need no subprocess call the loop in-process (`pergrad.train.loop.run`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import REPO, TRAIN, compose, run_cli

from pergrad.config import build_plan
from pergrad.train.loop import run
from pergrad.train.metrics import read_records

BASE = ("train.steps=12", "train.eval_every=6", "train.checkpoint_every=6",
        "logging.log_every=1", "optimizer.lr=1e-2")


def _train(tmp, overrides, extra=(), echo=None):
  cfg = compose([*overrides, *BASE, *extra])
  lines = []
  summary = run(build_plan(cfg), tmp, echo=echo or lines.append)
  return summary, lines


def _final_params(run_dir: Path, step: int):
  path = Path(run_dir) / "checkpoints" / str(step) / "default"
  return ocp.StandardCheckpointer().restore(path.absolute())["params"]


def _assert_trees_equal(a, b):
  import jax
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert len(la) == len(lb) > 0
  for x, y in zip(la, lb, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _no_duplicates(recs):
  keys = [(r["step"], r["split"]) for r in recs]
  assert len(keys) == len(set(keys)), "duplicate (step, split) records"


@pytest.fixture(scope="module", autouse=True)
def _cache(compilation_cache):
  """This module's runs share compiled programs (tests/conftest.py): most of its runs train
  the BASE config, which compiles once."""
  return compilation_cache


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, tiny_overrides):
  """One in-process run of BASE, with statistics logged at steps 1 and 6k."""
  d = tmp_path_factory.mktemp("base")
  summary, lines = _train(d, tiny_overrides, ("stats=vmap", "stats.log_every=6"))
  return d, summary, lines


def test_run_writes_metrics_summary_checkpoints(base_run):
  d, summary, lines = base_run
  assert summary["status"] == "completed" and json.loads((d / "summary.json").read_text()) \
      == json.loads(json.dumps(summary, default=str))
  recs = read_records(d / "metrics.jsonl")
  _no_duplicates(recs)
  train = [r for r in recs if r["split"] == "train"]
  evals = {r["step"]: r["loss"] for r in recs if r["split"] == "eval"}
  stats = [r for r in recs if r["split"] == "stats"]
  assert [r["step"] for r in train] == list(range(1, 13))
  assert sorted(evals) == [0, 6, 12]
  for key in ("loss", "lr", "grad_norm", "examples_seen", "tokens_seen"):
    assert all(key in r for r in train), key
  assert all("tokens_per_s" in r for r in train[1:])
  assert train[-1]["examples_seen"] == 12 * 8 and train[-1]["tokens_seen"] == 12 * 8 * 32
  assert evals[12] < evals[0] - 0.5, evals  # loss falls
  assert summary["initial_eval_loss"] == pytest.approx(evals[0], rel=1e-6)
  assert summary["final_eval_loss"] == pytest.approx(evals[12], rel=1e-6)
  assert [r["step"] for r in stats] == [1, 6, 12]
  assert any(k.startswith("stats/") for k in stats[0]) and any(k.startswith("opt/") for k in
                                                              stats[0])
  assert sorted(int(p.name) for p in (d / "checkpoints").iterdir()) == [6, 12]
  assert (d / "config.yaml").exists()
  assert any("eval loss" in line for line in lines)  # the printed summary


TIMING = ("tokens_per_s", "train_time_s")


def _records(run_dir: Path, splits=("train", "eval")) -> list[dict]:
  """The run's records of `splits` without the timing fields."""
  return [{k: v for k, v in r.items() if k not in TIMING}
          for r in read_records(Path(run_dir) / "metrics.jsonl") if r["split"] in splits]


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory, tiny_overrides):
  """BASE without statistics logging."""
  d = tmp_path_factory.mktemp("plain")
  _train(d, tiny_overrides)
  return d


def test_statistics_logging_leaves_the_trajectory_bit_identical(base_run, plain_run):
  """Logging steps (vmap statistics, eps_share of AdamW's held ε) update by the plain
  step's operations: train and eval losses, norms and parameters are the same bits."""
  d, _, _ = base_run
  assert _records(d) == _records(plain_run)
  stats = _records(d, ("stats",))
  assert [r["step"] for r in stats] == [1, 6, 12] and "opt/all/eps_share" in stats[0]
  _assert_trees_equal(_final_params(d, 12), _final_params(plain_run, 12))


@pytest.mark.parametrize("extra", [
    # The logged request is the optimizer's: the update's own statistics are summarised.
    ("optimizer.variant=micro_adam_msq", "stats.want=[mean,sq]"),
    # A second, per-example backward pass (surgery) beside value_and_grad's update.
    ("optimizer.variant=adam", "stats=example"),
], ids=["same_request", "second_pass"])
@pytest.mark.extended
def test_adam_family_logging_leaves_the_trajectory_bit_identical(tmp_path, tiny_overrides,
                                                                 extra):
  opt = ("optimizer=adam_family", "optimizer.eps=1e-4", *extra)
  _train(tmp_path / "logged", tiny_overrides, (*opt, "stats.log_every=3"))
  _train(tmp_path / "plain", tiny_overrides, (*opt, "stats.log_every=0"))
  assert _records(tmp_path / "logged") == _records(tmp_path / "plain")
  stats = _records(tmp_path / "logged", ("stats",))
  assert [r["step"] for r in stats] == [1, 3, 6, 9, 12]
  assert all(0 <= r["opt/all/eps_share"] <= 1 and "opt/all/share_mu2" in r for r in stats)
  _assert_trees_equal(_final_params(tmp_path / "logged", 12),
                      _final_params(tmp_path / "plain", 12))


def test_a_rerun_writes_the_same_metrics(base_run, tmp_path, tiny_overrides):
  """The same config and seed again: metrics.jsonl record for record (timing aside)."""
  d, _, _ = base_run
  _train(tmp_path, tiny_overrides, ("stats=vmap", "stats.log_every=6"))
  splits = ("train", "eval", "stats")
  assert _records(tmp_path, splits) == _records(d, splits) and len(_records(d, splits)) > 12


def test_completed_run_is_skipped(base_run, tiny_overrides):
  d, summary, _ = base_run
  mtime = (d / "metrics.jsonl").stat().st_mtime_ns
  again, lines = _train(d, tiny_overrides, ("stats=vmap", "stats.log_every=6"))
  assert again == json.loads(json.dumps(summary, default=str))
  assert lines[0] == f"already completed: {d}"
  assert (d / "metrics.jsonl").stat().st_mtime_ns == mtime


# A failed Orbax restore leaves a callback on a closed asyncio loop (harmless, inside Orbax).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage", ["truncate_data", "missing_metadata"])
def test_corrupt_checkpoint_falls_back_to_previous(base_run, tmp_path, tiny_overrides, damage):
  src, _, _ = base_run
  d = tmp_path / "run"
  shutil.copytree(src, d)
  (d / "summary.json").unlink()
  ck = d / "checkpoints" / "12"
  if damage == "truncate_data":
    for f in ck.rglob("*"):
      if f.is_file() and f.parent.name == "d":
        f.write_bytes(b"")
  else:
    (ck / "default" / "_METADATA").unlink()
  summary, lines = _train(d, tiny_overrides, ("stats=vmap", "stats.log_every=6"))
  msg = [line for line in lines if line.startswith("[checkpoint]")]
  assert len(msg) == 1 and "step 12" in msg[0] and "corrupt or incomplete" in msg[0], lines
  assert (d / "checkpoints" / "12.corrupt").is_dir()  # moved aside, not deleted
  assert summary["status"] == "completed" and summary["resumed_from"] == 6
  _assert_trees_equal(_final_params(src, 12), _final_params(d, 12))
  _no_duplicates(read_records(d / "metrics.jsonl"))


@pytest.mark.parametrize("schedule", [
    pytest.param((), marks=pytest.mark.extended),  # a fixed batch: the same loop, less of it
    # A GNS-guided batch size (decisions read the restored tracker state) from B = 2 to 8.
    ("batch=gns", "batch.start=2", "batch.every=4", "batch.gns_factor=0.3"),
], ids=["fixed", "gns_schedule"])
@pytest.mark.extended
def test_resume_after_sigkill_is_bit_exact(tmp_path, tiny_overrides, schedule,
                                           compilation_cache):
  """A run SIGKILLed after a checkpoint, re-run with the same command, ends with exactly
  the parameters (and logged losses and batch sizes) of an uninterrupted run."""
  steps = ("train.steps=150", "train.checkpoint_every=10", "train.eval_every=100",
           "logging.log_every=1", "optimizer.lr=1e-2", *schedule)
  d = tmp_path / "killed"
  args = [*tiny_overrides, *steps, f"train.out_dir={d}", f"hydra.run.dir={tmp_path / 'h'}"]
  env = {**os.environ, "WANDB_MODE": "disabled", **compilation_cache}
  proc = subprocess.Popen([sys.executable, str(TRAIN), *args], cwd=REPO, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  ckdir, t0 = d / "checkpoints", time.time()
  while not (ckdir.exists() and any(p.name.isdigit() for p in ckdir.iterdir())):
    assert proc.poll() is None, proc.stderr.read()[-2000:]
    assert time.time() - t0 < 120
    time.sleep(0.005)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (d / "summary.json").exists(), "the run finished before it was killed"

  out = run_cli(args, env=compilation_cache)
  assert out.returncode == 0, out.stderr[-3000:]
  resumed = re.search(r"resuming .* from the checkpoint of step (\d+)", out.stdout)
  assert resumed and int(resumed.group(1)) >= 10, out.stdout[-2000:]

  ref = tmp_path / "ref"
  summary = run(build_plan(compose([*tiny_overrides, *steps])), ref, echo=lambda s: None)
  last = summary["last_step"]
  assert int(resumed.group(1)) < last
  _assert_trees_equal(_final_params(ref, last), _final_params(d, last))  # bit-exact
  got, want = read_records(d / "metrics.jsonl"), read_records(ref / "metrics.jsonl")
  _no_duplicates(got)
  key = lambda r: (r["step"], r["split"], r.get("batch_size"), r.get("examples_seen"))
  assert [key(r) for r in got] == [key(r) for r in want]
  assert [r.get("loss") for r in got] == [r.get("loss") for r in want]
  sizes = [r["batch_size"] for r in want if r["split"] == "train"]
  if schedule:  # the schedule changed B, after the point where the run was killed too
    assert sizes[0] == 2 and sizes[-1] > sizes[int(resumed.group(1))] >= 2, sizes
    assert sizes == sorted(sizes)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, tiny_overrides):
  d = tmp_path / "nan"
  out = run_cli([*tiny_overrides, "train.steps=50", "train.checkpoint_every=1",
                 "optimizer=sgd", "optimizer.clip_norm=null", "optimizer.lr=300",
                 "schedule=constant", "schedule.warmup_steps=40",
                 f"train.out_dir={d}", f"hydra.run.dir={tmp_path / 'h'}"])
  assert out.returncode == 1
  errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
  # Every checkpoint is evaluated before it is saved: the divergence shows first either
  # in the training loss or in the eval of the checkpoint that would have been saved.
  step = int(re.search(r"(?:non-finite training loss|the eval loss diverged) at step (\d+)",
                       errors[0]).group(1))
  good = re.search(r"the last good checkpoint is step (\d+)", errors[0])
  assert good, errors[0]
  good = int(good.group(1))
  assert 1 <= good < step
  kept = sorted(int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())
  assert kept and max(kept) == good and step not in kept, (kept, step)
  summary = json.loads((d / "summary.json").read_text())
  assert summary["status"] == "diverged" and f"step {step}" in summary["error"]
  restored = _final_params(d, good)
  import jax
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(restored))


@pytest.mark.extended
def test_dp_sgd_under_a_batch_ramp_trains_and_reruns_bit_exact(tmp_path, tiny_overrides):
  """Clipping by surgery with Gaussian noise (DP-SGD) from the config, with B ramping
  2 -> 8: the run trains to a finite loss, the noise moves it off the noiseless run, and
  a rerun gives the same bits (the noise is keyed by seed and examples seen)."""
  dp = ("stats.backend=surgery", "optimizer.per_example_clip=0.5", "batch=linear",
        "batch.start=2", "batch.ramp_tokens=1000")
  noisy = [_train(tmp_path / f"noisy{i}", tiny_overrides, (*dp, "optimizer.noise_multiplier=0.5"))
           for i in range(2)]
  quiet = _train(tmp_path / "quiet", tiny_overrides, dp)
  assert all(s["status"] == "completed" for s, _ in (*noisy, quiet))
  runs = [_records(tmp_path / name) for name in ("noisy0", "noisy1", "quiet")]
  assert runs[0] == runs[1]
  assert all(np.isfinite(r["loss"]) for r in runs[0] if "loss" in r)
  assert [r["loss"] for r in runs[0]] != [r["loss"] for r in runs[2]]


@pytest.mark.extended
def test_multirun_2x2_grid(tmp_path, tiny_overrides, compilation_cache):
  sweep = tmp_path / "sweep"
  fixed = [o for o in tiny_overrides if not o.startswith("data.batch_size=")]
  fixed += ["train.steps=2", "train.eval_every=2", "train.eval_batches=1"]
  exclude = ",".join(o.split("=")[0] for o in fixed)  # only the swept keys name the dirs
  out = run_cli(["-m", *fixed, "optimizer.lr=1e-3,3e-3", "data.batch_size=8,16",
                 f"hydra.sweep.dir={sweep}",
                 f"hydra.job.config.override_dirname.exclude_keys=[{exclude}]"],
                env=compilation_cache, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  runs = sorted(p.name for p in sweep.iterdir() if (p / "metrics.jsonl").exists())
  assert runs == ["data.batch_size=16,optimizer.lr=0.001", "data.batch_size=16,optimizer.lr=0.003",
                  "data.batch_size=8,optimizer.lr=0.001", "data.batch_size=8,optimizer.lr=0.003"
                  ], runs
  for r in runs:
    s = json.loads((sweep / r / "summary.json").read_text())
    assert s["status"] == "completed"
    assert (sweep / r / ".hydra" / "overrides.yaml").exists()
    ex = [x for x in read_records(sweep / r / "metrics.jsonl") if x["split"] == "train"][-1]
    assert ex["examples_seen"] == 2 * int(re.search(r"batch_size=(\d+)", r).group(1))


@pytest.mark.extended
def test_two_devices_match_one_device(base_run, tmp_path, tiny_overrides):
  d1, _, _ = base_run
  d2 = tmp_path / "two"
  out = run_cli([*tiny_overrides, *BASE, "stats=vmap", "stats.log_every=6",
                 f"train.out_dir={d2}", f"hydra.run.dir={tmp_path / 'h'}"],
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"})
  assert out.returncode == 0, out.stderr[-3000:]
  assert json.loads((d2 / "summary.json").read_text())["n_devices"] == 2
  pick = lambda d, split: [r["loss"] for r in read_records(d / "metrics.jsonl")
                           if r["split"] == split]
  for split in ("train", "eval"):
    np.testing.assert_allclose(pick(d2, split), pick(d1, split), rtol=2e-5)


def test_wandb_failure_only_warns(tmp_path, tiny_overrides, monkeypatch, capsys):
  import wandb

  for var in ("WANDB_MODE", "WANDB_DISABLED"):  # the environment would win over the config
    monkeypatch.delenv(var, raising=False)

  def broken(*a, **k):
    raise RuntimeError("no network")

  monkeypatch.setattr(wandb, "init", broken)
  # BASE as in the test above: its programs are compiled already (the session's cache).
  summary, _ = _train(tmp_path, tiny_overrides, ("logging.wandb.mode=online",))
  assert summary["status"] == "completed"
  err = capsys.readouterr().err
  assert err.count("[warning] W&B init failed (RuntimeError: no network)") == 1


@pytest.mark.extended
def test_throughput_benchmark_prints_json():
  """scripts/bench_throughput.py measures the trainer's own step and prints one JSON object."""
  from conftest import TINY
  proc = subprocess.run(
      [sys.executable, str(REPO / "scripts" / "bench_throughput.py"), "--steps", "2",
       "--warmup", "1", "--peak-flops", "1e12", *TINY, "optimizer=adam_family",
       "optimizer.variant=micro_adam"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  out = json.loads(proc.stdout)
  assert out["tokens_per_s"] > 0 and out["step_s"] > 0
  assert out["tokens_per_s"] == pytest.approx(out["batch_size"] * out["seq_len"] / out["step_s"],
                                              rel=1e-3)
  mem = out["memory_analysis"]
  assert mem["mem_bytes"] > 0 and mem["peak_bytes"] > 0 and out["peak_rss_bytes"] > 0
  assert out["stats_request"] == ["mean", "sq"]  # micro_adam asks for per-example squares
  # MFU: model FLOPs (6N + 12·L·T·d per token) x tokens/s over the given peak
  n, t, d, layers = out["n_params"], out["seq_len"], 32, 1
  assert out["model_flops_per_token"] == 6 * n + 12 * layers * t * d
  assert out["mfu"] == pytest.approx(out["tokens_per_s"] * out["model_flops_per_token"] / 1e12,
                                     rel=1e-6)
  assert out["xla_flops_per_step"] > 0


def test_different_config_in_a_completed_run_dir_is_one_line_error(base_run, tiny_overrides):
  """The plan's fingerprint is compared before anything else, completed run or not."""
  d, summary, _ = base_run
  before = (d / "summary.json").read_text(), (d / "metrics.jsonl").read_text()
  with pytest.raises(ValueError, match=r"different config \(data.batch_size: 8 -> 4\).*"
                                       r"train.out_dir"):
    _train(d, tiny_overrides, ("stats=vmap", "stats.log_every=6", "data.batch_size=4"))
  with pytest.raises(ValueError, match=r"optimizer.lr: 0.01 -> 0.02"):
    _train(d, tiny_overrides, ("optimizer.lr=2e-2",))
  assert ((d / "summary.json").read_text(), (d / "metrics.jsonl").read_text()) == before
  # Logging settings are not part of the run's identity: the run is still "completed".
  again, lines = _train(d, tiny_overrides, ("logging.log_every=3", "stats.log_every=0"))
  assert lines[0] == f"already completed: {d}" and again["status"] == "completed"


def test_run_dir_lacking_a_config_key_is_another_run(base_run, tiny_overrides, tmp_path):
  """A run directory whose config lacks a key of the schema holds another run (no
  compatibility with configs written before a key existed), unless the key is resumable."""
  import yaml

  from pergrad.config.plan import resume_decision
  d = tmp_path / "old"
  shutil.copytree(base_run[0], d)
  cfg = yaml.safe_load((d / "config.yaml").read_text())
  del cfg["plugins"], cfg["stats"]["log_every"]  # resumable keys
  (d / "config.yaml").write_text(yaml.safe_dump(cfg))
  overrides = (*tiny_overrides, *BASE, "stats=vmap", "stats.log_every=6")
  assert resume_decision(d, build_plan(compose(overrides))) == "completed"
  del cfg["stats"]["gns"]
  (d / "config.yaml").write_text(yaml.safe_dump(cfg))
  with pytest.raises(ValueError, match=r"different config \(stats.gns: None -> False\)"):
    resume_decision(d, build_plan(compose(overrides)))
