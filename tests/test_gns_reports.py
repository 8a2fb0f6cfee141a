"""Reports of norm_cost and gns_layers on constructed data, including the cases that flip
their verdicts (gns_schedule: test_gns_schedule.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from conftest import as_planned

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import gns_layers, norm_cost  # noqa: E402
from pergrad.analysis.runs import read_csv  # noqa: E402
from pergrad.sweep.record import Runs  # noqa: E402

# --- norm_cost ---------------------------------------------------------------------------------


REPS = 11
SELF = list(np.linspace(0.99, 1.01, REPS))  # the baseline timed against itself


def _bench(ratios: dict[str, list[float]], flops: dict[str, float], base=0.1,
           self_ratios=SELF) -> dict:
  """A bench.json whose variants take base·ratio per rep, paired with the fastest plain step
  (here "contraction", whose own row pairs it with itself, `self_ratios`)."""
  rows = []
  for var, rs in {"contraction/mean": self_ratios, **ratios}.items():
    backend, stats = var.split("/")
    rows.append(dict(preset="tiny", B=8, backend=backend, stats=stats, baseline="contraction",
                     times=[base * r for r in rs], base_times=[base] * len(rs),
                     time_ratios=list(rs), flops_ratio=flops.get(var, 1.0), peak_ratio=1.0))
  return {"rows": rows}


def _norm_cost(tmp_path, name, ratios, flops, self_ratios=SELF):
  d = tmp_path / name
  d.mkdir()
  (d / "sweep").mkdir()
  (d / "sweep" / "bench.json").write_text(json.dumps(_bench(ratios, flops,
                                                            self_ratios=self_ratios)))
  norm_cost.analyze(Runs(d / "sweep"), d)
  assert norm_cost.figures(d)[0].exists()
  return norm_cost.report(d)


def test_norm_cost_verdicts(tmp_path):
  ok = {"surgery/norms": [1.0, 1.01, 1.02, 0.99, 1.0] * 2 + [1.0],
        "surgery/norms@norm": [1.0] * REPS}
  rep = _norm_cost(tmp_path, "ok", ok, {"surgery/norms": 1.003})
  assert rep.verdict == "reproduced" and rep.rule == norm_cost.RULE
  assert "self-ratio's 90% upper end" in rep.finding and rep.calibration["n"] == REPS
  assert rep.calibration["false_alarm"] <= 0.05 and rep.calibration["power"] >= 0.8
  # FLOPs over the bound: a failure whatever the time (all layers, and norm layers alone).
  rep = _norm_cost(tmp_path, "flops", ok, {"surgery/norms": 1.40})
  assert rep.verdict == "not reproduced" and "all layers: FLOPs 1.400× (fails)" in rep.finding
  rep = _norm_cost(tmp_path, "flops_norm", ok, {"surgery/norms@norm": 1.02})
  assert rep.verdict == "not reproduced"
  assert "normalization layers only: FLOPs 1.020× (fails)" in rep.finding
  # The location's interval straddles the bound: within noise, partly reproduced; the low power
  # at that spread is reported beside, not a gate.
  noisy = {**ok, "surgery/norms@norm": [0.98, 1.0, 1.005, 1.03, 1.04] * 2 + [1.0]}
  rep = _norm_cost(tmp_path, "noisy", noisy, {"surgery/norms": 1.003})
  assert rep.verdict == "partly reproduced" and "within noise" in rep.finding
  assert rep.rule_verdict == "" and rep.calibrations["normalization layers only"]["power"] < 0.8
  # Every rep above the bound: fails.
  slow = {**ok, "surgery/norms": [1.4, 1.41, 1.39, 1.42, 1.4] * 2 + [1.4]}
  rep = _norm_cost(tmp_path, "slow", slow, {"surgery/norms": 1.003})
  assert rep.verdict == "not reproduced" and "(fails; rep quartiles" in rep.finding
  # A bound not measured holds nothing: the all-layer bound alone holding is partly.
  rep = _norm_cost(tmp_path, "one", {"surgery/norms": ok["surgery/norms"]},
                   {"surgery/norms": 1.003})
  assert "normalization layers only: not measured" in rep.finding
  assert rep.verdict == "partly reproduced", rep.verdict


def test_norm_cost_is_powered_for_a_free_variant_not_a_faster_one(tmp_path):
  """The normalization layers' bound is 1.01: 'a variant 0.05 below its bound' would be one
  4 % faster than the plain step it adds work to. At the cpu run's self-ratio noise (IQR about
  0.06) the rule cannot show a truly free variant within 1.01: its power, reported beside,
  is low, and the reading stays open (within noise: partly reproduced)."""
  wide = list(1.0 + 0.045 * np.linspace(-1.5, 1.5, REPS))
  ratios = {"surgery/norms": [1.0] * REPS, "surgery/norms@norm": wide}
  rep = _norm_cost(tmp_path, "free", ratios, {"surgery/norms": 1.003}, self_ratios=wide)
  cal = rep.calibrations["normalization layers only"]
  assert abs(cal["effect"] - 0.01) < 1e-12 and cal["power"] < 0.8  # at 1.00: the claim's
  assert rep.verdict == "partly reproduced", rep.verdict
  assert rep.calibrations["all layers"]["effect"] == norm_cost.EFFECT.value  # 1.35: 0.05 below


def test_norm_cost_paired_rows_and_summary(tmp_path):
  d = tmp_path / "pairs"
  (d / "sweep").mkdir(parents=True)
  doc = _bench({"surgery/norms": [1.0, 1.1, 1.2, 1.3, 1.4]}, {"surgery/norms": 1.01})
  (d / "sweep" / "bench.json").write_text(json.dumps(doc))
  norm_cost.analyze(Runs(d / "sweep"), d)
  pairs = read_csv(d / "paired.csv")
  assert len(pairs) == REPS + 5 and set(pairs["baseline"]) == {"contraction"}
  s = norm_cost.summary(pairs).set_index("variant")
  assert s.loc["surgery/norms", "time_median"] == 1.2
  assert np.isclose(s.loc["surgery/norms", "time_q25"], 1.1)  # order statistics
  assert np.isclose(s.loc["surgery/norms", "time_q75"], 1.3)
  assert s.loc["contraction/mean", "time_median"] == 1.0  # the null pair
  # Without the norm-only variant: that bound is not measured, the other still judged.
  rep = norm_cost.report(d)
  assert "normalization layers only: not measured" in rep.finding
  assert rep.ours.startswith("all layers: ")


# --- gns_layers --------------------------------------------------------------------------------


def _gns_table(seeds, coupled: bool, steps=200, seed=0, g2_norm=0.3, s_rest=1.0):
  """Raw per-step terms, |G|² constant (norm g2_norm, the rest 1 − g2_norm): the norm
  group's S drifts up over training; the rest's S is s_rest × (2× the norm's drift
  (coupled) or an independent random walk); the total is their sum."""
  rng = np.random.default_rng(seed)
  rows = []
  for s in seeds:
    drift = np.linspace(1.0, 3.0, steps) * (1 + 0.05 * s)
    walk = 2.0 + np.cumsum(rng.normal(0, 0.2, steps)).clip(-1.5, 3)
    for k in range(steps):
      S_norm = drift[k] * (1 + 0.3 * rng.standard_normal())
      S_rest = s_rest * (2 * drift[k] if coupled else walk[k]) * (
          1 + 0.3 * rng.standard_normal())
      rows.append({"run": f"train.seed={s}", "train.seed": s, "step": k + 1,
                   "data.batch_size": 32, "gns/norm/G2": g2_norm, "gns/norm/S": S_norm,
                   "gns/total/G2": 1.0, "gns/total/S": S_norm + S_rest})
  return pd.DataFrame(rows)


def _gns_report(tmp_path, name, table):
  d = tmp_path / name
  d.mkdir()
  for r in table["run"].unique():  # each run's warmup, as Hydra records its config
    (d / r / ".hydra").mkdir(parents=True)
    (d / r / ".hydra" / "config.yaml").write_text("schedule:\n  warmup_steps: 20\n")
  gns_layers.analyze(Runs(d, table, pd.DataFrame({"run": table["run"].unique()})), d)
  assert gns_layers.figures(d)[0].exists()
  return gns_layers.report(as_planned(d)), read_csv(d / gns_layers.PART_WHOLE)


PILOT = gns_layers.SEEDS["cpu"]


def test_gns_layers_verdicts(tmp_path):
  rep, reg = _gns_report(tmp_path, "coupled", _gns_table(PILOT, coupled=True))
  assert rep.verdict == "reproduced", rep.finding
  assert rep.rule == gns_layers.RULE and "look 1 of 2 (5 seeds" in rep.ours, rep.ours
  at = reg[np.isclose(reg["alpha"], gns_layers.ALPHA)]
  # rest = 2 × norm in S, |G|² 0.7 vs 0.3: B_rest = (2 · 0.3 / 0.7) B_norm
  assert len(at) == 5 and (at["slope_complement"].between(0.7, 1.0)).all()
  np.testing.assert_allclose(at["share_g2"], 0.3, rtol=1e-5)
  assert set(reg["alpha"]) == set(gns_layers.ALPHAS)
  rep, _ = _gns_report(tmp_path, "independent", _gns_table(PILOT, coupled=False))
  # r spread over seeds: open at the first look, named "not separable" (never "powered": the
  # design's power is reported beside), the design's own seeds named as what settles it
  assert rep.verdict.startswith("undetermined: not separable"), rep.finding
  assert "up to 15" in rep.finding and rep.calibration["kind"].startswith("sequential")
  assert all(g["name"] != "powered" or g["ok"] for g in rep.guards), rep.guards
  # Part-whole: the norm group holds 90 % of |G|² and most of S, so the total tracks it
  # (r_total high) while the rest does not: the verdict reads the rest.
  rep, reg = _gns_report(tmp_path, "part_whole", _gns_table(
      PILOT, coupled=False, g2_norm=0.9, s_rest=0.05))
  at = reg[np.isclose(reg["alpha"], gns_layers.ALPHA)]
  assert (at["r_total"] > 0.9).all() and (at["r_complement"] < 0.9).all(), at
  assert gns_layers.decide(at["r_total"].tolist()) == "reproduced"  # total-on-norm would pass
  assert not rep.verdict.startswith("reproduced") and "part-whole r of the total" in rep.finding
  assert rep.calibration["n"] == 5
  # r well below the threshold on every seed, but spread: a decided "not reproduced" stands
  # whatever the power for r = 0.95 at that spread (reported beside, not a gate)
  path = tmp_path / "part_whole" / gns_layers.PART_WHOLE
  low = reg.copy()
  low.loc[np.isclose(low["alpha"], gns_layers.ALPHA), "r_complement"] = [0.1, 0.8, -0.3, 0.6, 0]
  low.to_csv(path, index=False)
  rep = gns_layers.report(as_planned(tmp_path / "part_whole"))
  assert rep.verdict == "not reproduced" and rep.calibration["power"] < 0.8, rep.calibration
  rep, _ = _gns_report(tmp_path, "one", _gns_table((0,), coupled=True))
  assert rep.verdict.startswith("undetermined: not separable (fewer seeds than the first look")
  assert gns_layers.decide([0.95, 0.97, 0.96, 0.96, 0.95]) == "reproduced"
  assert gns_layers.decide([0.5, 0.6, 0.55, 0.5, 0.6]) == "not reproduced"
  assert gns_layers.decide([0.95, 0.7, 0.99, 0.9, 0.8]).startswith("undetermined: not separable")
  # An analysis without the complement regression: re-run.
  (tmp_path / "one" / gns_layers.PART_WHOLE).unlink()
  rep = gns_layers.report(as_planned(tmp_path / "one"))
  assert rep.verdict == "not measured" and "re-run" in rep.finding


def test_gns_layers_rule_false_alarm_and_power_by_simulation():
  """`RULE` applied to simulated seeds whose Fisher z is normal about a known r: at r = R_MIN
  (the threshold itself) it calls either side in ≤ 5 % of draws over both looks; at the clean
  run's Fisher-z spread (0.32) and r = CLAIMED_R it reproduces in most draws, and the design's
  mean r recovers the true r."""
  rng, des = np.random.default_rng(3), gns_layers.design()
  def draws(r, sd, k=2000):
    z = np.arctanh(r) + sd * rng.standard_normal((k, des.cap))
    return [gns_layers.decide(list(np.tanh(row[:des.looks[0]])))
            if gns_layers.read(np.tanh(row[:des.looks[0]]))[1] == 0
            else gns_layers.decide(list(np.tanh(row))) for row in z], z
  at_min, _ = draws(gns_layers.R_MIN, 0.32)
  decided = np.mean([v in ("reproduced", "not reproduced") for v in at_min])
  assert decided <= 0.05 + 0.01, decided
  at_claim, z = draws(gns_layers.CLAIMED_R, 0.32)
  power = np.mean([v == "reproduced" for v in at_claim])
  assert 0.5 < power <= 1.0, power
  assert abs(np.tanh(z.mean()) - gns_layers.CLAIMED_R) < 0.005
  cal = gns_layers.calibration(list(np.tanh(z[0])))
  assert cal.false_alarm <= 0.05 and 0 <= cal.power <= 1 and cal.n == des.cap


def test_gns_layers_first_look_must_be_the_first_five_seeds(tmp_path):
  """Seeds added past the first look, with a first-look seed missing (its run failed): the
  design would read its first look on an added seed; the `pilot` guard names it."""
  rep, _ = _gns_report(tmp_path, "gap", _gns_table((0, 1, 2, 4, 5, 6), coupled=True))
  assert rep.verdict == "undetermined: pilot", rep.finding
  rep, _ = _gns_report(tmp_path, "whole", _gns_table(range(7), coupled=True))
  assert rep.verdict == "reproduced", rep.finding


def test_gns_layers_follow_up_adds_seeds_only_to_an_open_first_look(tmp_path, monkeypatch):
  """The follow-up stage reads the first look's seeds alone: open there -> seeds 5..14 (the
  cap), decided -> none, a first-look seed unfinished -> none yet; seeds already added do not
  change what it asks (a sweep stopped and resumed asks for the same)."""
  def fake(table):
    fin = table.groupby("run", as_index=False)["train.seed"].first().assign(status="completed")
    monkeypatch.setattr(gns_layers, "aggregate", lambda _: table)
    monkeypatch.setattr(gns_layers, "finals", lambda _: fin)
  fake(_gns_table(PILOT, coupled=False))
  (block,) = gns_layers.follow_up("cpu", tmp_path)
  assert block.grid == {"train.seed": list(range(5, 15))}
  more = pd.concat([_gns_table(PILOT, coupled=False),
                    _gns_table(range(5, 9), coupled=True, seed=7)], ignore_index=True)
  fake(more)
  assert gns_layers.follow_up("cpu", tmp_path)[0].grid == block.grid
  fake(_gns_table(PILOT, coupled=True))
  assert gns_layers.follow_up("cpu", tmp_path) == ()
  fake(_gns_table(PILOT[:4], coupled=False))
  assert gns_layers.follow_up("cpu", tmp_path) == ()
  assert gns_layers.follow_up("ci", tmp_path) == () == gns_layers.follow_up("cpu_xs", tmp_path)


def test_gns_layers_smoothing_is_the_trackers():
  """The offline smoothing of the analysis is `pergrad.analysis.smooth`: a constant input gives
  itself at every step (debiased from the first step)."""
  t = gns_layers.terms(_gns_table((0,), coupled=True, steps=30).assign(
      **{"gns/norm/S": 2.0, "gns/norm/G2": 0.5}))
  sm = gns_layers.smoothed(t, 0.9)
  np.testing.assert_allclose(sm[sm["group"] == "norm"]["b_simple"], 4.0, rtol=1e-6)


def test_cross_seed_r_recovers_what_a_shared_drift_alone_gives():
  """Runs whose two B_simple series share a drift (variance 1) and differ by independent noise
  (variance 1): another run's series correlate at r = 1/(1+1) = 0.5, the known value; where a
  run's two series also share their noise, its own r is higher and the cross-run r stays."""
  rng, steps = np.random.default_rng(0), pd.RangeIndex(2000, name="step")
  drift = pd.Series(rng.standard_normal(2000), index=steps)
  noise = {i: pd.Series(rng.standard_normal(2000), index=steps) for i in range(3)}
  apart = {i: (drift + noise[i], drift + pd.Series(rng.standard_normal(2000), index=steps))
           for i in range(3)}
  assert abs(gns_layers.cross_seed_r(apart) - 0.5) < 0.05
  together = {i: (drift + noise[i], drift + noise[i]) for i in range(3)}
  assert abs(gns_layers.cross_seed_r(together) - 0.5) < 0.05  # own r: 1.0
  assert np.isnan(gns_layers.cross_seed_r({0: apart[0]}))  # one run: no other to pair with


def test_the_shared_drift_line_says_when_it_is_not_measured(tmp_path):
  """One seed has no other to pair with: the shared-drift r is not measured, and the report
  says so rather than 'nan, exceeded in 0 of 1 seeds'; with three it is a number."""
  one, _ = _gns_report(tmp_path, "one", _gns_table([0], coupled=True))
  assert any("not measured (fewer than two seeds)" in c for c in one.checks)
  three, _ = _gns_report(tmp_path, "three", _gns_table([0, 1, 2], coupled=True))
  assert any("of 3 seeds" in c and "nan" not in c for c in three.checks if "shared" in c)


def test_settle_text_names_the_designs_seeds_then_what_would_settle_it():
  """Before the cap: the design's own seeds settle it; at the cap: the fewest seeds a one-look
  t at the observed spread and mean gap needs (`decide.seeds_to_settle`), or none up to 64
  where the mean r sits on the threshold."""
  assert "up to 15" in gns_layers.settle_text([0.925, 0.875, 0.964, 0.9, 0.93])
  rng = np.random.default_rng(0)
  z = np.arctanh(0.93) + 0.3 * rng.standard_normal(15)
  text = gns_layers.settle_text(list(np.tanh(z)))
  assert text.startswith("seeds that would settle it: ") and "cap is 15" in text, text
  flat = np.tanh(np.arctanh(0.9) + 0.3 * np.array([1, -1] * 7 + [0.0]))
  assert gns_layers.settle_text(list(flat)).startswith("no number of seeds up to 64")
