"""The Adam-preconditioner family: Adam, MicroAdam, MicroAdamVar, MicroAdamMSQ and mix.

Per coordinate, with per-example gradients g_i (i = 1..B), mean ḡ, second moment
q = mean_i g_i², unbiased variance σ̂² = B/(B-1)(q - ḡ²) and squared mean μ̂² = ḡ² - σ̂²/B:

    m_t = EMA_β1(ḡ),   v_t = EMA_β2(s),   u = m̂ / (sqrt(v̂ + eps_root) + eps)

with m̂ = m/(1-β1^t), v̂ = v/(1-β2^t), and the second-moment statistic s:

    adam            s = ḡ²                          E[s] = μ² + σ²/B
    micro_adam      s = q                           E[s] = μ² + σ²
    micro_adam_var  s = σ̂²                          E[s] = σ²
    micro_adam_msq  s = max(ḡ² - σ̂²/B, 0)           ≈ μ² (unbiased before the clip)
    mix             s = max(a·μ̂² + b·σ̂², 0)

The named variants are mix(1, 1/B), mix(1, 1), mix(0, 1) and mix(1, 0), exactly for the
sample statistics. `variant="adam"` equals `optax.scale_by_adam` (tested).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from pergrad.fields import check_decay
from pergrad.optim.common import f32, require_stats
from pergrad.optim.configs import AdamVariant
from pergrad.optim.hparams import traced
from pergrad.stats.request import StatsRequest
from pergrad.stats.types import GradStats, unbiased_sq_mean

VARIANTS = AdamVariant.values()
NEEDS_SQ = frozenset(VARIANTS) - {"adam"}


class ScaleByAdamFamilyState(NamedTuple):
  count: jax.Array  # int32 scalar: number of updates so far
  mu: Any  # EMA_β1(ḡ), float32, like params
  nu: Any  # EMA_β2(s), float32, like params
  nu_weight: jax.Array  # float32 scalar 1 - β2^t (the debiasing divisor of nu)


def check_adam_args(variant: str, b1: float, b2: float, eps: float, eps_root: float,
                    mix_a: float, mix_b: float) -> None:
  """One clear ValueError for an invalid setting (called before any compute)."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown Adam variant {variant!r}; choose one of {VARIANTS}")
  check_decay(b1, "b1")
  check_decay(b2, "b2")
  if eps < 0 or eps_root < 0:
    raise ValueError(f"eps={eps} and eps_root={eps_root} must be >= 0")
  if variant == "mix" and (mix_a < 0 or mix_b < 0 or mix_a + mix_b == 0):
    raise ValueError(
        f"variant=mix needs mix_a >= 0, mix_b >= 0, not both 0; got ({mix_a}, {mix_b})")


def second_moment_statistic(variant: str, mean: Any, stats: GradStats | None, *,
                            mix_a: float = 1.0, mix_b: float = 0.0,
                            scale_sq: jax.Array | float = 1.0) -> Any:
  """The statistic s fed to v = EMA_β2(s) (module docstring), in float32.

  Args:
    variant: one of VARIANTS.
    mean: ḡ (the incoming updates, possibly clipped).
    stats: per-example statistics (unused for "adam").
    mix_a, mix_b: weights of μ̂² and σ̂² for variant "mix".
    scale_sq: c² when ḡ was clipped by a factor c: the per-example statistics are
      those of the gradients c·g_i (q and σ̂² scale by c²).
  """
  g = f32(mean)
  if variant == "adam":
    return jax.tree.map(jnp.square, g)
  who = f"Adam variant '{variant}'"
  stats = require_stats(stats, who, need=("sq",), granularity="example")
  n = stats.count
  if variant == "micro_adam":
    return jax.tree.map(lambda q: scale_sq * q, f32(stats.second_moment))
  var = jax.tree.map(lambda v: scale_sq * v, f32(stats.variance))
  if variant == "micro_adam_var":
    return var
  if variant == "micro_adam_msq":
    return jax.tree.map(lambda m, v: jnp.maximum(unbiased_sq_mean(m, v, n), 0.0), g, var)
  return jax.tree.map(
      lambda m, v: jnp.maximum(mix_a * unbiased_sq_mean(m, v, n) + mix_b * v, 0.0), g, var)


def scale_by_adam_family(variant: str = "adam", b1: float = 0.9, b2: float = 0.999,
                         eps: float = 1e-8, eps_root: float = 0.0, mix_a: float = 1.0,
                         mix_b: float = 0.0, *, clip_norm: float | None = None
                         ) -> optax.GradientTransformationExtraArgs:
  """Adam-family direction u = m̂/(sqrt(v̂ + eps_root) + eps) (module docstring).

  The incoming updates are taken as ḡ (the train step passes `grad_stats.mean`).
  With `clip_norm`, ḡ is clipped to that global norm as by `optax.clip_by_global_norm`,
  and q, σ̂² are scaled by the same factor squared, as if every g_i had been scaled:
  clip here rather than earlier in the chain, where the statistics would not follow.

  Args:
    variant: "adam" | "micro_adam" | "micro_adam_var" | "micro_adam_msq" | "mix".
    b1, b2: EMA decays in [0, 1) of the first and second moments.
    eps, eps_root: added outside / inside the square root.
    mix_a, mix_b: weights of μ̂² and σ̂² for variant "mix".
    clip_norm: optional global-norm clip of ḡ.

  Returns:
    A transformation whose update reads `grad_stats` (with the 'sq' statistic,
    granularity "example") for every variant except "adam", which ignores it.

  micro_adam_msq (and mix with b = 0) has s = 0 on every coordinate whose batch mean is
  noise-dominated (ḡ² ≤ σ̂²/B), where the update is then m̂/ε: ε is its floor, so it needs a
  far larger ε than Adam's 1e-8 (the msq_eps experiment searches it).

  "MicroAdam" is the per-example Adam of Roulet & Agarwala (arXiv 2510.00236), equal to the
  Micro-Adam of optax's `examples/aggregate.ipynb` and to the batch-size-invariant Adam of Wang
  & Aitchison (arXiv 2402.18824); not IST-DASLab's MicroAdam (gradient compression). The
  formulas of MicroAdamVar, MicroAdamMSQ and mix are this project's reading of the paper's
  names and abstract. `build_optimizer` uses variant="adam" for the Adam/AdamW baselines too:
  its state carries the debiasing weight of v, which `pergrad.optim.diagnostics` needs.
  """
  if not traced(b1, b2, eps, eps_root, clip_norm):  # else checked where built
    check_adam_args(variant, b1, b2, eps, eps_root, mix_a, mix_b)
    if clip_norm is not None and clip_norm <= 0:
      raise ValueError(f"clip_norm={clip_norm} must be positive (or None for no clipping)")
  clip = optax.clip_by_global_norm(clip_norm) if clip_norm is not None else None

  def init_fn(params):
    zeros = lambda: optax.tree.zeros_like(params, dtype=jnp.float32)
    return ScaleByAdamFamilyState(count=jnp.zeros([], jnp.int32), mu=zeros(), nu=zeros(),
                                  nu_weight=jnp.zeros([], jnp.float32))

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del params, extra_args
    g = f32(updates)
    scale_sq = 1.0
    if clip is not None:
      norm = optax.tree.norm(g)
      scale_sq = jnp.where(norm < clip_norm, 1.0, jnp.square(clip_norm / norm))
      g, _ = clip.update(g, optax.EmptyState())
    mu = optax.tree.update_moment(g, state.mu, b1, 1)
    if variant == "adam":  # the very operations of optax.scale_by_adam
      nu = optax.tree.update_moment_per_elem_norm(g, state.nu, b2, 2)
    else:
      s = second_moment_statistic(variant, g, grad_stats, mix_a=mix_a, mix_b=mix_b,
                                  scale_sq=scale_sq)
      nu = optax.tree.update_moment(s, state.nu, b2, 1)
    count_inc = optax.safe_increment(state.count)
    mu_hat = optax.tree.bias_correction(mu, b1, count_inc)
    nu_hat = optax.tree.bias_correction(nu, b2, count_inc)
    out = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + eps_root) + eps), mu_hat, nu_hat)
    nu_weight = b2 * state.nu_weight + (1.0 - b2)
    return out, ScaleByAdamFamilyState(count=count_inc, mu=mu, nu=nu, nu_weight=nu_weight)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def request_for_variant(variant: str) -> StatsRequest:
  """The statistics that `scale_by_adam_family(variant)` reads."""
  return StatsRequest(want=("mean", "sq") if variant in NEEDS_SQ else ("mean",))
