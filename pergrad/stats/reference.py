"""Reference backend ("loop"): a plain Python loop over examples. For tests, not fast.

For b = 1..B: g_b = ∇ loss_b (one `jax.value_and_grad` per example, batch of one),
optionally clipped ĝ_b = g_b · min(1, C/‖g_b‖), then accumulated: Σ ĝ_b and, for every
requested registered statistic (`pergrad.stats.registry`), Σ_b φ(ĝ_b) per coordinate
(kind "coordinate") or Σ_coords φ(ĝ_b) per leaf, stacked over examples (kind "example").
Clipping acts on ĝ_b itself, so it applies to any statistic (no `clip_power` needed).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pergrad.stats import registry
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest
from pergrad.stats.types import GradStats


@functools.lru_cache(maxsize=32)
def _example_grad_fn(loss_fn):
  return jax.jit(jax.value_and_grad(lambda p, ex: loss_fn(p, ex)[0]))


def per_example_grads(loss_fn, params, batch):
  """[(loss_b, g_b) for b in range(B)], one backward pass per example (batch of one)."""
  B = jax.tree.leaves(batch)[0].shape[0]
  grad_fn = _example_grad_fn(loss_fn)
  return [grad_fn(params, jax.tree.map(lambda x, b=b: x[b:b + 1], batch)) for b in range(B)]


def loop_stats(loss_fn, params, batch, request: StatsRequest, options: StatsOptions):
  """(mean loss, GradStats) of `batch`, one example at a time (no options apply)."""
  del options
  want, per_example_clip = request.want, request.per_example_clip
  coord_names = registry.select(want, "coordinate")
  example_names = registry.select(want, "example")
  losses, sums = [], None
  coord = dict.fromkeys(coord_names)
  example = {k: [] for k in example_names}
  add = lambda acc, x: x if acc is None else jax.tree.map(jnp.add, acc, x)
  for loss_b, g in per_example_grads(loss_fn, params, batch):
    if per_example_clip is not None:
      norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(g)))
      scale = jnp.where(norm > per_example_clip, per_example_clip / jnp.maximum(norm, 1e-30), 1.0)
      g = jax.tree.map(lambda x, s=scale: x * s, g)
    losses.append(loss_b)
    sums = add(sums, g)
    for k in coord_names:
      coord[k] = add(coord[k], jax.tree.map(registry.get(k).phi, g))
    for k in example_names:
      phi = registry.get(k).phi
      example[k].append(jax.tree.map(lambda x, phi=phi: jnp.sum(phi(x)), g))
  stats = GradStats(
      count=jnp.asarray(len(losses), jnp.float32),
      sum=sums,
      coordinate_stats=coord,
      example_stats={k: jax.tree.map(lambda *n: jnp.stack(n), *v) for k, v in example.items()},
      granularity="example",
  )
  return jnp.mean(jnp.stack(losses)), stats
