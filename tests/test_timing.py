"""pergrad.bounds: a time bound judged on the paired ratio's location has wrong calls ≤ 5 % at
a location exactly at the bound and power that rises with reps (simulated at a per-rep spread
like the overhead benchmark's); `pergrad.analysis.sequential.until_decided` adds reps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pergrad import bounds as T
from pergrad.analysis.sequential import until_decided

BOUND, LOG_SD = 1.17, 0.1  # vmap's bound; per-rep log-ratio spread near the measured 0.10


@pytest.mark.parametrize("n", [5, 11, 41])
def test_wrong_calls_at_the_bound_at_most_5_percent(n):
  at = T.power(LOG_SD, n, BOUND, BOUND)
  assert at[T.HOLDS] <= 0.05 + 0.005 and at[T.FAILS] <= 0.05 + 0.005


def test_location_power_rises_with_reps():
  true = 1.12  # inside the bound; its per-rep ratios' 75th percentile (1.20) past it
  reps = (5, 11, 25, 50, 100)
  new = [T.power(LOG_SD, n, true, BOUND)[T.HOLDS] for n in reps]
  assert all(b > a for a, b in zip(new, new[1:], strict=False)) and new[-1] >= 0.99


def test_until_decided_stops_when_decided_and_keeps_its_error_rates():
  rng = np.random.default_rng(5)
  draw = lambda ratio: (lambda k: ratio * np.exp(LOG_SD * rng.standard_normal(k)))
  loc = until_decided(draw(1.0), BOUND)
  assert loc.verdict == T.HOLDS and loc.n == 5
  # at the bound "holds" is right at the bound and wrong just past it, "fails" the reverse:
  # each ≤ 5 % over all the looks (1000 runs: Monte Carlo slack 0.02)
  at = [until_decided(draw(BOUND), BOUND).verdict for _ in range(1000)]
  assert at.count(T.FAILS) / 1000 <= 0.07 and at.count(T.HOLDS) / 1000 <= 0.07
  far = until_decided(draw(1.3), BOUND)
  assert far.verdict == T.FAILS and far.lo > BOUND


def test_location_reads_geometric_mean_and_refuses_bad_ratios():
  loc = T.location([1.0, 1.21, 1.1], 2.0)
  assert loc.ratio == pytest.approx(math.exp(np.mean(np.log([1.0, 1.21, 1.1]))))
  assert loc.verdict == T.HOLDS and "holds" in loc.text()
  assert T.location([1.0, -1.0], 2.0).verdict == T.UNDETERMINED
  assert T.location([1.0], 2.0).verdict == T.UNDETERMINED
  assert T.location([1.0, 1.21, 1.1]).verdict == T.UNDETERMINED  # no bound: the location alone


def test_a_bound_is_never_tighter_than_the_baseline_against_itself():
  self_ratios = [0.9, 1.1, 1.0, 1.2, 0.95]
  hi = T.location(self_ratios).hi
  assert hi > 1.1 and T.floored(1.05, self_ratios) == hi and T.floored(2.0, self_ratios) == 2.0
  assert T.floored(1.05, [1.0]) == 1.05 and T.floored(1.05, None) == 1.05


def test_exact_bounds():
  assert T.bound(1.5, 1.67) == T.HOLDS and T.bound(1.67, 1.67) == T.HOLDS
  assert T.bound(1.7, 1.67) == T.FAILS and T.bound(math.nan, 1.67) == T.UNDETERMINED


def test_median_and_combined_verdicts():
  assert T.median_verdict([T.HOLDS, T.HOLDS, T.FAILS]) == T.HOLDS
  assert T.median_verdict([T.HOLDS, T.FAILS]) == T.UNDETERMINED
  assert T.median_verdict([]) == T.UNDETERMINED
  assert T.combine([T.HOLDS, T.FAILS]) == T.FAILS
  assert T.combine([T.HOLDS, T.UNDETERMINED]) == T.UNDETERMINED
  assert T.combine([T.HOLDS, T.HOLDS]) == T.HOLDS
