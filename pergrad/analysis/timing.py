"""A timing bound judged on the location of the paired ratio, not on its spread.

Interleaved reps give paired ratios r_i = t_new,i / t_base,i. On x_i = log r_i (n reps, mean x̄,
sd s) the location is the geometric mean exp(x̄), its interval exp(x̄ ± t_{n−1}(1 − a)·s/√n)
with a = 0.05 a side. Against a bound (ratio ≤ bound):

  holds         the interval's upper end is under the bound (a location at the bound is
                called holding ≤ 5 % of the time)
  fails         its lower end is over the bound (≤ 5 % when the location is at the bound)
  undetermined  otherwise

Unlike a quantile of the per-rep ratios, the interval narrows as 1/√n, so more reps make the
reading more certain. `until_decided` adds reps in rounds up to a cap, each look at a
`sequential` design's one-sided critical value, so neither wrong call exceeds 5 % over all
its looks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from pergrad.analysis import sequential

HOLDS, FAILS, UNDETERMINED = "holds", "fails", "undetermined"
ALPHA = 0.05  # a side
RULE = ("a time bound holds when the upper end of the 90% t-interval of the geometric mean of "
        "the paired per-rep ratios (t on their logs) is under it, fails when its lower end is "
        "over it, else undetermined")


@dataclasses.dataclass(frozen=True)
class Location:
  """The geometric mean of paired ratios and its interval; `verdict` against `bound`."""

  ratio: float
  lo: float
  hi: float
  n: int
  log_sd: float
  bound: float
  verdict: str

  def row(self) -> dict:
    return dataclasses.asdict(self)

  def text(self) -> str:
    return (f"{self.verdict}: {self.ratio:.3f}× [{self.lo:.3f}, {self.hi:.3f}] (n={self.n}) "
            f"vs ≤ {self.bound:g}×")


def _judge(x_DxN, bound: float, crit: float | None = None):
  """(geometric mean, lo, hi, verdict) along the last axis of log ratios; `crit` the t critical
  value (default t_{n−1}(1 − ALPHA))."""
  x = np.asarray(x_DxN, float)
  n = x.shape[-1]
  c = stats.t.isf(ALPHA, n - 1) if crit is None else crit
  m, half = x.mean(-1), c * x.std(-1, ddof=1) / math.sqrt(n)
  lb = math.log(bound)
  verdict = np.where(m + half < lb, HOLDS, np.where(m - half > lb, FAILS, UNDETERMINED))
  return np.exp(m), np.exp(m - half), np.exp(m + half), verdict


def location(ratios, bound: float, crit: float | None = None) -> Location:
  """`RULE` on paired per-rep ratios (all > 0; ≥ 2 of them)."""
  r = np.asarray(ratios, float)
  if len(r) < 2 or not (np.isfinite(r) & (r > 0)).all():
    return Location(math.nan, math.nan, math.nan, len(r), math.nan, float(bound), UNDETERMINED)
  g, lo, hi, v = _judge(np.log(r), bound, crit)
  return Location(float(g), float(lo), float(hi), len(r), float(np.std(np.log(r), ddof=1)),
                  float(bound), str(v))


def power(log_sd: float, n: int, ratio: float, bound: float, draws: int = 20000) -> dict:
  """`RULE`'s rates at a true location `ratio` and per-rep log-ratio sd `log_sd`, n reps:
  {holds, fails, undetermined} (fixed seed)."""
  x = math.log(ratio) + log_sd * np.random.default_rng(0).standard_normal((draws, n))
  v = _judge(x, bound)[3]
  return {k: float(np.mean(v == k)) for k in (HOLDS, FAILS, UNDETERMINED)}


def median_verdict(verdicts) -> str:
  """The median of several shapes' verdicts (holds < undetermined < fails; of an even count,
  the two middle ones where they agree, else undetermined)."""
  order = (HOLDS, UNDETERMINED, FAILS)
  v = sorted(verdicts, key=order.index)
  if not v:
    return UNDETERMINED
  lo, hi = v[(len(v) - 1) // 2], v[len(v) // 2]
  return lo if lo == hi else UNDETERMINED


def combine(verdicts) -> str:
  """A bound of several parts (time, FLOPs, peak): fails when one fails, holds when all hold."""
  v = list(verdicts)
  return FAILS if FAILS in v else HOLDS if v and all(x == HOLDS for x in v) else UNDETERMINED


def until_decided(draw: Callable[[int], np.ndarray], bound: float, first: int = 5,
                  cap: int = 41, looks: int = 4, spending: str = "pocock") -> Location:
  """Reps from `draw(k)` (k more paired ratios) until `RULE` decides at a look of the
  `sequential.design` from `first` to `cap` reps, or the cap: its last `Location`."""
  des = sequential.design(sequential.looks_between(first, cap, looks), spending)
  r = np.empty(0)
  for n, crit in zip(des.looks, des.crit_equiv, strict=True):
    r = np.concatenate([r, np.asarray(draw(n - len(r)), float)])
    loc = location(r, bound, crit)
    if loc.verdict != UNDETERMINED:
      break
  return loc
