"""Each rule's error rates, by applying it to DRAWS synthetic experiments (fixed seed) at the
noise an experiment measures: false_alarm (a true claim called false) and power (an effect of
the declared size detected; `pergrad.analysis.guards.powered` requires MIN_POWER of a reading
of absence only). `Calibration` is the record every report shows; the kind here is the
fitted-slope band (paired comparisons: `decide.calibrate`; group-sequential designs:
`sequential.simulate`)."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from scipy import stats

from pergrad.analysis import rules

DRAWS = 4000
MIN_POWER = 0.8
DIVERGED = "diverged"  # a Calibration's source when a seed diverged: no noise to calibrate
UNITS = {"bound location": "reps", "band": "points"}  # what a kind's n counts (else seeds)


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A rule's simulated error rates at `noise` (per-seed std) with `n` seeds (side A), and
  `noise_b`, `n_b` on side B where the rule compares two arms (NaN, 0: as side A)."""

  kind: str  # paired | paired equivalence | band | bound location | sequential location (Fisher z)
  noise: float
  n: int
  effect: float  # the declared effect (or margin), in the measurement's units
  false_alarm: float
  power: float
  source: str = "measured"  # "prior": not measured (stated in advance); DIVERGED: no noise
  noise_b: float = math.nan
  n_b: int = 0

  def row(self) -> dict:
    return dataclasses.asdict(self)

  def text(self) -> str:
    f = lambda x: "n/a" if not math.isfinite(x) else f"{x:.2f}"
    of = UNITS.get(self.kind, "seeds")  # what `n` counts
    two = (f" vs {self.noise_b:.3g} ({self.n_b} {of})"
           if self.n_b and (self.n_b != self.n or self.noise_b != self.noise) else "")
    return (f"{self.kind} rule at {self.source} noise {self.noise:.3g}, {self.n} {of}{two}, "
            f"effect {self.effect:.3g}: false alarm {f(self.false_alarm)}, power {f(self.power)}")


def band(noise: float, n: int, margin: float) -> tuple[float, float]:
  """A fitted slope's 90% t-interval (n points, df n − 2, its standard error `noise`, estimated
  from the residuals) within ±margin of the claimed value: P(within | the slope off by the
  margin), P(within | the slope at the claimed value)."""
  rng, df = np.random.default_rng(0), n - 2
  se = noise * np.sqrt(rng.chisquare(df, DRAWS) / df)
  half = stats.t.ppf(1 - rules.ALPHA, df) * se
  err = noise * rng.standard_normal(DRAWS)
  within = lambda d: float(np.mean(np.abs(d) + half <= margin))
  return within(err + margin), within(err)


KINDS = {"band": band}


def calibrate(kind: str, noise: float, n: int, *args, effect: float | None = None,
              source: str = "measured") -> Calibration:
  """`KINDS[kind](noise, n, *args)` as a `Calibration` recording `effect` (default args[0])
  (NaN rates without a finite positive noise or with < 2 seeds). Two arms compared on shared
  seeds are calibrated by `pergrad.analysis.decide.calibrate`, time bounds by
  `pergrad.bounds.power`."""
  eff = float(effect if effect is not None else (args[0] if args else math.nan))
  cal = functools.partial(Calibration, kind, float(noise), int(n), eff, source=source)
  if not (np.isfinite(noise) and noise > 0 and n >= 2):
    return cal(math.nan, math.nan)
  return cal(*KINDS[kind](float(noise), int(n), *args))


def weakest(cals) -> Calibration | None:
  """The calibration with the lowest power (unknown first; those decided by a diverged seed
  only when there is no other), the one the claims table shows."""
  cals = list(cals)
  cals = [c for c in cals if c.source != DIVERGED] or cals
  key = lambda c: (math.isfinite(c.power), c.power if math.isfinite(c.power) else 0.0)
  return min(cals, key=key) if cals else None


def simulate_curves(rng, n_seeds: int, n_points: int, sigma: float, rho: float = 0.5,
                    offset: float = 0.0, shared: float = 0.0) -> np.ndarray:
  """seeds × points of σ(√shared·c + √(1 − shared)·e) + offset: c ~ N(0, 1) per seed, e a
  unit-variance AR(1) (coefficient ρ) along the points."""
  c = rng.standard_normal((n_seeds, 1))
  e = np.empty((n_seeds, n_points))
  e[:, 0] = rng.standard_normal(n_seeds)
  for p in range(1, n_points):
    e[:, p] = rho * e[:, p - 1] + math.sqrt(1 - rho**2) * rng.standard_normal(n_seeds)
  return offset + sigma * (math.sqrt(shared) * c + math.sqrt(1 - shared) * e)
