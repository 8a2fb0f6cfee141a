"""What the Adam family's second moment and ε say about its update, from the moments the
optimizer hands over (`Optimizer.moments(opt_state)`, a `Moments`), as ratios of sums
(`pergrad.optim.diagnostics`; statistics before any clipping):

    share_mu2 = Σ μ̂² / Σ v̂,   share_var_b = Σ (σ̂²/n) / Σ v̂,   share_var = Σ σ̂² / Σ v̂
    eps_share = #{j : ε > √(v̂_j + eps_root)} / #{j}
    eps_share_weighted = Σ_j |u_j|·[ε > √(v̂_j + eps_root)] / Σ_j |u_j|,  u = m̂/(√(v̂ + eps_root) + ε)

Adam's v estimates μ² + σ²/B (share_mu2 + share_var_b ≈ 1 for a stationary mean),
MicroAdam's μ² + σ² (share_mu2 + share_var ≈ 1); eps_share ≈ 1: u ≈ m̂/ε, ≈ 0: the
preconditioner acts. m̂ = m/(1 − β1^t) carries one factor on every coordinate, which cancels
in the weighted ratio, so |m| stands for |m̂|.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.stats import noise
from pergrad.stats.types import GradStats


class Moments(NamedTuple):
  """What an Adam-family optimizer hands the diagnostics (`Optimizer.moments(opt_state)`):
  its direction's state and the ε, eps_root it divides by (the optimizer's hparams)."""

  adam: ScaleByAdamFamilyState  # m, v and v's debiasing weight
  eps: Any
  eps_root: Any


def moment_quantities(stats: GradStats, moments: Moments | None = None
                      ) -> dict[str, tuple[Any, Any]]:
  """name -> (numerator tree, denominator tree) of the shares (with the 'sq' statistic)
  and eps_share(_weighted) (module docstring); {} without moments."""
  if moments is None:
    return {}
  adam, quantities = moments.adam, {}
  v_hat = jax.tree.map(lambda v: noise.debiased(v, adam.nu_weight), adam.nu)
  if stats.sum_sq is not None:
    mu2, var, var_b = noise.snr_terms(stats)
    quantities["share_mu2"] = (mu2, v_hat)
    quantities["share_var_b"] = (var_b, v_hat)
    quantities["share_var"] = (var, v_hat)
  root = jax.tree.map(lambda v: jnp.sqrt(v + moments.eps_root), v_hat)
  dominated = jax.tree.map(lambda r: (moments.eps > r).astype(jnp.float32), root)
  quantities["eps_share"] = (dominated,
                             jax.tree.map(lambda d: jnp.ones_like(d, jnp.float32), dominated))
  size = jax.tree.map(lambda m, r: jnp.abs(m) / (r + moments.eps), adam.mu, root)  # ∝ |u|
  quantities["eps_share_weighted"] = (jax.tree.map(jnp.multiply, size, dominated), size)
  return quantities
