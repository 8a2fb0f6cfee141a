"""Batch-size schedule settings (the `batch` node) and the run's frozen `BatchSchedule`.

    sched = resolve(BatchConfig(kind="linear", start=8, ramp_tokens=2**17), max_batch_size=32,
                    seq_len=128, n_devices=1, microbatch=None, gns_groups=None)
    sched.sizes == (8, 16, 32); sched.ramp_examples == 1024

The run's length is train.steps x B_max examples (B_max = data.batch_size, the largest
allowed size); a schedule spends them in more, smaller updates, each allowed size with its
own compiled train step; `pergrad.train.batch_schedule.next_batch_size` picks each update's.
Seesaw (Meterez et al., arXiv 2510.14717; our reading of its abstract): after i of the step
schedule's halving points p_i = d_i · B_max examples, an update takes

    B = floor_sizes(start · 2^i),     lr = schedule(τ) · √(B / start)

so while B doubles the lr falls by 1/√2 a point, and once B reaches B_max by 1/2.

Names: `batch_size` the examples of one update; `max_batch_size` a schedule's largest (B_max,
also the examples of one full-batch step, the unit of train.steps); `sizes` the allowed
sizes; `B` in formulas and shape names (`x_BxT`).
"""

from __future__ import annotations

import dataclasses

from pergrad.fields import Choice
from pergrad.optim.configs import LrScaling


class BatchKind(Choice):
  fixed = "fixed"  # data.batch_size every update
  linear = "linear"  # a linear ramp in tokens from batch.start to data.batch_size
  gns = "gns"  # B = gns_factor x the tracked B_simple (needs stats.gns), never decreasing
  seesaw = "seesaw"  # B doubles (lr x 1/√2) where schedule=step halves the lr (Seesaw)


@dataclasses.dataclass
class BatchConfig:
  """The batch-size schedule's settings. The run's length stays train.steps x
  data.batch_size examples, and the learning-rate schedule is indexed by examples seen,
  so it does not depend on the batch schedule."""

  kind: BatchKind = BatchKind.fixed  # fixed, linear ramp, GNS-guided, or seesaw
  # Allowed sizes (one compiled step each), ascending, the largest = data.batch_size;
  # (): powers of two from batch.start up to data.batch_size.
  sizes: tuple[int, ...] = ()
  start: int = 8  # the first updates' size (linear, gns and seesaw)
  ramp_tokens: int = 0  # linear: tokens over which B grows from start to data.batch_size
  gns_factor: float = 1.0  # gns: target B = gns_factor x B_simple of gns_group
  gns_group: str = "total"  # gns: which tracked group's B_simple (total, norm, ...)
  every: int = 25  # gns: updates between decisions (each reads the tracker: one host sync)
  # Learning rate when B < data.batch_size: lr x (B / data.batch_size)^k, k = 0, 1/2, 1
  # (seesaw: lr x (B / batch.start)^(1/2) always, its rule; linear is an error there)
  lr_scaling: LrScaling = LrScaling.none

  def __post_init__(self):
    self.kind = BatchKind.check(self.kind, "batch.kind")
    self.lr_scaling = LrScaling.check(self.lr_scaling, "batch.lr_scaling")
    self.sizes = sizes = tuple(self.sizes)
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
class BatchSchedule:
  """A `BatchConfig` resolved for a run (`resolve`): the allowed sizes listed (the last
  is B_max), the linear ramp in examples, seesaw's doubling points in examples and the
  lr's reference size (None: B_max)."""

  kind: str = "fixed"
  sizes: tuple[int, ...] = (32,)
  start: int = 32
  ramp_examples: int = 0  # linear: ceil(batch.ramp_tokens / data.seq_len)
  gns_factor: float = 1.0
  gns_group: str = "total"
  every: int = 25
  lr_scaling: str = "none"
  decay_examples: tuple[int, ...] = ()  # seesaw: p_i = d_i x B_max
  lr_ref: int | None = None  # seesaw: batch.start

  @property
  def max_batch_size(self) -> int:
    return self.sizes[-1]

  def floor(self, x: float) -> int:
    """The largest allowed size ≤ x (the smallest size when x is below it)."""
    fits = [b for b in self.sizes if b <= x]
    return fits[-1] if fits else self.sizes[0]


def default_sizes(start: int, max_batch_size: int) -> tuple[int, ...]:
  """start, 2·start, 4·start, ... below max_batch_size, then max_batch_size."""
  sizes, b = [], start
  while b < max_batch_size:
    sizes.append(b)
    b *= 2
  return (*sizes, max_batch_size)


def resolve(b: BatchConfig, *, max_batch_size: int, seq_len: int, n_devices: int,
            microbatch: int | None, gns_groups: tuple[str, ...] | None,
            decay_steps: tuple[int, ...] | None = None) -> BatchSchedule:
  """The schedule of `b` for a run; one ValueError line naming the key and the fix for
  one that cannot run. gns_groups: the groups the GNS tracker will hold (None: off);
  decay_steps: the step lr schedule's halving points (None: the schedule is not step)."""
  common = dict(kind=b.kind, gns_factor=b.gns_factor, gns_group=b.gns_group, every=b.every,
                lr_scaling=b.lr_scaling)
  if b.kind == "fixed":
    return BatchSchedule(sizes=(max_batch_size,), start=max_batch_size, **common)
  if b.start > max_batch_size:
    raise ValueError(f"batch.start={b.start} exceeds data.batch_size={max_batch_size} (the "
                     "largest size); lower batch.start.")
  sizes = b.sizes or default_sizes(b.start, max_batch_size)
  if b.kind == "seesaw":
    common.update(_seesaw(b, sizes, max_batch_size, decay_steps))
  if sizes[-1] != max_batch_size:
    raise ValueError(f"batch.sizes={list(sizes)} must end at data.batch_size={max_batch_size} (the "
                     "size the schedule grows to); add it or change data.batch_size.")
  if b.start not in sizes:
    raise ValueError(f"batch.start={b.start} is not one of batch.sizes={list(sizes)}; "
                     "add it there or change batch.start.")
  for batch_size in sizes:
    if batch_size % n_devices:
      raise ValueError(f"batch.sizes holds {batch_size}, not divisible by the {n_devices} "
                       f"devices; use multiples of {n_devices}.")
    if microbatch and batch_size % microbatch:
      raise ValueError(f"batch.sizes holds {batch_size}, not divisible by stats.microbatch_size="
                       f"{microbatch}; use multiples of it or another microbatch size.")
  sched = BatchSchedule(sizes=sizes, start=b.start, ramp_examples=-(-b.ramp_tokens // seq_len),
                        **common)
  if b.kind == "linear" and sched.ramp_examples < 1:
    raise ValueError("batch.kind=linear needs batch.ramp_tokens > 0 (the tokens over which "
                     "B grows to data.batch_size), e.g. half the run's tokens.")
  if b.kind == "gns":
    if gns_groups is None:
      raise ValueError("batch.kind=gns reads the tracked gradient noise scale; set "
                       "stats.gns=true (e.g. stats=gns or stats=gns_norm).")
    if b.gns_group not in gns_groups:
      raise ValueError(f"batch.gns_group={b.gns_group} is not tracked (the tracker "
                       f"holds {list(gns_groups)}); choose one of them.")
  return sched


def _seesaw(b: BatchConfig, sizes: tuple[int, ...], max_batch_size: int,
            decay_steps: tuple[int, ...] | None) -> dict:
  """Seesaw's settings (module docstring), checked: optimizer.lr is the lr of the first
  updates, at B = batch.start (the paper starts at its cosine baseline's tuned lr and batch
  size); the sizes are the powers of two from batch.start, then B_max."""
  if decay_steps is None:
    raise ValueError("batch.kind=seesaw doubles B where a step schedule halves the lr; set "
                     "schedule=step (its halving points: schedule.decay_steps).")
  if sizes != default_sizes(b.start, max_batch_size):
    raise ValueError(f"batch.kind=seesaw doubles B from batch.start={b.start}; leave "
                     f"batch.sizes empty (the powers of two from batch.start), not "
                     f"{list(sizes)}.")
  if b.lr_scaling == "linear":
    raise ValueError("batch.kind=seesaw scales the lr by √(B / batch.start) (lr x 1/√2 per "
                     "doubling); batch.lr_scaling=linear contradicts it: set it to sqrt.")
  return dict(lr_scaling="sqrt", lr_ref=b.start,
              decay_examples=tuple(d * max_batch_size for d in decay_steps))
