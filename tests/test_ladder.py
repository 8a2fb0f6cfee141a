"""The scale ladder (`experiments.ladder`): its rungs are scale presets written from `plan` at
the same tokens per parameter, the four experiments take their budget and model from a rung,
other experiments are refused there, each claim's quantity is read from result CSVs, and the
figures, trend and README are rendered from a constructed ladder.csv."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import ladder  # noqa: E402
from experiments.runner import check_preset  # noqa: E402
from pergrad import sweep  # noqa: E402
from pergrad.analysis.runs import read_csv  # noqa: E402
from pergrad.sweep import (  # noqa: E402
  RUNG_PRESETS,
  record,
  report_md,
  scale_file,
  scale_value,
)
from pergrad.sweep.record import Inputs  # noqa: E402

RUNGS = ladder.rungs()  # {experiment: its Rung}, in launch order

CPU = REPO / "results" / "cpu"


@pytest.mark.parametrize("fam", sorted(ladder.RUNGS))
def test_rung_presets_are_written_from_the_plan_at_equal_tokens_per_parameter(fam):
  p = ladder.plan(fam)
  n = p["n_params"]
  assert n.is_monotonic_increasing and n.iloc[-1] / n.iloc[0] > 4  # a ladder, not a step
  tpp = ladder.TOKENS_PER_PARAM[fam]
  assert p["tokens_per_param"].between(tpp, tpp * 1.1).all()  # equal up to whole steps
  for row in p.to_dict("records"):  # the committed file is the one `write_presets` writes
    assert scale_file(row["preset"]).read_text() == ladder.preset_text(fam, row), row["preset"]
    assert int(scale_value(row["preset"], "train.steps")) == row["train.steps"]
  assert set(RUNG_PRESETS) >= set(p["preset"])


def test_the_experiments_take_the_rung_budget_model_and_lr(tmp_path):
  inputs = Inputs(tmp_path, "cpu_xs", dry_run=True)  # lr_exponent not run: planned lrs
  mom = record.get("moments").sweep_at("cpu_xs", inputs)
  assert mom.blocks[1].fixed == {"train.steps": 392 * 32 // 128}  # the rung's examples at B=128
  ramp = record.get("gns_ramp").sweep_at("cpu_s")
  assert ramp.base["model.d_model"] == 32 and ramp.base["scale"] == "cpu_s"
  assert ramp.blocks[0].grid["train.steps"] == [904 * 32 // 64]
  lrx = record.get("lr_exponent").sweep_at("cpu_xxs", inputs)  # no preconditioner at a rung
  assert 0.01 in lrx.blocks[3].grid["optimizer.lr"]  # B = 32: centred on the config's lr
  with pytest.raises(FileNotFoundError, match="lr_exponent"):  # Adam's lr: lr_exponent's
    record.get("gns_layers").sweep_at("cpu_xs", Inputs(tmp_path, "cpu_xs"))


def test_a_rung_refuses_other_experiments_and_unknown_presets():
  with pytest.raises(ValueError, match="rung of the scale ladder.*--preset cpu"):
    check_preset("cpu_xs", "snr")
  with pytest.raises(ValueError, match="unknown preset"):
    check_preset("cpu_xl", "moments")
  with pytest.raises(ValueError, match="--preset cpu"):  # the ladder runs every rung itself
    check_preset("cpu_xs", "ladder")
  for n in RUNGS:
    check_preset("cpu_s", n)
  assert sweep.default_results_dir("moments", "cpu_xs", Path("/s/moments/cpu_xs")) == \
      sweep.RESULTS / "cpu" / "ladder" / "xs" / "moments"
  assert "ladder" in record.experiments() and list(record.experiments())[-1] == "ladder"


def test_reproduce_refuses_a_rung_for_other_experiments_in_one_line(tmp_path, capsys):
  from test_record import _reproduce

  with pytest.raises(SystemExit) as e:
    _reproduce().main(["snr", "--preset", "cpu_xs", "--sweeps-root", str(tmp_path)])
  assert e.value.code == 2 and not any(tmp_path.iterdir())  # before anything is written
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert "rung of the scale ladder" in err and "use --preset cpu" in err


def test_quantities_read_from_the_committed_csvs(tmp_path):
  """The committed ladder.csv's points of the family's own model are what its experiments'
  committed CSVs give now, and G3's saving is the one gns_ramp's report states."""
  own = read_csv(CPU / "ladder" / ladder.LADDER_CSV)
  own = own[~own["on_ladder"].astype(bool)].set_index("experiment")["value"]
  assert set(own.index) == {"moments", "gns_layers", "lr_exponent"}
  for n in own.index:
    assert RUNGS[n].value(CPU / n) == pytest.approx(own[n], rel=1e-12), n
  saving = RUNGS["gns_ramp"].value(CPU / "gns_ramp")
  ours = report_md._json(CPU / "gns_ramp" / "report.json")["ours"]
  assert 0 < saving < 1 and f"ramp {saving:.1%}" in ours
  assert math.isnan(RUNGS["gns_ramp"].value(tmp_path))  # not run yet
  assert "snr" not in RUNGS and list(RUNGS) == ["lr_exponent", "gns_ramp", "moments",
                                                "gns_layers"]


def _points() -> pd.DataFrame:
  """C3c moves toward 1, C4 away from 0.5, G2 has one undetermined rung (trend from the other
  two), G3 two (undetermined, naming the guards)."""
  vals = {"moments": (0.3, 0.5, 0.8), "lr_exponent": (0.45, 0.3, 0.2),
          "gns_layers": (0.7, 0.8, 0.9), "gns_ramp": (0.05, 0.1, 0.12)}
  verdicts = {"gns_layers": ("partly reproduced", "undetermined: powered", "reproduced"),
              "gns_ramp": ("undetermined: bracketed", "not yet run", "reproduced")}
  return pd.DataFrame([{
      "claim": RUNGS[n].claim, "experiment": n, "rung": r, "n_params": size,
      "tokens_per_param": 20.0, "value": v, "paper": RUNGS[n].paper,
      "verdict": verdicts.get(n, ("not reproduced",) * 3)[i]}
      for n in vals for i, (r, size, v) in enumerate(zip(
          ("xxs", "xs", "s"), (18_512, 40_096, 92_480), vals[n], strict=True))])


def test_figures_trend_and_readme_rendered_from_a_constructed_ladder_csv(tmp_path):
  _points().to_csv(tmp_path / ladder.LADDER_CSV, index=False)
  paths = ladder.figures(tmp_path)
  assert sorted(p.name for p in paths) == sorted(f"ladder_{c}.png" for c in RUNGS)
  rep = ladder.report(tmp_path)
  assert rep.verdict == "2 toward, 1 away, 0 flat, 1 undetermined (of 4)"
  nan_dir = tmp_path / "nan"  # nothing measured yet: still drawn, every trend undetermined
  nan_dir.mkdir()
  _points().assign(value=float("nan")).to_csv(nan_dir / ladder.LADDER_CSV, index=False)
  assert len(ladder.figures(nan_dir)) == 4
  assert ladder.report(nan_dir).verdict.startswith("0 toward, 0 away, 0 flat, 4 undetermined")
  assert "C3c: toward" in rep.checks and "C4: away" in rep.checks
  assert "G2: toward (xs undetermined or not measured, left out)" in rep.checks
  assert "G3: undetermined: bracketed at xxs; not yet run at xs" in rep.checks
  assert "C3c 0.3→0.5→0.8 (toward)" in rep.ours
  info = {"command": "python scripts/reproduce.py ladder --preset cpu", "preset": "cpu",
          "launcher": "basic", "sweep_dir": "runs/sweeps/ladder/cpu", "commit": "abc",
          "clean": True, "wall_s": 1.0, "launch_wall_s": 60.0, "launched": 3, "skipped": 0,
          "n_runs_completed": 3, "runs_compute_s": 60.0}
  report_md.write_readme(record.get("ladder"), tmp_path, rep, info)
  text = (tmp_path / "README.md").read_text()
  assert f"**Verdict: {rep.headline}.**" in text and "ladder_moments.png" in text
  assert "undetermined: powered" in text and "cpu_xxs" in text  # per-rung verdicts, the rungs


def test_projected_cost_grows_with_the_rung_and_fits_the_budget():
  cost = ladder.projected_min("cpu", CPU)
  assert cost["minutes"].is_monotonic_increasing
  assert (cost["runs"] == 82).all() and cost["minutes"].sum() < 90  # of ~4 h in all


def test_the_family_model_is_drawn_beside_the_rungs_and_left_out_of_the_trend(tmp_path):
  """A point off the ladder (the family's own model, fewer tokens per parameter; here far
  from the paper) changes neither a trend nor the rungs' cells, and is read from the family's
  committed experiment by family_points (NaN where that experiment has no results)."""
  rungs = _points().assign(on_ladder=True)
  own = rungs[rungs["rung"] == "s"].assign(rung="cpu (own model)", n_params=664_832,
                                           tokens_per_param=1.2, value=-5.0, on_ladder=False)
  pd.concat([rungs, own]).to_csv(tmp_path / ladder.LADDER_CSV, index=False)
  assert len(ladder.figures(tmp_path)) == 4
  rep = ladder.report(tmp_path)
  assert rep.verdict == "2 toward, 1 away, 0 flat, 1 undetermined (of 4)"
  assert "C3c 0.3→0.5→0.8 (toward)" in rep.ours
  fam = ladder.family_points("cpu", tmp_path / "absent")
  assert list(fam["experiment"]) == [n for n in RUNGS if n != "gns_ramp"]
  assert not fam["on_ladder"].any() and fam["value"].isna().all()
  assert (fam["tokens_per_param"] < ladder.TOKENS_PER_PARAM["cpu"]).all()


def test_a_floor_is_as_close_past_it_as_at_it():
  """C3c's paper value is a floor (r > 1): 0.8 → 3.0 moves toward it, not away; G2's too
  (0.96 → 0.99 is flat, both past 0.95); C4's is two-sided (0.45 → 0.6 moves away)."""
  row = lambda n, r, size, v: {"experiment": n, "rung": r, "n_params": size, "value": v,
                               "paper": RUNGS[n].paper, "verdict": "reproduced"}
  pts = lambda n, a, b: pd.DataFrame([row(n, "xxs", 1, a), row(n, "s", 2, b)])
  assert ladder.trend(pts("moments", 0.8, 3.0)) == "toward"
  assert ladder.trend(pts("gns_layers", 0.96, 0.99)) == "flat"
  assert ladder.trend(pts("lr_exponent", 0.45, 0.6)) == "away"
