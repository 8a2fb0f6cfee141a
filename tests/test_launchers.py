"""Cluster launch paths that need no cluster: the SLURM launcher config composes, and
the README's SLURM command is what scripts/reproduce.py runs."""

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
