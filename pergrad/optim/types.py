"""What an optimizer asks of the statistics engine, and what `build_optimizer` returns."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import optax

from pergrad.stats.types import STATISTICS

GRANULARITIES = ("example", "token")


@dataclasses.dataclass(frozen=True)
class StatsRequest:
  """The statistics the train step must ask the statistics engine for.

  Attributes:
    want: subset of ("mean", "sq", "sign", "norms"); "mean" is always present.
    granularity: "example" (samples are per-example gradients g_i) or "token"
      (samples are per-token contributions).
    per_example_clip: if set, the engine clips each g_i to this global norm before
      computing any statistic (so `mean` is the mean of clipped gradients).
  """

  want: tuple[str, ...] = ("mean",)
  granularity: str = "example"
  per_example_clip: float | None = None

  def __post_init__(self):
    unknown = [w for w in self.want if w not in STATISTICS]
    if unknown:
      raise ValueError(f"StatsRequest.want has unknown statistics {unknown}; valid: {STATISTICS}")
    if "mean" not in self.want:
      raise ValueError("StatsRequest.want must contain 'mean' (the train step uses stats.mean)")
    if self.granularity not in GRANULARITIES:
      raise ValueError(
          f"StatsRequest.granularity={self.granularity!r} is unknown; use one of {GRANULARITIES}")
    if self.per_example_clip is not None and self.per_example_clip <= 0:
      raise ValueError(
          f"per_example_clip={self.per_example_clip} must be positive (or None for no clipping)")
    if self.per_example_clip is not None and self.granularity != "example":
      raise ValueError("per_example_clip needs granularity='example' (it clips whole examples)")

  @property
  def needs_per_example(self) -> bool:
    """True when plain `jax.grad` of the mean loss cannot supply the request."""
    return len(self.want) > 1 or self.per_example_clip is not None


class Optimizer(NamedTuple):
  """A built optimizer.

  Attributes:
    tx: the transformation; call it as
      `tx.update(stats.mean, opt_state, params, grad_stats=stats)`.
    request: the statistics `tx` needs in `grad_stats`.
    learning_rate: effective learning rate (after batch-size scaling) as a function
      of the step (0 = first update), for logging.
  """

  tx: optax.GradientTransformationExtraArgs
  request: StatsRequest
  learning_rate: optax.Schedule
