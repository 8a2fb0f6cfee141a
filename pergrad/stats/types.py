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

Every other statistic comes from the registry (`pergrad.stats.registry`), stored by
name: `coordinate_stats[name]` = Σ_n φ(g_n), a tree like params (kind "coordinate",
merged by addition), and `example_stats[name]` = Σ_coords φ(g_b) per parameter leaf,
leaves float32[B] (kind "example", examples never tokens, merged by concatenation).
The properties `sum_sq`, `sum_sign` and `sq_norms` read the built-ins "sq", "sign", "norms".
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from pergrad.stats import registry

PyTree = Any

# ("mean", *registered statistics): a live view of the registry, in registration order.
STATISTICS = registry.STATISTICS


def unbiased_sq_mean(mean, variance, n):
  """μ̂² = ḡ² − σ̂²/n per coordinate: unbiased for μ² (E ḡ² = μ² + σ²/n); may be negative."""
  return jnp.square(mean) - variance / n


@flax.struct.dataclass
class GradStats:
  count: jax.Array  # float32 scalar: number of samples n
  sum: PyTree = None  # Σ g_i, like params
  # name -> Σ_n φ(g_n), like params (registered statistics of kind "coordinate")
  coordinate_stats: dict = flax.struct.field(default_factory=dict)
  # name -> Σ_coords φ(g_b) per leaf, leaves float32[B] (kind "example")
  example_stats: dict = flax.struct.field(default_factory=dict)
  granularity: str = flax.struct.field(pytree_node=False, default="example")
  # The leaves whose statistics were asked (`pergrad.layer_types`; () = all): the values
  # of other leaves are zeros (surgery) or computed anyway (vmap, loop); read `selects`.
  layers: tuple = flax.struct.field(pytree_node=False, default=())
  # The layer-type rules of the leaves (the surgery backend's class-derived types first;
  # () = `pergrad.layer_types.TYPE_RULES`), for `selects` and `noise.groups_of(rules=...)`.
  rules: tuple = flax.struct.field(pytree_node=False, default=())

  def __post_init__(self):
    """A table given as None holds no statistic of its kind: {}."""
    for name in ("coordinate_stats", "example_stats"):
      if getattr(self, name) is None:
        object.__setattr__(self, name, {})

  # --- generic access ---------------------------------------------------------
  def selects(self, path: str) -> bool:
    """Whether the statistics of the leaf at `path` ("block_0/attn/query/kernel") were
    asked (always True without a layer selection)."""
    from pergrad.layer_types import TYPE_RULES, selects

    return selects(self.layers, path, self.rules or TYPE_RULES)

  def has(self, name: str) -> bool:
    """Whether statistic `name` ("mean" or a registered one) was computed."""
    if name == "mean":
      return self.sum is not None
    return name in self.coordinate_stats or name in self.example_stats

  def coord(self, name: str) -> PyTree:
    """Σ_n φ(g_n) of coordinate statistic `name`, a tree like params."""
    _need(self.coordinate_stats.get(name), name)
    return self.coordinate_stats[name]

  def per_example(self, name: str) -> PyTree:
    """Σ_coords φ(g_b) of example statistic `name`, leaves float32[B]."""
    _need(self.example_stats.get(name), name)
    return self.example_stats[name]

  def get(self, name: str) -> PyTree:
    """The stored value of `name`: the gradient sum Σ_n g_n for "mean", else by kind."""
    if name == "mean":
      return self.sum
    if registry.get(name).kind == "example":
      return self.per_example(name)
    return self.coord(name)

  def coord_mean(self, name: str) -> PyTree:
    """(1/n) Σ_n φ(g_n) of coordinate statistic `name`."""
    return jax.tree.map(lambda s: s / self.count, self.coord(name))

  # --- the built-ins by field name ---------------------------------
  @property
  def sum_sq(self) -> PyTree:  # Σ g_i², like params (None unless asked)
    return self.coordinate_stats.get("sq")

  @property
  def sum_sign(self) -> PyTree:  # Σ sign(g_i), like params (None unless asked)
    return self.coordinate_stats.get("sign")

  @property
  def sq_norms(self) -> PyTree:  # ‖g_b‖² per leaf, leaves float32[B] (None unless asked)
    return self.example_stats.get("norms")

  # --- derived statistics -------------------------------------------------
  @property
  def mean(self) -> PyTree:
    return jax.tree.map(lambda s: s / self.count, self.sum)

  @property
  def second_moment(self) -> PyTree:
    return self._over_count(self.sum_sq, "sq")

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
    return self._over_count(self.sum_sign, "sign")

  def _over_count(self, sums: PyTree, name: str) -> PyTree:
    """sums / n, after checking that statistic `name` was computed."""
    _need(sums, name)
    return jax.tree.map(lambda s: s / self.count, sums)

  @property
  def mean_sq_unbiased(self) -> PyTree:
    """μ̂² = ḡ² - σ̂²/n (may be negative; clip where a non-negative value is needed)."""
    return jax.tree.map(lambda m, v: unbiased_sq_mean(m, v, self.count), self.mean,
                        self.variance)

  @property
  def total_sq_norms(self) -> jax.Array:
    """‖g_b‖² over the whole model, float32[B]."""
    _need(self.sq_norms, "norms")
    return sum(jax.tree.leaves(self.sq_norms))

  # --- merging --------------------------------------------------------------
  def merge(self, other: "GradStats") -> "GradStats":
    """Statistics of the union of two disjoint sets of samples.

    Coordinate statistics (and the sum) add; example statistics concatenate along the
    example axis (self's examples first)."""
    if self.granularity != other.granularity:
      raise ValueError(f"cannot merge {self.granularity} and {other.granularity} statistics")
    mine = set(self.coordinate_stats) | set(self.example_stats)
    theirs = set(other.coordinate_stats) | set(other.example_stats)
    if mine != theirs:
      raise ValueError(f"cannot merge GradStats holding different statistics {sorted(mine)} "
                       f"and {sorted(theirs)}; compute both with the same `want`")
    add = lambda a, b: None if a is None else jax.tree.map(jnp.add, a, b)
    cat = lambda a, b: jax.tree.map(lambda x, y: jnp.concatenate([x, y], axis=-1), a, b)
    return GradStats(
        count=self.count + other.count,
        sum=add(self.sum, other.sum),
        coordinate_stats={k: add(v, other.coordinate_stats[k])
                          for k, v in self.coordinate_stats.items()},
        example_stats={k: cat(v, other.example_stats[k]) for k, v in self.example_stats.items()},
        granularity=self.granularity,
        layers=self.layers,
        rules=self.rules,
    )


def _need(x, name: str) -> None:
  if x is None:
    raise ValueError(
        f"this GradStats was computed without '{name}'; add '{name}' to `want` "
        "(pergrad.stats.compute(..., want=...))")
