"""What a newcomer sees is true: the progress bar ends on the latest eval, and the figure is
titled with the run's name and config (JAX's INFO lines and Hydra's folders:
tests/test_run_dir.py; --help's values: tests/test_config.py)."""

from __future__ import annotations

import re

import pytest
from conftest import compose

from pergrad.config import build_plan
from pergrad.train.figure import title
from pergrad.train.loop import run


@pytest.fixture(scope="module", autouse=True)
def _cache(compilation_cache):
  return compilation_cache


def test_progress_bar_ends_on_the_latest_eval_and_figure_names_the_run(tmp_path, capsys,
                                                                       tiny_overrides):
  """The bar showed the step-0 eval=7.346 at 100 %; curves.png was titled with the folder's
  time ("04-27-09")."""
  d = tmp_path / "04-27-09"
  summary = run(build_plan(compose([*tiny_overrides, "logging.progress=true", "name=probe",
                                    "train.steps=4", "train.eval_every=4",
                                    "logging.log_every=2", "optimizer.lr=1e-2"])), d,
                echo=lambda _: None)
  bar = capsys.readouterr().err
  final, first = summary["final_eval_loss"], summary["initial_eval_loss"]
  assert f"{final:.3f}" != f"{first:.3f}"
  shown = re.findall(r"eval=(\d+\.\d+)", bar)
  assert shown and shown[-1] == f"{final:.3f}", bar[-500:]
  assert title(d) == ("probe\nmodel=tiny optimizer=adamw lr=0.01 B=8 T=32 seed=0")
  assert summary["figure"] == str(d / "curves.png")
