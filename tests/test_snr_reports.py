"""Reports of the snr and moments experiments on constructed CSVs (their estimators are
checked against known truth in tests/test_estimators.py)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from conftest import as_planned

from pergrad.analysis.runs import read_csv

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


# --- reports of the snr and moments experiments on constructed CSVs ----------------------

# Two big leaves and one normalization leaf with 0.2 % of the parameters.
SIZES = {"block_0/mlp/kernel": 3000, "block_0/attn/kernel": 2000, "block_0/norm/scale": 10}
NORM = "block_0/norm/scale"


def _write_sizes(d: Path, sizes=SIZES) -> None:
  pd.DataFrame({"leaf": list(sizes), "n_params": list(sizes.values())}).to_csv(
      d / "leaf_params.csv", index=False)


def _offsets(spread, seeds):
  return spread * (np.arange(seeds) - (seeds - 1) / 2)  # std over seeds = spread


def _snr_csvs(d: Path, leaf: dict, norm: dict, spread, seeds=3, steps=(10, 20, 30, 40)):
  """snr_all.csv, snr_per_leaf.csv, leaf_params.csv: every non-norm leaf at SNR² `leaf`
  (stage -> value) plus a seed offset, the norm leaf at `norm`; the whole model is the
  norm-dominated mix 0.1 · leaf + 0.9 · norm."""
  d.mkdir()
  base = _offsets(spread, seeds)
  rows_all, rows_leaf = [], []
  for seed in range(seeds):
    off = {k: base[(seed + i) % seeds] for i, k in enumerate(("ema", "batch", "example"))}
    for step in steps:
      ids = {"run": f"train.seed={seed}", "train.seed": seed, "step": step,
             "examples_seen": 32 * step}
      for stage in ("ema", "batch", "example"):
        v = leaf[stage] + off[stage]
        rows_all.append({**ids, "stage": f"snr2_{stage}", "snr2": 0.1 * v + 0.9 * norm[stage]})
        for name in SIZES:
          rows_leaf.append({**ids, "stage": f"snr2_{stage}", "leaf": name,
                            "snr2": norm[stage] if name == NORM else v})
  pd.DataFrame(rows_all).to_csv(d / "snr_all.csv", index=False)
  pd.DataFrame(rows_leaf).to_csv(d / "snr_per_leaf.csv", index=False)
  pd.DataFrame({"run": [f"train.seed={s}" for s in range(seeds)], "warmup_steps": 20}).to_csv(
      d / "finals.csv", index=False)
  _write_sizes(d)
  return d


def test_snr_report_verdicts(tmp_path):
  from experiments import snr
  stages = lambda e, b: {"ema": e, "batch": b, "example": b / 32}
  cases = {  # (leaves' ema, batch, norm leaf's ema, batch, seed spread) -> verdict
      (4.0, 1.0, 4.0, 1.0, 0.1): "reproduced",
      (0.5, 1.0, 0.5, 1.0, 0.1): "not reproduced",  # the EMA lowers the SNR: flips it
      # within seed noise: a tie, at a noise where the pair rule has no power for the effect
      (1.05, 1.0, 1.05, 1.0, 0.2): "undetermined: not separable",
      # The norm leaf dominates the whole model (ema > batch there), the parameters say
      # otherwise: the verdict follows the parameter-weighted view without the norm layers.
      (0.5, 1.0, 40.0, 1.0, 0.1): "not reproduced",
  }
  for k, ((e, b, ne, nb, spread), want) in enumerate(cases.items()):
    d = _snr_csvs(tmp_path / str(k), stages(e, b), stages(ne, nb), spread)
    rep = snr.report(as_planned(d))
    assert rep.verdict.startswith(want), (k, rep.finding)
    assert rep.rule == snr.RULE and "EMA gain" in rep.finding
    assert "ema:batch" not in rep.finding and "batch:example" not in rep.finding
    assert "Sign agreement with E g: not logged" in rep.finding
  # One seed: nothing is significant.
  d = _snr_csvs(tmp_path / "one", stages(4.0, 1.0), stages(4.0, 1.0), 0.1, seeds=1)
  assert snr.report(as_planned(d)).verdict == "undetermined: not separable (ema vs batch)"
  # Without the parameter counts: not measured, re-run (the whole model still reported).
  (d / "leaf_params.csv").unlink()
  rep = snr.report(as_planned(d))
  assert rep.verdict == "not measured" and "re-run" in rep.finding and rep.rule


def _sign_columns(leaf_counts: dict, steps, prefix="sign") -> dict:
  """<prefix>/<leaf>/<field> columns: leaf -> (coords, agree_all, selected, agree, progress,
  mu2) per logged step, and <prefix>/total/ their sums."""
  from pergrad.analysis.leafwise import FIELDS
  cols = {}
  total = np.zeros(len(FIELDS))
  for leaf, c in leaf_counts.items():
    total = total + np.asarray(c, float)
    cols.update({f"{prefix}/{leaf}/{f}": c[i] for i, f in enumerate(FIELDS)})
  cols.update({f"{prefix}/total/{f}": total[i] for i, f in enumerate(FIELDS)})
  return cols


# The stage directions' counts (stats.sign_agreement with 'sign' and track_snr): per prefix
# sign[_lag]_<stage>, a factor on the dense leaf's agree and progress (of the update's).
STAGE_SCALE = {"sign_ema": 0.5, "sign_batch": 0.25, "sign_example": 0.2,
               "sign_lag": 1.05, "sign_lag_ema": 1.1, "sign_lag_batch": 0.4,
               "sign_lag_example": 0.3}


def _stage_columns(counts: dict, step) -> dict:
  out = {}
  for pre, f in STAGE_SCALE.items():
    c = dict(counts, **{"dense/kernel": (1000, 700, 400, 360 * f, 30.0 * f, 4.0)})
    out.update(_sign_columns(c, step, pre))
  return out


def test_snr_analyze_figures_report_from_a_table(tmp_path):
  """analyze -> figures -> report on a table shaped like runs.aggregate's, with the sign
  counts the train loop logs (which also give the leaves' parameter counts)."""
  from experiments import snr
  from pergrad.analysis import leafwise
  from pergrad.sweep.record import Runs
  leaves = {"dense/kernel": (1.0, 1000), "embed/embedding": (-0.01, 500),
            "norm/scale": (50.0, 4)}
  # per step: coords, agree_all, selected, agree, progress, mu2
  counts = {"dense/kernel": (1000, 700, 400, 360, 30.0, 4.0),
            "embed/embedding": (500, 260, 100, 60, 2.0, 1.0),
            "norm/scale": (4, 4, 4, 4, 8.0, 16.0)}
  rows = []
  for seed in range(3):
    for step in (5, 10, 15, 20):
      r = {"run": f"s{seed}", "train.seed": seed, "step": step, "data.batch_size": 8}
      for leaf, (scale, _) in (("all", (1.0, 0)), *leaves.items()):
        r[f"opt/{leaf}/snr2_example"] = scale / 8
        r[f"opt/{leaf}/snr2_batch"] = scale + 0.01 * seed
        r[f"opt/{leaf}/snr2_ema"] = 3 * scale + 0.01 * seed
      rows.append({**r, **_sign_columns(counts, step), **_stage_columns(counts, step)})
  table = pd.DataFrame(rows)
  (tmp_path / "s0" / ".hydra").mkdir(parents=True)  # the run's warmup, as Hydra records it
  (tmp_path / "s0" / ".hydra" / "config.yaml").write_text("schedule:\n  warmup_steps: 20\n")
  snr.analyze(Runs(tmp_path, table, pd.DataFrame({"run": ["s0"]})), tmp_path)
  leaf = read_csv(tmp_path / "snr_per_leaf.csv")
  assert set(leaf["leaf"]) == set(leaves)
  assert len(read_csv(tmp_path / "snr_all.csv")) == 3 * 4 * 3
  sizes = read_csv(tmp_path / "leaf_params.csv").set_index("leaf")["n_params"]
  assert sizes.to_dict() == {"dense/kernel": 1000, "embed/embedding": 500, "norm/scale": 4}
  assert all(p.exists() for p in snr.figures(tmp_path))
  rep = snr.report(as_planned(tmp_path))
  assert rep.verdict == "reproduced" and "1.726" in rep.finding  # gain √(3.01/1.01)
  assert rep.rule == snr.RULE
  # Pooled over the second half (steps 15, 20) and over seeds the ratios are the per-step
  # ones: total agreement (360+60+4)/(400+100+4), alignment 40/√(1504·21); without the norm
  # leaf 420/500 and 32/√(1500·5).
  signs = read_csv(tmp_path / snr.SIGN_CSV)
  assert {(d, t) for d, t in zip(signs["direction"], signs["target"], strict=True)} == {
      (d, t) for d in ("update", "ema", "batch", "example") for t in ("current", "lagged")}
  own = signs[(signs["direction"] == "update") & (signs["target"] == "current")]
  pooled = leafwise.sign_pooled(own, ["train.seed"])
  tot = pooled[pooled["leaf"] == "total"].iloc[0]
  rest = pooled[pooled["leaf"] == leafwise.NO_NORM].iloc[0]
  assert tot["coords"] == 2 * 1504
  np.testing.assert_allclose([tot["agree"], tot["alignment"], tot["resolved"]],
                             [424 / 504, 40 / np.sqrt(1504 * 21), 504 / 1504])
  np.testing.assert_allclose([rest["agree"], rest["alignment"], rest["agree_raw"]],
                             [420 / 500, 32 / np.sqrt(1500 * 5), 960 / 1500])
  one_leaf = own.assign(leaf="block_0/mlp/kernel")  # rows, but no pool's: nothing pooled
  assert len(one_leaf) and leafwise.sign_pooled(one_leaf, ["train.seed"]).empty
  assert "Sign agreement with E g (held-out" in rep.finding
  assert f"agreement {424 / 504:.3f}" in rep.finding
  # Why SignEMA wins: every stage against both targets, no-norm leaves: agreement
  # (360 f + 60) / 500, alignment (30 f + 2) / √(1500 · 5); m's alignment over ḡ's.
  why = next(c for c in rep.checks if c.startswith("Why SignEMA wins"))
  pair = lambda f: f"{(360 * f + 60) / 500:.3f} / {(30 * f + 2) / np.sqrt(7500):.3f}"
  assert f"current E g: ema {pair(0.5)}, batch {pair(0.25)}, example {pair(0.2)}" in why
  assert f"lagged E g: ema {pair(1.1)}, batch {pair(0.4)}, example {pair(0.3)}" in why
  assert f"current E g is {(30 * 0.5 + 2) / (30 * 0.25 + 2):.3f} times" in why
  assert f"lagged E g is {(30 * 1.1 + 2) / (30 * 0.4 + 2):.3f} times" in why
  assert "Sign agreement of each direction" in rep.numbers_md


def test_sign_counts_summary_edges():
  from pergrad.analysis import leafwise
  df = pd.DataFrame({"coords": [10.0, 10.0], "agree_all": [5.0, 6.0], "selected": [0.0, 2.0],
                     "agree": [0.0, 2.0], "progress": [1.0, 1.0], "mu2": [-1.0, 0.1]})
  s = leafwise.sign_summary(df)
  assert np.isnan(s["agree"][0]) and np.isnan(s["alignment"][0])  # none resolved; mu2 <= 0
  np.testing.assert_allclose(s["alignment"][1], 1 / np.sqrt(10 * 0.1))


def _moments_csvs(d: Path, leaf_ratio, norm_ratio, spread, seeds=3, n=32, late=None,
                  sizes=(None,), warmup=20):
  """moments_all.csv, moments_per_leaf.csv, leaf_params.csv: every non-norm leaf with
  μ̂²/(σ̂²/n) = leaf_ratio (`late` in the second half, if given; + a seed offset), the norm
  leaf at norm_ratio with a 1000× larger σ̂² per coordinate (so it dominates the whole-model
  sums); runs at each batch size of `sizes` (None: the scale's, B NaN)."""
  d.mkdir()
  rows_all, rows_leaf = [], []
  for (seed, off), b in itertools.product(enumerate(_offsets(spread, seeds)), sizes):
    for step in (10, 20, 30, 40):
      ids = {"run": f"s{seed}b{b}", "train.seed": seed, "step": step, "examples_seen": 32 * step,
             "B": np.nan if b is None else b}
      num = den = 0.0
      ratio = leaf_ratio if late is None or step <= 20 else late
      for leaf, size in SIZES.items():
        r, var = (norm_ratio, 1000.0) if leaf == NORM else (ratio + off, 1.0)
        mu2 = r * var / n
        num, den = num + mu2 * size, den + var * size / n
        rows_leaf += [{**ids, "value": mu2, "quantity": "mu2_mean", "leaf": leaf},
                      {**ids, "value": var, "quantity": "var_mean", "leaf": leaf},
                      {**ids, "value": r, "quantity": "snr2_batch", "leaf": leaf}]
      for q, v in (("snr2_batch", num / den), ("snr2_example", num / den / n),
                   ("share_mu2", 0.5), ("share_var_b", 0.5), ("share_var", 16.0)):
        rows_all.append({**ids, "quantity": q, "value": v})
  pd.DataFrame(rows_all).to_csv(d / "moments_all.csv", index=False)
  pd.DataFrame(rows_leaf).to_csv(d / "moments_per_leaf.csv", index=False)
  pd.DataFrame([{"run": f"s{s}b{b}", "data.batch_size": b, "warmup_steps": warmup}
                for s in range(seeds) for b in sizes]).to_csv(d / "finals.csv", index=False)
  _write_sizes(d)
  return d


def test_moments_judges_both_halves_at_both_batch_sizes(tmp_path):
  from experiments import moments
  # μ² dominates early, σ²/B late (r 3 -> 0.3) in every leaf but the norm layer (r 3, which
  # dominates the sums): both halves are judged, so not reproduced, and every cell (2 windows
  # × 2 B × with/without norm) is in the table; only the second half without norm loses
  d = _moments_csvs(tmp_path / "flip", 3.0, 3.0, 0.1, late=0.3, sizes=(None, 128))
  rep = moments.report(as_planned(d))
  assert rep.verdict == "not reproduced", rep.finding
  assert rep.ours.count(": win") == 6 and rep.ours.count(": loss") == 2
  assert "(second half, B=128, no norm): loss" in rep.ours
  assert len(rep.calibrations) == 8 and "| second | 128 | no norm | 0.300 |" in rep.numbers_md
  assert "| first | ref | all leaves | 3.000 |" in rep.numbers_md
  same = moments.report(as_planned(_moments_csvs(tmp_path / "same", 3.0, 3.0, 0.1,
                                                 sizes=(None, 128))))
  assert same.verdict == "reproduced" and len(same.calibrations) == 8
  cold = moments.report(as_planned(_moments_csvs(tmp_path / "cold", 3.0, 3.0, 0.1, warmup=5)))
  assert cold.verdict == "undetermined: warm" and "B=ref warms up 5 steps" in cold.guards_text()


def test_moments_report_verdicts(tmp_path):
  from experiments import moments
  cases = {(3.0, 3.0, 0.2): "reproduced", (0.3, 0.3, 0.1): "not reproduced",  # flipped
           (1.2, 1.2, 0.5): "undetermined: not separable",  # within seed noise
           # The norm leaf's μ² makes the whole-model ratio > 1; the parameters' is 0.3.
           (0.3, 20.0, 0.1): "not reproduced"}
  for k, ((leaf, norm, spread), want) in enumerate(cases.items()):
    d = _moments_csvs(tmp_path / str(k), leaf, norm, spread)
    rep = moments.report(as_planned(d))
    assert rep.verdict.startswith(want), (k, rep.finding)
    assert rep.rule == moments.RULE and "Rule:" not in rep.finding
    assert all(p.exists() for p in moments.figures(d))
  whole = read_csv(d / "moments_all.csv").query("quantity == 'snr2_batch'")["value"]
  assert whole.min() > 1  # the norm-dominated ratio of sums the rule does not use
  views = moments.leaf_views(d)
  np.testing.assert_allclose(views["weighted_median_no_norm"], 0.3 + _offsets(0.1, 3))
  np.testing.assert_allclose(views["norm_share_params"], 10 / 5010)
  assert moments.report(as_planned(tmp_path / "nothing")).verdict == "not measured"
  (d / "leaf_params.csv").unlink()
  rep = moments.report(as_planned(d))
  assert rep.verdict == "not measured" and "re-run" in rep.finding


def test_reports_with_a_rule_lose_the_old_rule_mark(tmp_path):
  """The claims table marks a report.json without a commit or a rule; snr and moments
  state a rule."""
  import json

  from experiments import moments, snr
  from pergrad.sweep import report_md
  from pergrad.sweep.record import Report
  for name, mod in (("snr", snr), ("moments", moments)):
    rep = mod.report(as_planned(tmp_path / "missing"))
    assert rep.rule
    (tmp_path / name).mkdir()
    (tmp_path / name / "report.json").write_text(
        json.dumps(rep.to_json({"commit": "abc1234", "clean": True})))
  table = report_md.claims_table(tmp_path)
  assert report_md.NO_RULE not in table and report_md.STALE not in table
  assert report_md.stale_mark({"verdict": "x", "rule": "r"}) == report_md.STALE
  assert report_md.stale_mark({"verdict": "x", "commit": "abc"}) == report_md.NO_RULE
  from experiments import snr

  doc = {"verdict": "x", "commit": "abc", "rule": snr.RULE, "guards": []}
  assert report_md.stale_mark(doc, "snr") == ""
  no_guards = {k: v for k, v in doc.items() if k != "guards"}  # written before the guards
  assert report_md.stale_mark(no_guards, "snr") == report_md.NO_GUARDS
  assert report_md.stale_mark({**doc, "rule": "an older rule"}, "snr") == report_md.OLD_RULE
  assert Report.from_json({"verdict": "x"}).rule == ""


def test_experiment_configs_match_the_modules(tmp_path):
  """Every placement at its own tuned lr with ≥ 3 seeds at cpu; β read from the config."""
  from test_record import needed_runs

  from experiments import moments, snr
  from pergrad.sweep import experiment_value
  assert snr.BETA == float(experiment_value("snr", "optimizer.b1"))
  assert experiment_value("snr", "stats.track_snr")
  for preset in ("cpu", "ci"):
    inputs = needed_runs(tmp_path / preset, preset)
    for mod in (snr, moments):
      pts = [p for b in mod.EXPERIMENT.sweep_at(preset, inputs).blocks for p in b.points()]
      assert len({p["train.seed"] for p in pts}) >= (3 if preset == "cpu" else 1)


def test_leaf_sizes_from_the_sweeps_overrides():
  """The runner's base overrides give every leaf's parameter count (shapes only); at the
  cpu scale the normalization layers hold 0.19 % of the parameters."""
  from pergrad.analysis import leafwise
  from pergrad.analysis.leafwise import is_norm_leaf
  table = pd.DataFrame({"run": ["r"], "step": [1]})
  assert leafwise.sizes_from_table(table) is None
  table.attrs["overrides"] = ["experiment=moments", "scale=cpu", "stats.log_every=10"]
  sizes = leafwise.sizes_from_table(table)
  assert sum(sizes.values()) == 664_832 and sizes["block_0/attn/query/kernel"] == 128 * 128
  norm = sum(v for k, v in sizes.items() if is_norm_leaf(k))
  assert round(100 * norm / sum(sizes.values()), 2) == 0.19


def test_moments_with_a_run_not_finished_is_not_measured(tmp_path):
  """A run stopped part-way logged the first steps of its schedule only: its "second half" is
  not its schedule's, so nothing is judged until it finishes."""
  from experiments import moments

  d = _moments_csvs(tmp_path / "cut", 3.0, 3.0, 0.1)
  fin = read_csv(d / "finals.csv").assign(status=["completed", "partial", "diverged"])
  fin.to_csv(d / "finals.csv", index=False)
  rep = moments.report(as_planned(d))
  assert rep.verdict == "not measured" and "runs not finished: ['s1bNone']" in rep.ours
  fin.assign(status="completed").to_csv(d / "finals.csv", index=False)
  assert moments.report(as_planned(d)).verdict == "reproduced"
