"""`StatsOptions`: how a backend computes a `StatsRequest` (never what it computes).

Every field changes cost (time, memory, FLOP count) only: the statistics are the same up
to float rounding whatever the options. `pergrad.stats.compute` passes one to the backend
it dispatches to; the default is what training uses.
"""

from __future__ import annotations

import dataclasses

DENSE_METHODS = ("auto", "simultaneous", "separate")
VMAP_LAYOUTS = ("last", "first")


@dataclasses.dataclass(frozen=True)
class StatsOptions:
  """How to compute the statistics.

  Attributes:
    microbatch_size: the dispatcher runs the backend on chunks of this many examples,
      one after the other, and merges them (bounds the memory of per-example quantities;
      a positive divisor of B, checked by the dispatcher); None: the whole batch at
      once. Backends see one chunk as their batch.
    dense_method: surgery, per-example statistics of dense and normalization layers:
      "auto" (`surgery.dense.simultaneous_is_used`), "simultaneous" wherever it applies
      whatever the cost, "separate" never (autodiff's parameter gradient beside the tap's
      materialised or Gram statistics). With per-example clipping (`surgery.clip.keeps_g`):
      "auto" keeps a dense kernel's per-example gradient where it is no larger than its
      factors A and Δ (fewer FLOPs too), else the factors; "simultaneous" keeps the
      per-example gradients whatever their size; "separate" keeps the factors only.
    scan_unroll: surgery, `unroll` of the scans over token chunks and examples; True
      (fully unrolled) makes XLA's cost analysis, which counts a loop body once, count
      every trip (benchmarks of FLOPs).
    vmap_layout: vmap, where the example axis of the per-example gradients goes before
      the reduction: "last" (reduced by a sum) or "first" (by a matmul with ones).
  """

  microbatch_size: int | None = None
  dense_method: str = "auto"
  scan_unroll: int | bool = 1
  vmap_layout: str = "last"

  def __post_init__(self):
    if self.dense_method not in DENSE_METHODS:
      raise ValueError(f"dense_method={self.dense_method!r}; choose one of {DENSE_METHODS}.")
    if self.vmap_layout not in VMAP_LAYOUTS:
      raise ValueError(f"vmap_layout={self.vmap_layout!r}; choose one of {VMAP_LAYOUTS}.")
    if not (self.scan_unroll is True or (isinstance(self.scan_unroll, int)
                                         and self.scan_unroll >= 1)):
      raise ValueError(f"scan_unroll={self.scan_unroll!r} must be a positive integer or True.")
