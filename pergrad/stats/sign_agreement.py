"""How often an update's sign agrees with the sign of the expected gradient. Jittable.

Per coordinate j, with the true mean gradient μ_j = E g_j at the current parameters and
an update direction u_j (the batch mean ḡ, Adam's / SignEMA's EMA m, the mean of
per-example signs, ...), the sign agreement is

    p_j = P(sign u_j = sign μ_j)          (1/2 where μ_j = 0),

e.g. p_j = Φ(|μ_j| √B / σ_j) for the mean of B Gaussian samples, Φ(|E m_j| / √Var m_j) for
an EMA. A sign step moves coordinate j downhill with probability p_j: its expected
first-order progress is ⟨E sign u, μ⟩ = Σ_j |μ_j| (2p_j − 1).

E g is estimated by the mean h of a HELD-OUT set of n_h samples (that no term of u has
seen, so h ⟂ u given μ), with unbiased variance v̂ and t_j = h_j / √(v̂_j / n_h); the
same-batch comparison is biased up and not computed. `counts` returns the sums behind
`raw_agreement` (all coordinates), `agreement` (those the held-out mean resolves,
|t_j| ≥ z, with `bias_bound`) and `alignment` (the cosine of the sign step with E g), so
leaves pool by adding counts (`per_leaf`). The target is a `Target` (h, v̂, n_h): the
held-out statistics (`current`) or a trailing mean of past ones (`lag_update`, `lagged`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pergrad.stats.noise import leaf_path
from pergrad.stats.types import GradStats, unbiased_sq_mean

PyTree = Any
Z = 4.0  # held-out |t| from which a coordinate's mean sign counts as known (Φ(−4) = 3e-5)


class SignCounts(NamedTuple):
  """Sums over a set of coordinates (float32 scalars; add two to pool them)."""

  coords: jax.Array  # D
  agree_all: jax.Array  # Σ_j 1[sign u = sign h]
  selected: jax.Array  # |S|: coordinates with |t| ≥ z
  agree: jax.Array  # Σ_{j∈S} 1[sign u = sign h]
  progress: jax.Array  # Σ_j sign(u_j) h_j, unbiased for Σ_j |μ_j| (2 p_j − 1)
  mu2: jax.Array  # Σ_j (h_j² − v̂_j/n_h), unbiased for Σ_j μ_j²

  def __add__(self, other):  # pooled counts, not a tuple concatenation
    return SignCounts(*(a + b for a, b in zip(self, other, strict=True)))


class Target(NamedTuple):
  """What an update is compared with: mean h, unbiased variance v̂ (trees like params) of a
  mean of n_h independent samples (v̂/n_h: the variance of h)."""

  mean: PyTree
  var: PyTree
  count: Any


class LagState(NamedTuple):
  """The un-debiased trailing mean of held-out means, float32 (`lag_update`)."""

  mean: PyTree  # h̄, like params
  var: PyTree  # w, like params
  weight: jax.Array  # a = 1 − ρ^k after k logging steps


def current(heldout: GradStats) -> Target:
  """The held-out statistics as a target (they need 'sq')."""
  if heldout.sum_sq is None:
    raise ValueError("the held-out GradStats has no 'sq'; compute it with want=('mean', 'sq')")
  return Target(heldout.mean, heldout.variance, heldout.count)


def lag_init(params: PyTree) -> LagState:
  zeros = lambda: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
  return LagState(mean=zeros(), var=zeros(), weight=jnp.float32(0.0))


def lag_update(state: LagState, target: Target, rho: float) -> LagState:
  """One logging step of the trailing mean of the held-out means h_k of the logging steps
  k = 1, 2, ... (the one home of this EMA; ρ = stats.sign_lag):

      h̄_k = ρ h̄_{k−1} + (1−ρ) h_k,   w_k = ρ² w_{k−1} + (1−ρ)² v̂_k/n_h,   a_k = ρ a_{k−1} + (1−ρ)

  from h̄_0 = w_0 = a_0 = 0. An update made of past batches (an EMA) points along past
  expected gradients, so it is also compared with this lagged target (`lagged`)."""
  f = lambda a, b: rho * a + (1.0 - rho) * jnp.asarray(b, jnp.float32)
  return LagState(mean=jax.tree.map(f, state.mean, target.mean),
                  var=jax.tree.map(lambda w, v: rho**2 * w + (1.0 - rho)**2
                                   * jnp.asarray(v, jnp.float32) / target.count,
                                   state.var, target.var),
                  weight=f(state.weight, 1.0))


def lagged(state: LagState) -> Target:
  """The lagged target (h̄/a, w/a², 1) (`lag_update`). The held-out draws are independent
  across logging steps, so w/a² is the variance of the debiased mean h̄/a, a weighted mean
  of the h_i with weights summing to 1; `counts` reads t² = h̄²/w (a cancels). At the first
  logging step it is the current target. Each term of h̄ is independent of the update, so
  every estimator holds with E h̄/a (a trailing mean of E g) in place of E g."""
  a = jnp.maximum(state.weight, jnp.finfo(jnp.float32).tiny)
  return Target(jax.tree.map(lambda m: m / a, state.mean),
                jax.tree.map(lambda w: w / (a * a), state.var), jnp.float32(1.0))


def counts(u, h, v, n_h, z: float = Z) -> SignCounts:
  """`SignCounts` of one array of coordinates: u the update, h and v the held-out mean
  and unbiased variance (same shape), n_h the held-out sample count (≥ 2)."""
  u, h, v = (jnp.asarray(x, jnp.float32) for x in (u, h, v))
  su, sh = jnp.sign(u), jnp.sign(h)
  same = (su == sh) & (su != 0)
  t2 = jnp.square(h) * n_h / jnp.maximum(v, jnp.finfo(jnp.float32).tiny)
  sel = (t2 >= z * z) & (sh != 0)
  f = lambda x: jnp.sum(x, dtype=jnp.float32)
  return SignCounts(coords=jnp.asarray(u.size, jnp.float32), agree_all=f(same),
                    selected=f(sel), agree=f(same & sel), progress=f(su * h),
                    mu2=f(unbiased_sq_mean(h, v, n_h)))


def agreement(c: SignCounts) -> jax.Array:
  """A_S: the share of resolved coordinates, S = {j : |t_j| ≥ z}, whose update sign agrees
  with the held-out sign; NaN when none is resolved.

  Given S (a function of h alone) it estimates mean_{j∈S} p_j. It differs only at selected
  coordinates whose held-out sign is wrong, where the indicator reads 1 − p_j instead of
  p_j; a coordinate with μ_j = 0 contributes 1/2 either way. So the bias is at most the
  expected share of wrong-sign selections, ≤ D Φ(−z) / |S| over D coordinates
  (`bias_bound`; Gaussian h: a wrong sign needs t beyond −z on the wrong side), and in
  practice far less (a coordinate whose sign h gets wrong has |μ| small, so p_j ≈ 1/2
  there). The target is the agreement over the coordinates with a detectable mean, reported
  with their share |S|/D (`share_resolved`; more held-out samples: a larger S). It
  saturates: a resolved coordinate has |μ_j|√n_h/σ_j ≳ z, so an update of effective
  sample size n_u (B for a batch mean, ≈ B(1+β)/(1−β) for an EMA) has SNR ≳ z√(n_u/n_h)
  there, and p_j ≈ 1 unless n_h ≫ z² n_u. With a held-out set of a few batches, compare
  placements by `alignment`, which does not saturate."""
  return jnp.where(c.selected > 0, c.agree / jnp.maximum(c.selected, 1.0), jnp.nan)


def share_resolved(c: SignCounts) -> jax.Array:
  """|S| / D: the share of coordinates whose held-out mean sign is resolved."""
  return c.selected / c.coords


def raw_agreement(c: SignCounts) -> jax.Array:
  """mean_j 1[sign u = sign h] over all coordinates. With c_u = 2p − 1 and
  c_h = 2 P(sign h = sign μ) − 1, independence gives E = 1/2 + (1/2) mean_j c_u,j c_h,j:
  attenuated toward 1/2 by the held-out mean's own sign errors (c_h < 1). (The same
  comparison with h from u's own batch shares its noise and is biased up: not computed.)"""
  return c.agree_all / c.coords


def bias_bound(c: SignCounts, z: float = Z) -> jax.Array:
  """D Φ(−z) / |S|: bound on the expected share of wrong-sign coordinates in S."""
  return c.coords * 0.5 * math.erfc(z / math.sqrt(2.0)) / jnp.maximum(c.selected, 1.0)


def alignment(c: SignCounts) -> jax.Array:
  """Σ_j sign(u_j) h_j / √(D Σ_j (h_j² − v̂_j/n_h)): the cosine between the sign step and
  E g over all coordinates; NaN when Σ μ̂² ≤ 0. A ratio of sums whose numerator is unbiased
  for Σ|μ_j| c_u,j (h enters linearly and is independent of u) and whose denominator's
  square is unbiased for D Σμ² (`GradStats.mean_sq_unbiased`)."""
  return jnp.where(c.mu2 > 0, c.progress / jnp.sqrt(c.coords * jnp.maximum(c.mu2, 1e-30)),
                   jnp.nan)


def summary(c: SignCounts, z: float = Z) -> dict[str, jax.Array]:
  """{"agree", "resolved", "agree_raw", "bias_bound", "alignment"} of one set of counts."""
  return {"agree": agreement(c), "resolved": share_resolved(c), "agree_raw": raw_agreement(c),
          "bias_bound": bias_bound(c, z), "alignment": alignment(c)}


def per_leaf(update: PyTree, target: Target | GradStats, z: float = Z) -> dict[str, SignCounts]:
  """leaf path -> `SignCounts` of update (a tree like params) against `target` (a `Target`,
  or held-out statistics computed with want ⊇ ("mean", "sq") on samples no term of the
  update has seen), plus "total": every leaf pooled."""
  t = current(target) if isinstance(target, GradStats) else target
  flat = jax.tree_util.tree_flatten_with_path(update)[0]
  mean, var = jax.tree.leaves(t.mean), jax.tree.leaves(t.var)
  if len(flat) != len(mean):
    raise ValueError(f"update has {len(flat)} leaves, the target {len(mean)}; "
                     "give a tree like params for both")
  out = {leaf_path(p): counts(u, h, v, t.count, z)
         for (p, u), h, v in zip(flat, mean, var, strict=True)}
  total = None
  for c in out.values():
    total = c if total is None else total + c
  return {**out, "total": total}
