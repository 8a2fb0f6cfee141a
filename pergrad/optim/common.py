"""Small helpers shared by the transformations of `pergrad.optim`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from pergrad.stats import registry
from pergrad.stats.types import GradStats


def require_stats(grad_stats: GradStats | None, who: str, *, need: tuple[str, ...] = (),
                  granularity: str | None = None) -> GradStats:
  """Returns `grad_stats` after checking it holds what `who` needs (one clear error if not)."""
  if grad_stats is None:
    raise ValueError(
        f"{who} needs per-example statistics: call tx.update(stats.mean, state, params, "
        "grad_stats=stats) with the GradStats computed for Optimizer.request")
  for name in need:
    if name != "mean":
      registry.get(name)  # any registered statistic; one-line ValueError if unknown
    if not grad_stats.has(name):
      raise ValueError(
          f"{who} needs the '{name}' statistic but grad_stats was computed without it; "
          f"ask the statistics engine for Optimizer.request.want (which includes '{name}')")
  if granularity is not None and grad_stats.granularity != granularity:
    raise ValueError(
        f"{who} needs {granularity}-level statistics but got granularity="
        f"'{grad_stats.granularity}'; use Optimizer.request.granularity")
  return grad_stats


def f32(tree: Any) -> Any:
  """Casts every leaf to float32 (statistics and optimizer math run in float32)."""
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree)


def with_float32_state(tx: optax.GradientTransformationExtraArgs
                      ) -> optax.GradientTransformationExtraArgs:
  """Wraps `tx` so that its state is initialised (hence kept) in float32 even for bf16 params."""

  def init_fn(params):
    return tx.init(f32(params))

  return optax.GradientTransformationExtraArgs(init_fn, tx.update)
