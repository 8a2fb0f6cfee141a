"""Each decision rule's simulated error rates (`pergrad.analysis.calibrate`) at the noise its
experiment measured in results/cpu (or its stated prior): false alarm ≤ 0.05, power printed."""

import math
import time

import numpy as np
import pytest

from experiments.report import finding
from pergrad.analysis import calibrate, rules

# (rule, noise measured in results/cpu, seeds, the rule's extra arguments: effect / margin / ...)
CASES = {
    "pair: preconditioner, 5 fresh seeds, 0.02 nats": ("pair", 0.011, 5, (0.02,)),
    "pair: sign_placement, 5 fresh seeds, 0.05 nats": ("pair", 0.009, 5, (0.05,)),
    "pair: gns_schedule, 6 seeds, Δ18 = 0.043": ("pair", 0.023, 6, (0.043,)),
    "equivalence: batch_scaling, 5 seeds, margin 0.03": ("equivalence", 0.0047, 5, (0.03,)),
    "threshold: gns_layers r ≥ 0.9, claimed 0.95": ("threshold", 0.0196, 3, (0.9, 0.95)),
    "bound: overhead vmap ≤ 1.17, 11 reps": ("bound", 0.04, 11, (1.17, 0.05)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rule_false_alarm_at_most_5_percent_and_power_reported(name):
  kind, noise, n, args = CASES[name]
  t0 = time.time()
  cal = calibrate.calibrate(kind, noise, n, *args)
  assert time.time() - t0 < 1.0
  assert cal.false_alarm <= 0.05, cal
  assert 0.0 <= cal.power <= 1.0
  print(f"{name}: {cal.text()}")


def test_simulated_pair_rule_matches_the_rule_itself():
  """The vectorised simulation agrees with `rules.compare` applied draw by draw."""
  rng = np.random.default_rng(1)
  wins = sum(rules.compare(0.01 * rng.standard_normal(5), 0.03 + 0.01 * rng.standard_normal(5)
                           ).outcome == rules.WIN for _ in range(600)) / 600
  assert abs(wins - calibrate.calibrate("pair", 0.01, 5, 0.03).power) < 0.06


def test_simulated_bound_rule_matches_the_rule_as_overhead_applies_it():
  """The bound rule as `overhead.judged` applies it (quartiles of 11 per-rep ratios per shape,
  their medians over 3 shapes, against max(bound, the self-ratio floor)), run draw by draw
  through `rules.bound`, agrees with `calibrate.bound`'s vectorised rates."""
  rng, n, shapes, limit, floor, noise = np.random.default_rng(2), 11, 3, 1.1, 1.04, 0.06

  def outcome(true):
    q = [rules.quartiles(true + noise * rng.standard_normal(n)) for _ in range(shapes)]
    q25, q75 = (float(np.median([x[i] for x in q])) for i in (0, 1))
    return rules.bound(true, limit, q25, q75, floor)
  holds = sum(outcome(limit - 0.05) == rules.HOLDS for _ in range(800)) / 800
  fails = sum(outcome(limit) == rules.FAILS for _ in range(800)) / 800
  fa, power = calibrate.bound(noise, n, limit, 0.05, shapes=shapes, floor=floor)
  assert abs(holds - power) < 0.06 and abs(fails - fa) < 0.04, (holds, power, fails, fa)


def test_power_grows_with_seeds_and_seeds_for_finds_the_smallest():
  p = [calibrate.calibrate("pair", 0.02, n, 0.04).power for n in (3, 5, 8)]
  assert p[0] < p[1] < p[2]
  n = calibrate.seeds_for(0.02, 0.04)
  assert calibrate.calibrate("pair", 0.02, n, 0.04).power >= 0.8
  assert calibrate.calibrate("pair", 0.02, n - 1, 0.04).power < 0.8


def test_pair_rates_recover_the_welch_test_known_rates():
  """On synthetic arms the simulated rates match the Welch t-test's: false alarm 5 % (two
  sides at 2.5 %), power P(T > t*) from the noncentral t, equal noises and seeds."""
  from scipy import stats

  n, sigma, effect = 6, 0.02, 0.03
  cal = calibrate.calibrate("pair", sigma, n, effect)
  df = 2 * n - 2
  crit = stats.t.ppf(1 - rules.PAIR_ALPHA, df)
  power = stats.nct.sf(crit, df, effect / (sigma * math.sqrt(2 / n)))
  assert cal.false_alarm == pytest.approx(0.05, abs=0.012)
  assert cal.power == pytest.approx(power, abs=0.03)


def test_each_comparison_is_calibrated_at_its_own_arms_noise():
  """Unequal noises and seeds (Welch): the false alarm stays ≤ 5 % and the power is that of
  the two arms compared, not of a noise pooled with other arms."""
  quiet, loud = [4.00, 4.01, 4.00, 4.01, 4.00], [4.1, 4.3, 4.0, 4.2, 4.4, 4.1, 4.3, 4.2]
  c = calibrate.of_arms(quiet, loud, 0.05)
  assert (c.noise, c.n, c.n_b) == (pytest.approx(calibrate.std(quiet)), 5, 8)
  assert c.noise_b == pytest.approx(calibrate.std(loud))
  assert c.false_alarm <= 0.06 and c.power < 0.8  # the loud arm limits this comparison
  both_quiet = calibrate.of_arms(quiet, [x + 0.1 for x in quiet], 0.05)
  assert both_quiet.power >= 0.8  # and only this one
  assert math.isnan(calibrate.of_arms(quiet, [4.0, math.inf], 0.05).power)  # diverged
  assert "vs 0.131 (8 seeds)" in c.text()
  assert calibrate.weakest([both_quiet, c]) is c


def test_noninferiority_rates_and_rule():
  cal = calibrate.calibrate("noninferiority", 0.005, 5, 0.02)
  assert cal.false_alarm <= 0.05 and cal.power >= 0.8  # one-sided 5 % at the margin
  ok = rules.noninferior([4.010, 4.012, 4.011], [4.000, 4.002, 4.001], 0.02)
  assert ok.outcome == rules.NONINFERIOR and "is non-inferior to" in ok.sentence()
  far = rules.noninferior([4.100, 4.102, 4.101], [4.000, 4.002, 4.001], 0.02)
  assert far.outcome == rules.LOSS
  wide = rules.noninferior([4.0, 4.1, 3.9], [4.0, 4.1, 3.9], 0.02)
  assert wide.outcome == rules.UNDETERMINED  # same mean, but not shown within the margin
  assert rules.noninferior([4.0, math.inf], [4.0, 4.1], 0.02).outcome == rules.LOSS


def test_time_bound_is_never_tighter_than_the_self_ratio():
  assert rules.bound(1.03, 1.01, 1.02, 1.04) == rules.FAILS
  assert rules.bound(1.03, 1.01, 1.02, 1.04, self_q75=1.044) == rules.HOLDS
  assert rules.bound(1.5, 1.67) == rules.HOLDS and rules.bound(1.7, 1.67) == rules.FAILS


def test_finding_template():
  cal = calibrate.calibrate("pair", 0.01, 5, 0.02)
  text = finding("reproduced", "a vs b: win", ["a beats b (1 vs 2, noise 0.1)"], cal)
  assert text.startswith("reproduced: a vs b: win. a beats b") and "false alarm" in text


@pytest.mark.parametrize("noise_a,noise_b,effect", [(0.02, 0.02, 0.02), (0.076, 0.0057, 0.05),
                                                    (0.05, 0.01, 0.03)])
def test_seeds_to_power_is_the_fewest_that_reach_it_near_the_normal_formula(noise_a, noise_b,
                                                                            effect):
  # Known value: n = (z_.975 + z_.8)² (σa² + σb²) / δ² seeds a side for a one-sided 2.5 % test
  # at power 0.8 (normal approximation; Welch's t needs a few more at small n).
  from scipy import stats

  cal = calibrate.calibrate("pair", noise_a, 3, effect, n_b=3, noise_b=noise_b)
  n = calibrate.seeds_to_power(cal)
  normal = (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) ** 2 * (
      noise_a ** 2 + noise_b ** 2) / effect ** 2
  assert normal <= n <= 1.35 * normal + 2, (n, normal)
  power = lambda k: calibrate.calibrate("pair", noise_a, k, effect, n_b=k,
                                        noise_b=noise_b).power
  assert power(n) >= 0.8 > power(n - 1)
  assert calibrate.seeds_to_power(cal, most=n - 1) is None  # past `most`: not said
  assert calibrate.seeds_to_power(calibrate.calibrate("pair", 0.001, 3, 0.05)) == 3  # has it
  assert calibrate.seeds_to_power(calibrate.calibrate("band", 0.01, 5, 0.05)) is None
