"""Each decision rule's simulated error rates (`pergrad.analysis.calibrate`) at the noise its
experiment measured in results/cpu (or its stated prior): false alarm ≤ 0.05, power printed."""

import time

import pytest

from pergrad import bounds
from pergrad.analysis import calibrate, decide, sequential
from pergrad.analysis.report import finding

# (rule, noise measured in results/cpu (the paired sd of per-seed gaps, the per-rep log-ratio
# sd), seeds or reps, the rule's effect / margin / extra arguments)
CASES = {
    "paired: preconditioner, 5 fresh seeds, 0.02 nats": ("paired", 0.011, 5, (0.02,)),
    "paired: sign_placement, 3 fresh seeds, 0.05 nats": ("paired", 0.009, 3, (0.05,)),
    "paired: gns_schedule, 6 seeds, Δ18 = 0.043": ("paired", 0.023, 6, (0.043,)),
    "TOST: batch_scaling, 5 seeds, margin 0.03": ("tost", 0.009, 5, (0.03,)),
    "sequential: gns_layers Fisher z vs atanh 0.9, 5 then 15 seeds": ("sequential", 0.32, 5,
                                                                      ((5, 15), 0.36)),
    "location: overhead vmap ≤ 1.17, 11 reps": ("location", 0.04, 11, (1.17, 0.05)),
}


def _rates(kind, noise, n, args) -> tuple[float, float]:
  """(false alarm, power) of each rule at the measured noise."""
  if kind == "paired":
    r = decide.calibrate(noise, n, *args)
    return r["false_alarm"], r["power"]
  if kind == "tost":
    r = decide.calibrate(noise, n, args[0], margin=args[0])
    return r["false_equivalence"], r["power_equivalence"]
  if kind == "location":
    limit, effect = args
    return (bounds.power(noise, n, limit, limit)[bounds.HOLDS],
            bounds.power(noise, n, limit - effect, limit)[bounds.HOLDS])
  if kind == "sequential":
    looks, effect = args
    des = sequential.design(looks)
    null, alt = sequential.simulate(des, 0.0, noise), sequential.simulate(des, effect, noise)
    return null[decide.WIN] + null[decide.LOSS], alt[decide.WIN]
  cal = calibrate.calibrate(kind, noise, n, *args)
  return cal.false_alarm, cal.power


@pytest.mark.parametrize("name", list(CASES))
def test_rule_false_alarm_at_most_5_percent_and_power_reported(name):
  kind, noise, n, args = CASES[name]
  t0 = time.time()
  false_alarm, power = _rates(kind, noise, n, args)
  assert time.time() - t0 < 2.0
  assert false_alarm <= 0.05 + 0.005, (name, false_alarm)  # simulated: ± its Monte Carlo error
  assert 0.0 <= power <= 1.0
  print(f"{name}: false alarm {false_alarm:.3f}, power {power:.2f}")


def test_finding_template():
  cal = calibrate.calibrate("band", 0.05, 8, 0.15)
  text = finding("reproduced", "a vs b: win", ["a beats b (1 vs 2, noise 0.1)"], cal)
  assert text.startswith("reproduced: a vs b: win. a beats b") and "false alarm" in text


def test_a_calibration_names_what_its_n_counts():
  """A time bound's n counts paired reps, a fitted band's its points, a comparison's seeds."""
  text = lambda kind: calibrate.Calibration(kind, 0.05, 11, 0.05, 0.04, 0.9).text()
  assert "11 reps" in text("bound location") and "11 points" in text("band")
  assert "11 seeds" in text("paired") and "seeds" not in text("bound location")
