"""Surgery handler for dense layers (nn.Dense, nn.DenseGeneral without batch_dims,
nnx.Linear, nnx.LinearGeneral without batch axes, nnx.Einsum of a dense form, `taps.dense`).

Samples of the kernel are G_b = B·A_bᵀΔ_b (A: input rows, Δ: output cotangent rows), of
the bias B·Σ_r Δ_br. Two methods:
  - "simultaneous" (`simultaneous_dense`): the layer's own custom VJP forms the B×K×L
    per-example gradients once and takes the weight gradient as their sum;
  - the tap (`tapped`): autodiff's weight gradient, and the statistics from A and Δ in
    the tap's backward pass (materialised B×K×L, the Gram "ghost norm" for norms alone
    when it takes fewer FLOPs, or per token φ(A)ᵀφ(Δ)).
`simultaneous_is_used` chooses, under `StatsOptions.dense_method`. A call with no
statistic takes the fast weight-gradient path (`contracted`): one contraction over
(example, row), no per-example axis.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pergrad.stats.surgery import formulas as sm
from pergrad.stats.surgery.probes import F32, Call, Env, collector, rows, shapes_of, tapped
from pergrad.stats.surgery.sites import Site

# Largest per-example gradient tensor B×K×L (float32 elements) a layer materialises: 256 MB.
SIMULTANEOUS_MAX_ELEMS = 1 << 26


def simultaneous_is_used(site: Site, B: int, x_shape, want, token: bool,
                         method: str = "auto") -> bool:
  """Whether a dense call forms its per-example gradients G_b = A_bᵀΔ_b (B×K×L) once and
  takes the weight gradient as their sum (Gray et al. 2024's "simultaneous" method):
  extra work ≈ 2·B·K·L (φ and the sums over b) instead of a second 2·B·R·K·L
  contraction. At example granularity, with Flax's own dot_general, when B·K·L fits
  `SIMULTANEOUS_MAX_ELEMS` and, for norms alone, when that extra is below the Gram
  ("ghost") norm's 2·B·R²·(K+L) + B·R² (R = rows per example: T² > KL/(K+L), about).
  Otherwise autodiff's weight gradient plus the tap's statistics (Gram, or materialised
  when it does not fit) serve it. `method` (`StatsOptions.dense_method`): "auto" is this
  rule, "simultaneous" wherever it applies, "separate" never."""
  if token or site.kind != "dense" or site.in_axis is None or not site.plain_dot \
      or method == "separate" or not (sm.coordinate_names(want) or sm.example_names(want)):
    return False
  if method == "simultaneous":
    return True
  K = int(np.prod([x_shape[i] for i in site.contract]))
  R = int(np.prod([d for i, d in enumerate(x_shape) if i != site.in_axis
                   and i not in site.contract]))
  L = site.out_features
  if L * K * B > SIMULTANEOUS_MAX_ELEMS:
    return False
  norms_only = not sm.coordinate_names(want) and set(sm.example_names(want)) == {"norms"}
  return not norms_only or 2 * K * L <= 2 * R * R * (K + L) + R * R


def contracted(layer, site: Site, B: int):
  """y of a dense call without statistics whose kernel gradient is one contraction
  Aᵀ Δ over the B×R×K and B×R×L rows (einsum brk,brl->kl, float32 accumulation): the same
  FLOPs as autodiff's, faster on XLA:CPU (results/cpu/overhead, `time_vs_value_and_grad`)."""
  kernel, bias = layer.params["kernel"], layer.params.get("bias")
  fwd = lambda x_, k_, b_: layer.forward(x_, {"kernel": k_, "bias": b_})

  @jax.custom_vjp
  def f(x_, k_, b_):
    return fwd(x_, k_, b_)

  def f_fwd(x_, k_, b_):
    return fwd(x_, k_, b_), (x_, k_, b_)

  def f_bwd(res, dy):
    _, k_, b_ = res
    dx, a_BxRxK, d_BxRxL = backward_rows(fwd, site, B, res, dy)
    dk = jnp.einsum("brk,brl->kl", a_BxRxK, d_BxRxL, preferred_element_type=F32)
    db = (None if b_ is None
          else d_BxRxL.astype(F32).sum(axis=(0, 1)).reshape(b_.shape).astype(b_.dtype))
    return dx, dk.reshape(k_.shape).astype(k_.dtype), db

  f.defvjp(f_fwd, f_bwd)
  return f(layer.x, kernel, bias)


def handle(env: Env, call: Call):
  """y of one dense call, with its statistics (module docstring)."""
  if simultaneous_is_used(call.site, env.B, call.x.shape, env.want, env.token,
                          env.options.dense_method):
    return simultaneous_dense(env, call)
  site = call.site

  def body(res, dy, dcarriers, put):
    nfeat = dy.ndim - (res["x"].ndim - len(site.contract)) - (site.in_axis is None)
    a = rows(res["x"], site.in_axis, env.B, site.contract)
    d = rows(dy, site.out_axis, env.B, tuple(range(-nfeat, 0)))
    put(env.outer(a, d), "kernel")
    put(env.rowsum(env.flat(d * env.scale)), "bias")

  return tapped(env, call, body)[0]


def backward_rows(fwd, site, B: int, res, dy):
  """A dense call's input cotangent (autodiff's) and its rows: inputs a_BxRxK and output
  cotangents d_BxRxL, from the residuals (x, kernel, bias) and dy."""
  x_, k_, b_ = res
  _, vjp_x = jax.vjp(lambda xx: fwd(xx, k_, b_), x_)
  (dx,) = vjp_x(dy)
  nfeat = dy.ndim - (x_.ndim - len(site.contract))
  a_BxRxK = rows(x_, site.in_axis, B, site.contract, dtype=None)
  d_BxRxL = rows(dy, site.out_axis, B, tuple(range(-nfeat, 0)), dtype=None)
  return dx, a_BxRxK, d_BxRxL


def simultaneous_dense(env: Env, call: Call):
  """y of the dense call, through a custom VJP whose backward pass forms the per-example
  weight gradients G_b = A_bᵀΔ_b (B×K×L, float32 accumulation) ONCE: the weight
  gradient is Σ_b G_b, the statistics are Σ_b φ(B·G_b) and Σ_coords φ(B·G_b); the input
  cotangent is autodiff's. The only extra work over a plain backward pass is φ and the
  sums over b."""
  site, B, want, scale = call.site, env.B, env.want, env.scale
  kernel, bias = call.layer.params["kernel"], call.layer.params.get("bias")
  fwd = lambda x_, k_, b_: call.layer.forward(x_, {"kernel": k_, "bias": b_})
  shapes = shapes_of(call.probes)

  @jax.custom_vjp
  def f(x_, k_, b_, probes_):
    return fwd(x_, k_, b_)

  def f_fwd(x_, k_, b_, probes_):
    return fwd(x_, k_, b_), (x_, k_, b_)

  def f_bwd(res, dy):
    _, k_, b_ = res
    dx, a, d = backward_rows(fwd, site, B, res, dy)
    g_BxKL = jnp.einsum("brk,brl->bkl", a, d, preferred_element_type=F32).reshape(B, -1)
    dk = sm.sum_examples(g_BxKL).reshape(k_.shape).astype(k_.dtype)
    put, done = collector(shapes)
    put(sm.flat_example_stats(g_BxKL * scale, want), "kernel")
    db = None
    if b_ is not None:
      d32 = d.astype(F32)
      db = d32.sum(axis=(0, 1)).reshape(b_.shape).astype(b_.dtype)
      put(sm.rowsum_example_stats(d32 * scale, want), "bias")
    return dx, dk, db, done()

  f.defvjp(f_fwd, f_bwd)
  return f(call.x, kernel, bias, call.probes)
