"""Scalar summaries of `GradStats` for logging (W&B, metrics.jsonl). Jittable.

Per parameter leaf (key "stats/<leaf path>/<name>"), with n samples (B examples, or
B·T tokens), ḡ the mean, σ̂² the unbiased variance (both per coordinate):
  mean_sq_median        median over coordinates of ḡ²
  var_median            median of σ̂²                                      (needs "sq")
  var_over_n_median     median of σ̂²/n, the variance of ḡ as an estimate   (needs "sq")
  snr_median            median of |ḡ|/σ̂ over coordinates with σ̂ > 0       (needs "sq")
  frac_mean_dominated   fraction of coordinates with ḡ² > σ̂²/n            (needs "sq")
  norm_p10/p50/p90      percentiles over examples of ‖g_b‖ in this leaf   (needs "norms")
Whole model (key "stats/total/<name>"):
  norm_p10/p50/p90, frac_mean_dominated, and the gradient noise scale
  B_simple = S/|G|² (McCandlish et al. 2018, per-example form of Gray et al.,
  arXiv 2411.00999) from P = (1/B) Σ_b ‖g_b‖² and ‖ḡ‖²:
    |G|² = (B‖ḡ‖² − P)/(B − 1)   (unbiased ‖E g‖²)
    S    = (P − ‖ḡ‖²)/(1 − 1/B)  (unbiased tr Σ)
  logged as gns_G2, gns_S, gns_b_simple (one step's ratio; average the two terms over
  steps, e.g. with an EMA, before dividing for a stable estimate). NaN when B = 1.
Medians over the coordinates of a leaf with more than MEDIAN_SAMPLE coordinates are
taken over MEDIAN_SAMPLE of them at fixed pseudo-random positions (`sample_coords`): a
sort of every coordinate made a logging step of the cpu preset cost about 35 plain
steps; the sampled median's standard error is about 1.25·s/√4096 ≈ 2% of the spread s
of the quantity around its median (asymptotic, for a density that is smooth there).
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
import numpy as np

from pergrad.stats import registry
from pergrad.stats.types import GradStats

PERCENTILES = (10, 50, 90)
MEDIAN_SAMPLE = 4096
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


def sample_coords(x: jax.Array, n: int = MEDIAN_SAMPLE) -> jax.Array:
  """x flattened, or n of its entries at fixed pseudo-random positions if it has more."""
  x = x.ravel()
  if x.size <= n:
    return x
  idx = np.sort(np.random.default_rng(x.size).choice(x.size, n, replace=False))
  return x[idx]


def median(x: jax.Array) -> jax.Array:
  """Median over the coordinates of x (sampled beyond MEDIAN_SAMPLE; NaNs ignored)."""
  return jnp.nanmedian(sample_coords(x))


def _norm_percentiles(sq_norms_B: jax.Array, prefix: str) -> dict[str, jax.Array]:
  norms_B = jnp.sqrt(sq_norms_B)
  qs = jnp.percentile(norms_B, jnp.asarray(PERCENTILES, jnp.float32))
  return {f"{prefix}/norm_p{p}": qs[i] for i, p in enumerate(PERCENTILES)}


def layer_summaries(stats: GradStats) -> dict[str, jax.Array]:
  """dict "stats/<leaf>/<name>" -> float32 scalar; see the module docstring."""
  out: dict[str, jax.Array] = {}
  n = stats.count
  has_sq, has_norms = stats.sum_sq is not None, stats.sq_norms is not None
  mean = stats.mean
  var = stats.variance if has_sq else None
  paths = jax.tree_util.tree_flatten_with_path(mean)[0]
  n_dominated, n_coords = 0.0, 0
  for i, (path, m) in enumerate(paths):
    key = f"stats/{leaf_name(path)}"
    m2 = jnp.square(m).ravel()
    out[f"{key}/mean_sq_median"] = median(m2)
    if has_sq:
      v = jax.tree.leaves(var)[i].ravel()
      sd = jnp.sqrt(v)
      v_s, m_s, sd_s = sample_coords(v), sample_coords(m), sample_coords(sd)
      out[f"{key}/var_median"] = jnp.median(v_s)
      out[f"{key}/var_over_n_median"] = jnp.median(v_s / n)
      out[f"{key}/snr_median"] = jnp.nanmedian(
          jnp.where(sd_s > 0, jnp.abs(m_s) / jnp.where(sd_s > 0, sd_s, 1.0), jnp.nan))
      dominated = jnp.sum(m2 > v / n)
      out[f"{key}/frac_mean_dominated"] = dominated / m2.size
      n_dominated, n_coords = n_dominated + dominated, n_coords + m2.size
    if has_norms:
      out.update(_norm_percentiles(jax.tree.leaves(stats.sq_norms)[i], key))
  out.update(registered_summaries(stats))
  if has_sq:
    out["stats/total/frac_mean_dominated"] = n_dominated / n_coords
  if has_norms:
    sq_norms_B = stats.total_sq_norms
    out.update(_norm_percentiles(sq_norms_B, "stats/total"))
    out.update(noise_scale(sq_norms_B, mean))
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
      key = f"stats/{leaf_name(path)}"
      if st.summarize is not None:
        out.update({f"{key}/{suffix}": v for suffix, v in st.summarize(leaf, n).items()})
      elif st.kind == "coordinate":
        out[f"{key}/{name}_mean"] = jnp.mean(leaf) / n
      else:
        out[f"{key}/{name}_mean"] = jnp.mean(leaf)
  return out


def noise_scale(sq_norms_B: jax.Array, mean) -> dict[str, jax.Array]:
  """Per-example estimators of |G|², S = tr Σ and B_simple = S/|G|² (see module doc)."""
  B = sq_norms_B.shape[-1]
  P = jnp.mean(sq_norms_B)
  gbar2 = sum(jnp.sum(jnp.square(m)) for m in jax.tree.leaves(mean))
  if B < 2:
    nan = jnp.asarray(jnp.nan, jnp.float32)
    return {"stats/total/gns_G2": nan, "stats/total/gns_S": nan, "stats/total/gns_b_simple": nan}
  G2 = (B * gbar2 - P) / (B - 1)
  S = (P - gbar2) / (1 - 1 / B)
  return {"stats/total/gns_G2": G2, "stats/total/gns_S": S, "stats/total/gns_b_simple": S / G2}
