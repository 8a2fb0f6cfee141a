"""loop backend: a plain Python loop over examples. A reference for tests, not fast.

For b = 1..B: g_b = ∇ loss_b (one `jax.value_and_grad` per example, batch of one),
optionally clipped ĝ_b = g_b · min(1, C/‖g_b‖), then accumulated:
Σ ĝ_b, Σ ĝ_b², Σ sign(ĝ_b) and ‖ĝ_b‖² per leaf.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pergrad.stats.types import GradStats


@functools.lru_cache(maxsize=32)
def _example_grad_fn(loss_fn):
  return jax.jit(jax.value_and_grad(lambda p, ex: loss_fn(p, ex)[0]))


def per_example_grads(loss_fn, params, batch):
  """[(loss_b, g_b) for b in range(B)], one backward pass per example (batch of one)."""
  B = jax.tree.leaves(batch)[0].shape[0]
  grad_fn = _example_grad_fn(loss_fn)
  return [grad_fn(params, jax.tree.map(lambda x, b=b: x[b:b + 1], batch)) for b in range(B)]


def loop_stats(loss_fn, params, batch, *, want: Sequence[str] = ("mean",),
               per_example_clip: float | None = None):
  """(mean loss, GradStats) of `batch`, one example at a time."""
  losses, sums, sums_sq, sums_sign, sq_norms = [], None, None, None, []
  add = lambda acc, x: x if acc is None else jax.tree.map(jnp.add, acc, x)
  for loss_b, g in per_example_grads(loss_fn, params, batch):
    if per_example_clip is not None:
      norm = jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(g)))
      scale = jnp.where(norm > per_example_clip, per_example_clip / jnp.maximum(norm, 1e-30), 1.0)
      g = jax.tree.map(lambda x, s=scale: x * s, g)
    losses.append(loss_b)
    sums = add(sums, g)
    if "sq" in want:
      sums_sq = add(sums_sq, jax.tree.map(jnp.square, g))
    if "sign" in want:
      sums_sign = add(sums_sign, jax.tree.map(jnp.sign, g))
    sq_norms.append(jax.tree.map(lambda x: jnp.sum(jnp.square(x)), g))
  stats = GradStats(
      count=jnp.asarray(len(losses), jnp.float32),
      sum=sums, sum_sq=sums_sq, sum_sign=sums_sign,
      sq_norms=jax.tree.map(lambda *n: jnp.stack(n), *sq_norms) if "norms" in want else None,
      granularity="example",
  )
  return jnp.mean(jnp.stack(losses)), stats
