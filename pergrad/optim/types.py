"""What an optimizer's builder returns (`Direction`) and what `build_optimizer` returns
(`Optimizer`)."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import optax

from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.hparams import Hparams, holding, numbers
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
    tx: the transformation, built once, holding the numbers of `hparams` in its state
      (`pergrad.optim.hparams.inject`); call it as `tx.update(stats.mean, opt_state, params,
      grad_stats=stats, examples_seen=seen, batch_size=B)` (seen: int32, the examples seen
      before the update; B: the update's static batch size).
    request: the statistics `tx` and the trackers need in `grad_stats`
      (a `pergrad.stats.StatsRequest`).
    learning_rate: the lr of `hparams` (after batch-size scaling) as a function of
      τ = examples seen / B_max (the update count of a fixed-batch run; 0 = first update).
    schedule: numbers -> ((seen, B) -> the lr `tx` applies to that update), of the numbers
      an optimizer state holds (`lr` reads them).
    snr, gns: the trackers (`pergrad.optim.tracker.Tracker`; `OFF` when not tracked),
      kept outside `tx` so that the optimizer state does not depend on them.
    hparams: the numbers it was built from (`pergrad.optim.hparams.Hparams`: learning
      rate, β's, ε, weight decay, schedule, ...), as Python numbers.
    moments: opt_state -> what the diagnostics read of an Adam-family direction (its m, v
      and ε: `pergrad.optim.moments.Moments`), None for other optimizers.
  """

  tx: optax.GradientTransformationExtraArgs
  request: StatsRequest
  learning_rate: optax.Schedule
  schedule: Callable[[Hparams], Callable[[jax.Array, int], jax.Array]]
  snr: Tracker = OFF
  gns: Tracker = OFF
  hparams: Hparams | None = None
  moments: Callable[[Any], Moments | None] = no_moments

  def init(self, params: Any, hparams: Hparams | None = None) -> Any:
    """`tx.init(params)` holding `hparams` (`Hparams.as_arrays()` of this structure, or
    tracers of them: the jitted init's argument; None: `self.hparams`)."""
    state = self.tx.init(params)
    return state if hparams is None else holding(state, hparams)

  def lr(self, opt_state: Any, seen: jax.Array, batch_size: int) -> jax.Array:
    """The learning rate `tx` applies to the update of `batch_size` examples after `seen`,
    of the numbers `opt_state` holds (float32)."""
    return self.schedule(numbers(opt_state))(seen, batch_size)
