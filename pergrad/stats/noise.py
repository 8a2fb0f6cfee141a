"""Gradient-noise estimators: pure math on the sums of a `GradStats` (jittable), and the
one helper that names a parameter leaf ("block_0/attn/query/kernel", `leaf_path`).

Gradient noise scale (McCandlish et al. 2018, arXiv 1812.06162; per-example form of Gray
et al., arXiv 2411.00999; conventions of CerebrasResearch/nanoGNS). For B per-example
gradients g_b of a block of parameters, P = (1/B) Σ_b ‖g_b‖² and ḡ their mean (`noise_terms`):

    |G|²_est = (B‖ḡ‖² − P) / (B − 1)      unbiased for ‖E g‖²
    S_est    = (P − ‖ḡ‖²) / (1 − 1/B)     unbiased for tr Σ (Σ = Cov g_b)
    B_simple = EMA_α(S_est) / EMA_α(|G|²_est)   in examples (T·B_simple in tokens)

Both terms are sums over coordinates, so they add over disjoint blocks (`group_terms`);
each is smoothed separately and debiased (`ema`, `debiased`), never the per-step ratio.
`two_batch_terms` is the form from small batches of b inside a big one (b = 1: the above).

Signal-to-noise ratios (`snr_terms`), from one step's n samples with mean ḡ, unbiased
variance σ̂² and μ̂² = ḡ² − σ̂²/n (unbiased for μ²), as ratios of sums over coordinates:
snr2_example = Σ μ̂² / Σ σ̂² (one sample), snr2_batch = Σ μ̂² / Σ (σ̂²/n) = n·snr2_example.
At example granularity snr2_example = |G|²_est / S_est, the unsmoothed B_simple's inverse.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pergrad.layer_types import LAYER_TYPES, TYPE_RULES, layer_type, selects
from pergrad.stats.types import GradStats, unbiased_sq_mean

TOTAL = "total"
TIED = ("include", "exclude")
_TINY = float(jnp.finfo(jnp.float32).tiny)


# --- leaf paths ------------------------------------------------------------------------------
def leaf_path(keypath) -> str:
  """'block_0/attn/query/kernel' from a jax key path (`tree_flatten_with_path`)."""
  return jax.tree_util.keystr(tuple(keypath), simple=True, separator="/")


def leaf_paths(tree: Any) -> list[str]:
  """`leaf_path` of every leaf of `tree`, in tree order."""
  return [leaf_path(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def groups_of(paths: Sequence[str], *, tied_leaf: str | None = None, tied: str = "include",
              rules: Sequence[tuple[str, str]] = TYPE_RULES, layers: Sequence[str] = ()
              ) -> dict[str, tuple[int, ...]]:
  """{group: leaf indices}: each layer type present (`pergrad.layer_types`), and "total"
  (every counted leaf). A tied embedding is one parameter used twice, so it counts once.

  tied_leaf: the path of a tied embedding table (None: untied); `tied` says whether it is
  counted ("include", as "embedding") or left out of every group ("exclude", nanoGNS).
  layers: the statistics' layer selection (`pergrad.layer_types`; empty: every leaf);
  "total" is then the total over the selected leaves.
  """
  if tied not in TIED:
    raise ValueError(f"gns tied={tied!r}; choose one of {TIED}.")
  if tied_leaf is not None and tied_leaf not in paths:
    raise ValueError(f"tied embedding leaf {tied_leaf!r} is not a parameter leaf.")
  counted = [i for i, p in enumerate(paths) if not (tied == "exclude" and p == tied_leaf)
             and selects(layers, p)]
  if not counted:
    raise ValueError(f"no parameter leaf is selected by layers={list(layers)} (types "
                     f"{LAYER_TYPES} or path patterns).")
  out: dict[str, list[int]] = {}
  for i in counted:
    out.setdefault(layer_type(paths[i], rules), []).append(i)
  ordered = {k: tuple(out[k]) for k in LAYER_TYPES if k in out}
  ordered[TOTAL] = tuple(counted)
  return ordered


# --- gradient noise scale --------------------------------------------------------------------
def noise_terms(B, P, gbar2):
  """(|G|²_est, S_est) = ((B‖ḡ‖² − P)/(B − 1), (P − ‖ḡ‖²)/(1 − 1/B)) from P = mean_b ‖g_b‖²
  and gbar2 = ‖ḡ‖²."""
  return (B * gbar2 - P) / (B - 1.0), (P - gbar2) / (1.0 - 1.0 / B)


def leaf_terms(stats: GradStats) -> tuple[list[jax.Array], list[jax.Array]]:
  """Per leaf (tree order): (|G|²_est, S_est) of one step's per-example norms (float32)."""
  if not stats.has("norms") or stats.granularity != "example":
    raise ValueError("GNS needs per-example squared norms: ask the statistics engine for "
                     "want=[..., 'norms'] at granularity 'example' (e.g. stats=gns).")
  B = stats.count.astype(jnp.float32)
  P = [jnp.mean(n.astype(jnp.float32)) for n in jax.tree.leaves(stats.sq_norms)]
  g2 = [jnp.sum(jnp.square(m.astype(jnp.float32))) for m in jax.tree.leaves(stats.mean)]
  terms = [noise_terms(B, p, g) for g, p in zip(g2, P, strict=True)]
  return [t[0] for t in terms], [t[1] for t in terms]


def group_terms(stats: GradStats, groups: Mapping[str, Sequence[int]]
                ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  """({group: |G|²_est}, {group: S_est}): sums of the leaves' terms over each group."""
  G2, S = leaf_terms(stats)
  add = lambda xs, idx: sum((xs[i] for i in idx), jnp.float32(0.0))
  return ({g: add(G2, idx) for g, idx in groups.items()},
          {g: add(S, idx) for g, idx in groups.items()})


def two_batch_terms(small_sq_norms, big_sq_norm, b_small: float, b_big: float):
  """(|G|²_est, S_est) from ‖G_b‖² of small batches of b_small examples (averaged over
  them) and ‖G_B‖² of the big batch of b_big (McCandlish et al. 2018, App. A.1):

      |G|²_est = (B‖G_B‖² − b·‖G_b‖²) / (B − b),   S_est = (‖G_b‖² − ‖G_B‖²) / (1/b − 1/B)

  small batches being e.g. microbatches or devices; b = 1 is the per-example form."""
  if not b_big > b_small >= 1:
    raise ValueError(f"two-batch GNS needs b_big > b_small >= 1, got {b_big}, {b_small}.")
  small = jnp.mean(jnp.asarray(small_sq_norms, jnp.float32))
  big = jnp.asarray(big_sq_norm, jnp.float32)
  G2 = (b_big * big - b_small * small) / (b_big - b_small)
  S = (small - big) / (1.0 / b_small - 1.0 / b_big)
  return G2, S


def ema(alpha: float, old, new):
  """α·old + (1 − α)·new in float32 (un-debiased). Each GNS term is smoothed separately,
  never the EMA of the per-step ratio, whose denominator is noisy and can be ≤ 0.
  `pergrad.analysis.smooth` runs the same float32 recurrences in NumPy on logged raw terms:
  it equals the online values to float32 rounding (the device may fuse a multiply-add)."""
  return jnp.float32(alpha) * old + jnp.float32(1.0 - alpha) * new


def debiased(ema_value, weight):
  """ema / w_t, w_t = 1 − α^t the EMA of ones, carried as the recurrence
  w_t = α w_{t−1} + (1 − α) (guarded at w = 0)."""
  return ema_value / jnp.maximum(weight, _TINY)


# --- signal-to-noise ratios ------------------------------------------------------------------
def ratio(num, den):
  """num / den, the denominator guarded at the smallest float32 (ratios of sums)."""
  return num / jnp.maximum(den, _TINY)


def snr_terms(stats: GradStats) -> tuple[Any, Any, Any]:
  """(μ̂², σ̂², σ̂²/n): float32 trees like the parameters (needs the 'sq' statistic).
  μ̂² = ḡ² − σ̂²/n is unbiased for μ² since E ḡ² = μ² + σ²/n. The ratios built on them are
  RATIOS OF SUMS over coordinates (`ratio`; signed, ≈ 0 without signal, consistent)."""
  n = stats.count
  f32 = lambda t: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t)
  mean, var = f32(stats.mean), f32(stats.variance)
  mu2 = jax.tree.map(lambda m, v: unbiased_sq_mean(m, v, n), mean, var)
  return mu2, var, jax.tree.map(lambda v: v / n, var)
