"""Each decision rule's simulated error rates (`pergrad.analysis.calibrate`) at the noise its
experiment measured in results/cpu (or its stated prior): false alarm ≤ 0.05, power printed."""

import math
import time

import numpy as np
import pytest

from experiments.verdict import finding
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


def test_power_grows_with_seeds_and_seeds_for_finds_the_smallest():
  p = [calibrate.calibrate("pair", 0.02, n, 0.04).power for n in (3, 5, 8)]
  assert p[0] < p[1] < p[2]
  n = calibrate.seeds_for(0.02, 0.04)
  assert calibrate.calibrate("pair", 0.02, n, 0.04).power >= 0.8
  assert calibrate.calibrate("pair", 0.02, n - 1, 0.04).power < 0.8


def test_gate_turns_an_underpowered_not_reproduced_into_undetermined():
  weak = calibrate.calibrate("pair", 0.05, 3, 0.02)
  strong = calibrate.calibrate("pair", 0.005, 8, 0.02)
  assert weak.power < 0.8 <= strong.power
  assert calibrate.gate(rules.NOT_REPRODUCED, weak) == rules.UNDETERMINED
  assert calibrate.gate(rules.NOT_REPRODUCED, strong) == rules.NOT_REPRODUCED
  assert calibrate.gate(rules.REPRODUCED, weak) == rules.REPRODUCED
  nan = calibrate.calibrate("pair", math.nan, 3, 0.02)
  assert math.isnan(nan.power) and calibrate.gate(rules.NOT_REPRODUCED, nan) == rules.UNDETERMINED


def test_time_bound_is_never_tighter_than_the_self_ratio():
  assert rules.bound(1.03, 1.01, 1.02, 1.04) == rules.FAILS
  assert rules.bound(1.03, 1.01, 1.02, 1.04, self_q75=1.044) == rules.HOLDS
  assert rules.bound(1.5, 1.67) == rules.HOLDS and rules.bound(1.7, 1.67) == rules.FAILS


def test_finding_template():
  cal = calibrate.calibrate("pair", 0.01, 5, 0.02)
  text = finding("reproduced", "a vs b: win", ["a beats b (1 vs 2, noise 0.1)"], cal)
  assert text.startswith("reproduced: a vs b: win. a beats b") and "false alarm" in text
