"""Batch-size schedules: which batch size B each update uses.

    sched = BatchSchedule(kind="linear", sizes=(8, 16, 32), start=8, ramp_examples=4096)
    B = sched.next_size(k, seen, current, b_simple)   # before update k + 1

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

floor_sizes(x) is the largest allowed size ≤ x (at least the smallest). Each allowed
size has its own compiled train step (buckets, compiled before the loop), so changing B
never compiles. A decision depends only on (k, seen, the current B, the state after
update k), all of which a checkpoint holds (the current B is the last update's,
`TrainState.batch_size`), so a resumed run makes the same decisions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from pergrad.fields import Choice
from pergrad.optim.configs import LrScaling


class BatchKind(Choice):
  fixed = "fixed"  # data.batch_size every update
  linear = "linear"  # a linear ramp in tokens from batch.start to data.batch_size
  gns = "gns"  # B = gns_factor x the tracked B_simple (needs stats.gns), never decreasing


KINDS = BatchKind.values()


@dataclasses.dataclass(frozen=True)
class BatchConfig:
  """The batch-size schedule's settings (the `batch` config node). The run's length stays
  train.steps x data.batch_size examples; a schedule spends them in more, smaller updates,
  and the learning-rate schedule is indexed by examples seen, so it does not depend on it."""

  kind: BatchKind = BatchKind.fixed
  # Allowed sizes (one compiled step each), ascending, the largest = data.batch_size;
  # (): powers of two from batch.start up to data.batch_size.
  sizes: tuple[int, ...] = ()
  start: int = 8  # the first updates' size (linear and gns)
  ramp_tokens: int = 0  # linear: tokens over which B grows from start to data.batch_size
  gns_factor: float = 1.0  # gns: target B = gns_factor x B_simple of gns_group
  gns_group: str = "total"  # gns: which tracked group's B_simple (total, norm, ...)
  every: int = 25  # gns: updates between decisions (each reads the tracker: one host sync)
  # Learning rate when B < data.batch_size: lr x (B / data.batch_size)^k, k = 0, 1/2, 1.
  lr_scaling: LrScaling = LrScaling.none

  def __post_init__(self):
    object.__setattr__(self, "kind", BatchKind.check(self.kind, "batch.kind"))
    object.__setattr__(self, "lr_scaling", LrScaling.check(self.lr_scaling, "batch.lr_scaling"))
    object.__setattr__(self, "sizes", tuple(self.sizes))
    sizes = self.sizes
    if sizes and (list(sizes) != sorted(set(sizes)) or sizes[0] < 1):
      raise ValueError(f"batch.sizes={list(sizes)} must be distinct positive sizes in "
                       "ascending order.")
    if self.start < 1 or self.ramp_tokens < 0:
      raise ValueError(f"batch.start={self.start} must be >= 1 and batch.ramp_tokens="
                       f"{self.ramp_tokens} >= 0.")
    if not self.gns_factor > 0 or self.every < 1:
      raise ValueError(f"batch.gns_factor={self.gns_factor} must be > 0 and batch.every="
                       f"{self.every} >= 1.")


@dataclasses.dataclass(frozen=True)
class BatchSchedule(BatchConfig):
  """A `BatchConfig` resolved for a run (`pergrad.configure`): the allowed sizes listed
  (the last is B_max) and the linear ramp in examples."""

  sizes: tuple[int, ...] = (32,)
  start: int = 32
  ramp_examples: int = 0  # linear: ceil(ramp_tokens / data.seq_len)

  @property
  def max_size(self) -> int:
    return self.sizes[-1]

  def floor(self, x: float) -> int:
    """The largest allowed size ≤ x (the smallest size when x is below it)."""
    fits = [b for b in self.sizes if b <= x]
    return fits[-1] if fits else self.sizes[0]

  def first_size(self) -> int:
    return self.max_size if self.kind == "fixed" else self.start

  def next_size(self, k: int, seen: int, current: int,
                b_simple: Callable[[], float]) -> int:
    """B of update k + 1, after k updates that saw `seen` examples, the last of size
    `current` (0 before the first); `b_simple()` reads the tracker (gns decisions only)."""
    if self.kind == "fixed":
      return self.max_size
    if self.kind == "linear":
      frac = min(seen / self.ramp_examples, 1.0)
      return self.floor(self.start + (self.max_size - self.start) * frac)
    if current == 0:
      return self.start
    if k % self.every:
      return current
    b = b_simple()
    if not (math.isfinite(b) and b > 0):
      return current
    return max(current, self.floor(self.gns_factor * b))


def default_sizes(start: int, max_size: int) -> tuple[int, ...]:
  """start, 2·start, 4·start, ... below max_size, then max_size."""
  sizes, b = [], start
  while b < max_size:
    sizes.append(b)
    b *= 2
  return (*sizes, max_size)


def check(sched: BatchSchedule, *, n_devices: int, microbatch: int | None,
          gns_groups: tuple[str, ...] | None) -> None:
  """One ValueError line naming the key and the fix for a schedule that cannot run.

  gns_groups: the groups the GNS tracker will hold (None: stats.gns is off).
  """
  sizes = sched.sizes
  if sched.kind == "fixed":
    return
  if sched.start not in sizes:
    raise ValueError(f"batch.start={sched.start} is not one of batch.sizes={list(sizes)}; "
                     "add it there or change batch.start.")
  for b in sizes:
    if b % n_devices:
      raise ValueError(f"batch.sizes holds {b}, not divisible by the {n_devices} devices; "
                       f"use multiples of {n_devices}.")
    if microbatch and b % microbatch:
      raise ValueError(f"batch.sizes holds {b}, not divisible by stats.microbatch_size="
                       f"{microbatch}; use multiples of it or another microbatch size.")
  if sched.kind == "linear" and sched.ramp_examples < 1:
    raise ValueError("batch.kind=linear needs batch.ramp_tokens > 0 (the tokens over which "
                     "B grows to data.batch_size), e.g. half the run's tokens.")
  if sched.kind == "gns":
    if gns_groups is None:
      raise ValueError("batch.kind=gns reads the tracked gradient noise scale; set "
                       "stats.gns=true (e.g. stats=gns or stats=gns_norm).")
    if sched.gns_group not in gns_groups:
      raise ValueError(f"batch.gns_group={sched.gns_group} is not tracked (the tracker "
                       f"holds {list(gns_groups)}); choose one of them.")
