"""Scalar summaries of `GradStats` for logging (W&B, metrics.jsonl). Jittable.

Per parameter leaf (key "stats/<leaf path>/<name>", `noise.leaf_path`), with n samples
(B examples, or B·T tokens), ḡ the mean, σ̂² the unbiased variance, μ̂² = ḡ² − σ̂²/n the
unbiased squared mean (all per coordinate, `noise.snr_terms`), over the leaf's D
coordinates:
  gbar2_mean            (1/D) Σ ḡ²           (what Adam's v averages; E = mean μ² + σ²/n)
  mu2_mean              (1/D) Σ μ̂²           signed, unbiased for mean μ²     (needs "sq")
  var_mean              (1/D) Σ σ̂²           unbiased for mean σ²             (needs "sq")
  frac_mean_dominated   fraction of coordinates with ḡ² > σ̂²/n               (needs "sq")
  norm_p10/p50/p90      percentiles over examples of ‖g_b‖ in this leaf   (needs "norms")
frac_mean_dominated has a floor: with μ = 0 it is P(|t_{n−1}| > 1) (0.325 at n = 32,
0.317 for large n); read it as descriptive only. Whole model ("stats/total/<name>", over
the selected leaves): frac_mean_dominated and norm_p10/p50/p90 of the whole-model ‖g_b‖;
a leaf outside the layer selection gets gbar2_mean only. Other registered statistics:
`registered_summaries`. Every summary is a sum or a count: no per-coordinate median
(medians of noisy per-coordinate ratios sit on a noise floor, and a sort of every
coordinate is costly). The SNR ratios of sums are logged by `pergrad.optim.diagnostics`
("opt/<leaf>/snr2_example", "opt/<leaf>/snr2_batch"), the GNS by its tracker ("gns/...").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pergrad.stats import registry
from pergrad.stats.noise import leaf_path, snr_terms
from pergrad.stats.types import GradStats

PERCENTILES = (10, 50, 90)
# Statistics with dedicated summaries in `layer_summaries` ("sign": none, by choice).
DEDICATED = ("sq", "sign", "norms")


def _norm_percentiles(sq_norms_B: jax.Array, prefix: str) -> dict[str, jax.Array]:
  norms_B = jnp.sqrt(sq_norms_B)
  qs = jnp.percentile(norms_B, jnp.asarray(PERCENTILES, jnp.float32))
  return {f"{prefix}/norm_p{p}": qs[i] for i, p in enumerate(PERCENTILES)}


def layer_summaries(stats: GradStats) -> dict[str, jax.Array]:
  """dict "stats/<leaf>/<name>" -> float32 scalar; see the module docstring."""
  out: dict[str, jax.Array] = {}
  has_sq, has_norms = stats.sum_sq is not None, stats.sq_norms is not None
  paths = jax.tree_util.tree_flatten_with_path(stats.mean)[0]
  if has_sq:
    mu2, var, var_b = (jax.tree.leaves(t) for t in snr_terms(stats))
  n_dominated, n_coords = 0.0, 0
  chosen = [stats.selects(leaf_path(path)) for path, _ in paths]
  for i, (path, m) in enumerate(paths):
    key = f"stats/{leaf_path(path)}"
    m2 = jnp.square(m.astype(jnp.float32))
    out[f"{key}/gbar2_mean"] = jnp.mean(m2)
    if not chosen[i]:  # outside the request's layer selection: no statistics asked
      continue
    if has_sq:
      out[f"{key}/mu2_mean"] = jnp.mean(mu2[i])
      out[f"{key}/var_mean"] = jnp.mean(var[i])
      dominated = jnp.sum(m2 > var_b[i])
      out[f"{key}/frac_mean_dominated"] = dominated / m2.size
      n_dominated, n_coords = n_dominated + dominated, n_coords + m2.size
    if has_norms:
      out.update(_norm_percentiles(jax.tree.leaves(stats.sq_norms)[i], key))
  out.update(registered_summaries(stats))
  if has_sq:
    out["stats/total/frac_mean_dominated"] = n_dominated / n_coords
  if has_norms:
    sq_norms_B = sum(x for x, c in zip(jax.tree.leaves(stats.sq_norms), chosen, strict=True)
                     if c)
    out.update(_norm_percentiles(sq_norms_B, "stats/total"))
  return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def registered_summaries(stats: GradStats) -> dict[str, jax.Array]:
  """Per-leaf summaries of the registered statistics (`pergrad.stats.registry`) present in
  `stats` without a dedicated one ("sq", "sign", "norms": `layer_summaries`; "sign" none):

    stats/<leaf>/<name>_mean   kind "coordinate": mean over coordinates of (1/n) Σ_n φ(g_n);
                               kind "example": mean over examples of Σ_coords φ(g_b);

  or, if the statistic has a `summarize` callable, "stats/<leaf>/<suffix>" for each entry
  of summarize(leaf value, n)."""
  out: dict[str, jax.Array] = {}
  n = stats.count
  present = [(k, v) for k, v in (*stats.coordinate_stats.items(), *stats.example_stats.items())
             if k not in DEDICATED]
  for name, value in present:
    st = registry.get(name)
    for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
      if not stats.selects(leaf_path(path)):
        continue
      key = f"stats/{leaf_path(path)}"
      if st.summarize is not None:
        out.update({f"{key}/{suffix}": v for suffix, v in st.summarize(leaf, n).items()})
      elif st.kind == "coordinate":
        out[f"{key}/{name}_mean"] = jnp.mean(leaf) / n
      else:
        out[f"{key}/{name}_mean"] = jnp.mean(leaf)
  return out
