"""The benchmarks' reps in looks (`experiments.overhead.launch`, issue 53 item 3): a time bound
still undetermined at the preset's reps gets more, up to the declared cap, by a group-sequential
design whose wrong calls stay ≤ 5 % over all its looks (`sequential.bound_rates`); the looks
pool per row (`pooled`), a launch resumes at the look it stopped, and a report reads the
design's critical t at the look reached."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import norm_cost, overhead  # noqa: E402
from pergrad import bounds  # noqa: E402
from pergrad.analysis import sequential  # noqa: E402
from pergrad.bench import paired  # noqa: E402
from pergrad.sweep import How  # noqa: E402
from pergrad.sweep.record import Runs  # noqa: E402

LOG_SD = 0.03  # per-rep log-ratio spread near the cpu norm_cost run's (0.037)
NORM_BOUND = norm_cost.BOUNDS[1][2]


def _doc(reps: int, ratio: dict, rng) -> dict:
  """A bench document: the self-timed baseline and norm_cost's two variants, each rep's ratio
  drawn around `ratio[variant]` (log-normal, LOG_SD)."""
  rows = []
  for var, r in {"contraction/mean": 1.0, **ratio}.items():
    backend, stats = var.split("/")
    rs = [float(x) for x in r * np.exp(LOG_SD * rng.standard_normal(reps))]
    rows.append(dict(preset="tiny", B=8, backend=backend, granularity="example", stats=stats,
                     baseline="contraction", times=[0.1 * x for x in rs],
                     base_times=[0.1] * reps, time_ratios=rs,
                     flops_ratio=1.003 if stats == "norms" else 1.0, peak_ratio=1.0))
  return {"argv": [f"--reps {reps}"], "machine": {"loadavg_at_end": [0.0]}, "rows": rows}


def _fake_bench(monkeypatch, ratio: dict, seed: int = 0) -> list[int]:
  """stats.run replaced by `_doc` draws; the reps each call asked for."""
  from pergrad.bench import stats

  asked, rng = [], np.random.default_rng(seed)

  def run(*, reps, echo=None, **_):
    asked.append(reps)
    return _doc(reps, ratio, rng)
  monkeypatch.setattr(stats, "run", run)
  return asked


def test_pooled_concatenates_each_rows_reps_and_summarises_them_again():
  rng = np.random.default_rng(1)
  docs = [_doc(11, {"surgery/norms": 1.1}, rng), _doc(10, {"surgery/norms": 1.1}, rng)]
  doc = overhead.pooled(docs, (11, 21))
  for r, a, b in zip(doc["rows"], docs[0]["rows"], docs[1]["rows"], strict=True):
    assert r["time_ratios"] == a["time_ratios"] + b["time_ratios"]
    assert r["times"] == a["times"] + b["times"]
    q = paired.summary(a["time_ratios"] + b["time_ratios"])
    assert (r["time_location"], r["time_lo"], r["time_hi"]) == (q["location"], q["lo"], q["hi"])
  assert doc["rep_looks"] == [11, 21] and len(doc["looks"]) == 2
  assert json.loads(overhead.table(doc)["rep_looks"].iloc[0]) == [11, 21]


def test_a_bound_open_at_the_first_look_gets_reps_until_decided_then_resumes(tmp_path,
                                                                            monkeypatch):
  # the norm layers' true ratio a little over their bound: open at 11 reps, decided later
  asked = _fake_bench(monkeypatch, {"surgery/norms": 1.0, "surgery/norms@norm": 1.03})
  log = norm_cost.launch("cpu", tmp_path, How(echo=lambda s: None))
  des = overhead.rep_design(11, norm_cost.REP_CAP.value)
  assert des.looks == (11, 21, 31, 41) and asked[0] == 11 and len(asked) >= 2
  assert asked[1:] == [10] * (len(asked) - 1) and log.launched[1] == "bench_look2"
  docs, looks = overhead.looks_of(tmp_path)
  assert looks == des.looks and len(docs) == len(asked)
  df = overhead.table(overhead.pooled(docs, looks))
  k = len(asked) - 1
  assert k == len(des.looks) - 1 or not norm_cost.is_open(df, des.crit_equiv[k])
  # the same command again launches nothing: every look it took is kept
  again = norm_cost.launch("cpu", tmp_path, How(echo=lambda s: None))
  assert not again.launched and len(asked) == k + 1
  # the report reads the design at the look reached
  norm_cost.analyze(Runs(tmp_path), tmp_path)
  rep = norm_cost.report(tmp_path)
  assert f"look {k + 1} of 4" in rep.finding and "the design's, one-sided t" in rep.finding
  assert rep.calibrations["normalization layers only"]["n"] == des.looks[k]


def test_decided_bounds_and_the_ci_preset_take_the_first_look_alone(tmp_path, monkeypatch):
  asked = _fake_bench(monkeypatch, {"surgery/norms": 1.0, "surgery/norms@norm": 0.9})
  norm_cost.launch("cpu", tmp_path / "cpu", How(echo=lambda s: None))
  assert asked == [11]  # both bounds hold at the first look
  asked.clear()
  _fake_bench(monkeypatch, {"surgery/norms": 1.0, "surgery/norms@norm": 1.01})
  norm_cost.launch("ci", tmp_path / "ci", How(echo=lambda s: None))
  assert overhead.looks_of(tmp_path / "ci")[1] == (3,)


def test_a_dry_run_plans_the_first_look_and_writes_nothing(tmp_path, monkeypatch):
  asked = _fake_bench(monkeypatch, {"surgery/norms": 1.0})
  log = norm_cost.launch("cpu", tmp_path / "s", How(dry_run=True, echo=lambda s: None))
  assert log.launched == ["bench"] and not asked and not (tmp_path / "s").exists()


@pytest.mark.parametrize("log_sd", [0.01, 0.037, 0.1])
def test_the_design_keeps_wrong_calls_within_5_percent_and_gains_power(log_sd):
  """At a true ratio on the bound, neither 'holds' nor 'fails' over 5 % over all the looks
  (Monte Carlo slack 0.005); a ratio 1 % under it holds at least as often as at one look of
  the first look's reps, and with fewer reps on average than the cap."""
  des = overhead.rep_design(11, 41)
  at = sequential.bound_rates(des, log_sd, NORM_BOUND, NORM_BOUND)
  assert at[bounds.HOLDS] <= 0.055 and at[bounds.FAILS] <= 0.055
  under = sequential.bound_rates(des, log_sd, NORM_BOUND - 0.01, NORM_BOUND)
  one = bounds.power(log_sd, 11, NORM_BOUND - 0.01, NORM_BOUND)[bounds.HOLDS]
  assert under[bounds.HOLDS] >= one - 0.01 and under["mean_reps"] <= des.cap


def test_one_look_rates_are_the_fixed_rule_s():
  des = overhead.rep_design(11, None)
  assert des.looks == (11,)
  assert sequential.bound_rates(des, 0.04, 1.05, 1.1) == pytest.approx(
      {**bounds.power(0.04, 11, 1.05, 1.1), "mean_reps": 11.0})
