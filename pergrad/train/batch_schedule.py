"""Batch-size schedules: which batch size B each update uses.

    sched = plan.batch                  # pergrad.config.batch.BatchSchedule
    batch_size = next_batch_size(sched, k, seen, batch_size, b_simple)  # before update k + 1

The run's length is a number of examples, E = train.steps x B_max (B_max =
data.batch_size, the largest allowed size): a fixed run makes train.steps updates of
B_max; a schedule spends the same examples in more, smaller updates, and stops at the
first update that reaches E. The learning rate is indexed by examples seen
(`pergrad.optim.schedule.scale_by_token_schedule`), so its schedule does not depend on
the batch schedule. Kinds:

    fixed    B = B_max
    linear   B = floor_sizes(start + (B_max − start) · min(seen / ramp_examples, 1))
             (Gray et al.'s linear ramp in tokens; seen = examples before the update)
    gns      every `every` updates: B = max(B, floor_sizes(gns_factor · B_simple)),
             B_simple read from the GNS tracker's state (`gns_metrics`, group gns_group);
             it starts at `start` and never decreases (a non-finite or non-positive
             B_simple, early in training, keeps B)
    seesaw   B = floor_sizes(start · 2^i), i = #{p_i ≤ seen}: B doubles at each point p_i
             (examples) where the step lr schedule halves the lr (`pergrad.config.batch`:
             Seesaw, and its lr rule)

floor_sizes(x) is the largest allowed size ≤ x (at least the smallest). Each allowed
size has its own compiled train step (buckets, compiled before the loop), so changing B
never compiles. A decision depends only on (k, seen, the last_batch_size B, the state after
update k), all of which a checkpoint holds (the last_batch_size B is the last update's,
`TrainState.batch_size`), so a resumed run makes the same decisions.
"""

from __future__ import annotations

import math
from typing import Callable

from pergrad.config.batch import BatchSchedule


def next_batch_size(sched: BatchSchedule, k: int, seen: int, last_batch_size: int,
                    b_simple: Callable[[], float]) -> int:
  """B of update k + 1, after k updates that saw `seen` examples, the last of size
  `last_batch_size` (0 before the first); `b_simple()` reads the tracker (gns decisions
  only)."""
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
