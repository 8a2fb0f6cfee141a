"""A synthetic gradient source with known truth, to validate the logged estimators.

Per-example gradients of a params-shaped pytree, independent over examples and steps:

    g_{t,i} ~ N(μ_t, diag σ²)          i = 1..n at step t,

with σ fixed per coordinate (any shape broadcastable to the leaf's) and a mean

    μ_t = μ + d_t,    d_t = ρ d_{t-1} + τ ξ_t,   ξ_t ~ N(0, I),

i.e. a constant mean μ (τ = 0), a random walk with step std τ (ρ = 1), or a
mean-reverting AR(1) drift around μ (ρ < 1; d_0 drawn from its stationary law
N(0, τ²/(1-ρ²)), so the drift has std s = τ/√(1-ρ²) and correlation time 1/(1-ρ) steps).
μ, σ, τ may differ per leaf, and μ may be 0 (a leaf with no signal). NumPy RNG, seeded.

`grad_stats` turns one step's samples into the `GradStats` the real engine would give, so
the real optimizer, tracker, diagnostics and summaries run on it; `ratio_truth` gives the
truth and standard error of every ratio-of-sums estimator they log, `EmaTruth` and
`ema_gain2` those of the EMA stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pergrad.stats import registry
from pergrad.stats.types import GradStats

PyTree = Any


class GaussianSource:
  """Gaussian per-example gradients with known per-coordinate mean and std (module doc).

  Args:
    mu: the constant part μ of the mean, a pytree of arrays (defines the shapes).
    sigma: per-coordinate std σ, a pytree like mu (leaves broadcastable, e.g. scalars).
    walk_std: the drift's step std τ, a pytree like mu or one float (0: constant mean).
    rho: the drift's autoregression ρ in [0, 1] (1: random walk).
    seed: seed of the NumPy generator.
  """

  def __init__(self, mu: PyTree, sigma: PyTree, *, walk_std: PyTree | float = 0.0,
               rho: float = 1.0, seed: int = 0):
    if not 0.0 <= rho <= 1.0:
      raise ValueError(f"rho={rho} must be in [0, 1]")
    self.mu = jax.tree.map(lambda x: np.asarray(x, np.float64), mu)
    self.treedef = jax.tree.structure(self.mu)
    leaves = jax.tree.leaves(self.mu)
    as_leaves = lambda t: (jax.tree.leaves(t) if not np.isscalar(t) else [t] * len(leaves))
    self.sigma = [np.broadcast_to(np.asarray(s, np.float64), m.shape)
                  for s, m in zip(as_leaves(sigma), leaves, strict=True)]
    self.walk_std = [np.broadcast_to(np.asarray(s, np.float64), m.shape)
                     for s, m in zip(as_leaves(walk_std), leaves, strict=True)]
    self.rho = float(rho)
    self.rng = np.random.default_rng(seed)
    self.t = 0
    if self.rho < 1.0:  # stationary start
      self._d = [s / np.sqrt(1 - self.rho**2) * self.rng.standard_normal(m.shape)
                 for s, m in zip(self.walk_std, leaves, strict=True)]
    else:
      self._d = [np.zeros(m.shape) for m in leaves]

  def _tree(self, leaves):
    return jax.tree.unflatten(self.treedef, leaves)

  @property
  def mean(self) -> PyTree:
    """μ_t of the last step drawn (μ_0 before any), float64."""
    return self._tree([m + d for m, d in zip(jax.tree.leaves(self.mu), self._d, strict=True)])

  @property
  def variance(self) -> PyTree:
    """σ² per coordinate, float64."""
    return self._tree([s**2 for s in self.sigma])

  def step(self, n: int) -> PyTree:
    """Advances to step t+1 (drifts the mean when τ > 0) and draws its n samples:
    a pytree with leaves float32[n, *shape]."""
    if self.t > 0:
      self._d = [self.rho * d + s * self.rng.standard_normal(d.shape)
                 for d, s in zip(self._d, self.walk_std, strict=True)]
    self.t += 1
    mean = jax.tree.leaves(self.mean)
    return self._tree([(m + s * self.rng.standard_normal((n,) + m.shape)).astype(np.float32)
                       for m, s in zip(mean, self.sigma, strict=True)])


def grad_stats(samples: PyTree, want: Sequence[str] = ("mean", "sq", "norms")) -> GradStats:
  """The `GradStats` of one step's samples (leaves [n, *shape]), as the reference backend
  sums them (`pergrad.stats.reference`), in float32: Σ_i g_i; Σ_i φ(g_i) per coordinate
  (kind "coordinate"); Σ_coords φ(g_i) per example and leaf (kind "example"; "norms":
  ‖g_i‖²), for the registered statistics in `want`."""
  g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), samples)
  n = jax.tree.leaves(g)[0].shape[0]
  phis = {k: registry.get(k).phi for k in registry.select(want)}
  coord = {k: jax.tree.map(lambda x, phi=phis[k]: jnp.sum(phi(x), axis=0), g)
           for k in registry.select(want, "coordinate")}
  example = {k: jax.tree.map(lambda x, phi=phis[k]: jnp.sum(phi(x).reshape(n, -1), axis=1), g)
             for k in registry.select(want, "example")}
  return GradStats(count=jnp.asarray(n, jnp.float32), sum=jax.tree.map(lambda x: x.sum(0), g),
                   coordinate_stats=coord, example_stats=example, granularity="example")


def var_of_variance(sigma2, n: int):
  """Var(σ̂²) = 2σ⁴/(n−1) for Gaussian samples (n of them, unbiased σ̂²)."""
  return 2.0 * np.square(sigma2) / (n - 1)


def ratio_truth(M, W, U, c=1.0) -> tuple[float, float]:
  """(R, standard error of R̂) for R̂ = Σ(X² − Y)/Σ c·Y; arrays of any shape (c
  broadcastable), summed over all their entries.

  Every SNR / share logged by `pergrad.optim.diagnostics` and `pergrad.stats.summaries` has
  the form

      R̂ = Σ_j (X_j² − Y_j) / Σ_j c·Y_j,   X_j ~ N(M_j, W_j),  Y_j ⟂ X_j,  E Y_j = W_j,
                                                              Var Y_j = U_j,

  (X = ḡ, Y = σ̂²/n for the batch stage; X = m, Y = V for the EMA stage), estimating
  R = Σ M² / Σ c·W. For Gaussian samples, ḡ and σ̂² are independent and
  Var(σ̂²) = 2σ⁴/(n−1). The delta method gives the standard error of R̂
  (Var(X²) = 4M²W + 2W², Cov(X² − Y, Y) = −U):

      Var R̂ ≈ [Σ(4M²W + 2W² + U) + 2R Σ c·U + R² Σ c²·U] / (Σ c·W)²,

  with a relative bias O(1/D) over D coordinates, negligible next to it."""
  M, W, U = (np.asarray(x, np.float64).ravel() for x in (M, W, U))
  c = np.broadcast_to(np.asarray(c, np.float64).ravel(), W.shape)
  den = np.sum(c * W)
  R = np.sum(M**2) / den
  var = (np.sum(4 * M**2 * W + 2 * W**2 + U) + 2 * R * np.sum(c * U)
         + R**2 * np.sum(c**2 * U)) / den**2
  return float(R), float(np.sqrt(var))


class EmaTruth:
  """Known mean and variance of the tracker's m_t = β m_{t−1} + (1−β) ḡ_t (m_0 = 0), and
  the variance of its estimate V_t = β² V_{t−1} + (1−β)² σ̂²_t/n, given the mean path:

      E m_t = β E m_{t−1} + (1−β) μ_t,    W_t = Var m_t = β² W_{t−1} + (1−β)² σ²/n,
      U_t = Var V_t = β⁴ U_{t−1} + (1−β)⁴ · 2σ⁴/(n²(n−1)).
  """

  def __init__(self, beta: float):
    self.beta, self.M, self.W, self.U = beta, 0.0, 0.0, 0.0

  def update(self, mu, sigma2, n: int) -> None:
    b = self.beta
    self.M = b * self.M + (1 - b) * np.asarray(mu, np.float64)
    self.W = b**2 * self.W + (1 - b)**2 * np.asarray(sigma2, np.float64) / n
    self.U = b**4 * self.U + (1 - b)**4 * var_of_variance(sigma2, n) / n**2


def ema_gain2(beta: float, rho: float = 1.0, t: int | None = None) -> float:
  """Expected SNR²_ema / SNR²_batch for the tracker (m_0 = V_0 = 0) after t updates
  (stationary if t is None) on this source with μ = 0 and an AR(1) drift of coefficient
  ρ (stationary start), or with a constant mean (ρ = 1, τ = 0) and any μ.

  E(E[m_t|path])² / Var m_t with E[m_t|path] = (1−β) Σ_{k<t} β^k μ_{t−k} and
  Cov(μ_s, μ_{s'}) ∝ ρ^|s−s'|; Var m_t = (1−β)² Σ_{k<t} β^{2k} σ²/n; so

      gain² = Σ_{k,l<t} β^{k+l} ρ^|k−l| / Σ_{k<t} β^{2k}
            → (1+βρ)/(1−βρ)                                        (t → ∞),

  which is (1+β)/(1−β) for a constant mean (ρ = 1), with the finite-t factor
  (1−β^t)/(1+β^t) then; 1 for a mean redrawn every step (ρ = 0). The debiasing of m and
  V divides both by (1−β^t)^(1 or 2) and cancels in the ratio.
  """
  if t is None:
    return (1 + beta * rho) / (1 - beta * rho)
  k = np.arange(t)
  num = np.sum(beta ** (k[:, None] + k[None, :]) * rho ** np.abs(k[:, None] - k[None, :]))
  return float(num / np.sum(beta ** (2 * k)))
