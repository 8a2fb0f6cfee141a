"""Group-sequential seeds: a comparison still open after its first seeds gets more, up to a cap.

Looks at n_1 < … < n_K seeds (n_K the cap). At look k, with the per-seed gaps' mean d̄ and
standard error se, a difference is decided when |d̄/se| > c_k; with a margin m, equivalence is
shown when d̄ + e_k·se ≤ m and d̄ − e_k·se ≥ −m (TOST at e_k); else the next look, and at the
cap "not separable". A decided comparison gets no more seeds (`until_decided`: the same for
the reps of a time bound, `pergrad.bounds`). The critical values spend α = 0.05 of each
wrong call over the looks:

  bonferroni      c_k = t_{n_k−1}(1 − α/2K), e_k = t_{n_k−1}(1 − α/K) (the union bound)
  pocock          one nominal level at every look
  obrien_fleming  nominal z-levels C·√(n_K/n_k): strict early, near α at the cap

pocock's level and obrien_fleming's C are found by bisection on DRAWS simulated sequences of
normal gaps. Under a true gap of 0 (a false difference) or ±m (a false equivalence) the t
statistics do not depend on the noise, so one calibration serves every sd; it aims at
`CALIBRATED` < α, leaving room for its Monte Carlo error.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from pergrad import bounds
from pergrad.analysis.decide import (
  ALPHA,
  EQUIVALENT,
  LOSS,
  NONINFERIOR,
  NOT_SEPARABLE,
  WIN,
  WORSE,
)

SPENDINGS = ("bonferroni", "pocock", "obrien_fleming")
READING = ("read by a two-look Pocock design whose overall false-alarm rate is <= 5%: every "
           "look, the first included, at the design's critical t (wider than one look's 95% "
           "interval; the interval shown is the design's), a pair short of the first look's "
           "seeds not separable")
DRAWS = 100000
CALIBRATED = 0.9 * ALPHA


@dataclasses.dataclass(frozen=True)
class Design:
  """Looks (seeds at each) and their critical t values: two-sided for a difference (`crit`),
  one-sided each way for equivalence (`crit_equiv`)."""

  looks: tuple
  spending: str
  crit: tuple
  crit_equiv: tuple

  @property
  def cap(self) -> int:
    return self.looks[-1]


def looks_between(first: int, cap: int, k: int) -> tuple:
  """k looks (fewer where they coincide) from `first` to `cap` seeds, evenly spaced."""
  if not 2 <= first <= cap or k < 1:
    raise ValueError(f"looks_between: first {first}, cap {cap}, k {k}; give 2 <= first <= cap, "
                     "k >= 1")
  return tuple(sorted({int(round(x)) for x in np.linspace(first, cap, k)}))


def _t_stats(draws: int, looks: tuple, seed: int = 0) -> np.ndarray:
  """draws × looks of d̄/se of standard normal gaps, the looks nested (one sequence a row)."""
  z = np.random.default_rng(seed).standard_normal((draws, looks[-1]))
  n = np.array(looks)
  s1, s2 = np.cumsum(z, 1)[:, n - 1], np.cumsum(z**2, 1)[:, n - 1]
  mean = s1 / n
  sd = np.sqrt(np.maximum(s2 - n * mean**2, 0) / (n - 1))
  return mean / (sd / np.sqrt(n))


def _levels(spending: str, theta: float, looks: tuple) -> np.ndarray:
  """Nominal levels per look and tail for parameter theta (pocock: the level; OBF: C)."""
  n = np.array(looks, float)
  if spending == "pocock":
    return np.full(len(n), theta)
  return stats.norm.sf(theta * np.sqrt(n[-1] / n))


def _crit(levels, looks) -> np.ndarray:
  return stats.t.isf(levels, np.array(looks) - 1)


def _solve(spending: str, looks: tuple, t_DxK: np.ndarray, sides: int) -> np.ndarray:
  """Critical values whose simulated rate of crossing (|T| for sides 2, T < −c for 1) at any
  look is `CALIBRATED`, by bisection on the spending's parameter."""
  def rate(theta):
    c = _crit(_levels(spending, theta, looks), looks)
    hit = np.abs(t_DxK) > c if sides == 2 else t_DxK < -c
    return float(hit.any(1).mean())
  lo, hi = (1e-6, ALPHA) if spending == "pocock" else (1.0, 12.0)  # rate rises with lo→hi
  if spending != "pocock":
    lo, hi = hi, lo
  for _ in range(50):
    mid = 0.5 * (lo + hi)
    lo, hi = (mid, hi) if rate(mid) <= CALIBRATED else (lo, mid)
  return _crit(_levels(spending, lo, looks), looks)


@functools.lru_cache(maxsize=32)
def design(looks: tuple, spending: str = "pocock") -> Design:
  """The `Design` of `looks` (increasing seed counts ≥ 2) under `spending`."""
  looks = tuple(int(n) for n in looks)
  if spending not in SPENDINGS or not looks or looks[0] < 2 or list(looks) != sorted(set(looks)):
    raise ValueError(f"design: looks {looks}, spending {spending!r}; give increasing seed "
                     f"counts >= 2 and one of {SPENDINGS}")
  k = len(looks)
  if spending == "bonferroni" or k == 1:
    c, e = _crit(np.full(k, ALPHA / (2 * k)), looks), _crit(np.full(k, ALPHA / k), looks)
  else:
    t = _t_stats(DRAWS, looks)
    c, e = _solve(spending, looks, t, 2), _solve(spending, looks, t, 1)
  return Design(looks, spending, tuple(map(float, c)), tuple(map(float, e)))


def read(d, des: Design, margin: float = math.nan) -> tuple[str, int]:
  """(outcome, seeds to add) for the gaps `d` (A's advantage, seeds in order) at the design's
  last look ≤ len(d): win/loss/equivalent (add 0), else the seeds to the next look, or "not
  separable" at the cap."""
  d = np.asarray(d, float)
  at = [i for i, n in enumerate(des.looks) if n <= len(d)]
  if not at:
    return NOT_SEPARABLE, des.looks[0] - len(d)
  k = at[-1]
  out = _read_at(d[None, :des.looks[k]], des.crit[k], des.crit_equiv[k], margin)[0]
  if out != NOT_SEPARABLE or k == len(des.looks) - 1:
    return out, 0
  return out, des.looks[k + 1] - len(d)


def look(d, des: Design) -> tuple[int, float, float] | None:
  """(k, d̄, se) of the gaps `d` at the design's last look k ≤ len(d) (its first looks[k]
  seeds); None before the first look."""
  d = np.asarray(d, float)
  at = [i for i, n in enumerate(des.looks) if n <= len(d)]
  if not at:
    return None
  x = d[:des.looks[at[-1]]]
  return at[-1], float(x.mean()), float(x.std(ddof=1) / math.sqrt(len(x)))


def read_noninferior(d, des: Design, margin: float) -> tuple[str, int]:
  """(outcome, seeds to add) for A's advantage gaps `d` against a loss of `margin`, at the
  design's last look ≤ len(d): non-inferior when d̄ − e_k·se ≥ −margin (one-sided at the
  design's equivalence critical t, calibrated one-sided: `design`), worse when d̄ + c_k·se <
  −margin (its difference critical t); else the seeds to the next look, "not separable" at
  the cap."""
  d = np.asarray(d, float)
  if (at := look(d, des)) is None:
    return NOT_SEPARABLE, des.looks[0] - len(d)
  k, m, se = at
  out = (NONINFERIOR if m - des.crit_equiv[k] * se >= -margin else
         WORSE if m + des.crit[k] * se < -margin else NOT_SEPARABLE)
  if out != NOT_SEPARABLE or k == len(des.looks) - 1:
    return out, 0
  return out, des.looks[k + 1] - len(d)


def _read_at(d_DxN, crit: float, crit_equiv: float, margin: float) -> np.ndarray:
  n = d_DxN.shape[1]
  m, se = d_DxN.mean(1), d_DxN.std(1, ddof=1) / math.sqrt(n)
  with np.errstate(divide="ignore", invalid="ignore"):
    t = np.where(se > 0, m / se, np.sign(m) * np.inf)
  out = np.full(len(m), NOT_SEPARABLE, dtype=object)
  if math.isfinite(margin):
    out[(m + crit_equiv * se <= margin) & (m - crit_equiv * se >= -margin)] = EQUIVALENT
  out[t > crit] = WIN
  out[t < -crit] = LOSS
  return out


def simulate(des: Design, gap: float, sd: float, margin: float = math.nan,
             draws: int = 20000, seed: int = 1) -> dict:
  """The design run on `draws` comparisons of true advantage `gap` and paired sd `sd`:
  {win, loss, equivalent, not separable: their rates; mean_seeds: seeds run, on average}."""
  d = gap + sd * np.random.default_rng(seed).standard_normal((draws, des.cap))
  out = np.full(draws, NOT_SEPARABLE, dtype=object)
  seeds = np.full(draws, des.cap)
  open_ = np.ones(draws, bool)
  for n, c, e in zip(des.looks, des.crit, des.crit_equiv, strict=True):
    r = _read_at(d[open_, :n], c, e, margin)
    idx = np.flatnonzero(open_)
    done = r != NOT_SEPARABLE
    out[idx[done]], seeds[idx[done]] = r[done], n
    open_[idx[done]] = False
  rates = {k: float(np.mean(out == k)) for k in (WIN, LOSS, EQUIVALENT, NOT_SEPARABLE)}
  return {**rates, "mean_seeds": float(seeds.mean())}


def equivalence_rates(des: Design, sd: float, margin: float) -> tuple[float, float]:
  """A reading of absence by `des` over its looks at paired sd `sd` (`simulate`): (shown
  equivalent | true gap = margin: the false equivalence, shown equivalent | gap 0: the power)."""
  eq = lambda gap: simulate(des, gap, sd, margin)[EQUIVALENT]
  return eq(margin), eq(0.0)


def until_decided(draw: Callable[[int], np.ndarray], bound: float, first: int = 5,
                  cap: int = 41, looks: int = 4, spending: str = "pocock") -> bounds.Location:
  """Reps from `draw(k)` (k more paired ratios) until `bounds.RULE` decides at a look of the
  `design` from `first` to `cap` reps (each look at its one-sided critical value, so neither
  wrong call exceeds 5 % over all the looks), or the cap: its last `Location`."""
  des = design(looks_between(first, cap, looks), spending)
  r = np.empty(0)
  for n, crit in zip(des.looks, des.crit_equiv, strict=True):
    r = np.concatenate([r, np.asarray(draw(n - len(r)), float)])
    loc = bounds.location(r, bound, crit)
    if loc.verdict != bounds.UNDETERMINED:
      break
  return loc


def bound_rates(des: Design, log_sd: float, ratio: float, bound: float,
                draws: int = 20000) -> dict:
  """`until_decided`'s rates over the looks of `des`, at a true location `ratio` and per-rep
  log-ratio sd `log_sd`: {holds, fails, undetermined, mean_reps} (fixed seed)."""
  x = math.log(ratio) + log_sd * np.random.default_rng(0).standard_normal((draws, des.cap))
  out = np.full(draws, bounds.UNDETERMINED, dtype=object)
  reps = np.full(draws, des.cap)
  open_ = np.ones(draws, bool)
  for n, c in zip(des.looks, des.crit_equiv, strict=True):
    idx = np.flatnonzero(open_)
    v = bounds._judge(x[idx, :n], bound, c)[3]  # the one home of the rule  # noqa: SLF001
    done = v != bounds.UNDETERMINED
    out[idx[done]], reps[idx[done]] = v[done], n
    open_[idx[done]] = False
  return {**{k: float(np.mean(out == k)) for k in (bounds.HOLDS, bounds.FAILS,
                                                   bounds.UNDETERMINED)},
          "mean_reps": float(reps.mean())}
