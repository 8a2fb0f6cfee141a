"""What `build_optimizer` returns."""

from __future__ import annotations

from typing import NamedTuple

import optax

from pergrad.stats.request import StatsRequest


class Optimizer(NamedTuple):
  """A built optimizer.

  Attributes:
    tx: the transformation; call it as
      `tx.update(stats.mean, opt_state, params, grad_stats=stats)`.
    request: the statistics `tx` needs in `grad_stats` (a `pergrad.stats.StatsRequest`).
    learning_rate: effective learning rate (after batch-size scaling) as a function
      of τ = examples seen / B (the update count of a fixed-batch run; 0 = first update).
  """

  tx: optax.GradientTransformationExtraArgs
  request: StatsRequest
  learning_rate: optax.Schedule
