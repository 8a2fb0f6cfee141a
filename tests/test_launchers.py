"""Launch paths: the SLURM launcher config composes and the README's SLURM command is what
scripts/reproduce.py runs (no cluster needed); the joblib launcher runs small blocks side by
side (`launch.waves`), each run trained once."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from conftest import REPO


def _hydra_cfg(*overrides) -> dict:
  argv = [sys.executable, "-m", "pergrad.train", *overrides, "--cfg", "hydra", "--resolve"]
  out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "WANDB_MODE": "disabled"})
  assert out.returncode == 0, out.stderr[-2000:]
  return yaml.safe_load(out.stdout)["hydra"]


def test_slurm_launcher_config_composes_with_overridable_fields():
  launcher = _hydra_cfg("hydra/launcher=slurm_gpu", "hydra.launcher.partition=gpu",
                        "hydra.launcher.account=acct", "hydra.launcher.nodes=2",
                        "hydra.launcher.gpus_per_node=4",
                        "hydra.launcher.timeout_min=60")["launcher"]
  assert launcher["_target_"].endswith("SlurmLauncher")
  assert (launcher["partition"], launcher["account"], launcher["nodes"]) == ("gpu", "acct", 2)
  assert launcher["gpus_per_node"] == 4 and launcher["tasks_per_node"] == 4  # one task per GPU
  assert launcher["timeout_min"] == 60
  local = _hydra_cfg("hydra/launcher=local")["launcher"]
  assert local["_target_"].endswith("LocalLauncher")


@pytest.mark.extended  # --dry-run traces every point of the sweep at the paper's shapes (~40 s)
def test_readme_slurm_command_is_what_reproduce_runs():
  readme = (REPO / "README.md").read_text()
  cmd = re.search(r"^(python scripts/reproduce\.py sign_placement .*--launcher submitit.*)$",
                  readme, re.M)
  assert cmd, "README: no SLURM command for the sign-placement sweep"
  argv = shlex.split(cmd.group(1).replace("\\\n", " "))[2:]
  out = subprocess.run([sys.executable, "scripts/reproduce.py", *argv, "--dry-run"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "WANDB_MODE": "disabled"})
  assert out.returncode == 0, out.stderr[-2000:] + out.stdout[-2000:]
  assert "hydra/launcher=slurm_gpu" in out.stdout and "-m pergrad.train" in out.stdout


def test_small_blocks_run_side_by_side_in_waves_that_share_no_run():
  from pergrad.sweep import waves

  item = lambda *names: (None, list(names), {}, ["cmd", *names])
  a, b, c, d = item("a"), item("b"), item("c", "d", "e"), item("f")
  assert waves([a, b, c, d], 2) == [[a, b], [c], [d]]  # c fills both jobs alone
  assert waves([a, b, c, d], 1) == [[a], [b], [c], [d]]  # basic, submitit: one by one
  assert waves([a, item("a"), b], 4) == [[a], [item("a"), b]]  # never one run twice at once


def test_a_round_of_single_runs_launched_side_by_side_finishes_each_once(tmp_path):
  from test_experiments import FAKE_TRAIN, _fake_cmd
  from test_reuse import _fake_index

  from pergrad.sweep import Block, launch

  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  root = tmp_path / "root"
  blocks = [Block({"optimizer.placement": ["ema"], "optimizer.lr": [lr], "seed": [0]})
            for lr in (0.1, 0.2, 0.3)] + [Block({"optimizer.placement": ["ema"],
                                                  "optimizer.lr": [0.1, 0.4], "seed": [0]})]
  log = launch.launch_blocks(root / "s" / "ci", {"steps": 3}, blocks, train_cmd=_fake_cmd(fake),
                             launcher="joblib", n_jobs=2, index=_fake_index(root),
                             echo=lambda *_: None)
  names = [f"optimizer.lr={lr},optimizer.placement=ema,seed=0" for lr in (0.1, 0.2, 0.3, 0.4)]
  assert log.launched == names and not log.failed and len(log.commands) == 4
  for n in names:  # each trained once, although 0.1 is in two blocks, and indexed
    assert (root / "s" / "ci" / n / "launches.txt").read_text() == "x\n"
  assert len(list((root / ".runs").iterdir())) == 4
