"""A ratio against its bound (ratio ≤ bound): exact for a FLOP or memory ratio, on the location
of the paired per-rep ratios for a time. NumPy/SciPy only: the one judge of the benchmarks
(`pergrad.bench`) and the analysis (`pergrad.analysis`).

Interleaved reps give paired ratios r_i = t_new,i / t_base,i. On x_i = log r_i (n reps, mean x̄,
sd s) the location is the geometric mean exp(x̄), its interval exp(x̄ ± t_{n−1}(1 − a)·s/√n)
with a = 0.05 a side:

  holds         the interval's upper end is under the bound (a location at the bound is
                called holding ≤ 5 % of the time)
  fails         its lower end is over the bound (≤ 5 % when the location is at the bound)
  undetermined  otherwise

The interval narrows as 1/√n, so more reps make the reading more certain (a quantile of the
r_i would not). A bound is never tighter than the baseline timed against itself: `floored`
raises it to the upper end of the self-ratio's interval. `quartiles` describes the r_i'
spread; no verdict rests on it.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

HOLDS, FAILS, UNDETERMINED = "holds", "fails", "undetermined"
ALPHA = 0.05  # a side
RULE = ("a time bound holds when the upper end of the 90% t-interval of the geometric mean of "
        "the paired per-rep ratios (t on their logs) is under it, fails when its lower end is "
        "over it, else undetermined")
BOUND = (f"a FLOP or memory ratio holds when ≤ its bound; {RULE}, the bound raised to the "
         "upper end of the baseline's own self-ratio interval where it is timed against itself")


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
  value (default t_{n−1}(1 − ALPHA)); no positive bound: undetermined."""
  x = np.asarray(x_DxN, float)
  n = x.shape[-1]
  c = stats.t.isf(ALPHA, n - 1) if crit is None else crit
  m, half = x.mean(-1), c * x.std(-1, ddof=1) / math.sqrt(n)
  lb = math.log(bound) if bound > 0 else math.nan
  verdict = np.where(m + half < lb, HOLDS, np.where(m - half > lb, FAILS, UNDETERMINED))
  return np.exp(m), np.exp(m - half), np.exp(m + half), verdict


def location(ratios, bound: float = math.nan, crit: float | None = None) -> Location:
  """`RULE` on paired per-rep ratios (all > 0; ≥ 2 of them); without a bound, the location
  alone (verdict undetermined)."""
  r = np.asarray(ratios, float)
  if len(r) < 2 or not (np.isfinite(r) & (r > 0)).all():
    return Location(math.nan, math.nan, math.nan, len(r), math.nan, float(bound), UNDETERMINED)
  g, lo, hi, v = _judge(np.log(r), bound, crit)
  return Location(float(g), float(lo), float(hi), len(r), float(np.std(np.log(r), ddof=1)),
                  float(bound), str(v))


def floored(bound: float, self_ratios) -> float:
  """max(bound, the upper end of the self-ratios' interval); `bound` without a finite one."""
  hi = location(self_ratios).hi if self_ratios is not None else math.nan
  return max(bound, hi) if np.isfinite(hi) else bound


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


def bound(value: float, limit: float) -> str:
  """An exact ratio (FLOPs, memory) against `limit`: holds when ≤ it (NaN: undetermined)."""
  if not np.isfinite(value):
    return UNDETERMINED
  return HOLDS if value <= limit else FAILS


def quartiles(x, axis=None):
  """(q25, q75) as order statistics (lower, higher): a description of spread, never judged."""
  x = np.asarray(x, float)
  return (np.percentile(x, 25, axis=axis, method="lower"),
          np.percentile(x, 75, axis=axis, method="higher"))
