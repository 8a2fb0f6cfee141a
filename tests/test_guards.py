"""The validity guards (`pergrad.analysis.guards`): each one, on a case built to violate it,
fires and makes the verdict "undetermined: <guard>"; on a case that satisfies it, passes and
leaves the verdict alone. Then the same guards from an lr search's best.csv, and in a report."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from experiments import lr_search
from pergrad.analysis import calibrate, decide, guards, rules
from pergrad.analysis.report import Report
from pergrad.analysis.verdict import gated, pairs_report
from pergrad.sweep import WARMUP

R = rules.REPRODUCED


def _cal(power: float) -> calibrate.Calibration:
  return calibrate.Calibration("pair", 0.01, 5, 0.02, 0.05, power)


@pytest.mark.parametrize("name, bad, good", [
    ("bracketed",  # the best lr at the top of its grid; the best batch size at the bottom
     lambda: guards.bracketed({"ema": ([1e-3, 3e-3, 1e-2], 1e-2), "B": ([8, 16, 32], 8)}),
     lambda: guards.bracketed({"ema": ([1e-3, 3e-3, 1e-2], 3e-3), "B": ([8, 16, 32], 16)})),
    ("stable",  # chosen one √2 step below a diverged lr is fine; at it or right below it is not
     lambda: guards.stable({"B=128": (0.06, [0.06]), "adam": (0.03, [0.0424])}, 2.0),
     lambda: guards.stable({"adam": (0.03, [0.0424 * 1.5]), "msq": (0.01, [])}, math.sqrt(2))),
    ("warm",  # warmup counted in examples: 640 examples at B = 128 are 5 steps
     lambda: guards.warm({"B=32": 20, "B=128": 5}),
     lambda: guards.warm({"B=32": 20, "B=128": 20})),
    ("in_regime",  # B_ref = 32 above B_simple ≈ 10 for a claim about B ≤ B_simple; unmeasured
     lambda: guards.in_regime({"B_ref / B_simple": 3.2},
                              [guards.Regime("B_ref / B_simple", hi=1.0),
                               guards.Regime("tokens per parameter", 15, 25)]),
     lambda: guards.in_regime({"B_ref / B_simple": 0.5, "tokens per parameter": 20.0},
                              [guards.Regime("B_ref / B_simple", hi=1.0),
                               guards.Regime("tokens per parameter", 15, 25)])),
    ("powered",  # a tie at power 0.15 is not a finding
     lambda: guards.powered({"msq vs micro_adam": _cal(0.15), "adam vs micro_adam": _cal(0.95)}),
     lambda: guards.powered({"adam vs micro_adam": _cal(0.95)})),
    ("pilot",  # pilot 2-6: seed 3 missing with 7-8 added; passes: in order, or pilot seeds only
     lambda: guards.pilot_first({"adam": [2, 4, 5, 6, 7, 8], "msq": [2, 3, 4, 5, 6, 7]},
                                (2, 3, 4, 5, 6)),
     lambda: guards.pilot_first({"adam": [2, 3, 4, 5, 6, 7, 8], "msq": [2, 4, 5, 6]},
                                (2, 3, 4, 5, 6))),
])
def test_each_guard_fires_on_its_violation_and_passes_otherwise(name, bad, good):
  b, g = bad(), good()
  assert b.name == g.name == name and name in guards.NAMES
  assert not b.ok and g.ok, (b, g)
  assert "FAILS" in b.text() and "passes" in g.text()
  assert guards.apply(R, [g, b]) == f"undetermined: {name}"
  assert guards.apply(R, [g]) == R
  assert guards.apply(rules.NOT_REPRODUCED, [b]) == f"undetermined: {name}"


def test_the_violations_are_named():
  b = guards.bracketed({"ema": ([1e-3, 3e-3, 1e-2], 1e-2)})
  assert "ema" in b.why and "highest" in b.why
  s = guards.stable({"B=128": (0.06, [0.06])}, 2.0)
  assert "B=128" in s.why and "0.06" in s.why
  r = guards.in_regime({}, [guards.Regime("tokens per parameter", 15, 25)])
  assert not r.ok and "not measured" in r.why
  assert not guards.warm({}).ok and not guards.powered({}).ok
  p = guards.pilot_first({"adam": [1, 2, 3, 4, 5, 6], "msq": [2, 3, 4, 5, 6, 7]}, (2, 3, 4, 5, 6))
  assert not p.ok and p.why == ("adam's first seeds are [1, 2, 3, 4, 5], not the pilot "
                                "[2, 3, 4, 5, 6]")
  assert not guards.powered({"x": _cal(math.nan)}).ok  # unknown power: not powered
  weak = guards.powered({"batch vs token": calibrate.Calibration(
      "paired", 0.076, 3, 0.05, 0.05, 0.12)})  # a reading of absence at power 0.12
  assert not weak.ok and weak.why.startswith("batch vs token: power 0.12 for effect 0.05")
  assert guards.powered({"batch vs token": calibrate.Calibration(
      "paired", 0.076, 3, 0.05, 0.05, 0.12)}, decided=["batch vs token"]).ok  # decided


def test_several_failed_guards_are_all_listed_and_not_measured_stays():
  failed = [guards.warm({"a": 3}), guards.powered({"x": _cal(0.1)})]
  assert guards.apply(rules.PARTLY, failed) == "undetermined: warm, powered"
  assert guards.apply("not measured", failed) == "not measured"


def _best(rows) -> pd.DataFrame:
  return pd.DataFrame([{"optimizer.placement": p, "optimizer.lr": lr, "grid": grid,
                        "diverged_lrs": div, WARMUP: w}
                       for p, lr, grid, div, w in rows])


def test_lr_search_guards_read_best_csv_columns():
  label = lambda r: r["optimizer.placement"]
  ok = _best([("ema", 3e-3, "0.001 0.003 0.01", "", 20.0),
              ("batch", 1e-2, "0.003 0.01 0.03 0.1", "0.1", 20.0)])
  assert all(g.ok for g in lr_search.guards_of(ok, label))
  bad = _best([("ema", 1e-2, "0.001 0.003 0.01", "", 20.0),  # at the edge
               ("batch", 3e-2, "0.003 0.01 0.03 0.1", "0.03", 10.0)])  # diverged at its lr
  b, s, w = lr_search.guards_of(bad, label)
  assert not b.ok and not s.ok and not w.ok
  assert all(g.ok for g in lr_search.guards_of(bad.iloc[:0], label)[:2])
  unused = lr_search.guards_of(bad, label, used={"other"})
  assert unused[0].ok and unused[1].ok  # only the compared groups are guarded
  missing = _best([("ema", 3e-3, "0.001 0.003 0.01", "", math.nan)])
  assert not lr_search.guards_of(missing, label)[2].ok  # a warmup not recorded is not warm
  old = lr_search.guards_of(ok.drop(columns="diverged_lrs"), label)[1]  # older best.csv
  assert not old.ok and "records no divergences" in old.why


def _seeded(**arms) -> dict:
  return {k: dict(enumerate(v)) for k, v in arms.items()}


def test_a_report_shows_the_failed_guard_as_its_verdict():
  vals = _seeded(a=[4.00, 4.01, 4.00, 4.01, 4.00], b=[4.10, 4.11, 4.10, 4.12, 4.11])
  rep = pairs_report(vals, [("a", "b")], rule="r", paper="p", effect=0.05)
  assert rep.verdict == R and [g["name"] for g in rep.guards] == ["powered"]
  rep = pairs_report(vals, [("a", "b")], rule="r", paper="p", effect=0.05,
                     checked=(guards.warm({"a": 20, "b": 5}),))
  assert rep.verdict == "undetermined: warm" and "warm: FAILS" in rep.guards_text()
  doc = rep.to_json({"commit": "x", "clean": True})
  assert doc["guards"][0]["name"] == "warm" and "a vs b" in doc["calibrations"]
  weak = gated(R, _cal(0.3))
  assert weak.verdict == "undetermined: powered"
  # The rule's own verdict stays beside the guards' (report.json, the finding), said once.
  assert weak.rule_verdict == R and rep.rule_verdict == R and doc["rule_verdict"] == R
  assert weak.finding.startswith(f"undetermined: powered (the rule alone: {R}): ")
  assert rep.finding.count("undetermined") == 1
  assert Report.from_json(doc).headline == f"undetermined: warm (the rule alone: {R})"
  assert gated(R, _cal(0.99)).rule_verdict == "" and "rule_verdict" not in pairs_report(
      vals, [("a", "b")], rule="r", paper="p", effect=0.05).to_json({})


def test_a_detected_difference_stands_at_any_power_and_an_open_pair_names_itself():
  """Power qualifies a reading of absence only (issue 53): a 38-sigma win on 3 paired seeds is
  decided although the unpaired design had little power; a tie at low power is "not
  separable" (the verdict says so and names the pair), never "undetermined: powered"; an
  equivalence shown by TOST is a finding (every pair equivalent: not reproduced)."""
  win = _seeded(a=[2.00, 2.50, 3.00], b=[3.89, 4.41, 4.90])  # gaps 1.89 ± 0.01, a shared offset
  rep = pairs_report(win, [("a", "b")], rule="r", paper="p", effect=0.05)
  powered = next(g for g in rep.guards if g["name"] == "powered")
  assert rep.verdict == rules.REPRODUCED and powered["ok"], powered
  p = decide.compare(win["a"], win["b"], effect=0.05)
  assert p.half_paired < 0.05 < 0.5 < p.half_unpaired  # the unpaired noise would hide much
  tie = _seeded(c=[3.2, 4.0, 3.5], d=[3.3, 3.9, 3.6])
  rep = pairs_report(tie, [("c", "d")], rule="r", paper="p", effect=0.05)
  assert rep.verdict == "undetermined: not separable (c vs d)" and rep.rule_verdict == ""
  assert rep.calibrations["c vs d"]["power"] < 0.8 and "would settle at" in rep.finding
  same = _seeded(e=[4.00, 4.50, 4.20, 4.30, 4.10, 4.40], f=[4.001, 4.499, 4.2, 4.301, 4.1, 4.4])
  rep = pairs_report(same, [("e", "f")], rule="r", paper="p", effect=0.05)
  assert rep.verdict == rules.NOT_REPRODUCED and "e vs f: equivalent" in rep.ours
