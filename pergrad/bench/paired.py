"""Paired time ratios and the choice of baseline (numpy only: no JAX).

A benchmark times each variant right beside its baseline: after one untimed pair, the
sequence B V B V ... V B (n variant reps bracketed by n + 1 baseline reps), so that every
timed call follows a call of the other program and drift and contention hit both alike;
rep i gives the paired ratio r_i = t_variant,i / t_base,i (t_base,i: the mean of its two
neighbours, `bracketed`). Reported (`summary`): the median of the r_i, and their location
(geometric mean) with its 90 % interval, on which `pergrad.bounds.location` judges a time
bound. The baseline of a shape is the fastest of several programs computing the same
gradient (`fastest`: least median time over interleaved reps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pergrad import bounds


def paired_ratios(times: Sequence[float], base_times: Sequence[float]) -> list[float]:
  """r_i = times[i] / base_times[i]; ValueError unless both have the same positive length."""
  if len(times) != len(base_times) or not len(times):
    raise ValueError(f"paired ratios need one baseline time per rep: got {len(times)} variant "
                     f"and {len(base_times)} baseline times; time them in the same reps.")
  return [float(t) / float(t0) for t, t0 in zip(times, base_times, strict=True)]


def summary(xs: Sequence[float]) -> dict:
  """{"median", "location", "lo", "hi", "n"} of positive xs: their median and
  `pergrad.bounds.location` (geometric mean, its 90 % interval; NaN under 2 of them)."""
  loc = bounds.location(xs)
  return dict(median=float(np.median(np.asarray(xs, float))), location=loc.ratio, lo=loc.lo,
              hi=loc.hi, n=loc.n)


def fastest(times: Mapping[str, Sequence[float]]) -> str:
  """The name with the least median time (ties: the first in `times`' order)."""
  if not times:
    raise ValueError("no baseline candidate was timed; give at least one.")
  medians = {k: float(np.median(v)) for k, v in times.items()}
  return min(medians, key=lambda k: (medians[k], list(medians).index(k)))


def bracketed(base_times: Sequence[float]) -> list[float]:
  """The baseline time paired with each of n variant reps from the n + 1 baseline reps that
  bracket them (B V B V ... B): the mean of the two neighbours of each variant rep."""
  if len(base_times) < 2:
    raise ValueError(f"bracketing needs n + 1 >= 2 baseline times, got {len(base_times)}.")
  return [(a + b) / 2 for a, b in zip(base_times[:-1], base_times[1:], strict=True)]
