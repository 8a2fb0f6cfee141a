"""Reports of the snr and moments experiments on constructed CSVs (their estimators are
checked against known truth in tests/test_estimators.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# --- reports of the snr and moments experiments on constructed CSVs ----------------------


def _snr_all(ema, batch, example, spread, seeds=3, steps=(10, 20, 30, 40)):
  rows = []  # seed offsets −s, 0, +s, …: std over seeds = spread (rotated per stage)
  base = spread * (np.arange(seeds) - (seeds - 1) / 2)
  for seed in range(seeds):
    off = {k: base[(seed + i) % seeds] for i, k in enumerate(("ema", "batch", "example"))}
    for step in steps:
      for stage, v in (("ema", ema), ("batch", batch), ("example", example)):
        rows.append({"run": f"train.seed={seed}", "train.seed": seed, "step": step,
                     "examples_seen": 32 * step, "stage": f"snr2_{stage}",
                     "snr2": v + off[stage]})
  return pd.DataFrame(rows)


def test_snr_report_verdicts(tmp_path):
  from experiments import snr, verdict
  cases = {  # (ema, batch, example, seed spread) -> verdict
      (4.0, 1.0, 1 / 32, 0.1): "reproduced",
      (0.5, 1.0, 1 / 32, 0.1): "not reproduced",  # the EMA lowers the SNR: flips it
      (1.05, 1.0, 1 / 32, 0.2): "partly reproduced",  # within seed noise: a tie
  }
  for (e, b, x, spread), want in cases.items():
    d = tmp_path / f"{e}-{b}"
    d.mkdir()
    _snr_all(e, b, x, spread).to_csv(d / "snr_all.csv", index=False)
    rep = snr.report(d)
    assert rep.verdict == want, (e, b, rep)
    assert verdict.RULE in rep.finding and "EMA gain" in rep.finding
  # One seed: nothing is significant.
  d = tmp_path / "one"
  d.mkdir()
  _snr_all(4.0, 1.0, 1 / 32, 0.1, seeds=1).to_csv(d / "snr_all.csv", index=False)
  assert snr.report(d).verdict == "undetermined"


def test_snr_analyze_figures_report_from_a_table(tmp_path):
  """analyze -> figures -> report on a table shaped like runs.aggregate's."""
  from experiments import snr
  rows = []
  for seed in range(3):
    for step in (5, 10, 15, 20):
      r = {"run": f"s{seed}", "train.seed": seed, "step": step, "data.batch_size": 8}
      for leaf, scale in (("all", 1.0), ("dense/kernel", 2.0), ("embed/embedding", -0.01)):
        r[f"opt/{leaf}/snr2_example"] = scale / 8
        r[f"opt/{leaf}/snr2_batch"] = scale + 0.01 * seed
        r[f"opt/{leaf}/snr2_ema"] = 3 * scale + 0.01 * seed
      rows.append(r)
  table = pd.DataFrame(rows)
  snr.analyze(table, pd.DataFrame({"run": ["s0"]}), tmp_path)
  leaf = pd.read_csv(tmp_path / "snr_per_leaf.csv")
  assert set(leaf["leaf"]) == {"dense/kernel", "embed/embedding"}
  assert len(pd.read_csv(tmp_path / "snr_all.csv")) == 3 * 4 * 3
  assert all(p.exists() for p in snr.figures(tmp_path))
  rep = snr.report(tmp_path)
  assert rep.verdict == "reproduced" and "1.726" in rep.finding  # gain √(3.01/1.01)


def _moments_all(ratio, spread, seeds=3):
  rows = []
  for seed in range(seeds):
    off = spread * (seed - (seeds - 1) / 2)  # std over seeds = spread
    for step in (10, 20, 30, 40):
      for q, v in (("snr2_batch", ratio + off), ("snr2_example", (ratio + off) / 32),
                   ("share_mu2", 0.5), ("share_var_b", 0.5), ("share_var", 16.0)):
        rows.append({"run": f"s{seed}", "train.seed": seed, "step": step,
                     "examples_seen": 32 * step, "quantity": q, "value": v})
  return pd.DataFrame(rows)


def test_moments_report_verdicts(tmp_path):
  from experiments import moments, verdict
  cases = {(3.0, 0.2): "reproduced", (0.3, 0.1): "not reproduced",  # flipped
           (1.2, 0.5): "partly reproduced"}  # within seed noise: a tie
  for (ratio, spread), want in cases.items():
    d = tmp_path / f"{ratio}"
    d.mkdir()
    _moments_all(ratio, spread).to_csv(d / "moments_all.csv", index=False)
    pd.DataFrame(columns=["run", "train.seed", "step", "examples_seen", "value", "quantity",
                          "leaf"]).to_csv(d / "moments_per_leaf.csv", index=False)
    rep = moments.report(d)
    assert rep.verdict == want, (ratio, rep)
    assert verdict.RULE in rep.finding
    assert all(p.exists() for p in moments.figures(d))
  assert moments.report(tmp_path / "nothing").verdict == "not measured"


def test_experiment_configs_match_the_modules(tmp_path):
  """Every placement at its own tuned lr with ≥ 3 seeds at cpu; β read from the config."""
  from test_record import needed_runs

  from experiments import moments, snr
  from experiments.sweep import experiment_value
  assert snr.BETA == float(experiment_value("snr", "optimizer.b1"))
  assert experiment_value("snr", "stats.track_snr")
  for preset in ("cpu", "ci"):
    inputs = needed_runs(tmp_path / preset, preset)
    for mod in (snr, moments):
      pts = [p for b in mod.EXPERIMENT.sweep_at(preset, inputs).blocks for p in b.points()]
      assert len({p["train.seed"] for p in pts}) >= (3 if preset == "cpu" else 1)
