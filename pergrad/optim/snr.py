"""The signal-to-noise ratios of the mean gradient, and the tracker of its EMA.

Ratios of sums over coordinates (`pergrad.optim.diagnostics`), from the estimators of
`pergrad.stats.noise`, all SIGNED (take √max(·, 0) only to draw an SNR):

    snr2_example = Σ μ̂² / Σ σ̂²            SNR² of one sample (`noise.snr_terms`)
    snr2_batch   = Σ μ̂² / Σ (σ̂²/n)        SNR² of ḡ, = n · snr2_example by construction
    snr2_ema     = Σ (m² − V) / Σ V         SNR² of the EMA m (the `track_snr` state)

where `track_snr` tracks m_t = β m_{t−1} + (1−β) ḡ_t (un-debiased) and
V_t = β² V_{t−1} + (1−β)² σ̂_t²/n_t, which estimates Var m_t without bias when the batch means
of different steps are independent (no stationarity assumed), so m² − V estimates (E m_t)².
The EMA gain SNR_ema / SNR_batch (`pergrad.analysis.ema_gain`) is √((1+β)/(1−β)) for a mean
constant over steps once stationary, smaller when the mean drifts
(`pergrad.stats.synthetic.ema_gain2`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pergrad.fields import check_decay
from pergrad.optim.common import f32, require_stats
from pergrad.optim.hparams import traced
from pergrad.optim.tracker import Tracker
from pergrad.stats import noise
from pergrad.stats.types import GradStats


class SnrTrackerState(NamedTuple):
  mu: Any  # m = EMA_β(ḡ), un-debiased, float32 like params
  var_mu: Any  # V = β² V + (1-β)² σ̂²/n, float32 like params


def track_snr(beta: float | None = None) -> Tracker:
  """Tracks (m, V) of the module docstring from `grad_stats`, which needs the 'sq'
  statistic, so that the EMA SNR can be logged; β = `beta`, or with None the optimizer's b1
  that `update(state, grad_stats, hparams)` reads from `hparams` (the numbers the optimizer
  state holds: `pergrad.optim.hparams.numbers`)."""
  if beta is not None and not traced(beta):  # else checked where built
    check_decay(beta)

  def init(params):
    zeros = lambda: optax.tree.zeros_like(params, dtype=jnp.float32)
    return SnrTrackerState(mu=zeros(), var_mu=zeros())

  def update(state, grad_stats, hparams=None):
    stats = require_stats(grad_stats, "the SNR tracker (track_snr)", need=("sq",))
    b = hparams.b1 if beta is None else beta
    n = stats.count
    mu = jax.tree.map(lambda m, g: b * m + (1.0 - b) * g, state.mu, f32(stats.mean))
    var_mu = jax.tree.map(lambda w, v: b**2 * w + (1.0 - b)**2 * v / n,
                          state.var_mu, f32(stats.variance))
    return SnrTrackerState(mu=mu, var_mu=var_mu)

  return Tracker(init, update)


def snr_quantities(stats: GradStats, snr: Any = None) -> dict[str, tuple[Any, Any]]:
  """name -> (numerator tree, denominator tree) of each SNR² (module docstring) that
  `stats` and the `track_snr` state `snr` allow: none without 'sq', no snr2_ema without the
  tracker's state."""
  quantities = {}
  if stats.sum_sq is not None:
    mu2, var, var_b = noise.snr_terms(stats)
    quantities["snr2_example"] = (mu2, var)
    quantities["snr2_batch"] = (mu2, var_b)
  if isinstance(snr, SnrTrackerState):
    quantities["snr2_ema"] = (jax.tree.map(lambda m, w: jnp.square(m) - w, snr.mu, snr.var_mu),
                              snr.var_mu)
  return quantities
