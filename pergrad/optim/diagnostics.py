"""Trackers beside the optimizer and what is logged from them: the SNR diagnostics
("opt/...") and the gradient noise scale ("gns/...").

A tracker is a pair of pure functions (`Tracker`): state = init(params) and
state = update(state, grad_stats). It never touches the updates, and its state lives in
the train state beside the optimizer's (`pergrad.train.state.TrainState.snr`, `.gns`), so
turning a diagnostic on or off leaves the optimizer state (and its checkpoint) unchanged.
A tracker that is off (`OFF`) has the empty state `optax.EmptyState()`.

The estimators are the pure math of `pergrad.stats.noise`. Every SNR quantity is a RATIO
OF SUMS over the coordinates j of a parameter leaf ("opt/<leaf path>/<name>") and over all
coordinates ("opt/all/<name>"): Σ_j signal_j / Σ_j noise_j. It estimates
Σ_j μ_j² / Σ_j (noise variance)_j, is unbiased in its numerator and consistent (relative
bias O(1/D) over D coordinates), and reads ≈ 0 on a leaf without signal:

    snr2_example = Σ μ̂² / Σ σ̂²            SNR² of one sample (`noise.snr_terms`)
    snr2_batch   = Σ μ̂² / Σ (σ̂²/n)        SNR² of ḡ, = n · snr2_example by construction
    snr2_ema     = Σ (m² − V) / Σ V         SNR² of the EMA m (needs the `track_snr` state)

where `track_snr` tracks, along the updates,

    m_t = β m_{t−1} + (1−β) ḡ_t   (un-debiased),    V_t = β² V_{t−1} + (1−β)² σ̂_t²/n_t.

V_t estimates Var m_t without bias when the batch means of different steps are
independent with variances σ_t²/n_t (no stationarity assumed), so m² − V estimates
(E m_t)² without bias; the ratio needs no debiasing. The EMA gain
`pergrad.analysis.ema_gain(snr2_ema, snr2_batch)` = SNR_ema / SNR_batch is √((1+β)/(1−β)) for a mean
constant over steps once stationary (≈ 4.36 at β = 0.9; after t updates from
m_0 = V_0 = 0 its square carries the factor (1−β^t)/(1+β^t)), and smaller when the mean
drifts (`pergrad.stats.synthetic.ema_gain2`). All three are SIGNED; take √max(·, 0) only
to draw an SNR.

For the Adam family (states of `scale_by_adam_family`), the shares of the current step's
μ̂², σ̂²/n and σ̂² in the debiased v̂, as ratios of sums:

    share_mu2 = Σ μ̂² / Σ v̂,   share_var_b = Σ (σ̂²/n) / Σ v̂,   share_var = Σ σ̂² / Σ v̂

(statistics before any clipping). Adam's v estimates μ² + σ²/B (share_mu2 + share_var_b
≈ 1 for a stationary mean), MicroAdam's μ² + σ² (share_mu2 + share_var ≈ 1).

From the moments and the ε that the optimizer hands over (`Optimizer.moments(opt_state)`,
a `Moments`; the Adam family's builders say where their state sits in the chain), the
share of coordinates whose denominator √(v̂ + eps_root) + ε is dominated by ε, a
coordinate count over a coordinate count:

    eps_share = #{j : ε > √(v̂_j + eps_root)} / #{j}

(≈ 1: u ≈ m̂/ε, the momentum direction scaled by 1/ε; ≈ 0: the preconditioner acts),
and the same share weighted by the size of the direction's update u = m̂/(√(v̂ + eps_root) + ε):

    eps_share_weighted = Σ_j |u_j|·[ε > √(v̂_j + eps_root)] / Σ_j |u_j|

(the share of the update's L1 mass that ε dominates). m̂ = m/(1 − β1^t) carries the same
factor on every coordinate, which cancels in the ratio, so |m| stands for |m̂|.

With a layer selection (`GradStats.layers`), only the selected leaves are reported and
"all" sums over them. A quantity is left out when what it needs is absent (no 'sq'
statistic, no tracker state, no moments), so `diagnostics` is jittable for a fixed
(stats, opt_state, snr) structure. `tests/test_estimators.py` checks each estimator against the
known truth of `pergrad.stats.synthetic`.

`track_gns` reads the per-example squared norms of `grad_stats` ("norms") every step and
keeps, per group (`noise.groups_of`), the step's raw terms |G|²_est, S_est and their EMAs;
`gns_metrics(gns_state)` gives the "gns/<group>/..." keys, logged every step. The raw
terms are written with the 9 digits that round-trip a float32, so `pergrad.analysis.resmooth`
recomputes B_simple offline with any α.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pergrad.fields import check_decay
from pergrad.layer_types import TYPE_RULES
from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.common import f32, require_stats
from pergrad.optim.hparams import traced
from pergrad.stats import noise
from pergrad.stats.types import GradStats


class Tracker(NamedTuple):
  """A diagnostic beside the optimizer: pure functions of its state (module docstring)."""

  init: Callable[[Any], Any]  # params -> state
  update: Callable[[Any, GradStats], Any]  # (state, grad_stats) -> state


OFF = Tracker(init=lambda params: optax.EmptyState(), update=lambda state, stats: state)


# --- the Adam family's moments --------------------------------------------------------------
class Moments(NamedTuple):
  """What an Adam-family optimizer hands the diagnostics (`Optimizer.moments(opt_state)`):
  its direction's state and the ε, eps_root it divides by (the optimizer's hparams)."""

  adam: ScaleByAdamFamilyState  # m, v and v's debiasing weight
  eps: Any
  eps_root: Any


# --- SNR -------------------------------------------------------------------------------------
class SnrTrackerState(NamedTuple):
  mu: Any  # m = EMA_β(ḡ), un-debiased, float32 like params
  var_mu: Any  # V = β² V + (1-β)² σ̂²/n, float32 like params


def track_snr(beta: float) -> Tracker:
  """Tracks (m, V) of the module docstring from `grad_stats`, which needs the 'sq'
  statistic, so that the EMA SNR can be logged."""
  if not traced(beta):  # else checked where built
    check_decay(beta)

  def init(params):
    zeros = lambda: optax.tree.zeros_like(params, dtype=jnp.float32)
    return SnrTrackerState(mu=zeros(), var_mu=zeros())

  def update(state, grad_stats):
    stats = require_stats(grad_stats, "the SNR tracker (track_snr)", need=("sq",))
    n = stats.count
    mu = jax.tree.map(lambda m, g: beta * m + (1.0 - beta) * g, state.mu, f32(stats.mean))
    var_mu = jax.tree.map(lambda w, v: beta**2 * w + (1.0 - beta)**2 * v / n,
                          state.var_mu, f32(stats.variance))
    return SnrTrackerState(mu=mu, var_mu=var_mu)

  return Tracker(init, update)


def diagnostics(stats: GradStats, moments: Moments | None = None, snr: Any = None
                ) -> dict[str, jax.Array]:
  """Ratios of sums of the SNRs², second-moment shares, eps_share and eps_share_weighted
  (module docstring), keyed "opt/<leaf>/<name>" per parameter leaf and "opt/all/<name>"
  over all coordinates.

  `moments`: the Adam family's m, v and ε (`Optimizer.moments(opt_state)`; None: no shares,
  no eps_share); `snr`: the `track_snr` state (an empty state or None: no snr2_ema)."""
  require_stats(stats, "diagnostics")
  # name -> (numerator tree, denominator tree), both like params
  quantities: dict[str, tuple[Any, Any]] = {}
  has_sq = stats.sum_sq is not None
  if has_sq:
    mu2, var, var_b = noise.snr_terms(stats)
    quantities["snr2_example"] = (mu2, var)
    quantities["snr2_batch"] = (mu2, var_b)
  if isinstance(snr, SnrTrackerState):
    quantities["snr2_ema"] = (jax.tree.map(lambda m, w: jnp.square(m) - w, snr.mu, snr.var_mu),
                              snr.var_mu)
  adam = None if moments is None else moments.adam
  if adam is not None and has_sq:
    v_hat = jax.tree.map(lambda v: noise.debiased(v, adam.nu_weight), adam.nu)
    quantities["share_mu2"] = (mu2, v_hat)
    quantities["share_var_b"] = (var_b, v_hat)
    quantities["share_var"] = (var, v_hat)
  if adam is not None:
    v_hat = jax.tree.map(lambda v: noise.debiased(v, adam.nu_weight), adam.nu)
    root = jax.tree.map(lambda v: jnp.sqrt(v + moments.eps_root), v_hat)
    dominated = jax.tree.map(lambda r: (moments.eps > r).astype(jnp.float32), root)
    quantities["eps_share"] = (dominated,
                               jax.tree.map(lambda d: jnp.ones_like(d, jnp.float32), dominated))
    size = jax.tree.map(lambda m, r: jnp.abs(m) / (r + moments.eps), adam.mu, root)  # ∝ |u|
    quantities["eps_share_weighted"] = (jax.tree.map(jnp.multiply, size, dominated), size)

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


# --- gradient noise scale --------------------------------------------------------------------
class GnsTrackerState(NamedTuple):
  """Per group: this step's raw terms, their un-debiased EMAs, and the EMA weight."""

  G2: dict  # group -> float32: |G|²_est of the last step
  S: dict  # group -> float32: S_est of the last step
  ema_G2: dict  # group -> float32: α·ema + (1 − α)·G2
  ema_S: dict
  weight: jax.Array  # float32 w_t = α w_{t−1} + (1 − α) = 1 − α^t


def track_gns(alpha: float, *, tied_leaf: str | None = None, tied: str = "include",
              rules: Sequence[tuple[str, str]] = TYPE_RULES, layers: Sequence[str] = ()
              ) -> Tracker:
  """Tracks the GNS terms of every group (`noise.groups_of` on the parameter paths,
  restricted to `layers`) from `grad_stats`, which must hold per-example "norms" of those
  leaves (`build_optimizer(gns=...)` adds them to the optimizer's request)."""
  check_decay(alpha, "gns alpha")
  if tied not in noise.TIED:
    raise ValueError(f"gns tied={tied!r}; choose one of {noise.TIED}.")
  groups = lambda tree: noise.groups_of(noise.leaf_paths(tree), tied_leaf=tied_leaf,
                                        tied=tied, rules=rules, layers=layers)

  def init(params):
    zero = {g: jnp.float32(0.0) for g in groups(params)}
    return GnsTrackerState(G2=zero, S=dict(zero), ema_G2=dict(zero), ema_S=dict(zero),
                           weight=jnp.float32(0.0))

  def update(state, grad_stats):
    if grad_stats is None:
      raise ValueError("track_gns needs grad_stats with per-example 'norms' (stats.gns).")
    G2, S = noise.group_terms(grad_stats, groups(grad_stats.mean))
    return GnsTrackerState(
        G2=G2, S=S,
        ema_G2={g: noise.ema(alpha, state.ema_G2[g], G2[g]) for g in G2},
        ema_S={g: noise.ema(alpha, state.ema_S[g], S[g]) for g in S},
        weight=noise.ema(alpha, state.weight, jnp.float32(1.0)))

  return Tracker(init, update)


def gns_metrics(st: Any) -> dict[str, jax.Array]:
  """"gns/<group>/{G2,S}" (this step's raw terms: what `resmooth` reads), and the smoothed
  "gns/<group>/{G2_ema,S_ema}" (debiased) and "gns/<group>/b_simple" = S_ema / G2_ema,
  from the `track_gns` state `st`; {} for an empty state (the GNS is not tracked)."""
  if not isinstance(st, GnsTrackerState):
    return {}
  out = {}
  for g in st.G2:
    G2_ema = noise.debiased(st.ema_G2[g], st.weight)
    S_ema = noise.debiased(st.ema_S[g], st.weight)
    out.update({f"gns/{g}/G2": st.G2[g], f"gns/{g}/S": st.S[g], f"gns/{g}/G2_ema": G2_ema,
                f"gns/{g}/S_ema": S_ema, f"gns/{g}/b_simple": S_ema / G2_ema})
  return out
