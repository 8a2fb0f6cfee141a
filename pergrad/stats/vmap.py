"""vmap backend: per-example gradients by `jax.vmap(jax.grad)`, reduced in the same jit.

For any model. The per-example gradients G (one per parameter leaf, example axis B)
exist transiently inside the compiled step; XLA fuses the reductions

    sum Σ_b g_b,   sum_sq Σ_b g_b²,   sum_sign Σ_b sign(g_b),   sq_norms_b = Σ_coords g_b²

into the backward pass, and likewise every registered statistic
(`pergrad.stats.registry`): Σ_b φ(g_b) per coordinate (kind "coordinate") or
Σ_coords φ(g_b) per example and leaf (kind "example"). On XLA:CPU a reduction over a
*leading* batch axis is much
slower than over the last axis, so the example axis is put last
(`vmap(..., out_axes=-1)`) and reduced there (layout "last", the default), or kept
first and reduced by a matmul with a vector of ones/weights (layout "first",
`StatsOptions.vmap_layout`): scripts/bench_stats.py measures both.

Per-example clipping, ĝ_b = g_b · w_b with w_b = min(1, C/‖g_b‖) (‖·‖ over the whole
model), enters every statistic through the weights: Σ_b ĝ_b = Σ_b w_b g_b,
Σ_b ĝ_b² = Σ_b w_b² g_b², sign(ĝ_b) = sign(g_b), ‖ĝ_b‖² = w_b² ‖g_b‖²; in general
φ(w_b g_b) = w_b^p φ(g_b) with p the statistic's `clip_power`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pergrad.stats import registry
from pergrad.stats.clipping import clip_weights
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest
from pergrad.stats.types import GradStats


def example_loss(loss_fn):
  """(params, one example without batch axis) -> scalar loss of that example."""
  def f(params, example):
    return loss_fn(params, jax.tree.map(lambda x: x[None], example))[0]
  return f


def vmap_stats(loss_fn, params, batch, request: StatsRequest, options: StatsOptions):
  """(mean loss, GradStats) of `batch` from materialised per-example gradients, in the
  layout `options.vmap_layout`."""
  axis = -1 if options.vmap_layout == "last" else 0
  losses_B, grads = jax.vmap(jax.value_and_grad(example_loss(loss_fn)),
                             in_axes=(None, 0), out_axes=(0, axis))(params, batch)
  return losses_B.mean(), reduced(grads, losses_B.shape[0], request, options)


def reduced(grads, B: int, request: StatsRequest, options: StatsOptions) -> GradStats:
  """GradStats of per-example gradients `grads` (example axis last for layout "last",
  first for "first": `options.vmap_layout`), B examples."""
  want, per_example_clip = request.want, request.per_example_clip
  layout = options.vmap_layout

  def bsum(x, w_B=None):  # Σ_b w_b x_b over the example axis
    if layout == "last":
      return x.sum(-1) if w_B is None else x @ w_B
    w_B = jnp.ones((B,), x.dtype) if w_B is None else w_B
    return jnp.tensordot(w_B, x, axes=1)

  def example_sum(phi, g):  # Σ_coords φ(g_b), float32[B]
    if layout == "last":
      return phi(g).reshape(-1, B).sum(0)
    return phi(g).reshape(B, -1).sum(1)

  def weights(p):  # w_b^p, None for no weighting
    if w_B is None or p == 0:
      return None
    return w_B if p == 1 else jnp.square(w_B) if p == 2 else w_B ** p

  coord_names = registry.select(want, "coordinate")
  example_names = registry.select(want, "example")
  w_B, sq_norms = None, None
  if per_example_clip is not None:  # every statistic has a clip_power (`api.check_support`)
    sq_norms = jax.tree.map(functools.partial(example_sum, jnp.square), grads)
    w_B = clip_weights(sum(jax.tree.leaves(sq_norms)), per_example_clip)
  coordinate_stats = {}
  for k in coord_names:
    st = registry.get(k)
    w = weights(st.clip_power)
    coordinate_stats[k] = jax.tree.map(lambda g, phi=st.phi, w=w: bsum(phi(g), w), grads)
  example_stats = {}
  for k in example_names:
    st = registry.get(k)
    if sq_norms is not None and st.phi is jnp.square:
      vals = sq_norms  # already computed for the clip weights
    else:
      vals = jax.tree.map(functools.partial(example_sum, st.phi), grads)
    w = weights(st.clip_power)
    example_stats[k] = vals if w is None else jax.tree.map(lambda n, w=w: n * w, vals)
  return GradStats(
      count=jnp.asarray(B, jnp.float32),
      sum=jax.tree.map(lambda g: bsum(g, w_B), grads),
      coordinate_stats=coordinate_stats,
      example_stats=example_stats,
      granularity="example",
  )
