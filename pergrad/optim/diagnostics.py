"""Diagnostics for the signal-to-noise argument and the Adam second-moment decomposition.

Every quantity is a RATIO OF SUMS over the coordinates j of a parameter leaf
("opt/<leaf path>/<name>") and over all coordinates ("opt/all/<name>"): Σ_j signal_j /
Σ_j noise_j. It estimates Σ_j μ_j² / Σ_j (noise variance)_j, is unbiased in its numerator
and consistent (relative bias O(1/D) over D coordinates), costs two sums per leaf (no
sort), and reads ≈ 0 on a leaf without signal. (The median over coordinates of a ratio
with the noisy |ḡ| in the numerator, logged before, sits on a noise floor instead: with
μ = 0, √n|ḡ|/σ̂ is |t_{n−1}|, median ≈ 0.67-0.69, whatever the leaf.)

Per coordinate, from the statistics of one step (n samples, mean ḡ, unbiased variance
σ̂², μ̂² = ḡ² − σ̂²/n, unbiased for μ² since E ḡ² = μ² + σ²/n):

    snr2_example = Σ μ̂² / Σ σ̂²            estimates Σμ²/Σσ²: the SNR² of one sample
    snr2_batch   = Σ μ̂² / Σ (σ̂²/n)        estimates Σμ²/(Σσ²/n): the SNR² of ḡ
                 = n · snr2_example         exactly, by construction (not a measurement)
    snr2_ema     = Σ (m² − V) / Σ V         SNR² of the EMA m (needs `track_snr`)

where `track_snr` tracks, along the updates,

    m_t = β m_{t−1} + (1−β) ḡ_t   (un-debiased),    V_t = β² V_{t−1} + (1−β)² σ̂_t²/n_t.

V_t estimates Var m_t without bias when the batch means of different steps are
independent with variances σ_t²/n_t (no stationarity assumed), so m² − V estimates
(E m_t)² without bias. Debiasing would divide m by (1−β^t) and V by (1−β^t)²: the ratio
needs none. The EMA gain `ema_gain(snr2_ema, snr2_batch)` = SNR_ema / SNR_batch is
√((1+β)/(1−β)) for a mean constant over steps once stationary (≈ 4.36 at β = 0.9; after
t updates from m_0 = V_0 = 0 its square carries the factor (1−β^t)/(1+β^t)), and smaller
when the mean drifts: √((1+βρ)/(1−βρ)) for a mean drifting as an AR(1) of coefficient ρ
(`pergrad.stats.synthetic.ema_gain2`).

All three are SIGNED: on coordinates without signal their estimate is negative about as
often as positive. They are logged and aggregated unclipped; take √max(·, 0) only to draw an SNR.

For the Adam family (states of `scale_by_adam_family`, which Adam/AdamW use too), the
shares of the current step's μ̂², σ̂²/n and σ̂² in the debiased v̂, as ratios of sums:

    share_mu2 = Σ μ̂² / Σ v̂,   share_var_b = Σ (σ̂²/n) / Σ v̂,   share_var = Σ σ̂² / Σ v̂

(statistics before any clipping). Adam's v estimates μ² + σ²/B (share_mu2 + share_var_b
≈ 1 for a stationary mean), MicroAdam's μ² + σ² (share_mu2 + share_var ≈ 1).

With a layer selection (`GradStats.layers`), only the selected leaves are reported and
"all" sums over them. A quantity is left out when what it needs is absent (no 'sq'
statistic, no tracker, no Adam state), so the function is jittable for a fixed
(opt_state, stats) structure. These estimators are this project's reading of the paper's
SNR argument (its text is unavailable); `tests/test_estimators.py` checks each against
the known truth of `pergrad.stats.synthetic`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.common import check_beta, f32, find_state, require_stats
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


def _ratio(num, den):
  return num / jnp.maximum(den, _TINY)


def ema_gain(snr2_ema, snr2_batch):
  """SNR_ema / SNR_batch = √(snr2_ema / snr2_batch), NaN unless both are > 0 (works on
  floats, NumPy and pandas values alike)."""
  ok = (snr2_ema > 0) & (snr2_batch > 0)
  return np.sqrt(np.where(ok, snr2_ema, np.nan) / np.where(ok, snr2_batch, np.nan))


def diagnostics(opt_state: Any, stats: GradStats) -> dict[str, jax.Array]:
  """Ratios of sums of the SNRs² and second-moment shares (module docstring), keyed
  "opt/<leaf>/<name>" per parameter leaf and "opt/all/<name>" over all coordinates."""
  require_stats(stats, "diagnostics")
  # name -> (numerator tree, denominator tree), both like params
  quantities: dict[str, tuple[Any, Any]] = {}
  has_sq = stats.sum_sq is not None
  if has_sq:
    n = stats.count
    mean, var = f32(stats.mean), f32(stats.variance)
    mu2 = jax.tree.map(lambda m, v: jnp.square(m) - v / n, mean, var)
    var_b = jax.tree.map(lambda v: v / n, var)
    quantities["snr2_example"] = (mu2, var)
    quantities["snr2_batch"] = (mu2, var_b)
  tracker = find_state(opt_state, SnrTrackerState)
  if tracker is not None:
    quantities["snr2_ema"] = (jax.tree.map(lambda m, w: jnp.square(m) - w, tracker.mu,
                                           tracker.var_mu), tracker.var_mu)
  adam = find_state(opt_state, ScaleByAdamFamilyState)
  if adam is not None and has_sq:
    v_hat = jax.tree.map(lambda v: v / jnp.maximum(adam.nu_weight, _TINY), adam.nu)
    quantities["share_mu2"] = (mu2, v_hat)
    quantities["share_var_b"] = (var_b, v_hat)
    quantities["share_var"] = (var, v_hat)

  out = {}
  for name, (num, den) in quantities.items():
    num_sums = jax.tree_util.tree_flatten_with_path(jax.tree.map(jnp.sum, num))[0]
    den_sums = jax.tree.leaves(jax.tree.map(jnp.sum, den))
    kept = []  # the leaves of the statistics' layer selection (all without one)
    for (path, a), b in zip(num_sums, den_sums, strict=True):
      key = jax.tree_util.keystr(path, simple=True, separator="/")
      if stats.selects(key):
        out[f"opt/{key}/{name}"] = _ratio(a, b)
        kept.append((a, b))
    out[f"opt/all/{name}"] = _ratio(sum(a for a, _ in kept), sum(b for _, b in kept))
  return out
