"""A run never stops, or starts again, silently: divergence found from the training loss
when no eval runs (the diverged state never saved), progress that no checkpoint holds not
thrown away, and the one-line reasons of a corrupt checkpoint and of a full disk."""

from __future__ import annotations

import errno
import json
import math
import os
import shutil

import pytest
from conftest import compose

from pergrad.config import build_plan
from pergrad.train.checkpoint import OutputError
from pergrad.train.divergence import TrainLossWatch
from pergrad.train.loop import NonFiniteLossError, run
from pergrad.train.metrics import read_records

SHORT = ("train.steps=12", "train.eval_every=6", "train.checkpoint_every=6",
         "logging.log_every=1", "optimizer.lr=1e-2")  # tests/test_faults.py's


@pytest.fixture(scope="module", autouse=True)
def _cache(compilation_cache):
  return compilation_cache


def _run(tmp, overrides, extra=()):
  return run(build_plan(compose([*overrides, *SHORT, *extra])), tmp, echo=lambda _: None), None


@pytest.fixture(scope="module")
def short_run(tmp_path_factory, tiny_overrides):
  d = tmp_path_factory.mktemp("short")
  _run(d, tiny_overrides)
  return d


def test_train_loss_watch_rule():
  ln_v = math.log(256)
  watch = TrainLossWatch(ln_v, window=3)
  for k, loss in enumerate([6.0, 5.0, 3.8, 5.9, 4.0, 4.1], start=1):  # one noisy batch
    watch.add(k, loss)
    assert watch.check(k) is None, (k, loss)
  assert watch.check(6) is None  # no update since the last check
  for k in (7, 8):
    watch.add(k, 7.0)
  assert "diverged at step 8 (mean 6.033 over updates 6-8" in watch.check(8)
  nan = TrainLossWatch(ln_v)
  nan.add(1, math.nan)
  assert "diverged at step 1" in nan.check(1)


@pytest.mark.parametrize("extra,step,good", [
    # the probe: ended `completed` with train loss 292 and checkpoints saved; logged
    # at step 1 only, so the check before the checkpoint of step 6 is the one that stops it
    (("optimizer=sgd", "optimizer.lr=1e6", "logging.log_every=50"), 6, None),
    # a long warmup to lr 1e3: some checkpoints are good first
    (("optimizer.lr=1e3", "schedule.warmup_steps=20000", "train.checkpoint_every=5",
      "train.steps=60"), 19, 15),
])
def test_divergence_without_evals_stops_before_a_bad_checkpoint(tmp_path, tiny_overrides,
                                                                 extra, step, good):
  """train.eval_batches=0: the mean training loss of the last 10 updates is held to the eval
  rule at every logged step and before every checkpoint; the diverged state is not saved."""
  d = tmp_path / "div"
  with pytest.raises(NonFiniteLossError) as e:
    _run(d, tiny_overrides, ("train.eval_batches=0", *extra))
  msg = str(e.value)
  assert "\n" not in msg and f"the training loss diverged at step {step} (mean " in msg, msg
  assert ("no checkpoint was saved before it" if good is None else
          f"the last good checkpoint is step {good} in {d / 'checkpoints'}") in msg, msg
  kept = sorted(int(p.name) for p in (d / "checkpoints").iterdir() if p.name.isdigit())
  assert kept == ([] if good is None else [good - 5, good])
  summary = json.loads((d / "summary.json").read_text())
  assert summary["status"] == "diverged" and summary["diverged_step"] == step
  train = [r["loss"] for r in read_records(d / "metrics.jsonl") if r["split"] == "train"]
  assert max(train) > math.log(256)

def test_progress_without_any_checkpoint_is_not_restarted_silently(short_run, tmp_path,
                                                                   tiny_overrides):
  """Every checkpoint deleted after the run logged its steps: the same command restarted
  from step 0 and rewrote metrics.jsonl. Now one line says what was found, and nothing is
  written, until train.restart=true."""
  d = tmp_path / "run"
  shutil.copytree(short_run, d)
  shutil.rmtree(d / "checkpoints")
  (d / "summary.json").unlink()
  metrics = (d / "metrics.jsonl").read_bytes()
  before = sorted(p.name for p in d.iterdir())
  with pytest.raises(OutputError) as e:
    _run(d, tiny_overrides)
  assert str(e.value) == (
      f"{d} records progress (metrics.jsonl logs 12 training records up to step 12) but "
      f"{d / 'checkpoints'} holds no checkpoint; nothing was started. Set train.restart=true "
      "to train again from step 0 on purpose (metrics.jsonl is then rewritten), or set "
      "another train.out_dir.")
  assert (d / "metrics.jsonl").read_bytes() == metrics and sorted(
      p.name for p in d.iterdir()) == before
  summary, _ = _run(d, tiny_overrides, ("train.restart=true",))
  assert summary["status"] == "completed" and summary["resumed_from"] is None


def test_a_run_killed_before_its_first_checkpoint_starts_again(short_run, tmp_path,
                                                               tiny_overrides):
  """Metrics that stop before the first checkpoint (step 6) lose nothing a checkpoint held:
  the run starts again from step 0 without asking."""
  d = tmp_path / "run"
  d.mkdir()
  shutil.copy(short_run / "config.yaml", d)
  lines = (short_run / "metrics.jsonl").read_text().splitlines()
  (d / "metrics.jsonl").write_text("\n".join(
      ln for ln in lines if json.loads(ln)["step"] <= 3) + "\n")
  summary, _ = _run(d, tiny_overrides)
  assert summary["status"] == "completed" and summary["resumed_from"] is None
  clockless = lambda run: [{k: v for k, v in r.items() if k not in ("tokens_per_s",
                                                                     "train_time_s")}
                           for r in read_records(run / "metrics.jsonl")]
  assert clockless(d) == clockless(short_run)

def test_a_corrupt_checkpoints_reason_is_one_readable_line(tmp_path):
  """TensorStore's status for a truncated data file (as a restore raised it): the message
  carried the escaped JSON spec, cut mid-way; now the code, the file and the cause."""
  from pergrad.train.checkpoint import _reason

  step = tmp_path / "checkpoints" / "12"
  raw = ('OUT_OF_RANGE: Error opening "cast" driver: Error opening "zarr" driver: Error '
         f'reading "lr/.zarray" in OCDBT database at local file "{step}/default/": Error '
         f'reading Byte range [0, 3406) of local file "{step}/default/d/582ae12c": Requested '
         "byte range [0, 3406) is not valid for value of size 0 [tensorstore_spec[1]='{"
         '\\"base\\":{\\"driver\\":\\"zarr\\",\\"fill_missing_dat\' [source '
         "locations='tensorstore/kvstore/ocdbt/io.cc:52']\ntraceback line")
  assert _reason(ValueError(raw), step) == (
      "ValueError: OUT_OF_RANGE reading default/d/582ae12c: Requested byte range [0, 3406) "
      "is not valid for value of size 0")
  assert _reason(KeyError(), step) == "KeyError"


def test_a_full_disk_outside_a_checkpoint_names_the_run_directory(tmp_path):
  """'No space left on device' of a write that carries no path (a later run on the full
  disk) names the run directory."""
  from pergrad.train.cli import _one_line

  msg = _one_line(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), tmp_path / "run")
  assert msg == (f"No space left on device: writing in {tmp_path / 'run'}; check that path "
                 "(free disk space there, or set train.out_dir to a writable folder).")
