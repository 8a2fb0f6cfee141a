"""pergrad.analysis.timing: a bound judged on the paired ratio's location has wrong calls ≤ 5 %
and power that rises with reps, where the quartile rule's falls (simulated at a per-rep spread
like the overhead benchmark's)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pergrad.analysis import rules
from pergrad.analysis import timing as T

BOUND, LOG_SD = 1.17, 0.1  # vmap's bound; per-rep log-ratio spread near the measured 0.10


@pytest.mark.parametrize("n", [5, 11, 41])
def test_wrong_calls_at_the_bound_at_most_5_percent(n):
  at = T.power(LOG_SD, n, BOUND, BOUND)
  assert at[T.HOLDS] <= 0.05 + 0.005 and at[T.FAILS] <= 0.05 + 0.005


def old_quartile_power(n, ratio, draws=4000):
  """rules.bound's quartile reading: P(holds) for per-rep ratios at location `ratio`."""
  rng = np.random.default_rng(0)
  x = ratio * np.exp(LOG_SD * rng.standard_normal((draws, n)))
  _, q75 = rules.quartiles(x, axis=1)
  return float(np.mean(q75 <= BOUND))


def test_location_power_rises_with_reps_where_the_quartile_rule_falls():
  true = 1.12  # inside the bound; its per-rep ratios' 75th percentile (1.20) past it
  reps = (11, 25, 50, 100)
  new = [T.power(LOG_SD, n, true, BOUND)[T.HOLDS] for n in reps]
  old = [old_quartile_power(n, true) for n in reps]
  assert all(b > a for a, b in zip(new, new[1:], strict=False)) and new[-1] >= 0.99
  assert old[-1] < old[0] and old[-1] < 0.05


def test_until_decided_stops_when_decided_and_keeps_its_error_rates():
  rng = np.random.default_rng(5)
  draw = lambda ratio: (lambda k: ratio * np.exp(LOG_SD * rng.standard_normal(k)))
  loc = T.until_decided(draw(1.0), BOUND)
  assert loc.verdict == T.HOLDS and loc.n == 5
  # at the bound "holds" is right at the bound and wrong just past it, "fails" the reverse:
  # each ≤ 5 % over all the looks (1000 runs: Monte Carlo slack 0.02)
  at = [T.until_decided(draw(BOUND), BOUND).verdict for _ in range(1000)]
  assert at.count(T.FAILS) / 1000 <= 0.07 and at.count(T.HOLDS) / 1000 <= 0.07
  far = T.until_decided(draw(1.3), BOUND)
  assert far.verdict == T.FAILS and far.lo > BOUND


def test_location_reads_geometric_mean_and_refuses_bad_ratios():
  loc = T.location([1.0, 1.21, 1.1], 2.0)
  assert loc.ratio == pytest.approx(math.exp(np.mean(np.log([1.0, 1.21, 1.1]))))
  assert loc.verdict == T.HOLDS and "holds" in loc.text()
  assert T.location([1.0, -1.0], 2.0).verdict == T.UNDETERMINED
  assert T.location([1.0], 2.0).verdict == T.UNDETERMINED


def test_median_and_combined_verdicts():
  assert T.median_verdict([T.HOLDS, T.HOLDS, T.FAILS]) == T.HOLDS
  assert T.median_verdict([T.HOLDS, T.FAILS]) == T.UNDETERMINED
  assert T.median_verdict([]) == T.UNDETERMINED
  assert T.combine([T.HOLDS, T.FAILS]) == T.FAILS
  assert T.combine([T.HOLDS, T.UNDETERMINED]) == T.UNDETERMINED
  assert T.combine([T.HOLDS, T.HOLDS]) == T.HOLDS
