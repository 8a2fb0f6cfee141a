"""What an optimizer's builder returns (`Direction`) and what `build_optimizer` returns
(`Optimizer`)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import optax

from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.moments import Moments
from pergrad.optim.tracker import OFF, Tracker
from pergrad.stats.request import StatsRequest


class Direction(NamedTuple):
  """What an optimizer's builder returns."""

  tx: optax.GradientTransformation  # maps ḡ (and grad_stats) to the update direction
  request: StatsRequest = StatsRequest()  # the statistics tx reads from grad_stats
  clips: bool = False  # tx applies optimizer.clip_norm itself
  # tx's state -> its Adam-family state (m, v), for the diagnostics; None: it has none
  moments: Callable[[Any], ScaleByAdamFamilyState] | None = None


def no_moments(opt_state: Any) -> None:
  """`Optimizer.moments` of an optimizer without Adam-family moments."""
  del opt_state


class Optimizer(NamedTuple):
  """A built optimizer and the trackers beside it.

  Attributes:
    tx: the transformation; call it as `tx.update(stats.mean, opt_state, params,
      grad_stats=stats, examples_seen=seen, batch_size=B)` (seen: int32, the examples
      seen before the update; B: the update's static batch size).
    request: the statistics `tx` and the trackers need in `grad_stats`
      (a `pergrad.stats.StatsRequest`).
    learning_rate: effective learning rate (after batch-size scaling) as a function
      of τ = examples seen / B_max (the update count of a fixed-batch run; 0 = first update).
    token_lr: (seen, B) -> the learning rate `tx` applies to that update (float32).
    snr, gns: the trackers (`pergrad.optim.tracker.Tracker`; `OFF` when not tracked),
      kept outside `tx` so that the optimizer state does not depend on them.
    hparams: the numbers it was built from (`pergrad.optim.hparams.Hparams`: learning
      rate, β's, ε, weight decay, schedule, ...), as Python numbers.
    at: hparams -> the same optimizer built from other numbers of that structure (arrays
      or tracers: the compiled train step's argument, so that a sweep compiles once).
    moments: opt_state -> what the diagnostics read of an Adam-family direction (its m, v
      and ε: `pergrad.optim.moments.Moments`), None for other optimizers.
  """

  tx: optax.GradientTransformationExtraArgs
  request: StatsRequest
  learning_rate: optax.Schedule
  token_lr: Callable[[jax.Array, int], jax.Array]
  snr: Tracker = OFF
  gns: Tracker = OFF
  hparams: Any = None
  at: Callable[[Any], Optimizer] | None = None
  moments: Callable[[Any], Moments | None] = no_moments
