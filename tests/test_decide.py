"""pergrad.analysis.decide: each reading's wrong-call rate by simulation at the paired noise, a
detected difference decided whatever its power, readings of absence only where powered."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from pergrad.analysis import decide as D

SIDE = 0.05  # the rate each wrong call must stay under
MC = 3 * math.sqrt(SIDE * (1 - SIDE) / D.DRAWS)  # Monte Carlo slack of a rate near 5 %


@pytest.mark.parametrize("n", [3, 5, 8])
@pytest.mark.parametrize("sd", [0.009, 0.1])
def test_false_alarm_and_false_equivalence_at_most_alpha(n, sd):
  cal = D.calibrate(sd, n, effect=2 * sd, margin=sd)
  assert cal["false_alarm"] <= SIDE + MC  # paired t: exactly 5 % under normal gaps
  assert cal["false_equivalence"] <= SIDE


def test_paired_gaps_cancel_the_seed_variance_welch_does_not():
  """Arms sharing each seed's init and data (a per-seed offset of sd 0.1) differing by 0.02
  with per-run noise 0.005: the paired reading decides, the unpaired noise is ~20× wider."""
  rng = np.random.default_rng(3)
  seed_effect = 0.1 * rng.standard_normal(5)
  a = dict(enumerate(4.0 + seed_effect + 0.005 * rng.standard_normal(5)))
  b = dict(enumerate(4.02 + seed_effect + 0.005 * rng.standard_normal(5)))
  p = D.compare(a, b, ("a", "b"), effect=0.02)
  assert p.outcome == D.WIN
  assert p.half_unpaired > 10 * p.half_paired
  # and identical arms under the same shared noise: false alarms stay at 5 %
  draws = rng.standard_normal((4000, 1, 5))
  xa = 4.0 + 0.1 * draws[:, 0] + 0.005 * rng.standard_normal((4000, 5))
  xb = 4.0 + 0.1 * draws[:, 0] + 0.005 * rng.standard_normal((4000, 5))
  assert np.mean(np.isin(D.read_gaps(xb - xa), D.DECIDED)) <= SIDE + 0.01


def test_a_38_sigma_win_at_three_seeds_is_decided_whatever_its_power():
  """sign_placement's batch vs token: 1.89 nats apart, token's seeds spread 0.076, batch's
  0.0057; the power for the declared 0.05 is low, the win is still decided."""
  batch = {0: 4.001, 1: 4.010, 2: 3.999}
  token = {0: 5.80, 1: 5.95, 2: 5.92}
  p = D.compare(batch, token, ("batch", "token"), effect=0.05)
  assert p.outcome == D.WIN and p.lo95 > 1.5
  assert p.power < 0.8  # a design property, reported beside, not a gate
  assert "beats" in p.sentence() and "power" in p.sentence()


def test_a_tie_at_power_02_reads_not_separable_with_the_seeds_to_settle_it():
  sd, effect, margin = 0.03, 0.04, 0.02
  n = next(k for k in range(2, 30) if D.power_difference(sd, k, effect) >= 0.2)
  assert 0.15 <= D.power_difference(sd, n, effect) <= 0.3
  rng = np.random.default_rng(0)
  base = rng.standard_normal(n)
  a = dict(enumerate(base))
  b = dict(enumerate(base + sd * (rng.standard_normal(n) * 0 + np.linspace(-1, 1, n))))
  p = D.compare(a, b, effect=effect, margin=margin)
  assert p.outcome == D.NOT_SEPARABLE
  need, gap = p.seeds_to_settle, abs(p.advantage)
  assert need["difference"] is None or (
      need["difference"] > n and D.power_difference(p.sd_paired, need["difference"], gap) >= 0.8
      and D.power_difference(p.sd_paired, need["difference"] - 1, gap) < 0.8)
  assert need["equivalence"] > n
  assert D.power_equivalence(p.sd_paired, need["equivalence"], margin, gap) >= 0.8
  # by simulation: such a design almost never reads a true tie as equivalent (no reading of
  # absence from an under-powered design) and never calls it a difference past 5 %
  cal = D.calibrate(sd, n, effect, margin)
  assert cal["power_equivalence"] < 0.2 and cal["false_alarm"] <= SIDE + MC


def test_tost_power_rises_with_seeds_at_a_fixed_false_equivalence():
  sd, margin = 0.01, 0.015
  powers = [D.calibrate(sd, n, 0.02, margin)["power_equivalence"] for n in (3, 5, 8, 12)]
  assert all(b > a for a, b in zip(powers, powers[1:], strict=False))
  assert powers[-1] >= 0.8
  assert all(D.calibrate(sd, n, 0.02, margin)["false_equivalence"] <= SIDE for n in (3, 5, 8, 12))
  # the analytic helper agrees with the rule's own simulation
  assert D.power_equivalence(sd, 8, margin) == pytest.approx(powers[2], abs=0.02)


def test_power_difference_matches_the_rules_simulation():
  for sd, n, eff in ((0.01, 5, 0.01), (0.05, 3, 0.1), (0.02, 10, 0.015)):
    assert D.power_difference(sd, n, eff) == pytest.approx(
        D.calibrate(sd, n, eff)["power"], abs=0.015)


def test_noninferiority_error_rates():
  rng = np.random.default_rng(1)
  sd, n, m = 0.01, 6, 0.02
  z = sd * rng.standard_normal((20000, n))
  worse_by_margin = D.read_noninferior(z - m, m)  # A's advantage −m: A worse by the margin
  assert np.mean(worse_by_margin == D.NONINFERIOR) <= SIDE
  assert np.mean(D.read_noninferior(z, m) == D.WORSE) <= SIDE
  assert np.mean(D.read_noninferior(z, m) == D.NONINFERIOR) >= 0.9  # power at gap 0
  p = D.compare({i: 0.0 for i in range(5)}, {i: 0.001 * i for i in range(5)}, effect=m,
                margin=m, noninferiority=True)
  assert p.outcome == D.NONINFERIOR
  # msq_eps's MicroAdamMSQ vs Adam: worse by 0.028 [0.011, 0.046], neither within 0.02 nor
  # beyond it; what settles it is its excess over the margin
  excess = [0.040, 0.012, 0.045, 0.020, 0.025]
  q = D.compare(dict(enumerate(excess)), {i: 0.0 for i in range(5)}, effect=m, margin=m,
                noninferiority=True)
  assert q.outcome == D.NOT_SEPARABLE and q.lo95 < 0  # a detected loss, not beyond the margin
  n = q.seeds_to_settle["against the margin"]
  assert n > 5 and D.power_difference(q.sd_paired, n, -q.advantage - m) >= 0.8


def test_sign_flip_is_exact_and_cannot_reject_below_six_seeds():
  assert D.sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
  assert D.sign_flip_p([1.0, 2.0, 3.0, 1.5, 2.5, 0.5]) == pytest.approx(2 / 64)
  rng = np.random.default_rng(2)
  heavy = rng.standard_t(2, size=(400, 8))  # heavy-tailed gaps, true location 0
  assert np.mean([D.sign_flip_p(d) <= SIDE for d in heavy]) <= SIDE + 0.02


def test_shared_seeds_only_and_divergence():
  p = D.compare({0: 1.0, 1: 1.1, 2: 1.2, 7: 0.0}, {0: 2.0, 1: 2.2, 2: 2.1, 9: 5.0}, effect=0.1)
  assert p.n == 3 and p.dropped == (7.0, 9.0)
  assert D.compare({0: math.inf, 1: 1.0}, {0: 2.0, 1: 2.0}, effect=0.1).outcome == D.LOSS
  assert D.compare({0: 1.0, 1: 1.0}, {0: math.nan, 1: 2.0}, effect=0.1).outcome == D.WIN
  assert D.compare({0: 1.0}, {0: 2.0}, effect=0.1).outcome == D.NOT_SEPARABLE


def test_a_gap_inside_the_margin_reads_equivalent_and_a_detected_one_stays_within():
  rng = np.random.default_rng(4)
  a = dict(enumerate(rng.standard_normal(8)))
  tie = D.compare(a, {k: v + 0.001 * rng.standard_normal() for k, v in a.items()}, effect=0.02,
                  margin=0.02)
  assert tie.outcome == D.EQUIVALENT and tie.within_margin and not tie.seeds_to_settle
  small = D.compare(a, {k: v + 0.005 + 1e-4 * rng.standard_normal() for k, v in a.items()},
                    effect=0.02, margin=0.02)
  assert small.outcome == D.WIN and small.within_margin  # detected, and within ±margin


def test_verdict_of_expected_wins():
  p = D.compare({0: 0.0, 1: 0.1}, {0: 1.0, 1: 1.2}, ("a", "b"), effect=0.1)
  of = lambda *outs: [dataclasses.replace(p, outcome=o, a=f"a{i}") for i, o in enumerate(outs)]
  assert D.verdict_of(of(D.WIN, D.WIN)) == "reproduced"
  assert D.verdict_of(of(D.WIN, D.NOT_SEPARABLE)) == "partly reproduced"
  assert D.verdict_of(of(D.WIN, D.LOSS)) == "not reproduced"
  assert D.verdict_of(of(D.EQUIVALENT, D.EQUIVALENT)) == "not reproduced"
  assert D.verdict_of(of(D.EQUIVALENT, D.NOT_SEPARABLE)) == (
      "undetermined: not separable (a1 vs b)")
