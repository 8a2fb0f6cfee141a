"""Batch-size schedules: which batch size B each update uses.

    sched = plan.batch                  # pergrad.config.batch.BatchSchedule
    batch_size = next_batch_size(sched, k, seen, batch_size, b_simple)  # before update k + 1

A run spends E = train.steps x B_max examples (B_max = data.batch_size); a schedule spends
them in more, smaller updates and stops at the first update that reaches E; the lr is indexed
by examples seen (`pergrad.optim.schedule`), whatever the batch schedule. Kinds:

    fixed    B = B_max
    linear   B = floor_sizes(start + (B_max − start) · min(seen / ramp_examples, 1))
    gns      every `every` updates: B = max(B, floor_sizes(gns_factor · B_simple))
    seesaw   B = floor_sizes(start · 2^i), i = #{p_i ≤ seen} (`pergrad.config.batch`)

floor_sizes(x) is the largest allowed size ≤ x (at least the smallest); each allowed size
has its own train step, compiled before the loop.
"""

from __future__ import annotations

import math
from typing import Callable

from pergrad.config.batch import BatchSchedule


def next_batch_size(sched: BatchSchedule, k: int, seen: int, last_batch_size: int,
                    b_simple: Callable[[], float]) -> int:
  """B of update k + 1, after k updates that saw `seen` examples, the last of size
  `last_batch_size` (0 before the first); `b_simple()` reads the tracker (gns decisions
  only).

  linear is Gray et al.'s ramp in tokens (seen = examples before the update); gns reads
  B_simple from the GNS tracker's state (`gns_metrics`, group gns_group), starts at `start`,
  never decreases, and keeps B on a non-finite or non-positive B_simple. A decision depends only
  on (k, seen, the last update's B, the state after update k), all of which a checkpoint holds
  (`TrainState.batch_size`), so a resumed run makes the same decisions.
  """
  if sched.kind == "fixed":
    return sched.max_batch_size
  if sched.kind == "linear":
    frac = min(seen / sched.ramp_examples, 1.0)
    return sched.floor(sched.start + (sched.max_batch_size - sched.start) * frac)
  if sched.kind == "seesaw":
    return sched.floor(sched.start * 2 ** sum(seen >= p for p in sched.decay_examples))
  if last_batch_size == 0:
    return sched.start
  if k % sched.every:
    return last_batch_size
  b = b_simple()
  if not (math.isfinite(b) and b > 0):
    return last_batch_size
  return max(last_batch_size, sched.floor(sched.gns_factor * b))
