"""What is logged of the optimizer every stats.log_every steps: `diagnostics(stats,
moments, snr)`, keyed "opt/<leaf path>/<name>" per parameter leaf and "opt/all/<name>"
over all coordinates.

Every quantity is a RATIO OF SUMS over the coordinates j of a parameter leaf, and over all
coordinates: Σ_j numerator_j / Σ_j denominator_j. For the SNRs it estimates
Σ_j μ_j² / Σ_j (noise variance)_j, is unbiased in its numerator and consistent (relative
bias O(1/D) over D coordinates), and reads ≈ 0 on a leaf without signal. The quantities:
the SNRs² of one sample, of ḡ and of its EMA (`pergrad.optim.snr`), and what the Adam
family's moments and ε say (`pergrad.optim.moments`: the shares of μ̂², σ̂²/n and σ̂² in v̂,
eps_share, eps_share_weighted).

With a layer selection (`GradStats.layers`), only the selected leaves are reported and
"all" sums over them. A quantity is left out when what it needs is absent (no 'sq'
statistic, no tracker state, no moments), so `diagnostics` is jittable for a fixed
(stats, moments, snr) structure. `tests/test_estimators.py` checks each estimator against the
known truth of `pergrad.stats.synthetic`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from pergrad.optim.common import require_stats
from pergrad.optim.moments import Moments, moment_quantities
from pergrad.optim.snr import snr_quantities
from pergrad.stats import noise
from pergrad.stats.types import GradStats


def diagnostics(stats: GradStats, moments: Moments | None = None, snr: Any = None
                ) -> dict[str, jax.Array]:
  """The ratios of sums of the SNRs², second-moment shares, eps_share and
  eps_share_weighted (module docstring).

  `moments`: the Adam family's m, v and ε (`Optimizer.moments(opt_state)`; None: no shares,
  no eps_share); `snr`: the `track_snr` state (an empty state or None: no snr2_ema)."""
  require_stats(stats, "diagnostics")
  # name -> (numerator tree, denominator tree), both like params
  quantities = {**snr_quantities(stats, snr), **moment_quantities(stats, moments)}
  out = {}
  for name, (num, den) in quantities.items():
    num_sums = jax.tree_util.tree_flatten_with_path(jax.tree.map(jnp.sum, num))[0]
    den_sums = jax.tree.leaves(jax.tree.map(jnp.sum, den))
    kept = []  # the leaves of the statistics' layer selection (all without one)
    for (path, a), b in zip(num_sums, den_sums, strict=True):
      key = noise.leaf_path(path)
      if stats.selects(key):
        out[f"opt/{key}/{name}"] = noise.ratio(a, b)
        kept.append((a, b))
    out[f"opt/all/{name}"] = noise.ratio(sum(a for a, _ in kept), sum(b for _, b in kept))
  return out
