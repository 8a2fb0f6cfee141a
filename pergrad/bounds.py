"""A ratio against its bound (`BOUND`): exact for a FLOP or memory ratio, on the quartiles of
paired per-rep ratios for a time, so that timing noise reads "within noise", not a verdict.
NumPy only: the benchmarks (`pergrad.bench`) and the analysis (`pergrad.analysis.rules`)
judge a bound with this one function."""

from __future__ import annotations

import math

import numpy as np

UNDETERMINED = "undetermined"
HOLDS, FAILS, WITHIN = "holds", "fails", "within noise"
BOUND = ("a FLOP or memory ratio holds when ≤ its bound; a time ratio is judged on the "
         "quartiles (lower q25, upper q75 order statistics) of its paired per-rep ratios "
         "against max(bound, the baseline's own self-ratio q75): holds when q75 ≤ that, fails "
         "when q25 > it, else within noise")


def quartiles(x, axis=None):
  """(q25, q75) as order statistics: a ratio exactly at a bound fails ≤ 5 % from 11 reps on."""
  x = np.asarray(x, float)
  return (np.percentile(x, 25, axis=axis, method="lower"),
          np.percentile(x, 75, axis=axis, method="higher"))


def bound(value: float, limit: float, q25: float = math.nan, q75: float = math.nan,
          self_q75: float = math.nan) -> str:
  """`BOUND` (exact when no quartiles are given)."""
  if not (np.isfinite(value) or np.isfinite(q75)):
    return UNDETERMINED
  if not np.isfinite(q75):
    return HOLDS if value <= limit else FAILS
  lim = max(limit, self_q75) if np.isfinite(self_q75) else limit
  return HOLDS if q75 <= lim else FAILS if q25 > lim else WITHIN
