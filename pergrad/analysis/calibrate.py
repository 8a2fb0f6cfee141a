"""Each rule's error rates, by applying it to DRAWS synthetic experiments (fixed seed) at the
noise an experiment measures: false_alarm (a true claim called false, e.g. identical arms
called different) and power (an effect of the declared size detected; below MIN_POWER the
verdict is "undetermined: powered", `pergrad.analysis.guards.powered`). Each comparison is
calibrated at its own arms' noise and seeds (Welch: unequal variances, unequal n), never at a
noise pooled across arms."""

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


@dataclasses.dataclass(frozen=True)
class Calibration:
  """A rule's simulated error rates at `noise` (per-seed std) with `n` seeds (side A), and
  `noise_b`, `n_b` on side B where the rule compares two arms (NaN, 0: as side A)."""

  kind: str  # pair | equivalence | noninferiority | band | threshold | bound
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
    two = (f" vs {self.noise_b:.3g} ({self.n_b} seeds)"
           if self.n_b and (self.n_b != self.n or self.noise_b != self.noise) else "")
    return (f"{self.kind} rule at {self.source} noise {self.noise:.3g}, {self.n} seeds{two}, "
            f"effect {self.effect:.3g}: false alarm {f(self.false_alarm)}, power {f(self.power)}")


def _draws(noise, n, n_b, noise_b):
  rng, nb = np.random.default_rng(0), n_b or n
  sb = noise if noise_b is None or not np.isfinite(noise_b) else noise_b
  return noise * rng.standard_normal((DRAWS, n)), sb * rng.standard_normal((DRAWS, nb))


def pair(noise: float, n: int, effect: float, n_b: int | None = None,
         noise_b: float | None = None, pilot: int | None = None) -> tuple[float, float]:
  """`rules.compare` (lower is better) with A's seeds at std `noise`, B's at `noise_b` (`pilot`:
  its variances from the first `pilot` seeds): P(win or loss | same mean), P(win | A lower by
  effect)."""
  a, b = _draws(noise, n, n_b, noise_b)
  pilot = rules.pilot_of(pilot, n, n_b or n)
  if pilot == rules.SHORT_OF_PILOT:  # `rules.compare` reads it undetermined
    return math.nan, math.nan
  _, lo, hi = rules.welch_interval(b, a, rules.PAIR_ALPHA, pilot)
  fa = float(np.mean((lo > 0) | (hi < 0)))
  _, lo, _ = rules.welch_interval(b + effect, a, rules.PAIR_ALPHA, pilot)
  return fa, float(np.mean(lo > 0))


def equivalence(noise: float, n: int, margin: float, n_b: int | None = None,
                noise_b: float | None = None) -> tuple[float, float]:
  """`rules.equivalence` on the seeds' curve averages (A's spread `noise`, B's `noise_b`; the
  point guard left out): P(the interval lies beyond ±margin | gap = margin), P(equivalent | gap
  = 0)."""
  a, b = _draws(noise, n, n_b, noise_b)
  _, lo, hi = rules.welch_interval(a + margin, b, rules.PAIR_ALPHA)
  fa = float(np.mean((lo > margin) | (hi < -margin)))
  _, lo, hi = rules.welch_interval(a, b, rules.ALPHA)
  return fa, float(np.mean((lo >= -margin) & (hi <= margin)))


def noninferiority(noise: float, n: int, margin: float, n_b: int | None = None,
                   noise_b: float | None = None, pilot: int | None = None) -> tuple[float, float]:
  """`rules.noninferior` (A's seeds at std `noise`, B's at `noise_b`; `pilot`: `pair`'s): the
  larger of its two wrong calls with A worse by exactly the margin, P(non-inferior) and
  P(loss: worse beyond the margin); and P(non-inferior | same mean)."""
  a, b = _draws(noise, n, n_b, noise_b)
  pilot = rules.pilot_of(pilot, n, n_b or n)
  if pilot == rules.SHORT_OF_PILOT:  # `rules.noninferior` reads it undetermined
    return math.nan, math.nan
  _, _, hi = rules.welch_interval(a + margin, b, rules.ALPHA, pilot)
  _, lo95, _ = rules.welch_interval(a + margin, b, rules.PAIR_ALPHA, pilot)
  fa = max(float(np.mean(hi <= margin)), float(np.mean(lo95 > margin)))
  _, _, hi = rules.welch_interval(a, b, rules.ALPHA, pilot)
  return fa, float(np.mean(hi <= margin))


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


def threshold(noise: float, n: int, level: float, claimed: float) -> tuple[float, float]:
  """Mean ± std against `level` (true value `claimed`): P(mean + s < level), P(mean − s ≥ level)."""
  x = claimed + noise * np.random.default_rng(0).standard_normal((DRAWS, n))
  m, s = x.mean(1), x.std(1, ddof=1)
  return float(np.mean(m + s < level)), float(np.mean(m - s >= level))


def bound(noise: float, n: int, limit: float, effect: float, shapes: int = 1,
          floor: float = -math.inf) -> tuple[float, float]:
  """`rules.bound` as applied: the medians over `shapes` shapes of the quartiles of n per-rep
  ratios each (rep noise `noise`), judged against max(limit, `floor`: the baseline's own
  self-ratio q75): P(fails | true ratio at the limit), P(holds | true ratio `effect` below
  it)."""
  rng, lim = np.random.default_rng(0), max(limit, floor)
  q = lambda true: rules.quartiles(true + noise * rng.standard_normal((DRAWS, shapes, n)), axis=2)
  q25, _ = q(limit)
  _, q75 = q(limit - effect)
  return (float(np.mean(np.median(q25, axis=1) > lim)),
          float(np.mean(np.median(q75, axis=1) <= lim)))


KINDS = {"pair": pair, "equivalence": equivalence, "noninferiority": noninferiority,
         "band": band, "threshold": threshold, "bound": bound}
TWO_ARMS = ("pair", "equivalence", "noninferiority")  # rules comparing two arms' seeds


def calibrate(kind: str, noise: float, n: int, *args, effect: float | None = None,
              source: str = "measured", n_b: int | None = None, noise_b: float | None = None,
              **kw) -> Calibration:
  """`KINDS[kind](noise, n, *args)` as a `Calibration` recording `effect` (default args[0])
  (NaN rates without a finite noise or with < 2 seeds a side); `n_b`, `noise_b`: side B's
  seeds and std (the `TWO_ARMS` rules; default: side A's)."""
  eff = float(effect if effect is not None else (args[0] if args else math.nan))
  nb = int(n_b) if n_b is not None else int(n)
  sb = float(noise_b) if noise_b is not None else float(noise)
  two = kind in TWO_ARMS
  if two:
    kw = {**kw, "n_b": nb, "noise_b": sb}
  ok = (np.isfinite(noise) and noise >= 0 and n >= 2 and (not two or (
      np.isfinite(sb) and sb >= 0 and nb >= 2)) and (noise > 0 or (two and sb > 0)))
  cal = functools.partial(Calibration, kind, float(noise), int(n), eff, source=source,
                          noise_b=sb if two else math.nan, n_b=nb if two else 0)
  if not ok:
    return cal(math.nan, math.nan)
  return cal(*KINDS[kind](float(noise), int(n), *args, **kw))


def std(values) -> float:
  """The sample std (ddof 1) of one arm's finite values (NaN with < 2 or a diverged one)."""
  x = np.asarray(values, float)
  return float(np.std(x, ddof=1)) if len(x) > 1 and np.isfinite(x).all() else math.nan


def of_arms(a, b, effect: float, kind: str = "pair", source: str = "measured",
            pilot: int | None = None) -> Calibration:
  """A `TWO_ARMS` rule's error rates for arms with values `a` and `b`, each at its own std and
  seeds (`pilot`: the pair rule's, `rules.compare`; the stds then of the pilot seeds); with a
  diverged seed on a side, NaN rates and source DIVERGED: the comparison is decided by the
  divergence (a diverged seed loses), which `guards.stable` judges, not noise."""
  if any(not np.isfinite(float(x)) for x in (*a, *b)):
    source = DIVERGED
  k = pilot if kind in ("pair", "noninferiority") and pilot else None  # [:None]: every value
  return calibrate(kind, std(list(a)[:k]), len(a), effect, n_b=len(b), noise_b=std(list(b)[:k]),
                   source=source, **({"pilot": k} if k else {}))


def weakest(cals) -> Calibration | None:
  """The calibration with the lowest power (unknown first; those decided by a diverged seed
  only when there is no other), the one the claims table shows."""
  cals = list(cals)
  cals = [c for c in cals if c.source != DIVERGED] or cals
  key = lambda c: (math.isfinite(c.power), c.power if math.isfinite(c.power) else 0.0)
  return min(cals, key=key) if cals else None


def seeds_for(noise: float, effect: float, kind: str = "pair", *args, target: float = MIN_POWER,
              most: int = 12) -> int | None:
  """The fewest seeds a side (2..most) at which the rule's power reaches `target`."""
  for n in range(2, most + 1):
    if calibrate(kind, noise, n, *(args or (effect,))).power >= target:
      return n
  return None


def seeds_to_power(c: Calibration, target: float = MIN_POWER, most: int = 64) -> int | None:
  """The fewest seeds a side (both sides alike, from the present count) at which `c`'s
  `TWO_ARMS` rule reaches `target` power at `c`'s measured noises and declared effect (power
  grows with n: doubled, then bisected); None for another kind, an unknown noise, or past
  `most`."""
  sb = c.noise_b if np.isfinite(c.noise_b) else c.noise  # NaN: as side A (`Calibration`)
  if not (c.kind in TWO_ARMS and np.isfinite(c.noise) and np.isfinite(sb)
          and (c.noise > 0 or sb > 0)):
    return None
  ok = lambda n: calibrate(c.kind, c.noise, n, c.effect, n_b=n, noise_b=sb).power >= target
  lo = hi = max(c.n, c.n_b, 2)
  while not ok(hi):
    if hi >= most:
      return None
    lo, hi = hi, min(2 * hi, most)
  while hi - lo > 1:  # power(lo) < target <= power(hi), or lo == hi at the start
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if ok(mid) else (mid, hi)
  return hi


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
