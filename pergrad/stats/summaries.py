"""Scalar summaries of `GradStats` for logging (W&B, metrics.jsonl). Jittable.

Per parameter leaf (key "stats/<leaf path>/<name>"), with n samples (B examples, or
B·T tokens), ḡ the mean, σ̂² the unbiased variance, μ̂² = ḡ² − σ̂²/n the unbiased squared
mean (all per coordinate), and sums / means over the leaf's D coordinates:
  gbar2_mean            (1/D) Σ ḡ²           (what Adam's v averages; E = mean μ² + σ²/n)
  mu2_mean              (1/D) Σ μ̂²           signed, unbiased for mean μ²     (needs "sq")
  var_mean              (1/D) Σ σ̂²           unbiased for mean σ²             (needs "sq")
  mu2_over_var_b        Σ μ̂² / Σ (σ̂²/n)     estimates Σμ²/(Σσ²/n), signed    (needs "sq")
  mu2_over_var          Σ μ̂² / Σ σ̂²         estimates Σμ²/Σσ², signed        (needs "sq")
  frac_mean_dominated   fraction of coordinates with ḡ² > σ̂²/n               (needs "sq")
  norm_p10/p50/p90      percentiles over examples of ‖g_b‖ in this leaf   (needs "norms")
mu2_over_var_b is the squared SNR of the batch mean, the same ratio of sums as the
optimizer diagnostics' `snr2_batch` (`pergrad.optim.diagnostics`): μ² over Adam's σ²/B
term (the moments experiment's quantity); mu2_over_var = mu2_over_var_b / n is μ² over
MicroAdam's σ² term. Being ratios of sums they read ≈ 0 (and may be < 0) on a leaf
without signal; the median over coordinates of |ḡ|/σ̂ that was logged before sat at a
noise floor instead (median |t_{n−1}|/√n for μ = 0: 0.68/√n at n = 32).
frac_mean_dominated has a floor too: with μ = 0 it is P(|t_{n−1}| > 1) (0.325 at
n = 32, 0.317 for large n); read it as descriptive only.
A leaf outside the request's layer selection (`GradStats.layers`) gets gbar2_mean only,
and the totals below run over the selected leaves.
Whole model (key "stats/total/<name>"):
  mu2_over_var_b, mu2_over_var and frac_mean_dominated over all coordinates,
  norm_p10/p50/p90, and the gradient noise scale
  B_simple = S/|G|² (McCandlish et al. 2018, per-example form of Gray et al.,
  arXiv 2411.00999) from P = (1/B) Σ_b ‖g_b‖² and ‖ḡ‖²:
    |G|² = (B‖ḡ‖² − P)/(B − 1)   (unbiased ‖E g‖² = Σμ²; = Σ μ̂² over all coordinates)
    S    = (P − ‖ḡ‖²)/(1 − 1/B)  (unbiased tr Σ = Σσ²; = Σ σ̂²)
  logged as gns_G2, gns_S, gns_b_simple (one step's ratio, = 1/mu2_over_var of the whole
  model; average the two terms over steps, e.g. with an EMA, before dividing for a stable
  estimate). NaN when B = 1.
No per-coordinate median is logged: every summary above is a sum or a count (medians of
noisy per-coordinate ratios sit on a noise floor, and a sort of every coordinate made a
logging step of the cpu preset cost about 35 plain steps).
Any other registered statistic present in the GradStats (`pergrad.stats.registry`;
"sq", "sign", "norms" have the dedicated summaries above, "sign" none), per leaf:
  <name>_mean           kind "coordinate": mean over coordinates of (1/n) Σ_n φ(g_n);
                        kind "example": mean over examples of Σ_coords φ(g_b);
or, if the statistic has a `summarize` callable, "stats/<leaf>/<suffix>" for each
entry of summarize(leaf value, n).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pergrad.stats import registry
from pergrad.stats.types import GradStats

PERCENTILES = (10, 50, 90)
# Statistics with dedicated summaries in `layer_summaries` ("sign": none, by choice).
DEDICATED = ("sq", "sign", "norms")


def leaf_name(path) -> str:
  """'block_0/attn/query/kernel' from a jax tree path."""
  parts = []
  for k in path:
    for attr in ("key", "name", "idx"):
      if hasattr(k, attr):
        parts.append(str(getattr(k, attr)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def _norm_percentiles(sq_norms_B: jax.Array, prefix: str) -> dict[str, jax.Array]:
  norms_B = jnp.sqrt(sq_norms_B)
  qs = jnp.percentile(norms_B, jnp.asarray(PERCENTILES, jnp.float32))
  return {f"{prefix}/norm_p{p}": qs[i] for i, p in enumerate(PERCENTILES)}


def _ratio(num, den):
  return num / jnp.maximum(den, jnp.finfo(jnp.float32).tiny)


def layer_summaries(stats: GradStats) -> dict[str, jax.Array]:
  """dict "stats/<leaf>/<name>" -> float32 scalar; see the module docstring."""
  out: dict[str, jax.Array] = {}
  n = stats.count
  has_sq, has_norms = stats.sum_sq is not None, stats.sq_norms is not None
  mean = stats.mean
  var = stats.variance if has_sq else None
  paths = jax.tree_util.tree_flatten_with_path(mean)[0]
  n_dominated, n_coords, sum_mu2, sum_var = 0.0, 0, 0.0, 0.0
  chosen = [stats.selects(leaf_name(path)) for path, _ in paths]
  for i, (path, m) in enumerate(paths):
    key = f"stats/{leaf_name(path)}"
    m2 = jnp.square(m.astype(jnp.float32))
    out[f"{key}/gbar2_mean"] = jnp.mean(m2)
    if not chosen[i]:  # outside the request's layer selection: no statistics asked
      continue
    if has_sq:
      v = jax.tree.leaves(var)[i].astype(jnp.float32)
      s_mu2, s_var = jnp.sum(m2 - v / n), jnp.sum(v)
      out[f"{key}/mu2_mean"] = s_mu2 / m2.size
      out[f"{key}/var_mean"] = s_var / m2.size
      out[f"{key}/mu2_over_var_b"] = _ratio(s_mu2, s_var / n)
      out[f"{key}/mu2_over_var"] = _ratio(s_mu2, s_var)
      dominated = jnp.sum(m2 > v / n)
      out[f"{key}/frac_mean_dominated"] = dominated / m2.size
      n_dominated, n_coords = n_dominated + dominated, n_coords + m2.size
      sum_mu2, sum_var = sum_mu2 + s_mu2, sum_var + s_var
    if has_norms:
      out.update(_norm_percentiles(jax.tree.leaves(stats.sq_norms)[i], key))
  out.update(registered_summaries(stats))
  if has_sq:
    out["stats/total/frac_mean_dominated"] = n_dominated / n_coords
    out["stats/total/mu2_over_var_b"] = _ratio(sum_mu2, sum_var / n)
    out["stats/total/mu2_over_var"] = _ratio(sum_mu2, sum_var)
  if has_norms:
    sq_norms_B = sum(x for x, c in zip(jax.tree.leaves(stats.sq_norms), chosen, strict=True)
                     if c)
    out.update(_norm_percentiles(sq_norms_B, "stats/total"))
    out.update(noise_scale(sq_norms_B, [m for (_, m), c in zip(paths, chosen, strict=True)
                                        if c]))
  return {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}


def registered_summaries(stats: GradStats) -> dict[str, jax.Array]:
  """Per-leaf summaries of the registered statistics without a dedicated one (see above)."""
  out: dict[str, jax.Array] = {}
  n = stats.count
  present = [(k, v) for k, v in (*stats.coordinate_stats.items(), *stats.example_stats.items())
             if k not in DEDICATED]
  for name, value in present:
    st = registry.get(name)
    for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
      if not stats.selects(leaf_name(path)):
        continue
      key = f"stats/{leaf_name(path)}"
      if st.summarize is not None:
        out.update({f"{key}/{suffix}": v for suffix, v in st.summarize(leaf, n).items()})
      elif st.kind == "coordinate":
        out[f"{key}/{name}_mean"] = jnp.mean(leaf) / n
      else:
        out[f"{key}/{name}_mean"] = jnp.mean(leaf)
  return out


def noise_terms(B, P, gbar2):
  """(|G|²_est, S_est) = ((B‖ḡ‖² − P)/(B − 1), (P − ‖ḡ‖²)/(1 − 1/B)) from P = mean_b ‖g_b‖²
  and gbar2 = ‖ḡ‖² (McCandlish et al. 2018; also `pergrad.gns`, per leaf and group)."""
  return (B * gbar2 - P) / (B - 1.0), (P - gbar2) / (1.0 - 1.0 / B)


def noise_scale(sq_norms_B: jax.Array, mean) -> dict[str, jax.Array]:
  """Per-example estimators of |G|², S = tr Σ and B_simple = S/|G|² (see module doc)."""
  B = sq_norms_B.shape[-1]
  P = jnp.mean(sq_norms_B)
  gbar2 = sum(jnp.sum(jnp.square(m)) for m in jax.tree.leaves(mean))
  if B < 2:
    nan = jnp.asarray(jnp.nan, jnp.float32)
    return {"stats/total/gns_G2": nan, "stats/total/gns_S": nan, "stats/total/gns_b_simple": nan}
  G2, S = noise_terms(B, P, gbar2)
  return {"stats/total/gns_G2": G2, "stats/total/gns_S": S, "stats/total/gns_b_simple": S / G2}
