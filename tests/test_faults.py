"""Faults a run must report truthfully, each in one line naming the problem and the fix:
files that are not text, a diverged eval loss, SIGINT / SIGTERM / the pre-emption signal
(stop with a checkpoint, resume bit-exactly), unreadable checkpoints, a full disk and an
unwritable run directory. The multi-process start-up timeout is in test_distributed.py.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TRAIN, compose, run_cli
from test_train import _assert_trees_equal, _final_params, _no_duplicates

from pergrad.config import build_plan
from pergrad.data import DataError, DataSpec, make_data
from pergrad.data.corpus import not_text
from pergrad.train.checkpoint import Checkpoints, OutputError
from pergrad.train.divergence import eval_diverged
from pergrad.train.loop import NonFiniteLossError, run
from pergrad.train.metrics import read_records
from pergrad.train.progress import Clock

SHORT = ("train.steps=12", "train.eval_every=6", "train.checkpoint_every=6",
         "logging.log_every=1", "optimizer.lr=1e-2")


@pytest.fixture(scope="module", autouse=True)
def _cache(compilation_cache):
  return compilation_cache


def _run(tmp, overrides, extra=()):
  lines = []
  summary = run(build_plan(compose([*overrides, *SHORT, *extra])), tmp, echo=lines.append)
  return summary, lines


def _one_line(err: str) -> str:
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
  return errors[0]


# --------------------------------------------------------------------------- data


def test_not_text_tolerates_a_few_invalid_bytes():
  text = ("plain text, naïve café " * 500).encode()
  assert not_text(text) is None
  assert not_text(text[:5000] + b"\xff" + text[5000:]) is None  # 1 bad byte in 11k
  assert "invalid UTF-8" in not_text(text[:100] + b"\xff\xfe" * 50)
  assert "NUL" in not_text(b"abc\0def")


@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_random_bytes_as_txt_are_refused_before_any_work(tmp_path, tokenizer):
  folder = tmp_path / "corpus"
  folder.mkdir()
  (folder / "good.txt").write_text("An honest line of text.\n" * 200)
  rng = np.random.default_rng(0)
  for name in ("noise.txt", "more_noise.txt"):
    (folder / name).write_bytes(rng.integers(0, 256, 20_000, dtype=np.uint8).tobytes())
  tfds = tmp_path / "tfds"
  with pytest.raises(DataError) as e:
    make_data(DataSpec(name="txt_folder", path=str(folder), tfds_dir=str(tfds),
                       tokenizer=tokenizer, vocab_size=256 if tokenizer == "byte" else 512))
  msg = str(e.value)
  assert "\n" not in msg and "2 of 3 .txt files are not text" in msg, msg
  assert "noise.txt" in msg and "more_noise.txt" in msg and "good.txt" not in msg
  assert "convert them to UTF-8" in msg
  assert not (tfds / "pergrad_text").exists()  # nothing prepared, no tokenizer trained


def test_random_bytes_cli_is_one_line(tmp_path):
  folder = tmp_path / "corpus"
  folder.mkdir()
  for i in range(2):
    (folder / f"r{i}.txt").write_bytes(os.urandom(5000))
  out = run_cli(["data=txt_folder", f"data.path={folder}", "data.tokenizer=byte",
                 f"data.tfds_dir={tmp_path / 'tfds'}", f"hydra.run.dir={tmp_path / 'h'}"])
  assert out.returncode == 1
  assert "are not text (r0.txt: " in _one_line(out.stderr)


# --------------------------------------------------------------------------- divergence


def test_eval_divergence_rule():
  ln_v = math.log(256)
  assert eval_diverged(math.nan, {0: 6.0}, ln_v) and eval_diverged(math.inf, {}, ln_v)
  assert eval_diverged(5.6, {0: 6.0, 5: 4.3}, ln_v)  # above ln V after being below it
  assert eval_diverged(6.5, {0: 6.0}, ln_v)  # above ln V and above the untrained loss
  assert not eval_diverged(5.9, {0: 6.0}, ln_v)  # still falling towards ln V
  assert not eval_diverged(4.0, {0: 6.0, 5: 3.0}, ln_v)


def test_diverged_eval_is_not_kept_as_good_checkpoint(tmp_path, tiny_overrides):
  """lr 1e3 (reached through a long warmup, so that some checkpoints are good first):
  the eval that diverges stops the run, its step is not saved, and the message names the
  last good checkpoint, which evaluates finite and below ln V."""
  d = tmp_path / "div"
  cfg = compose([*tiny_overrides, "optimizer.lr=1e3", "schedule.warmup_steps=20000",
                 "train.checkpoint_every=5", "train.eval_every=5", "train.steps=60"])
  plan = build_plan(cfg)
  with pytest.raises(NonFiniteLossError) as e:
    run(plan, d, echo=lambda s: None)
  msg = str(e.value)
  step = int(re.search(r"eval loss diverged at step (\d+)", msg).group(1))
  good = int(re.search(r"last good checkpoint is step (\d+)", msg).group(1))
  assert "\n" not in msg and good < step
  kept = sorted(int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())
  assert max(kept) == good and step not in kept
  summary = json.loads((d / "summary.json").read_text())
  assert summary["status"] == "diverged" and summary["diverged_step"] == step

  from pergrad.train.loop import Evaluator
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps

  data = make_data(plan.data)
  loss = Evaluator(Steps(plan, make_mesh()), data.eval_batches(plan.train.eval_batches))(
      _final_params(d, good))
  assert math.isfinite(loss) and loss < math.log(data.vocab_size)


# --------------------------------------------------------------------------- interrupts

LONG = ("train.steps=300", "train.checkpoint_every=100", "train.eval_every=150",
        "logging.log_every=1", "optimizer.lr=1e-2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_overrides):
  """The reference: the LONG run, never interrupted."""
  d = tmp_path_factory.mktemp("uninterrupted")
  summary = run(build_plan(compose([*tiny_overrides, *LONG])), d, echo=lambda s: None)
  return d, summary


def _n_train(path: Path) -> int:
  if not path.exists():
    return 0
  return sum('"split": "train"' in line for line in path.read_text().splitlines())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [
    signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.extended),
    pytest.param(signal.SIGUSR2, marks=pytest.mark.extended)],  # submitit's default
    ids=["SIGINT", "SIGTERM", "SIGUSR2"])
def test_signal_stops_with_checkpoint_and_resumes_bit_exact(sig, tmp_path, tiny_overrides,
                                                            uninterrupted, compilation_cache):
  d = tmp_path / "run"
  args = [*tiny_overrides, *LONG, f"train.out_dir={d}", f"hydra.run.dir={tmp_path / 'h'}"]
  env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONUNBUFFERED": "1",
         **compilation_cache}
  env.pop("HYDRA_FULL_ERROR", None)
  proc = subprocess.Popen([sys.executable, str(TRAIN), *args], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  t0 = time.time()
  while _n_train(d / "metrics.jsonl") < 3:
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.time() - t0 < 120
    time.sleep(0.005)
  proc.send_signal(sig)
  stdout, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 128 + sig, stderr[-3000:]
  assert "Traceback" not in stderr and "error" not in stderr, stderr[-3000:]
  said = [line for line in stdout.splitlines() if "interrupted" in line]
  assert len(said) == 1 and "re-run the same command to resume" in said[0], stdout
  assert signal.Signals(sig).name in said[0]
  summary = json.loads((d / "summary.json").read_text())
  k = summary["last_step"]
  assert summary["status"] == "interrupted" and summary["signal"] == signal.Signals(sig).name
  assert 3 <= k < 300 and k in summary["checkpoint_steps"], summary
  assert f"after step {k}:" in said[0]

  out = run_cli(args, env=compilation_cache)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"from the checkpoint of step {k}." in out.stdout
  ref, _ = uninterrupted
  _assert_trees_equal(_final_params(ref, 300), _final_params(d, 300))  # bit-exact
  got, want = read_records(d / "metrics.jsonl"), read_records(ref / "metrics.jsonl")
  _no_duplicates(got)
  assert [(r["step"], r["split"], r.get("loss")) for r in got] == \
      [(r["step"], r["split"], r.get("loss")) for r in want]
  assert json.loads((d / "summary.json").read_text())["status"] == "completed"
  # the resumed process's clock goes on from the checkpoint's training time (not from 0)
  times = [(r["step"], r["train_time_s"]) for r in got if "train_time_s" in r]
  assert any(s <= k for s, _ in times) and any(s > k for s, _ in times), times
  assert [t for _, t in times] == sorted(t for _, t in times), times


def test_checkpoint_carries_the_training_time(tmp_path):
  ckpt = Checkpoints(tmp_path / "c", keep=3)
  ckpt.save(1, {"w": np.ones(2, np.float32)}, train_time_s=12.5)
  ckpt.save(2, {"w": np.ones(2, np.float32)})  # an older checkpoint: no time recorded
  ckpt.wait()
  assert (ckpt.train_time_s(1), ckpt.train_time_s(2)) == (12.5, 0.0)
  ckpt.close()
  clock = Clock(tokens_per_example=4, elapsed_before=12.5)
  assert clock.elapsed() is None
  clock.tick(1)
  assert 12.5 <= clock.elapsed() < 13.5


def _task_pids(marker: str) -> list[int]:
  """The submitit task processes whose command line holds `marker`."""
  pids = []
  for p in Path("/proc").iterdir():
    try:
      cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError):
      continue
    if "submitit.core._submit" in cmd and marker in cmd:
      pids.append(int(p.name))
  return pids


@pytest.mark.extended
def test_submitit_preemption_checkpoints_and_requeues(tmp_path, tiny_overrides, uninterrupted,
                                                      compilation_cache):
  """hydra/launcher=local (submitit's local executor, the same job code as on SLURM): the
  pre-emption signal makes the job checkpoint, requeue itself and finish the same run."""
  sweep = tmp_path / "sweep"
  fixed = [*tiny_overrides, *LONG]
  exclude = ",".join(o.split("=")[0] for o in fixed)
  env = {**os.environ, "WANDB_MODE": "disabled", **compilation_cache}
  proc = subprocess.Popen(
      [sys.executable, "-m", "pergrad.train", "-m", "hydra/launcher=local", *fixed,
       "train.seed=0", f"hydra.sweep.dir={sweep}",
       f"hydra.job.config.override_dirname.exclude_keys=[{exclude}]"],
      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  run_dir, t0 = sweep / "train.seed=0", time.time()
  while _n_train(run_dir / "metrics.jsonl") < 3:
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.time() - t0 < 300
    time.sleep(0.01)
  pids = _task_pids(str(sweep))
  assert len(pids) == 1, pids
  os.kill(pids[0], signal.SIGUSR2)
  _, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, stderr[-3000:]
  logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.*"))
  said = re.search(r"interrupted by SIGUSR2 after step (\d+): .*requeues itself", logs)
  assert said, logs[-3000:]
  assert f"resuming {run_dir} from the checkpoint of step {said.group(1)}." in logs
  assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
  ref, _ = uninterrupted
  _assert_trees_equal(_final_params(ref, 300), _final_params(run_dir, 300))


# --------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tiny_overrides):
  d = tmp_path_factory.mktemp("short")
  _run(d, tiny_overrides)
  return d


def test_every_checkpoint_unreadable_stops_until_restart_is_asked(short_run, tmp_path,
                                                                  tiny_overrides):
  d = tmp_path / "run"
  shutil.copytree(short_run, d)
  (d / "summary.json").unlink()
  for step in (6, 12):
    for f in (d / "checkpoints" / str(step)).rglob("*"):
      if f.is_file() and f.parent.name == "d":
        f.write_bytes(b"")
  args = [*tiny_overrides, *SHORT, f"train.out_dir={d}", f"hydra.run.dir={tmp_path / 'h'}"]
  out = run_cli(args)
  assert out.returncode == 1
  msg = _one_line(out.stderr)
  assert "every checkpoint in" in msg and "train.restart=true" in msg, msg
  assert len((out.stdout + out.stderr).splitlines()) < 20, out.stdout + out.stderr
  assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["12.corrupt", "6.corrupt"]
  # Again: the damaged ones are aside now, and still no silent restart from step 0.
  with pytest.raises(OutputError, match="every checkpoint in .* is unreadable"):
    _run(d, tiny_overrides)
  summary, _ = _run(d, tiny_overrides, ("train.restart=true",))
  assert summary["status"] == "completed" and summary["resumed_from"] is None
  _assert_trees_equal(_final_params(short_run, 12), _final_params(d, 12))


# The failed write leaves callbacks on Orbax's closed asyncio loop (harmless, inside Orbax).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("raised", ["oserror", "tensorstore"])
def test_disk_full_during_a_checkpoint_is_one_line_and_keeps_the_earlier(
    short_run, tmp_path, tiny_overrides, monkeypatch, raised):
  """A full disk as Python's OSError, or as TensorStore's status (what a 600 KiB tmpfs gave:
  a raw RESOURCE_EXHAUSTED line, the temporary folder left, no summary.json): one line
  naming the path and the cause, summary.json status failed, no temporary folder, and the
  last complete checkpoint resumes bit-exactly once there is space again."""
  from orbax.checkpoint._src.path import async_path

  d = tmp_path / "run"
  write_text = async_path.write_text

  async def full(path, text):
    if "12.orbax-checkpoint-tmp" in str(path):
      if raised == "oserror":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
      raise ValueError(f'RESOURCE_EXHAUSTED: Error writing "params/0" in OCDBT database at '
                       f'local file "{path}": Failed to write 30725 bytes to file 17: No '
                       "space left on device [os_error_code='28']")
    return await write_text(path, text)

  monkeypatch.setattr(async_path, "write_text", full)
  with pytest.raises(OutputError) as e:
    _run(d, tiny_overrides)
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(
      f"cannot write the checkpoint of step 12 to {d / 'checkpoints'} (No space left on device")
  assert msg.endswith("); free disk space there or set train.out_dir to a writable folder; "
                      "the earlier checkpoints are intact (steps [6]).")
  assert sorted(p.name for p in (d / "checkpoints").iterdir()) == ["6"]  # no temporary dir
  summary = json.loads((d / "summary.json").read_text())
  assert summary["status"] == "failed" and summary["error"] == msg
  _assert_trees_equal(_final_params(short_run, 6), _final_params(d, 6))
  monkeypatch.undo()  # space again: the same command resumes from step 6
  summary, _ = _run(d, tiny_overrides)
  assert summary["status"] == "completed" and summary["resumed_from"] == 6
  _assert_trees_equal(_final_params(short_run, 12), _final_params(d, 12))


def test_unwritable_run_directory_is_one_line(tmp_path, tiny_overrides):
  blocker = tmp_path / "a_file"
  blocker.write_text("not a folder")
  with pytest.raises(OutputError, match=f"cannot write the run directory {blocker}/run"):
    _run(blocker / "run", tiny_overrides)
  out = run_cli([*tiny_overrides, f"train.out_dir={blocker / 'run'}",
                 f"hydra.run.dir={tmp_path / 'h'}"])
  assert out.returncode == 1
  msg = _one_line(out.stderr)
  assert str(blocker) in msg and "train.out_dir" in msg, msg
