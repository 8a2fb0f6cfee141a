"""Each rule's error rates, by applying it to DRAWS synthetic experiments (fixed seed) at the
noise an experiment measures: false_alarm (a true claim called false, e.g. identical arms
called different) and power (an effect of the claimed size detected; below MIN_POWER a "not
reproduced" says "undetermined", `gate`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from pergrad.analysis import rules

DRAWS = 4000
MIN_POWER = 0.8


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A rule's simulated error rates at `noise` (per-seed std) with `n` seeds a side."""

  kind: str  # pair | equivalence | threshold | bound
  noise: float
  n: int
  effect: float  # the effect the paper claims, in the measurement's units
  false_alarm: float
  power: float
  source: str = "measured"  # or "prior": the noise was not measured (stated in advance)

  def row(self) -> dict:
    return dataclasses.asdict(self)

  def text(self) -> str:
    f = lambda x: "n/a" if not math.isfinite(x) else f"{x:.2f}"
    return (f"{self.kind} rule at {self.source} noise {self.noise:.3g}, {self.n} seeds, effect "
            f"{self.effect:.3g}: false alarm {f(self.false_alarm)}, power {f(self.power)}")


def pair(noise: float, n: int, effect: float, n_b: int | None = None) -> tuple[float, float]:
  """`rules.compare` (lower is better): P(win or loss | same mean), P(win | A lower by effect)."""
  rng, nb = np.random.default_rng(0), n_b or n
  a, b = noise * rng.standard_normal((DRAWS, n)), noise * rng.standard_normal((DRAWS, nb))
  _, lo, hi = rules.welch_interval(b, a, rules.PAIR_ALPHA)
  fa = float(np.mean((lo > 0) | (hi < 0)))
  _, lo, _ = rules.welch_interval(b + effect, a, rules.PAIR_ALPHA)
  return fa, float(np.mean(lo > 0))


def equivalence(noise: float, n: int, margin: float, n_b: int | None = None) -> tuple[float, float]:
  """`rules.equivalence` on the seeds' curve averages (spread `noise`; the point guard left
  out): P(the interval lies beyond ±margin | gap = margin), P(equivalent | gap = 0)."""
  rng, nb = np.random.default_rng(0), n_b or n
  a, b = noise * rng.standard_normal((DRAWS, n)), noise * rng.standard_normal((DRAWS, nb))
  _, lo, hi = rules.welch_interval(a + margin, b, rules.PAIR_ALPHA)
  fa = float(np.mean((lo > margin) | (hi < -margin)))
  _, lo, hi = rules.welch_interval(a, b, rules.ALPHA)
  return fa, float(np.mean((lo >= -margin) & (hi <= margin)))


def threshold(noise: float, n: int, level: float, claimed: float) -> tuple[float, float]:
  """Mean ± std against `level` (true value `claimed`): P(mean + s < level), P(mean − s ≥ level)."""
  x = claimed + noise * np.random.default_rng(0).standard_normal((DRAWS, n))
  m, s = x.mean(1), x.std(1, ddof=1)
  return float(np.mean(m + s < level)), float(np.mean(m - s >= level))


def bound(noise: float, n: int, limit: float, effect: float) -> tuple[float, float]:
  """`rules.bound` on the quartiles of n per-rep ratios (rep noise `noise`): P(fails | true
  ratio at the limit), P(holds | true ratio `effect` below the limit)."""
  rng = np.random.default_rng(0)
  q25, _ = rules.quartiles(limit + noise * rng.standard_normal((DRAWS, n)), axis=1)
  _, q75 = rules.quartiles(limit - effect + noise * rng.standard_normal((DRAWS, n)), axis=1)
  return float(np.mean(q25 > limit)), float(np.mean(q75 <= limit))


KINDS = {"pair": pair, "equivalence": equivalence, "threshold": threshold, "bound": bound}


def calibrate(kind: str, noise: float, n: int, *args, effect: float | None = None,
              source: str = "measured", **kw) -> Calibration:
  """`KINDS[kind](noise, n, *args)` as a `Calibration` recording `effect` (default args[0])
  (NaN rates without a finite noise or with < 2 seeds)."""
  eff = float(effect if effect is not None else (args[0] if args else math.nan))
  if not (np.isfinite(noise) and noise > 0 and n >= 2):
    return Calibration(kind, float(noise), int(n), eff, math.nan, math.nan, source)
  fa, pw = KINDS[kind](float(noise), int(n), *args, **kw)
  return Calibration(kind, float(noise), int(n), eff, fa, pw, source)


def pooled_std(groups) -> float:
  """√ of the mean within-group sample variance over groups of ≥ 2 finite values."""
  v = [np.var(np.asarray(g, float), ddof=1) for g in groups
       if len(g) > 1 and np.isfinite(np.asarray(g, float)).all()]
  return float(math.sqrt(np.mean(v))) if v else math.nan


def gate(verdict: str, cal: Calibration) -> str:
  """"not reproduced" from a rule with power < MIN_POWER (or unknown) is "undetermined"."""
  if verdict == rules.NOT_REPRODUCED and not (cal.power >= MIN_POWER):
    return rules.UNDETERMINED
  return verdict


def seeds_for(noise: float, effect: float, kind: str = "pair", *args, target: float = MIN_POWER,
              most: int = 12) -> int | None:
  """The fewest seeds a side (2..most) at which the rule's power reaches `target`."""
  for n in range(2, most + 1):
    if calibrate(kind, noise, n, *(args or (effect,))).power >= target:
      return n
  return None


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
