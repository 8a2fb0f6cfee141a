"""Paired time ratios and the choice of baseline (numpy only: no JAX).

A benchmark times each variant right beside its baseline, rep by rep (back to back, the
order alternating), so that drift and contention hit both alike; rep i gives the paired
ratio r_i = t_variant,i / t_base,i. Reported: the median of the r_i and their quartiles
(q25, q75). A time bound b is judged on them:
  holds         q75 ≤ b   (the interquartile range lies below b)
  fails         q25 > b   (it lies above)
  within noise  q25 ≤ b < q75 (it straddles b: the reps cannot tell)
The baseline of a shape is the fastest of several programs computing the same gradient
(`fastest`: least median time over interleaved reps).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

OUTCOMES = ("holds", "fails", "within noise")


def paired_ratios(times: Sequence[float], base_times: Sequence[float]) -> list[float]:
  """r_i = times[i] / base_times[i]; ValueError unless both have the same positive length."""
  if len(times) != len(base_times) or not len(times):
    raise ValueError(f"paired ratios need one baseline time per rep: got {len(times)} variant "
                     f"and {len(base_times)} baseline times; time them in the same reps.")
  return [float(t) / float(t0) for t, t0 in zip(times, base_times, strict=True)]


def quartiles(xs: Sequence[float]) -> dict:
  """{"median", "q25", "q75"} of xs (numpy's linear interpolation)."""
  q25, median, q75 = np.percentile(np.asarray(xs, float), [25, 50, 75])
  return dict(median=float(median), q25=float(q25), q75=float(q75))


def judge(q25: float, q75: float, bound: float) -> str:
  """"holds" | "fails" | "within noise" for a time bound (module docstring)."""
  if q75 <= bound:
    return "holds"
  return "fails" if q25 > bound else "within noise"


def fastest(times: Mapping[str, Sequence[float]]) -> str:
  """The name with the least median time (ties: the first in `times`' order)."""
  if not times:
    raise ValueError("no baseline candidate was timed; give at least one.")
  medians = {k: float(np.median(v)) for k, v in times.items()}
  return min(medians, key=lambda k: (medians[k], list(medians).index(k)))


def interleaved_order(n_variants: int, rep: int) -> list[tuple[int, bool]]:
  """Rep `rep`'s schedule: (variant j, baseline first?) for every j; the order inside a
  pair alternates with j and with the rep, so neither side always runs second."""
  return [(j, (j + rep) % 2 == 0) for j in range(n_variants)]
