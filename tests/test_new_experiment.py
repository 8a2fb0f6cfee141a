"""A new built-in experiment is its module, its YAML and its test: in a copy of the repository
this test adds `experiments/toy.py` and `configs/experiment/toy.yaml`, nothing else, and the
registry, the claims table and `scripts/reproduce.py` take it from there (the ci streams of
tests/conftest.py read its `stream`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

MODULE = '''
"""A toy: one ci run, its final eval loss."""

from pathlib import Path

import pandas as pd

from pergrad.sweep.record import Experiment, Report, register
from pergrad.sweep import Block, Sweep, base_for


def sweep(preset):
  return Sweep(base_for("toy", preset), (Block({"train.seed": [0]}),))


def analyze(runs, out_dir):
  runs.finals.to_csv(Path(out_dir) / "finals.csv", index=False)


def report(out_dir):
  loss = float(pd.read_csv(Path(out_dir) / "finals.csv")["final_eval_loss"].iloc[0])
  return Report(verdict="measured", ours=f"final eval loss {loss:.3f}", rule="none: a toy")


EXPERIMENT = register(Experiment(
    name="toy", title="a toy", claim="a run trains", row="T, ours: a toy row", sweep=sweep,
    analyze=analyze, figures=lambda out_dir: [], report=report, rank=99, stream=0))
'''
YAML = "# @package _global_\n# A toy.\ndefaults:\n  - override /optimizer: adam\n"
CHECK = '''
import json
from pergrad.sweep import claims
from pergrad.sweep import record
print(json.dumps({"builtin": record.builtin(), "rows": claims.claim_rows(),
                  "order": list(record.experiments())}))
'''


@pytest.fixture()
def copy(tmp_path) -> Path:
  """The repository's code and configs, with the toy's two files added."""
  ignore = shutil.ignore_patterns("__pycache__")
  for d in ("pergrad", "experiments", "configs"):
    shutil.copytree(REPO / d, tmp_path / d, ignore=ignore)
  (tmp_path / "scripts").mkdir()
  shutil.copy(REPO / "scripts" / "reproduce.py", tmp_path / "scripts")
  (tmp_path / "experiments" / "toy.py").write_text(textwrap.dedent(MODULE))
  (tmp_path / "configs" / "experiment" / "toy.yaml").write_text(YAML)
  return tmp_path


def _run(copy: Path, *args, timeout=600) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": str(copy), "WANDB_MODE": "disabled"}
  return subprocess.run([sys.executable, *args], cwd=copy, env=env, capture_output=True,
                        text=True, timeout=timeout)


def test_a_toy_module_and_yaml_are_a_built_in_experiment(copy):
  out = _run(copy, "-c", CHECK)
  assert out.returncode == 0, out.stderr[-3000:]
  got = json.loads(out.stdout)
  assert "toy" in got["builtin"] and got["order"][-1] == "toy"
  assert got["rows"]["T, ours: a toy row"] == ["toy"]


@pytest.mark.extended  # one ci training run (~20-40 s)
def test_the_toy_reproduces_end_to_end(copy):
  out = _run(copy, "scripts/reproduce.py", "toy", "--preset", "ci", "--sweeps-root",
             str(copy / "sweeps"))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  doc = json.loads((copy / "sweeps" / "toy" / "ci" / "report" / "report.json").read_text())
  assert doc["verdict"] == "measured" and doc["ours"].startswith("final eval loss")
