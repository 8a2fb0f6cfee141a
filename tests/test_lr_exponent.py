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
from conftest import as_planned

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import lr_exponent as le  # noqa: E402
from pergrad.analysis import calibrate  # noqa: E402
from pergrad.analysis.runs import read_csv, run_dirname  # noqa: E402
from pergrad.sweep import WARMUP, best_lr, follow_up_blocks  # noqa: E402

SIZES = (4, 8, 16, 32, 64, 128)


def _out(tmp_path, alpha: float, *, b_simple: float = 16.0, centre_alpha: float | None = None,
         jitter: float = 0.03) -> Path:
  """finals.csv, best.csv, lr_star.csv, b_simple.csv as `analyze` writes them: final loss
  4 + 0.2·(ln lr − ln lr*(B))² (+ a seed offset), lr*(B) = 0.01·(B/32)^alpha·e^(±jitter ±
  jitter/2) (a deviation shared by B's seeds, alternating over B, and one per seed), a √2 grid
  of 5 lrs per B centred on 0.01·(B/32)^centre_alpha (default: alpha)."""
  rows = []
  for i, b in enumerate(SIZES):
    centre = 0.01 * (b / 32) ** (alpha if centre_alpha is None else centre_alpha)
    for s in le.SELECT:
      star = 0.01 * (b / 32) ** alpha * math.exp(jitter * ((-1) ** i + (-1) ** s / 2))
      for i in range(-2, 3):
        lr = float(f"{centre * 2 ** (i / 2):.3g}")
        loss = 4 + 0.2 * math.log(lr / star) ** 2 + 0.001 * s
        point = {le.KEY: b, le.LR: lr, le.SEED: s}
        rows.append({"run": run_dirname(point), "status": "completed", **point,
                     "final_eval_loss": loss, "diverged": False, WARMUP: 20.0})
  d = tmp_path / f"a{alpha}_{b_simple}_{centre_alpha}"
  d.mkdir()
  fin = pd.DataFrame(rows)
  fin.to_csv(d / "finals.csv", index=False)
  best_lr(fin, (le.KEY,), le.LR, select_seed=le.SELECT).to_csv(d / "best.csv",
                                                                         index=False)
  le.lr_star(fin).to_csv(d / "lr_star.csv", index=False)
  pd.DataFrame({"run": ["r", "far"], le.KEY: [32, 128], le.LR: [0.01, 0.02], le.SEED: [0, 0],
                "b_simple": [b_simple, 1e4], "at_ref": [True, False]}).to_csv(
      d / "b_simple.csv", index=False)  # the regime reads B_ref's run at lr* alone
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
  rep, f = le.report(as_planned(d)), le.fit(read_csv(d / "lr_star.csv"))
  assert f["alpha"] == pytest.approx(alpha, abs=0.03) and f["lo95"] < alpha < f["hi95"]
  assert rep.verdict == verdict, (rep.verdict, rep.guards_text())
  assert rep.calibration["kind"] == "band" and rep.calibration["power"] >= 0.8
  assert rep.calibration["false_alarm"] <= 0.05 and all(g["ok"] for g in rep.guards)


def test_guards_fire_off_the_grid_and_out_of_regime(tmp_path):
  steep = le.report(as_planned(_out(tmp_path, 1.0, centre_alpha=0.5)))  # lr* leaves √-centred grids
  assert "bracketed" in steep.verdict and "B=4" in steep.guards_text()
  narrow = le.report(as_planned(_out(tmp_path, 0.5, b_simple=2.0)))  # every B above B_simple
  assert narrow.verdict == "undetermined: in_regime"
  assert "min B / B_simple 2" in narrow.guards_text()
  assert calibrate.calibrate("band", 0.2, 12, 0.15).power < 0.8  # a loose fit: unpowered


def test_each_seeds_lr_star_is_guarded_and_read_from_finished_runs(tmp_path):
  """The fit reads each seed's lr*, so the guards check each: one seed's best lr at its
  grid's edge (the seeds' mean inside it) fires `bracketed`; a seed diverged one lr above the
  other seed's lr* fires `stable`; an interrupted run's last eval is no final loss."""
  d = _out(tmp_path, 0.5)
  fin = read_csv(d / "finals.csv")
  b16 = fin[le.KEY] == 16
  lrs = sorted(fin.loc[b16, le.LR].unique())
  s0, s1 = b16 & (fin[le.SEED] == 0), b16 & (fin[le.SEED] == 1)
  edge = fin.copy()  # seed 0 best at the lowest lr, seed 1 at the middle: the mean inside
  edge.loc[s0, "final_eval_loss"] = [4.00, 4.05, 4.10, 4.20, 4.30]
  edge.loc[s1, "final_eval_loss"] = [4.50, 4.10, 4.00, 4.10, 4.30]
  star = le.lr_star(edge)
  bracket, stable = le.star_guards(star, edge)
  assert not bracket.ok and "B=16 seed 0's lr" in bracket.why and stable.ok
  div = fin.copy()  # seed 1 diverges at the 4th lr; seed 0's lr* lies between the 3rd and 4th
  div.loc[s1 & (fin[le.LR] == lrs[3]), "diverged"] = True
  div.loc[s0, "final_eval_loss"] = [4.30, 4.10, 4.01, 4.00, 4.30]
  bracket, stable = le.star_guards(le.lr_star(div), div)
  assert bracket.ok and not stable.ok and "B=16 seed 0" in stable.why
  cut = fin.copy()  # seed 1's 2nd lr interrupted part-way, its last eval low
  cut.loc[s1 & (fin[le.LR] == lrs[1]), ["status", "final_eval_loss"]] = ["partial", 3.0]
  assert le.lr_star(cut).equals(le.lr_star(cut[cut["status"] == "completed"]))


def test_the_regime_reads_b_refs_runs_at_lr_star_only(tmp_path):
  d = _out(tmp_path, 0.5)  # B_ref's run measures 16; another B's run 1e4, not read
  assert le.regime(d).ok and "min B / B_simple 0.25" in le.regime(d).why
  bs = read_csv(d / "b_simple.csv").assign(at_ref=False)
  bs.to_csv(d / "b_simple.csv", index=False)  # none at B_ref's lr*: not measured
  assert not le.regime(d).ok and "not measured" in le.regime(d).why
  assert le.reference_batch_size(["experiment=lr_exponent", "scale=cpu"]) == 32
  assert le.reference_batch_size(["experiment=lr_exponent"]) is None


def test_the_interval_keeps_its_coverage_when_a_bs_seeds_share_a_deviation():
  """lr* = 0.01·(B/32)^α·e^(u_B + e_Bs), u_B ~ N(0, 0.1²) shared by B's two seeds (its grid
  and examples), e_Bs ~ N(0, 0.03²): the 90% interval of `fit` covers α in 90 % of draws
  (a fit over every (B, seed) as independent points covered it in 71 %), and the band rule
  reads "reproduced" at α on the band's edge at most its 5 % false-alarm rate."""
  rng = np.random.default_rng(0)
  n, cover, false = 1000, 0, 0
  x = np.log(np.repeat(np.array(SIZES, float), 2) / 32)
  for alpha in (0.5, le.ALPHA.value + le.MARGIN.value):
    for _ in range(n):
      u = np.repeat(rng.normal(0, 0.1, len(SIZES)), 2)
      y = np.log(0.01) + alpha * x + u + rng.normal(0, 0.03, len(x))
      f = le.fit(pd.DataFrame({le.KEY: np.exp(x) * 32, le.SEED: [0, 1] * len(SIZES),
                               "lr_star": np.exp(y)}))
      if alpha == 0.5:
        cover += f["lo90"] <= alpha <= f["hi90"]
      else:
        false += le.judge(f) == "reproduced"
  se = math.sqrt(0.1 * 0.9 / n)
  assert abs(cover / n - 0.90) < 3 * se, cover / n
  assert false / n <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / n), false / n


def test_a_seed_whose_best_lr_is_at_its_grid_edge_extends_the_grid(tmp_path):
  """Seed 0's best lr at B = 16 is the grid's lowest while the seeds' mean is inside: the
  search extends that B's grid below (`LrSearch.each_seed`), as it would for the mean."""
  from test_record import needed_runs

  sw = le.sweep("cpu", needed_runs(tmp_path, "cpu"))
  rows = []
  for b in sw.blocks:
    for p in b.points():
      lrs = sorted(b.grid[le.LR])
      k = lrs.index(p[le.LR])
      own = ([4.00, 4.05, 4.10, 4.20, 4.30] if p[le.SEED] == 0 else [4.5, 4.1, 4.0, 4.1, 4.3]
             ) if p[le.KEY] == 16 else [4.3, 4.1, 4.0, 4.1, 4.3]
      rows.append({**p, "run": run_dirname(p), "status": "completed",
                   "final_eval_loss": own[k], "diverged": False})
  fin = pd.DataFrame(rows)
  blocks, kind = follow_up_blocks(sw, fin)
  low = min(next(b for b in sw.blocks if b.grid[le.KEY] == [16]).grid[le.LR])
  assert kind == "extend" and [b.grid[le.KEY] for b in blocks] == [[16]]
  assert blocks[0].grid[le.LR] == [float(f"{low / math.sqrt(2):.3g}")]
  mean_only = best_lr(fin, (le.KEY,), le.LR, select_seed=le.SELECT)
  assert not mean_only["at_edge"].any()  # the seeds' mean alone would not have extended it


def test_at_ref_marks_b_refs_runs_only(tmp_path):
  """A run at another B that shares a B_ref run's (seed, lr) is not B_ref's: the regime's
  B_simple reads B_ref's runs alone."""
  from pergrad.sweep.record import Runs

  rows = []
  for b, lr, s in ((32, 0.01, 0), (32, 0.014, 0), (64, 0.01, 0), (16, 0.01, 0)):
    for step in (1, 2, 3, 4):
      rows.append({"run": f"b{b}lr{lr}s{s}", le.KEY: b, le.LR: lr, le.SEED: s, "step": step,
                   "status": "completed", le.B_SIMPLE: float(b)})
  table = pd.DataFrame(rows)
  table.attrs["overrides"] = ["experiment=lr_exponent", "scale=cpu"]  # B_ref 32
  fin = pd.DataFrame([{"run": f"b{b}lr{lr}s0", le.KEY: b, le.LR: lr, le.SEED: 0,
                       "status": "completed", "final_eval_loss": 4.0 + abs(lr - 0.01),
                       "diverged": False, "final_step": 4}
                      for b, lr in ((32, 0.01), (32, 0.014), (64, 0.01), (16, 0.01))])
  le.analyze(Runs(tmp_path, table, fin), tmp_path)
  bs = read_csv(tmp_path / "b_simple.csv").set_index("run")
  assert bs["at_ref"].to_dict() == {"b16lr0.01s0": False, "b32lr0.01s0": True,
                                    "b32lr0.014s0": False, "b64lr0.01s0": False}


def test_extension_blocks_train_on_the_extended_blocks_budget(tmp_path):
  """The block that grows B's lr grid (and every follow-up of the group) inherits every
  `fixed=` setting of B's first-stage block: its steps, warmup, eval and log cadence."""
  from test_record import needed_runs

  sw = le.sweep("cpu", needed_runs(tmp_path, "cpu"))
  rows = []
  for b in sw.blocks:
    for p in b.points():
      lrs = sorted(b.grid[le.LR])
      own = [4.0, 4.1, 4.2, 4.3, 4.4] if p[le.KEY] in (4, 128) else [4.3, 4.1, 4.0, 4.1, 4.3]
      rows.append({**p, "run": run_dirname(p), "status": "completed",
                   "final_eval_loss": own[lrs.index(p[le.LR])], "diverged": False})
  blocks, kind = follow_up_blocks(sw, pd.DataFrame(rows))
  assert kind == "extend" and sorted(b.grid[le.KEY][0] for b in blocks) == [4, 128]
  for bl in blocks:
    first = next(f for f in sw.blocks if f.grid[le.KEY] == bl.grid[le.KEY])
    assert bl.fixed == first.fixed and bl.fixed["train.steps"] == 12800 // bl.grid[le.KEY][0]
