"""pergrad.analysis.sequential: the overall wrong-call rates of the group-sequential design stay
≤ 0.05 over all its looks (simulated on sequences independent of its calibration), its power,
and that decided comparisons get no more seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pergrad.analysis import decide as D
from pergrad.analysis import sequential as S

LOOKS = (3, 6, 9, 12)


@pytest.mark.parametrize("spending", S.SPENDINGS)
def test_overall_false_alarm_and_false_equivalence_at_most_alpha(spending):
  des = S.design(LOOKS, spending)
  null = S.simulate(des, 0.0, 1.0, seed=7)
  assert null[D.WIN] + null[D.LOSS] <= 0.05
  at_margin = S.simulate(des, 0.5, 1.0, margin=0.5, seed=8)
  assert at_margin[D.EQUIVALENT] <= 0.05
  # a single look at each n spends 5 % each time: repeated looks would inflate it
  naive = [S.design((n,), "bonferroni").crit[0] for n in LOOKS]
  naive_des = S.Design(LOOKS, "naive", tuple(naive), tuple(naive))
  inflated = S.simulate(naive_des, 0.0, 1.0, seed=7)
  assert inflated[D.WIN] + inflated[D.LOSS] > 0.07


def test_power_grows_past_the_first_look_and_seeds_go_where_open():
  des = S.design(LOOKS, "pocock")
  seq = S.simulate(des, 1.0, 1.0)  # effect of one paired sd
  first_only = D.calibrate(1.0, LOOKS[0], 1.0)["power"]
  assert seq[D.WIN] >= 0.7 > first_only
  assert seq["mean_seeds"] < des.cap  # decided comparisons stopped early
  big = S.simulate(des, 10.0, 1.0)
  assert big[D.WIN] >= 0.99 and big["mean_seeds"] < 4
  tie = S.simulate(des, 0.0, 0.1, margin=0.2)
  assert tie[D.EQUIVALENT] >= 0.8  # a tie shown equivalent when the design can


def test_read_decided_gets_no_seeds_open_gets_the_next_look():
  des = S.design(LOOKS, "pocock")
  assert S.read([5.0, 5.1, 4.9], des) == (D.WIN, 0)
  out, add = S.read([0.1, -0.2, 0.05], des, margin=0.01)
  assert out == D.NOT_SEPARABLE and add == 3
  out, add = S.read(np.random.default_rng(0).standard_normal(12), des, margin=0.01)
  assert out == D.NOT_SEPARABLE and add == 0  # at the cap
  assert S.read([1.0], des) == (D.NOT_SEPARABLE, 2)


def test_bad_design_is_one_clear_error():
  with pytest.raises(ValueError, match="increasing seed counts"):
    S.design((6, 3))
  with pytest.raises(ValueError, match="first"):
    S.looks_between(1, 5, 3)
  assert S.looks_between(3, 12, 4) == LOOKS
  assert math.isfinite(S.design((5,), "pocock").crit[0])


def test_a_reading_by_the_design_shows_the_design_s_interval():
  """A pair read by the two-look design shows the interval its outcome was read on (every look
  at the design's critical t, wider than one look's 95%): a gap whose 95% t-interval excludes
  0 but whose design interval does not reads not separable, and says so consistently."""
  from pergrad.analysis import verdict

  des = S.design((5, 15), "pocock")
  gaps = np.array([0.10, 0.01, 0.08, 0.03, 0.06])  # t ≈ 3.43 at 5 seeds: past t(.975) = 2.78
  a = {float(s): 4.0 for s in range(5)}
  b = {float(s): 4.0 + g for s, g in enumerate(gaps)}
  one_look = D.compare(a, b, ("a", "b"), effect=0.05, margin=0.05)
  m, se = gaps.mean(), gaps.std(ddof=1) / math.sqrt(5)
  assert one_look.outcome == D.WIN and m / se < des.crit[0]  # 2.78 < t < 3.5x
  p = verdict.sequential_reading(one_look, a, b, des)
  assert p.outcome == D.NOT_SEPARABLE and p.lo95 < 0 < p.hi95
  assert p.lo95 == pytest.approx(m - des.crit[0] * se) and p.hi95 == pytest.approx(
      m + des.crit[0] * se)
  assert f"pocock look 1 of 2 (5 seeds), |t| > {des.crit[0]:.3g}" in p.sentence()
  short = verdict.sequential_reading(D.compare(dict(list(a.items())[:4]),
                                               dict(list(b.items())[:4]), ("a", "b"),
                                               effect=0.05, margin=0.05),
                                     dict(list(a.items())[:4]), dict(list(b.items())[:4]), des)
  assert short.outcome == D.NOT_SEPARABLE and "short of the pocock design's first look" in \
      short.sentence()


def test_a_reading_by_the_design_reports_the_design_s_power_and_false_alarm():
  """A pair read by the two-look design reports the design's rates over both looks at its
  paired sd (`sequential.simulate`), not one look's: the false alarm ≤ 5 % (Pocock's
  calibration), the power for the declared effect as simulated; a one-look pair keeps the
  one-look rates."""
  from pergrad.analysis import verdict

  des = S.design((5, 15), "pocock")
  gaps = np.array([0.10, 0.01, 0.08, 0.03, 0.06])
  a = {float(s): 4.0 for s in range(5)}
  b = {float(s): 4.0 + g for s, g in enumerate(gaps)}
  one_look = D.compare(a, b, ("a", "b"), effect=0.05, margin=0.05)
  p = verdict.sequential_reading(one_look, a, b, des)
  sd = float(np.std(gaps, ddof=1))
  assert p.power == S.simulate(des, 0.05, sd)[D.WIN] != one_look.power
  cal = verdict.calibration_of(p)
  null = S.simulate(des, 0.0, sd)
  assert cal.false_alarm == null[D.WIN] + null[D.LOSS] <= 0.05 and cal.power == p.power
  assert math.isnan(one_look.false_alarm)
  assert verdict.calibration_of(one_look).false_alarm == pytest.approx(
      D.calibrate(sd, 5, 0.05)["false_alarm"])
