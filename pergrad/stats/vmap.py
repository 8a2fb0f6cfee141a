"""vmap backend: per-example gradients by `jax.vmap(jax.grad)`, reduced in the same jit.

For any model. The per-example gradients G (one per parameter leaf, example axis B)
exist transiently inside the compiled step; XLA fuses the reductions

    sum Σ_b g_b,   sum_sq Σ_b g_b²,   sum_sign Σ_b sign(g_b),   sq_norms_b = Σ_coords g_b²

into the backward pass. On XLA:CPU a reduction over a *leading* batch axis is much
slower than over the last axis, so the example axis is put last
(`vmap(..., out_axes=-1)`) and reduced there (layout "last", the default), or kept
first and reduced by a matmul with a vector of ones/weights (layout "first"):
scripts/bench_stats.py measures both.

Per-example clipping, ĝ_b = g_b · w_b with w_b = min(1, C/‖g_b‖) (‖·‖ over the whole
model), enters every statistic through the weights: Σ_b ĝ_b = Σ_b w_b g_b,
Σ_b ĝ_b² = Σ_b w_b² g_b², sign(ĝ_b) = sign(g_b), ‖ĝ_b‖² = w_b² ‖g_b‖².
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from pergrad.stats.types import GradStats


def example_loss(loss_fn):
  """(params, one example without batch axis) -> scalar loss of that example."""
  def f(params, example):
    return loss_fn(params, jax.tree.map(lambda x: x[None], example))[0]
  return f


def clip_weights(sq_norms_B: jax.Array, clip: float) -> jax.Array:
  """w_b = min(1, C/‖g_b‖) (1 where ‖g_b‖ = 0)."""
  norms_B = jnp.sqrt(sq_norms_B)
  return jnp.where(norms_B > clip, clip / jnp.where(norms_B > 0, norms_B, 1.0), 1.0)


def vmap_stats(loss_fn, params, batch, *, want: Sequence[str] = ("mean",),
               per_example_clip: float | None = None, layout: str = "last"):
  """(mean loss, GradStats) of `batch` from materialised per-example gradients."""
  if layout not in ("last", "first"):
    raise ValueError(f"layout={layout!r} must be 'last' or 'first'.")
  axis = -1 if layout == "last" else 0
  losses_B, grads = jax.vmap(jax.value_and_grad(example_loss(loss_fn)),
                             in_axes=(None, 0), out_axes=(0, axis))(params, batch)
  B = losses_B.shape[0]

  def bsum(x, w_B=None):  # Σ_b w_b x_b over the example axis
    if layout == "last":
      return x.sum(-1) if w_B is None else x @ w_B
    w_B = jnp.ones((B,), x.dtype) if w_B is None else w_B
    return jnp.tensordot(w_B, x, axes=1)

  def sq_norms_of(g):
    if layout == "last":
      return jnp.square(g).reshape(-1, B).sum(0)
    return jnp.square(g).reshape(B, -1).sum(1)

  need_norms = "norms" in want or per_example_clip is not None
  sq_norms = jax.tree.map(sq_norms_of, grads) if need_norms else None
  w_B = None
  if per_example_clip is not None:
    w_B = clip_weights(sum(jax.tree.leaves(sq_norms)), per_example_clip)
    sq_norms = jax.tree.map(lambda n: n * jnp.square(w_B), sq_norms)
  stats = GradStats(
      count=jnp.asarray(B, jnp.float32),
      sum=jax.tree.map(lambda g: bsum(g, w_B), grads),
      sum_sq=(jax.tree.map(lambda g: bsum(jnp.square(g), None if w_B is None else jnp.square(w_B)),
                           grads) if "sq" in want else None),
      sum_sign=jax.tree.map(lambda g: bsum(jnp.sign(g)), grads) if "sign" in want else None,
      sq_norms=sq_norms if "norms" in want else None,
      granularity="example",
  )
  return losses_B.mean(), stats
