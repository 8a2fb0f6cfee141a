"""`GradStats`: sufficient statistics of a set of gradient samples g_1..g_n.

Samples are per-example gradients (granularity "example", n = B) or per-token
contributions (granularity "token", n = B*T, scaled so that their mean is the batch
gradient). Sums and counts are kept, so statistics over microbatches and devices
merge by addition (`merge`); means and variances are derived at the end:

    mean          ḡ   = (1/n) Σ g_i
    second moment q   = (1/n) Σ g_i²
    variance      σ̂²  = n/(n-1) (q - ḡ²)            (unbiased)
    sign mean     s   = (1/n) Σ sign(g_i)
    squared mean  μ̂²  = ḡ² - σ̂²/n                   (unbiased estimate of μ²)

`sq_norms` holds per-example squared norms ‖g_b‖² per parameter leaf, each leaf an
array float32[B] (examples, never tokens).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

PyTree = Any

STATISTICS = ("mean", "sq", "sign", "norms")


@flax.struct.dataclass
class GradStats:
  count: jax.Array  # float32 scalar: number of samples n
  sum: PyTree = None  # Σ g_i, like params
  sum_sq: PyTree = None  # Σ g_i², like params (None unless asked)
  sum_sign: PyTree = None  # Σ sign(g_i), like params (None unless asked)
  sq_norms: PyTree = None  # ‖g_b‖² per leaf, leaves float32[B] (None unless asked)
  granularity: str = flax.struct.field(pytree_node=False, default="example")

  # --- derived statistics -------------------------------------------------
  @property
  def mean(self) -> PyTree:
    return jax.tree.map(lambda s: s / self.count, self.sum)

  @property
  def second_moment(self) -> PyTree:
    _need(self.sum_sq, "sq")
    return jax.tree.map(lambda s: s / self.count, self.sum_sq)

  @property
  def variance(self) -> PyTree:
    """Unbiased per-coordinate variance σ̂² = n/(n-1) (q - ḡ²), clipped at 0; 0 when n = 1."""
    _need(self.sum_sq, "sq")
    n = self.count
    corr = jnp.where(n > 1, n / jnp.maximum(n - 1, 1), 0.0)
    return jax.tree.map(
        lambda s, q: corr * jnp.maximum(q / n - jnp.square(s / n), 0.0), self.sum, self.sum_sq)

  @property
  def sign_mean(self) -> PyTree:
    _need(self.sum_sign, "sign")
    return jax.tree.map(lambda s: s / self.count, self.sum_sign)

  @property
  def mean_sq_unbiased(self) -> PyTree:
    """μ̂² = ḡ² - σ̂²/n (may be negative; clip where a non-negative value is needed)."""
    return jax.tree.map(lambda m, v: jnp.square(m) - v / self.count, self.mean, self.variance)

  @property
  def total_sq_norms(self) -> jax.Array:
    """‖g_b‖² over the whole model, float32[B]."""
    _need(self.sq_norms, "norms")
    return sum(jax.tree.leaves(self.sq_norms))

  # --- merging --------------------------------------------------------------
  def merge(self, other: "GradStats") -> "GradStats":
    """Statistics of the union of two disjoint sets of samples."""
    if self.granularity != other.granularity:
      raise ValueError(f"cannot merge {self.granularity} and {other.granularity} statistics")
    add = lambda a, b: None if a is None else jax.tree.map(jnp.add, a, b)
    cat = lambda a, b: None if a is None else jax.tree.map(
        lambda x, y: jnp.concatenate([x, y], axis=-1), a, b)
    return GradStats(
        count=self.count + other.count,
        sum=add(self.sum, other.sum),
        sum_sq=add(self.sum_sq, other.sum_sq),
        sum_sign=add(self.sum_sign, other.sum_sign),
        sq_norms=cat(self.sq_norms, other.sq_norms),
        granularity=self.granularity,
    )


def _need(x, name: str) -> None:
  if x is None:
    raise ValueError(
        f"this GradStats was computed without '{name}'; add '{name}' to `want` "
        "(pergrad.stats.compute(..., want=...))")
