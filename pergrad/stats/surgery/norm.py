"""Surgery handler for normalization layers over the last axis (nn.LayerNorm, nn.RMSNorm,
nnx.LayerNorm, nnx.RMSNorm, `taps.layer_norm`, `taps.rms_norm`).

Samples of the scale are B·Σ_r Δ_br ⊙ x̂_br, of the bias B·Σ_r Δ_br (x̂ the normalized
input, Δ the output cotangent). Per example (input with an example axis, unless
`StatsOptions.dense_method` is "separate") the layer's own custom VJP keeps x̂ from the
forward pass and forms the B×D row sums once (`simultaneous_norm`); otherwise (per token,
or "separate") the tap recomputes x̂ in its backward pass.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.linen import dtypes as flax_dtypes

from pergrad.stats.surgery import formulas as sm
from pergrad.stats.surgery.probes import F32, Call, Env, collector, rows, shapes_of, tapped
from pergrad.stats.surgery.sites import Site


def simultaneous_norm_is_used(site: Site, want, token: bool, method: str = "auto") -> bool:
  """Whether a LayerNorm / RMSNorm call forms its per-example scale and bias gradients
  (B×D row sums) once in its own backward pass and takes the parameter gradients as their
  sums over b: at example granularity, for an input with an example axis, unless `method`
  (`StatsOptions.dense_method`) is "separate" (autodiff's backward, then the tap's row
  sums over a recomputed x̂)."""
  return (not token and site.kind == "norm" and site.in_axis is not None
          and method != "separate" and bool(sm.coordinate_names(want) or sm.example_names(want)))


def handle(env: Env, call: Call):
  """y of one normalization call, with its statistics (module docstring)."""
  if simultaneous_norm_is_used(call.site, env.want, env.token, env.options.dense_method):
    return simultaneous_norm(env, call)
  site = call.site

  def body(res, dy, dcarriers, put):
    x = rows(res["x"], site.in_axis, env.B)
    d = rows(dy, site.out_axis, env.B) * env.scale
    put(env.rowsum(env.flat(d * normalized(x, *site.norm))), "scale")
    put(env.rowsum(env.flat(d)), "bias")

  return tapped(env, call, body)[0]


def norm_stats(x32, eps, use_mean, fast):
  """Flax's float32 mean and variance over the last axis (`_compute_stats`)."""
  if not use_mean:
    var = jnp.square(x32).mean(-1, keepdims=True)
    return jnp.zeros_like(var), var
  mu = x32.mean(-1, keepdims=True)
  if fast:
    return mu, jnp.maximum(0.0, jnp.square(x32).mean(-1, keepdims=True) - jnp.square(mu))
  return mu, jnp.square(x32 - mu).mean(-1, keepdims=True)


def normalized(x_BxRxD, eps, use_mean, fast):
  """x̂ of LayerNorm (use_mean) or RMSNorm, as Flax computes it, in float32."""
  mu, var = norm_stats(x_BxRxD, eps, use_mean, fast)
  return (x_BxRxD - mu) * jax.lax.rsqrt(var + eps)


def simultaneous_norm(env: Env, call: Call):
  """y of the normalization call (Flax's arithmetic: y = (x − μ)·(rsqrt(σ² + ε)·γ) + β)
  through a custom VJP that keeps x̂ = (x − μ)·rsqrt(σ² + ε) from the forward pass and
  forms the per-example gradients g_b(γ) = Σ_r Δ_br ⊙ x̂_br and g_b(β) = Σ_r Δ_br (B×D)
  once: the parameter gradients are their sums over b, the statistics Σ_b φ(B·g_b) and
  Σ_coords φ(B·g_b), and the input cotangent is LayerNorm's (RMSNorm's without the mean
  terms) dx = r·(dx̂ − mean(dx̂) − x̂·mean(dx̂ ⊙ x̂)), dx̂ = Δ ⊙ γ."""
  site, B, x = call.site, env.B, call.x
  gamma, beta = call.layer.params.get("scale"), call.layer.params.get("bias")
  eps, use_mean, fast = site.norm
  out_dtype = flax_dtypes.canonicalize_dtype(
      *[a for a in (x, gamma, beta) if a is not None], dtype=call.layer.attrs["dtype"])
  shapes = shapes_of(call.probes)

  def forward(x_, g_, b_):
    x32 = x_.astype(jnp.promote_types(x_.dtype, F32))
    mu, var = norm_stats(x32, eps, use_mean, fast)
    r = jax.lax.rsqrt(var + eps)
    y = (x_ - mu) * (r * g_ if g_ is not None else r)
    y = y + b_ if b_ is not None else y
    return jnp.asarray(y, out_dtype), (x_ - mu) * r, r

  @jax.custom_vjp
  def f(x_, g_, b_, probes_):
    return forward(x_, g_, b_)[0]

  def f_fwd(x_, g_, b_, probes_):
    y, xhat, r = forward(x_, g_, b_)
    return y, (xhat, r, g_, b_)

  def f_bwd(res, dy):
    xhat, r, g_, b_ = res
    d32 = dy.astype(F32)
    dxhat = d32 * g_ if g_ is not None else d32
    corr = (dxhat * xhat).mean(-1, keepdims=True)
    centred = dxhat - dxhat.mean(-1, keepdims=True) if use_mean else dxhat
    dx = (r * (centred - xhat * corr)).astype(x.dtype)
    d_BxRxD = rows(d32, site.in_axis, B)
    put, done = collector(shapes)
    grads = {}
    for leaf, g_BxD in (("scale", (d_BxRxD * rows(xhat, site.in_axis, B)).sum(axis=1)),
                        ("bias", d_BxRxD.sum(axis=1))):
      p_ = g_ if leaf == "scale" else b_
      if p_ is None:
        continue
      grads[leaf] = sm.sum_examples(g_BxD).reshape(p_.shape).astype(p_.dtype)
      put(sm.flat_example_stats(g_BxD * env.scale, env.want), leaf)
    return dx, grads.get("scale"), grads.get("bias"), done()

  f.defvjp(f_fwd, f_bwd)
  return f(x, gamma, beta, call.probes)
