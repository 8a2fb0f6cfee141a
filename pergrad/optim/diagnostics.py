"""Diagnostics for the signal-to-noise argument and the Adam second-moment decomposition.

Per coordinate, from the statistics of one step (n samples, mean ḡ, unbiased
variance σ̂², μ̂² = ḡ² - σ̂²/n):

    snr_example = |ḡ| / σ̂                 SNR of one sample (example or token)
    snr_batch   = sqrt(n) |ḡ| / σ̂         SNR of the batch mean (its std is σ̂/sqrt(n))
    snr_ema     = |m| / sqrt(V)            SNR of the EMA m = EMA_β(ḡ) (un-debiased)

where V is tracked by `track_snr` along with m:

    m_t = β m_{t-1} + (1-β) ḡ_t,      V_t = β² V_{t-1} + (1-β)² σ̂_t²/n_t.

V_t is the variance of m_t when the batch means of different steps are independent
with variances σ̂_t²/n_t (no stationarity assumed); debiasing m would scale m and
sqrt(V) alike, so the ratio needs none. Each SNR is |value at that stage| / (estimated
std of that value), so all three read on one scale (the sign of a stage loses little
when its SNR is >> 1). These estimators are this project's reading of the paper's SNR
argument (its text is unavailable).

For the Adam family (states of `scale_by_adam_family`, which Adam/AdamW use too), the
shares of the current step's μ̂², σ̂²/n and σ̂² relative to the debiased v̂:

    share_mu2 = μ̂² / v̂,   share_var_b = (σ̂²/n) / v̂,   share_var = σ̂² / v̂

(statistics before any clipping). Adam's v estimates μ² + σ²/B, MicroAdam's μ² + σ².

Every quantity is reduced to its median over the coordinates of each parameter leaf
("opt/<leaf path>/<name>") and over all coordinates ("opt/all/<name>"), sampled
beyond `summaries.MEDIAN_SAMPLE` coordinates as the statistics' summaries are. A quantity is
left out when what it needs is absent (no 'sq' statistic, no tracker, no Adam state),
so the function is jittable for a fixed (opt_state, stats) structure.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.common import check_beta, f32, require_stats
from pergrad.stats import summaries
from pergrad.stats.types import GradStats

_TINY = float(jnp.finfo(jnp.float32).tiny)


class SnrTrackerState(NamedTuple):
  mu: Any  # m = EMA_β(ḡ), un-debiased, float32 like params
  var_mu: Any  # V = β² V + (1-β)² σ̂²/n, float32 like params


def track_snr(beta: float) -> optax.GradientTransformationExtraArgs:
  """Identity on the updates; tracks (m, V) of the module docstring from `grad_stats`.

  Needs the 'sq' statistic. Put it in the chain so the EMA SNR can be logged.
  """
  check_beta(beta)

  def init_fn(params):
    zeros = lambda: optax.tree.zeros_like(params, dtype=jnp.float32)
    return SnrTrackerState(mu=zeros(), var_mu=zeros())

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del params, extra_args
    stats = require_stats(grad_stats, "the SNR tracker (track_snr)", need=("sq",))
    n = stats.count
    mu = jax.tree.map(lambda m, g: beta * m + (1.0 - beta) * g, state.mu, f32(stats.mean))
    var_mu = jax.tree.map(lambda w, v: beta**2 * w + (1.0 - beta)**2 * v / n,
                          state.var_mu, f32(stats.variance))
    return updates, SnrTrackerState(mu=mu, var_mu=var_mu)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _find(opt_state: Any, cls: type) -> Any:
  """The first sub-state of type `cls` in `opt_state` (None if there is none)."""
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, cls))
           if isinstance(s, cls)]
  return found[0] if found else None


def _ratio(num, den):
  return num / jnp.maximum(den, _TINY)


def diagnostics(opt_state: Any, stats: GradStats) -> dict[str, jax.Array]:
  """Medians of the SNRs and second-moment shares (module docstring), keyed "opt/<leaf>/<name>"."""
  require_stats(stats, "diagnostics")
  quantities: dict[str, Any] = {}  # name -> pytree like params
  has_sq = stats.sum_sq is not None
  if has_sq:
    n = stats.count
    mean, var = f32(stats.mean), f32(stats.variance)
    std = jax.tree.map(jnp.sqrt, var)
    quantities["snr_example"] = jax.tree.map(lambda m, s: _ratio(jnp.abs(m), s), mean, std)
    quantities["snr_batch"] = jax.tree.map(lambda r: jnp.sqrt(n) * r, quantities["snr_example"])
  tracker = _find(opt_state, SnrTrackerState)
  if tracker is not None:
    quantities["snr_ema"] = jax.tree.map(lambda m, w: _ratio(jnp.abs(m), jnp.sqrt(w)),
                                         tracker.mu, tracker.var_mu)
  adam = _find(opt_state, ScaleByAdamFamilyState)
  if adam is not None and has_sq:
    v_hat = jax.tree.map(lambda v: v / jnp.maximum(adam.nu_weight, _TINY), adam.nu)
    mu2 = jax.tree.map(lambda m, v: jnp.square(m) - v / n, mean, var)
    quantities["share_mu2"] = jax.tree.map(_ratio, mu2, v_hat)
    quantities["share_var_b"] = jax.tree.map(lambda v, d: _ratio(v / n, d), var, v_hat)
    quantities["share_var"] = jax.tree.map(_ratio, var, v_hat)

  out = {}
  for name, tree in quantities.items():
    leaves_with_path = jax.tree_util.tree_flatten_with_path(tree)[0]
    for path, leaf in leaves_with_path:
      key = jax.tree_util.keystr(path, simple=True, separator="/")
      out[f"opt/{key}/{name}"] = summaries.median(leaf)
    # Over all coordinates: each leaf sampled in proportion to its size.
    total = sum(leaf.size for _, leaf in leaves_with_path)
    out[f"opt/all/{name}"] = jnp.nanmedian(jnp.concatenate([
        summaries.sample_coords(leaf, max(1, summaries.MEDIAN_SAMPLE * leaf.size // total))
        for _, leaf in leaves_with_path]))
  return out
