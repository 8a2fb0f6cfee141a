"""Claim 4 as an exponent (`experiments.lr_exponent`) on constructed finals: the plan, each
seed's lr* from the parabola through its grid, α and its interval against √ scaling, and
the bracketed and in-regime guards firing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import lr_exponent as le  # noqa: E402
from experiments import lr_search  # noqa: E402
from pergrad.analysis import calibrate  # noqa: E402
from pergrad.analysis.runs import run_dirname  # noqa: E402

SIZES = (4, 8, 16, 32, 64, 128)


def _out(tmp_path, alpha: float, *, b_simple: float = 16.0, centre_alpha: float | None = None,
         jitter: float = 0.03) -> Path:
  """finals.csv, best.csv, lr_star.csv, b_simple.csv as `analyze` writes them: final loss
  4 + 0.2·(ln lr − ln lr*(B))² (+ a seed offset), lr*(B) = 0.01·(B/32)^alpha·e^(±jitter),
  a √2 grid of 5 lrs per B centred on 0.01·(B/32)^centre_alpha (default: alpha)."""
  rows = []
  for b in SIZES:
    centre = 0.01 * (b / 32) ** (alpha if centre_alpha is None else centre_alpha)
    for s in le.SELECT:
      star = 0.01 * (b / 32) ** alpha * math.exp(jitter * (1 if (b // 4 + s) % 2 else -1))
      for i in range(-2, 3):
        lr = float(f"{centre * 2 ** (i / 2):.3g}")
        loss = 4 + 0.2 * math.log(lr / star) ** 2 + 0.001 * s
        point = {le.KEY: b, le.LR: lr, le.SEED: s}
        rows.append({"run": run_dirname(point), "status": "completed", **point,
                     "final_eval_loss": loss, "diverged": False, lr_search.WARMUP: 20.0})
  d = tmp_path / f"a{alpha}_{b_simple}_{centre_alpha}"
  d.mkdir()
  fin = pd.DataFrame(rows)
  fin.to_csv(d / "finals.csv", index=False)
  lr_search.best_lr(fin, (le.KEY,), le.LR, select_seed=le.SELECT).to_csv(d / "best.csv",
                                                                         index=False)
  le.lr_star(fin).to_csv(d / "lr_star.csv", index=False)
  pd.DataFrame({"run": ["r"], le.KEY: [32], le.LR: [0.01], "b_simple": [b_simple]}).to_csv(
      d / "b_simple.csv", index=False)
  return d


def test_plan_spans_the_batch_sizes_on_a_sqrt2_grid(tmp_path):
  from test_record import needed_runs

  sw = le.sweep("cpu", needed_runs(tmp_path, "cpu"))
  assert [b.grid[le.KEY][0] for b in sw.blocks] == [4, 8, 16, 32, 64, 128]
  for b in sw.blocks:
    lrs = b.grid[le.LR]
    assert len(lrs) == 5 and np.allclose(np.diff(np.log(lrs)), math.log(2) / 2, atol=0.01)
    assert b.fixed["train.steps"] * b.grid[le.KEY][0] == 12_800
    assert b.fixed["schedule.warmup_steps"] >= 20  # 20 steps at B = 128, more below
  assert sw.lr_search.seeds == () and len(le.SELECT) == 2


def test_vertex_recovers_the_optimum_between_grid_points():
  lrs = [0.005, 0.00707, 0.01, 0.0141, 0.02]
  star = 0.0085
  loss = [4 + 0.2 * math.log(x / star) ** 2 for x in lrs]
  assert le.vertex(lrs, loss) == pytest.approx(star, rel=1e-6)
  assert le.vertex(lrs, [4.0, 4.1, 4.2, 4.3, 4.4]) == pytest.approx(0.005)  # edge: grid point
  assert math.isnan(le.vertex(lrs, [math.inf] * 5))


@pytest.mark.parametrize(("alpha", "verdict"), [(0.5, "reproduced"),
                                                (1.0, "not reproduced")])
def test_alpha_and_its_interval_decide(tmp_path, alpha, verdict):
  d = _out(tmp_path, alpha)
  rep, f = le.report(d), le.fit(pd.read_csv(d / "lr_star.csv"))
  assert f["alpha"] == pytest.approx(alpha, abs=0.03) and f["lo95"] < alpha < f["hi95"]
  assert rep.verdict == verdict, (rep.verdict, rep.guards_text())
  assert rep.calibration["kind"] == "band" and rep.calibration["power"] >= 0.8
  assert rep.calibration["false_alarm"] <= 0.05 and all(g["ok"] for g in rep.guards)


def test_guards_fire_off_the_grid_and_out_of_regime(tmp_path):
  steep = le.report(_out(tmp_path, 1.0, centre_alpha=0.5))  # lr* leaves √-centred grids
  assert "bracketed" in steep.verdict and "B=4" in steep.guards_text()
  narrow = le.report(_out(tmp_path, 0.5, b_simple=2.0))  # every B above B_simple
  assert narrow.verdict == "undetermined: in_regime"
  assert "min B / B_simple 2" in narrow.guards_text()
  assert calibrate.calibrate("band", 0.2, 12, 0.15).power < 0.8  # a loose fit: unpowered
