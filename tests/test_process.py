"""A library user's process is theirs: importing pergrad.train, and training and checkpointing
through the library, changes no exception hook, logging filter or other library's log level;
the training CLI sets them (`pergrad.train.process`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = """
import json, logging, sys, threading
def state():
  names = ("absl", "jax", "asyncio", "orbax")
  return {"hooks": [id(sys.excepthook), id(sys.unraisablehook), id(threading.excepthook)],
          "levels": [logging.getLogger(n).level for n in names],
          "filters": [len(logging.getLogger(n).filters) for n in names]}
before = state()
import pergrad.train
from pergrad.train import loop, checkpoint, step, state as st
after_import = state()
from pergrad.config import build_plan, compose
plan = build_plan(compose(["scale=ci", "train.steps=2", "train.eval_batches=0",
                           "train.checkpoint_every=1", "logging.figure=false"]))
pergrad.train.run(plan, sys.argv[1], echo=lambda s: None)
after_run = state()
from pergrad.train import process
process.quiet()
print(json.dumps([before, after_import, after_run, state()]))
"""


def test_importing_and_running_the_library_changes_no_process_wide_hook(tmp_path):
  out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "run")], cwd=REPO,
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "disabled"})
  assert out.returncode == 0, out.stderr[-3000:]
  before, after_import, after_run, cli = json.loads(out.stdout.strip().splitlines()[-1])
  assert after_import == before and after_run == before
  assert cli != before  # the entry point's own settings are seen by this probe
