"""Learning-rate schedules and batch-size scaling of the hyper-parameters.

Batch-size scaling (`scale_hparams`): κ_B = B / B_ref, κ = 0, 1/2, 1 for lr_scaling none /
sqrt / linear; lr = base_lr · κ_B^κ, the whole schedule multiplied by it; with `sde_scaling`
(sqrt only; Malladi et al. 2022) 1 − β -> min(κ_B (1 − β), 1), ε -> ε / sqrt(κ_B),
eps_root -> eps_root / κ_B.

Schedules (`schedule_of`; step k = 0 the first update, W warmup steps, N total, f =
final_lr_frac):

    warmup   lr_k = lr · (k + 1) / W                        for k < W
    cosine   lr_k = lr · (f + (1 - f) · (1 + cos(π t)) / 2), t = (k - W) / (N - W)
    constant lr_k = lr                                     for k >= W
    step     lr_k = lr · 2^(−#{i : k >= d_i})              for k >= W

Indexed by examples (`by_examples`, `scale_by_token_schedule`, every chain's last link): k is
τ = seen / B_max, and an update of B examples uses lr = schedule(τ) · (B / B_ref)^κ'
(κ' of batch.lr_scaling), so the lr follows the tokens seen whatever the batch sizes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from pergrad.fields import Choice
from pergrad.optim.configs import LrScaling


class ScheduleName(Choice):
  cosine = "cosine"
  constant = "constant"
  step = "step"


@dataclasses.dataclass
class ScheduleConfig:
  """The learning-rate schedule's shape (the `schedule` config node)."""

  name: ScheduleName = ScheduleName.cosine  # warmup then cosine decay, constant, or step
  warmup_steps: int = 20  # steps of linear warmup from lr/warmup_steps
  final_lr_frac: float = 0.1  # cosine decays to final_lr_frac * lr
  # step: the full-batch steps at which the lr is halved, ascending; []: where the cosine
  # (warmup_steps, final_lr_frac) would halve it
  decay_steps: tuple[int, ...] = ()

  def __post_init__(self):
    self.name = ScheduleName.check(self.name, "schedule.name")
    if self.warmup_steps < 0:
      raise ValueError(f"schedule.warmup_steps={self.warmup_steps} must be >= 0")
    if not 0.0 <= self.final_lr_frac <= 1.0:
      raise ValueError(f"schedule.final_lr_frac={self.final_lr_frac} must be in [0, 1]")
    self.decay_steps = d = tuple(self.decay_steps)
    if d and (list(d) != sorted(set(d)) or d[0] < 1):
      raise ValueError(f"schedule.decay_steps={list(d)} must be distinct steps >= 1 in "
                       "ascending order.")


@dataclasses.dataclass(frozen=True)
class ScaledHparams:
  """Hyper-parameters after batch-size scaling (log these with the run)."""

  lr: float  # the schedule's peak
  b1: float
  b2: float
  eps: float
  eps_root: float
  batch_ratio: float  # κ_B = B / B_ref


def scale_hparams(*, lr: float, b1: float, b2: float, eps: float, eps_root: float,
                  lr_scaling: str, sde_scaling: bool, batch_size: int,
                  ref_batch_size: int) -> ScaledHparams:
  """Applies the batch-size rules of the module docstring to settings already checked
  (`OptimizerConfig` checks lr_scaling and sde_scaling once, at the config boundary)."""
  if batch_size < 1 or ref_batch_size < 1:
    raise ValueError(
        f"batch_size={batch_size} and ref_batch_size={ref_batch_size} must be positive")
  kappa_b = batch_size / ref_batch_size
  lr = lr * kappa_b ** LrScaling(lr_scaling).exponent
  if sde_scaling:
    b1, b2 = (1.0 - min(kappa_b * (1.0 - b), 1.0) for b in (b1, b2))
    eps, eps_root = eps / math.sqrt(kappa_b), eps_root / kappa_b
  return ScaledHparams(lr=lr, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                       batch_ratio=kappa_b)


def decay_steps(sched: ScheduleConfig, total_steps: int, *, cut: bool = True
                ) -> tuple[int, ...]:
  """The step schedule's halving points d_i (module docstring): schedule.decay_steps, or
  the first steps at which the cosine of `sched` over `total_steps` is ≤ 2^−i, before
  `total_steps` (`cut`) or all of them (one per level 2^−i > f whatever the run's length,
  those from total_steps on never reached: what the optimizer state holds).

  The step schedule halves the lr at the full-batch steps d_1 < d_2 < ...
  (schedule.decay_steps, i.e. at d_i · B_max examples); with none given, where the cosine of
  the same warmup and final_lr_frac over N steps would have halved it: d_i is the first step k
  with cosine shape ≤ 2^−i, for every 2^−i > f, before N. Without warmup it equals
  `optax.piecewise_constant_schedule(lr, {d_i: 0.5})`. The warmup starts at lr/W, not 0;
  a run shorter than its warmup ends during it.
  """
  if sched.decay_steps:
    return sched.decay_steps
  W, f = sched.warmup_steps, sched.final_lr_frac
  span, points, level = max(total_steps - W, 1), [], 0.5
  while level > f:
    # ½ (1 + cos πt) = (level − f)/(1 − f)  ⇔  t = arccos(2(level − f)/(1 − f) − 1)/π
    t = math.acos(2.0 * (level - f) / (1.0 - f) - 1.0) / math.pi
    d = W + math.ceil(span * t - 1e-9)
    if cut and d >= total_steps:
      break
    points.append(max(d, points[-1] + 1 if points else 1))
    level /= 2
  return tuple(points)


def make_schedule(sched: ScheduleConfig, lr: float, *, total_steps: int
                  ) -> optax.Schedule:
  """Linear warmup then cosine decay, constant or step halvings of `sched` (checked by
  ScheduleConfig); see the module docstring."""
  if total_steps < 1:
    raise ValueError(f"total_steps={total_steps} must be >= 1")
  halvings = decay_steps(sched, total_steps) if sched.name == "step" else ()
  return schedule_of(sched.name, lr, total_steps=total_steps,
                     warmup_steps=sched.warmup_steps, final_lr_frac=sched.final_lr_frac,
                     halvings=halvings)


def schedule_of(name: str, lr, *, total_steps, warmup_steps, final_lr_frac,
                halvings=()) -> optax.Schedule:
  """The schedule `name` (module docstring) of numbers that may be traced
  (`pergrad.optim.hparams`: checked where they were built): the peak lr, N, W, f and the
  step schedule's halving points d_i (a vector; None: none)."""
  halvings = jnp.asarray(() if halvings is None else halvings, jnp.float32).reshape(-1)

  def schedule(step):
    k = jnp.asarray(step, jnp.float32)
    W = jnp.asarray(warmup_steps, jnp.float32)
    warm = jnp.where(W > 0, jnp.minimum((k + 1.0) / jnp.maximum(W, 1.0), 1.0), 1.0)
    if name == "constant":
      shape = 1.0
    elif name == "step":  # 2^−#{i : k >= d_i}, exactly
      shape = jnp.ldexp(jnp.float32(1.0), -jnp.sum(k >= halvings, dtype=jnp.int32))
    else:
      span = jnp.maximum(jnp.asarray(total_steps, jnp.float32) - W, 1.0)
      t = jnp.clip((k - W) / span, 0.0, 1.0)
      shape = final_lr_frac + (1.0 - final_lr_frac) * 0.5 * (1.0 + jnp.cos(jnp.pi * t))
    return jnp.asarray(lr * warm * shape, jnp.float32)

  return schedule


def by_examples(schedule: optax.Schedule, max_batch_size: int, lr_scaling: str = "none",
             ref_batch: int | None = None, exact_floor: bool = False
             ) -> Callable[[jax.Array, int], jax.Array]:
  """(seen, B) -> lr = schedule(seen / max_batch_size) · (B / B_ref)^κ' (module docstring),
  float32; `seen` an int32 count of examples, B a Python int; B_ref = `ref_batch`
  (None: max_batch_size); `exact_floor`: τ kept below seen // max_batch_size + 1 (step
  schedules).

  B_ref = B_max, or batch.start for the seesaw schedule (`pergrad.config.batch`). For a step
  schedule τ is rounded in float32 but never up to the next integer (`exact_floor`), so d_i
  applies from exactly d_i · B_max examples. With B = B_max every update, τ = k exactly: a
  fixed-batch run's schedule. Stateless: the examples seen are the train state's
  (`TrainState.examples_seen`), passed to `update` as an extra argument.
  """
  if lr_scaling not in LrScaling.values():
    raise ValueError(f"batch.lr_scaling={lr_scaling!r}; choose one of {LrScaling.values()}")
  kappa = LrScaling(lr_scaling).exponent
  ref = ref_batch or max_batch_size

  def lr(seen: jax.Array, batch_size: int) -> jax.Array:
    # τ in integer arithmetic first: exactly k for a fixed-batch run.
    k = (seen // max_batch_size).astype(jnp.float32)
    tau = k + (seen % max_batch_size) / max_batch_size
    if exact_floor:
      tau = jnp.minimum(tau, jnp.nextafter(k + 1.0, k))
    return jnp.asarray(schedule(tau) * (batch_size / ref) ** kappa, jnp.float32)

  return lr


def step_args(name: str, max_batch_size: int, *, examples_seen=None, batch_size: int | None = None,
              **extra_args) -> tuple[jax.Array, int]:
  """(examples seen before the update as int32, the update's B) from the extra arguments
  the train step passes to every update (B: a static int; None: max_batch_size)."""
  del extra_args
  if examples_seen is None:
    raise ValueError(f"{name} needs the extra argument examples_seen (the examples seen "
                     "before this update).")
  return jnp.asarray(examples_seen, jnp.int32), max_batch_size if batch_size is None else batch_size


def scale_by_token_schedule(schedule: optax.Schedule, max_batch_size: int,
                            lr_scaling: str = "none", ref_batch: int | None = None,
                            exact_floor: bool = False
                            ) -> optax.GradientTransformationExtraArgs:
  """u -> −lr · u with lr = `by_examples(schedule, max_batch_size, ...)(seen, B)`.

  Stateless; `update` takes the extra arguments `examples_seen` (int32: examples seen
  before this update) and `batch_size` (a Python int: the compiled step's static batch
  dimension; None: max_batch_size). With a constant B = max_batch_size and examples_seen =
  k · B it equals `optax.scale_by_learning_rate(schedule)` at update k.
  """
  lr_of = by_examples(schedule, max_batch_size, lr_scaling, ref_batch, exact_floor)

  def update_fn(updates, state, params=None, **extra_args):
    del params
    lr = lr_of(*step_args("scale_by_token_schedule", max_batch_size, **extra_args))
    return jax.tree.map(lambda u: jnp.asarray(-lr, u.dtype) * u, updates), state

  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)
