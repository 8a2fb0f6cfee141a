"""Surgery backend: per-example / per-token gradient statistics in ONE backward pass.

The model stays a plain Flax module. `surgery_stats` attaches from outside with
`nn.intercept_methods`: the output y of every standard layer call (nn.Dense,
nn.DenseGeneral, nn.Embed.__call__ / .attend, nn.LayerNorm, nn.RMSNorm) goes through
an identity `jax.custom_vjp` "tap" whose residual is the layer input and whose extra
zero-valued "probe" inputs receive the statistics as cotangents. The layer's own
forward and the parameter gradient are untouched (plain autodiff); in the backward
pass each tap sees its layer's input A and output cotangent Δ and computes the
requested statistics of the samples (`pergrad.stats.surgery_math`). One
`jax.value_and_grad` w.r.t. (params, probes) yields the batch-mean gradient and all
statistics. Probes are keyed by the module's scope path, so their cotangents land on
the params tree. Any other module that owns parameters raises a ValueError.

Samples (GradStats.count = n):
- granularity "example" (n = B): g_b = ∇ loss_b. With the batch-mean loss each
  cotangent carries 1/B, so g_b = B · A_bᵀ Δ_b.
- granularity "token" (n = B·T): the contribution of token (b, t) THROUGH THAT
  TOKEN'S ACTIVATIONS at each layer, g_bt = B·T · a_bt δ_btᵀ, scaled so that the mean
  over tokens is the batch gradient. It is not the gradient of token t's loss: δ_bt
  carries the loss of every later token that attends to t.
  Tied embedding (one Embed used by `__call__` and `attend`): token (b, t)'s sample is
  the sum of its two uses, e_{id_bt} δin_btᵀ + δout_bt x_btᵀ, before φ.
  A position embedding called on arange(T) (no example axis) has sample δ_bt at row t.

Every registered statistic (`pergrad.stats.registry`) is computed: at granularity
"example" any of them; at granularity "token" the coordinate statistics whose φ is
multiplicative (φ(A)ᵀφ(Δ) per dense layer).
Per-example statistics of a dense layer come from the "simultaneous" method where it
pays (`simultaneous_is_used`: the layer's own custom VJP forms the B×K×L per-example
gradients once and the weight gradient as their sum), else from the tap (materialised
B×K×L, or for norms only the Gram "ghost norm" when it takes fewer FLOPs). Those of a
normalization layer come from its own custom VJP likewise (`_simultaneous_norm`: x̂ kept
from the forward pass, per-example row sums formed once); per token, from the tap.
Embedding tables use a per-example sort-based segment-sum (repeated ids combine before
φ). Statistics are computed in float32 whatever the compute dtype.

A layer whose input has no example axis (found by tracing at two batch sizes) is taken
to be broadcast against the batch along a new leading axis; its output is broadcast
explicitly to B×... so that its cotangent keeps the example axis.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import dtypes as flax_dtypes

from pergrad.stats import registry
from pergrad.stats import surgery_math as sm
from pergrad.stats.layers import LAYER_TYPES, selects
from pergrad.stats.types import STATISTICS, GradStats

_F32 = jnp.float32
_KIND = {nn.Dense: "dense", nn.DenseGeneral: "dense", nn.Embed: "embed",
         nn.LayerNorm: "norm", nn.RMSNorm: "norm"}
_LEAVES = {"dense": ("kernel", "bias"), "embed": ("embedding",), "norm": ("scale", "bias")}
_METHODS = ("__call__", "attend")


def _unsupported(msg: str) -> ValueError:
  return ValueError(f"surgery backend: {msg}; use backend='vmap', which supports any model.")


@dataclasses.dataclass(frozen=True)
class _Site:
  """One intercepted layer call, in forward order."""

  path: tuple[str, ...]
  kind: str  # "dense" | "lookup" | "attend" | "norm"
  in_axis: int | None  # example axis of the input; None: shared across the batch
  out_axis: int  # example axis of the (broadcast) output
  contract: tuple[int, ...] = ()  # dense: contracted input axes, in kernel order
  num_rows: int = 0  # embed: table rows V
  tied: bool = False  # embed used by both __call__ and attend
  norm: tuple = ()  # (epsilon, use_mean, use_fast_variance)
  rows: int = 0  # tokens per example R
  out_features: int = 0  # dense: L, the product of the kernel's output axes
  plain_dot: bool = True  # dense: Flax's default lax.dot_general (no injected one)


# --- discovery ------------------------------------------------------------------------
def _trace_calls(loss_fn, params, batch):
  """Shapes of every module method call of loss_fn (abstract evaluation)."""
  log = []

  def rec(next_fun, args, kwargs, ctx):
    out = next_fun(*args, **kwargs)
    if ctx.method_name in _METHODS:
      x = args[0] if args else next(iter(kwargs.values()), None)
      log.append(dict(path=tuple(ctx.module.path), type=type(ctx.module),
                      method=ctx.method_name, module=_attrs(ctx.module),
                      x=getattr(x, "shape", None), y=getattr(out, "shape", None)))
    return out

  def run(p, b):
    with nn.intercept_methods(rec):
      return loss_fn(p, b)

  jax.eval_shape(run, params, batch)
  return log


def _attrs(m) -> dict:
  names = ("axis", "batch_dims", "num_embeddings", "epsilon", "use_fast_variance",
           "reduction_axes", "feature_axes", "axis_name", "dot_general", "dot_general_cls")
  return {k: getattr(m, k) for k in names if hasattr(m, k)}


def _struct(x, lead=None):
  shape = tuple(x.shape)
  if lead is not None and shape:
    shape = (lead,) + shape[1:]
  return jax.ShapeDtypeStruct(shape, x.dtype)


def _example_axis(s1, s2, b1, b2):
  diff = [i for i, (u, v) in enumerate(zip(s1, s2, strict=True)) if u != v]
  if not diff:
    return None
  if len(diff) != 1 or (s1[diff[0]], s2[diff[0]]) != (b1, b2):
    raise _unsupported(f"cannot find the example axis of a layer input {s1}")
  return diff[0]


def _plan(loss_fn, params, batch, B: int, flat_params: dict) -> list[_Site]:
  """Traces loss_fn at batch sizes B and B+1 and plans one _Site per layer call."""
  p_abs = jax.tree.map(_struct, params)
  log1 = _trace_calls(loss_fn, p_abs, jax.tree.map(lambda a: _struct(a, B), batch))
  log2 = _trace_calls(loss_fn, p_abs, jax.tree.map(lambda a: _struct(a, B + 1), batch))
  owners = {k[:-1] for k in flat_params}
  types = {c["path"]: c["type"] for c in log1}
  for owner in sorted(owners):
    t = types.get(owner)
    if t not in _KIND:
      name = t.__name__ if t else "a module never called"
      raise _unsupported(f"cannot handle {name} at '{'/'.join(owner)}', which owns parameters")
  calls = [(c1, c2) for c1, c2 in zip(log1, log2, strict=True) if c1["path"] in owners]
  by_path: dict[tuple, list[str]] = {}
  for c1, _ in calls:
    by_path.setdefault(c1["path"], []).append(c1["method"])
  for path, methods in by_path.items():
    if len(methods) > 1 and methods != ["__call__", "attend"]:
      raise _unsupported(
          f"'{'/'.join(path)}' is used {len(methods)} times ({methods}); shared weights "
          "are handled only for a tied nn.Embed (__call__ then attend)")
  sites = []
  for c1, c2 in calls:
    kind, a = _KIND[c1["type"]], c1["module"]
    if c1["method"] == "attend":
      kind = "attend"
    elif kind == "embed":
      kind = "lookup"
    ax = _example_axis(c1["x"], c2["x"], B, B + 1)
    nx = len(c1["x"])
    kw = dict(path=c1["path"], kind=kind, in_axis=ax,
              tied=by_path[c1["path"]] == ["__call__", "attend"])
    contract = ()
    if kind == "dense":
      if a.get("batch_dims"):
        raise _unsupported(f"nn.DenseGeneral with batch_dims at '{'/'.join(c1['path'])}'")
      axis = a.get("axis", -1)
      contract = tuple(i % nx for i in (axis if isinstance(axis, (tuple, list)) else (axis,)))
      kw["contract"] = contract
      kw["plain_dot"] = a.get("dot_general") is None and a.get("dot_general_cls") is None
      kw["out_features"] = int(np.prod(c1["y"][len(c1["x"]) - len(contract):])) \
          if c1["y"] else 0
    if kind in ("lookup", "attend"):
      kw["num_rows"] = a["num_embeddings"]
    if kind == "norm":
      if a["axis_name"] is not None or any(
          tuple(np.atleast_1d(a[k]) % nx) != (nx - 1,) for k in ("reduction_axes", "feature_axes")):
        raise _unsupported(f"{c1['type'].__name__} at '{'/'.join(c1['path'])}' normalises "
                           "over axes other than the last one (or over a named axis)")
      kw["norm"] = (a["epsilon"], c1["type"] is nn.LayerNorm, a["use_fast_variance"])
    kw["out_axis"] = 0 if ax is None else ax - sum(i < ax for i in contract)
    feat = set(contract) if kind == "dense" else (set() if kind == "lookup" else {nx - 1})
    kw["rows"] = int(np.prod([d for i, d in enumerate(c1["x"]) if i != ax and i not in feat]))
    sites.append(_Site(**kw))
  return sites


# --- layouts ------------------------------------------------------------------------
def _lead(x, axis, B):
  """Example axis first (broadcast if the layer is shared across the batch)."""
  return jnp.broadcast_to(x, (B,) + x.shape) if axis is None else jnp.moveaxis(x, axis, 0)


def _rows(x, axis, B, feat: tuple[int, ...] = (-1,), dtype=_F32):
  """x -> B×R×F (float32 unless `dtype` is None: x's own): example axis first, axes
  `feat` (in order) flattened last."""
  x = x if dtype is None else x.astype(dtype)
  if axis is None:
    x, axis = jnp.broadcast_to(x, (B,) + x.shape), 0
    feat = tuple(f + 1 if f >= 0 else f for f in feat)
  feat = tuple(f % x.ndim for f in feat)
  x = jnp.moveaxis(x, (axis,) + feat, (0,) + tuple(range(x.ndim - len(feat), x.ndim)))
  F = int(np.prod(x.shape[x.ndim - len(feat):]))
  return x.reshape(B, -1, F)


def _normalized(x_BxRxD, eps, use_mean, fast):
  """x̂ of LayerNorm (use_mean) or RMSNorm, as Flax computes it, in float32."""
  mu = x_BxRxD.mean(-1, keepdims=True) if use_mean else 0.0
  if use_mean and fast:
    var = jnp.maximum(0.0, jnp.square(x_BxRxD).mean(-1, keepdims=True) - jnp.square(mu))
  else:
    var = jnp.square(x_BxRxD - mu).mean(-1, keepdims=True)
  return (x_BxRxD - mu) * jax.lax.rsqrt(var + eps)


# --- the tap ----------------------------------------------------------------------------
def _tap(y, res: dict, probes: dict, stats_fn: Callable, carrier_shapes=()):
  """Identity on y (plus zero carriers out) whose VJP puts stats_fn's results on probes.

  stats_fn(res, dy, dcarriers) -> (probe cotangents like `probes`, {res key: cotangent}).
  """

  @jax.custom_vjp
  def f(y, res, probes):
    return y, tuple(jnp.zeros(s, _F32) for s in carrier_shapes)

  def fwd(y, res, probes):
    return f(y, res, probes), res

  def bwd(res, cts):
    dy, dcarriers = cts
    # Scheduling (see sm.zero_after): what reads the forward residuals waits for dy, and
    # the layer input's cotangent (a zero added to it) waits for this layer's
    # statistics, so the backward pass computes them layer by layer, when they are due,
    # instead of early (while every activation is live) or all at once.
    z = sm.zero_after(dy)
    res = jax.tree.map(
        lambda r: r + z.astype(r.dtype) if jnp.issubdtype(r.dtype, jnp.inexact) else r, res)
    probe_cts, res_cts = stats_fn(res, dy, dcarriers)
    done = sum(sm.zero_after(v) for v in jax.tree.leaves(probe_cts))
    res_cts = {k: res_cts[k] if k in res_cts else jax.tree.map(lambda a: _zero_ct(a, done), v)
               for k, v in res.items()}
    return dy, res_cts, probe_cts

  f.defvjp(fwd, bwd)
  return f(y, res, probes)


def _zero_ct(x, zero=0.0):
  """A zero cotangent for x (float0 for integer x); `zero` may be a traced 0."""
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.full_like(x, zero)
  return np.zeros(x.shape, jax.dtypes.float0)


def _per_leaf(stats: dict, leaf: str, shapes: dict, out: dict):
  """Moves stats {stat: array} onto out[stat][leaf], reshaped like the probe."""
  for k, v in stats.items():
    if leaf in shapes.get(k, {}):
      out.setdefault(k, {})[leaf] = v.reshape(shapes[k][leaf])


def _fill(out: dict, shapes: dict) -> dict:
  """Probe cotangents with the exact structure of the probes (zeros where none computed)."""
  return {k: {leaf: out.get(k, {}).get(leaf, jnp.zeros(shp, _F32)) for leaf, shp in sub.items()}
          for k, sub in shapes.items()}


def _stats_fn(site: _Site, B: int, token: bool, want, scale: float, shapes: dict):
  """The backward-pass statistics of one layer call; shapes: {stat: {leaf: probe shape}}."""
  rowsum = sm.rowsum_token_stats if token else sm.rowsum_example_stats
  flat = (lambda a: a.reshape(-1, a.shape[-1])) if token else (lambda a: a)

  def outer(left, right):  # cotangents enter unscaled: the scale is applied to the result
    if token:
      return sm.outer_token_stats(left, right, want, scale)
    return sm.outer_example_stats(left, right, want, scale)

  def fn(res, dy, dcarriers):
    out, res_cts = {}, {}
    put = lambda st, leaf: _per_leaf(st, leaf, shapes, out)
    if site.kind == "dense":
      nfeat = dy.ndim - (res["x"].ndim - len(site.contract)) - (site.in_axis is None)
      a = _rows(res["x"], site.in_axis, B, site.contract)
      d = _rows(dy, site.out_axis, B, tuple(range(-nfeat, 0)))
      put(outer(a, d), "kernel")
      put(rowsum(flat(d * scale), want), "bias")
    elif site.kind == "norm":
      x = _rows(res["x"], site.in_axis, B)
      d = _rows(dy, site.out_axis, B) * scale
      put(rowsum(flat(d * _normalized(x, *site.norm)), want), "scale")
      put(rowsum(flat(d), want), "bias")
    elif site.kind == "lookup":
      ids = _lead(res["x"], site.in_axis, B).reshape(B, -1)
      d = _rows(dy, site.out_axis, B) * scale
      if token and site.tied:
        u = dcarriers[0].reshape(d.shape)
        st = sm.tied_token_lookup_stats(ids.reshape(-1), flat(d), flat(u), site.num_rows, want)
      elif token:
        st = sm.lookup_token_stats(ids.reshape(-1), flat(d), site.num_rows, want)
      elif site.tied:
        st = sm.tied_example_stats(ids, d, dcarriers[0], dcarriers[1], want)
      else:
        st = sm.lookup_example_stats(ids, d, site.num_rows, want)
      put(st, "embedding")
    elif site.kind == "attend":
      x = _rows(res["x"], site.in_axis, B)
      d = _rows(dy, site.out_axis, B)
      if site.tied and not token:  # the lookup's tap does the work, after summing both uses
        res_cts["carrier"] = (d * scale, x)
      else:
        put(outer(d, x), "embedding")
        if site.tied:
          carrier, ids = res["carrier"]
          u = sm.tied_token_own_row(ids.reshape(-1), flat(d * scale), flat(x))
          res_cts["carrier"] = (u.reshape(carrier.shape), _zero_ct(ids))
    return _fill(out, shapes), res_cts

  return fn


# --- dense layers, "simultaneous" ---------------------------------------------------------
def simultaneous_is_used(site: _Site, B: int, x_shape, want, token: bool) -> bool:
  """Whether a dense call forms its per-example gradients G_b = A_bᵀΔ_b (B×K×L) once and
  takes the weight gradient as their sum (Gray et al. 2024's "simultaneous" method):
  extra work ≈ 2·B·K·L (φ and the sums over b) instead of a second 2·B·R·K·L
  contraction. At example granularity, with Flax's own dot_general, when B·K·L fits
  `SIMULTANEOUS_MAX_ELEMS` and, for norms alone, when that extra is below the Gram
  ("ghost") norm's 2·B·R²·(K+L) + B·R² (R = rows per example: T² > KL/(K+L), about).
  Otherwise autodiff's weight gradient plus the tap's statistics (Gram, or materialised
  when it does not fit) serve it."""
  if token or site.kind != "dense" or site.in_axis is None or not site.plain_dot \
      or _DENSE_METHOD[0] == "separate" or not (sm._phis(want) or sm._examples(want)):
    return False
  if _DENSE_METHOD[0] == "simultaneous":
    return True
  K = int(np.prod([x_shape[i] for i in site.contract]))
  R = int(np.prod([d for i, d in enumerate(x_shape) if i != site.in_axis
                   and i not in site.contract]))
  L = site.out_features
  if L * K * B > SIMULTANEOUS_MAX_ELEMS:
    return False
  norms_only = not sm._phis(want) and set(sm._examples(want)) == {"norms"}
  return not norms_only or 2 * K * L <= 2 * R * R * (K + L) + R * R


# Largest per-example gradient tensor B×K×L (float32 elements) a layer materialises: 256 MB.
SIMULTANEOUS_MAX_ELEMS = 1 << 26
DENSE_METHODS = ("auto", "simultaneous", "separate")
_DENSE_METHOD = ["auto"]


@contextlib.contextmanager
def dense_method(name: str):
  """Forces how dense layers get per-example statistics while tracing (benchmarks,
  tests): "auto" (the rule of `simultaneous_is_used`), "simultaneous" wherever it
  applies whatever the cost, "separate" never (autodiff's weight gradient plus the tap's
  materialised or Gram statistics, as before the simultaneous method). "separate" also
  sends normalization layers to the tap (`simultaneous_norm_is_used`)."""
  if name not in DENSE_METHODS:
    raise ValueError(f"dense_method={name!r}; choose one of {DENSE_METHODS}.")
  old, _DENSE_METHOD[0] = _DENSE_METHOD[0], name
  try:
    yield
  finally:
    _DENSE_METHOD[0] = old


def _dense_forward(module, x, kernel, bias, contract):
  """What nn.Dense / nn.DenseGeneral (no batch_dims, default dot_general) compute."""
  x, kernel, bias = module.promote_dtype(x, kernel, bias, dtype=module.dtype)
  n = len(contract)
  y = jax.lax.dot_general(x, kernel, ((contract, tuple(range(n))), ((), ())),
                          precision=module.precision)
  if bias is not None:
    y = y + jnp.reshape(bias, (1,) * (y.ndim - bias.ndim) + bias.shape)
  return y


def _simultaneous_dense(module, site: _Site, B: int, x, want, scale: float, probes: dict,
                        shapes: dict):
  """y of the dense call, through a custom VJP whose backward pass forms the per-example
  weight gradients G_b = A_bᵀΔ_b (B×K×L, float32 accumulation) ONCE: the weight
  gradient is Σ_b G_b, the statistics are Σ_b φ(B·G_b) and Σ_coords φ(B·G_b); the input
  cotangent is autodiff's. The only extra work over a plain backward pass is φ and the
  sums over b."""
  params = module.variables["params"]
  kernel, bias = params["kernel"], params.get("bias")
  fwd = lambda x_, k_, b_: _dense_forward(module, x_, k_, b_, site.contract)
  phis, examples = sm._phis(want), sm._examples(want)

  @jax.custom_vjp
  def f(x_, k_, b_, probes_):
    return fwd(x_, k_, b_)

  def f_fwd(x_, k_, b_, probes_):
    return fwd(x_, k_, b_), (x_, k_, b_)

  def f_bwd(res, dy):
    x_, k_, b_ = res
    _, vjp_x = jax.vjp(lambda xx: fwd(xx, k_, b_), x_)
    (dx,) = vjp_x(dy)
    nfeat = dy.ndim - (x_.ndim - len(site.contract))
    a = _rows(x_, site.in_axis, B, site.contract, dtype=None)
    d = _rows(dy, site.out_axis, B, tuple(range(-nfeat, 0)), dtype=None)
    g_BxKL = jnp.einsum("brk,brl->bkl", a, d, preferred_element_type=_F32).reshape(B, -1)
    # Sums over b as products with a ones vector: a GEMV streams G once, where XLA:CPU's
    # reduction over the leading axis was 2-3x slower (measured on a 32×128×512 G).
    ones_B = jnp.ones((B,), _F32)
    sum_b = lambda v_BxKL: jnp.dot(ones_B, v_BxKL)
    dk = sum_b(g_BxKL).reshape(k_.shape).astype(k_.dtype)
    out = {}
    put = lambda st, leaf: _per_leaf(st, leaf, shapes, out)
    g_BxKL = g_BxKL * scale
    put({**{k: sum_b(sm._phi(k)(g_BxKL)) for k in phis},
         **{k: sm._phi(k)(g_BxKL).sum(axis=1) for k in examples}}, "kernel")
    db = None
    if b_ is not None:
      d32 = d.astype(_F32)
      db = d32.sum(axis=(0, 1)).reshape(b_.shape).astype(b_.dtype)
      put(sm.rowsum_example_stats(d32 * scale, want), "bias")
    return dx, dk, db, _fill(out, shapes)

  f.defvjp(f_fwd, f_bwd)
  return f(x, kernel, bias, probes)


# --- normalization layers, "simultaneous" --------------------------------------------------
def simultaneous_norm_is_used(site: _Site, want, token: bool) -> bool:
  """Whether a LayerNorm / RMSNorm call forms its per-example scale and bias gradients
  (B×D row sums) once in its own backward pass and takes the parameter gradients as their
  sums over b: at example granularity, for an input with an example axis, unless
  `dense_method("separate")` asks for the tap (autodiff's backward, then the tap's row
  sums over a recomputed x̂)."""
  return (not token and site.kind == "norm" and site.in_axis is not None
          and _DENSE_METHOD[0] != "separate" and bool(sm._phis(want) or sm._examples(want)))


def _norm_stats(x32, eps, use_mean, fast):
  """Flax's float32 mean and variance over the last axis (`_compute_stats`)."""
  if not use_mean:
    var = jnp.square(x32).mean(-1, keepdims=True)
    return jnp.zeros_like(var), var
  mu = x32.mean(-1, keepdims=True)
  if fast:
    return mu, jnp.maximum(0.0, jnp.square(x32).mean(-1, keepdims=True) - jnp.square(mu))
  return mu, jnp.square(x32 - mu).mean(-1, keepdims=True)


def _simultaneous_norm(module, site: _Site, B: int, x, want, scale: float, probes: dict,
                       shapes: dict):
  """y of the normalization call (Flax's arithmetic: y = (x − μ)·(rsqrt(σ² + ε)·γ) + β)
  through a custom VJP that keeps x̂ = (x − μ)·rsqrt(σ² + ε) from the forward pass and
  forms the per-example gradients g_b(γ) = Σ_r Δ_br ⊙ x̂_br and g_b(β) = Σ_r Δ_br (B×D)
  once: the parameter gradients are their sums over b, the statistics Σ_b φ(B·g_b) and
  Σ_coords φ(B·g_b), and the input cotangent is LayerNorm's (RMSNorm's without the mean
  terms) dx = r·(dx̂ − mean(dx̂) − x̂·mean(dx̂ ⊙ x̂)), dx̂ = Δ ⊙ γ."""
  params = module.variables["params"]
  gamma, beta = params.get("scale"), params.get("bias")
  eps, use_mean, fast = site.norm
  out_dtype = flax_dtypes.canonicalize_dtype(
      *[a for a in (x, gamma, beta) if a is not None], dtype=module.dtype)

  def forward(x_, g_, b_):
    x32 = x_.astype(jnp.promote_types(x_.dtype, _F32))
    mu, var = _norm_stats(x32, eps, use_mean, fast)
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
    d32 = dy.astype(_F32)
    dxhat = d32 * g_ if g_ is not None else d32
    corr = (dxhat * xhat).mean(-1, keepdims=True)
    centred = dxhat - dxhat.mean(-1, keepdims=True) if use_mean else dxhat
    dx = (r * (centred - xhat * corr)).astype(x.dtype)
    d_BxRxD = _rows(d32, site.in_axis, B)
    ones_B = jnp.ones((B,), _F32)
    out, grads = {}, {}
    for leaf, g_BxD in (("scale", (d_BxRxD * _rows(xhat, site.in_axis, B)).sum(axis=1)),
                        ("bias", d_BxRxD.sum(axis=1))):
      p_ = g_ if leaf == "scale" else b_
      if p_ is None:
        continue
      grads[leaf] = jnp.dot(ones_B, g_BxD).reshape(p_.shape).astype(p_.dtype)
      g_BxD = g_BxD * scale
      _per_leaf({**{k: jnp.dot(ones_B, sm._phi(k)(g_BxD)) for k in sm._phis(want)},
                 **{k: sm._phi(k)(g_BxD).sum(axis=1) for k in sm._examples(want)}},
                leaf, shapes, out)
    return dx, grads.get("scale"), grads.get("bias"), _fill(out, shapes)

  f.defvjp(f_fwd, f_bwd)
  return f(x, gamma, beta, probes)


# --- public entry point -------------------------------------------------------------------
def surgery_stats(loss_fn, params, batch, *, want: tuple[str, ...], granularity: str,
                  layers: tuple[str, ...] = ()):
  """Mean loss and GradStats of per-example (or per-token) gradients, one backward pass.

  Args:
    loss_fn: (params, batch) -> float32[B] per-example losses, built from Flax linen
      modules of the supported types (Dense, DenseGeneral, Embed, LayerNorm, RMSNorm).
    params: the parameter tree.
    batch: pytree of arrays whose leaves with a leading axis share the example axis B.
    want: statistic names: "mean" and registered statistics (`STATISTICS`).
    granularity: "example" (n = B samples) or "token" (n = B·T samples).
    layers: layer types / path patterns whose leaves get statistics (`pergrad.stats.layers`;
      empty: all). A layer call none of whose leaves is selected runs untouched (plain
      autodiff, no tap): its statistics are zeros and cost nothing.
  Returns:
    (mean loss, GradStats) with sum = n · ∇(mean loss) and the requested sums.
  """
  want = tuple(want)
  bad = [w for w in want if w not in STATISTICS]
  if bad:
    raise ValueError(f"unknown statistic(s) {bad}; choose from {STATISTICS}.")
  if granularity not in ("example", "token"):
    raise ValueError(f"granularity={granularity!r}; choose 'example' or 'token'.")
  if granularity == "token":
    for k in registry.select(want):
      st = registry.get(k)
      if st.kind == "example":
        raise ValueError(
            f"'{k}' is a per-example statistic: it exists only at granularity='example'; "
            f"drop '{k}' from want or use granularity='example'.")
      if not st.multiplicative:
        raise ValueError(
            f"statistic '{k}' has a non-multiplicative φ, so backend 'surgery' cannot compute "
            "it per token; use granularity='example' (backend 'surgery', 'vmap' or 'loop').")
  leads = {x.shape[0] for x in jax.tree.leaves(batch) if np.ndim(x)}
  if len(leads) != 1:
    raise ValueError(f"batch leaves must share one leading example axis, got sizes {leads}.")
  B = leads.pop()
  token = granularity == "token"

  path_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = [tuple(str(getattr(k, "key", k)) for k in kp) for kp, _ in path_leaves]
  flat_params = dict(zip(keys, (v for _, v in path_leaves), strict=True))
  sites = _plan(loss_fn, params, batch, B, flat_params)
  rows = {s.rows for s in sites}
  if token and len(rows) > 1:
    raise _unsupported(f"per-token statistics need every layer to see the same tokens per "
                       f"example, got {sorted(rows)}")
  T = rows.pop() if rows else 1
  count = B * T if token else B
  scale = float(count)

  chosen = {k[:-1] for k in flat_params if selects(layers, "/".join(k))}
  if not chosen:
    raise ValueError(f"layers={list(layers)} selects no parameter leaf; choose layer types "
                     f"{LAYER_TYPES} or path patterns of the model's leaves.")
  stat_keys = list(registry.select(want))
  example_keys = set(registry.select(want, "example"))
  probes = {k: {key: jnp.zeros((B,) if k in example_keys else v.shape, _F32)
                for key, v in flat_params.items()} for k in stat_keys}

  def objective(p, probes):
    state = {"i": 0}
    carriers = {}

    def interceptor(next_fun, args, kwargs, ctx):
      if ctx.method_name not in _METHODS or type(ctx.module) not in _KIND or not stat_keys:
        return next_fun(*args, **kwargs)
      site = sites[state["i"]]
      state["i"] += 1
      here = (tuple(ctx.module.path), ctx.method_name == "attend")
      if (site.path, site.kind == "attend") != here:
        raise RuntimeError(f"surgery: call order changed at {ctx.module.path}")
      if site.path not in chosen:
        return next_fun(*args, **kwargs)
      x = args[0] if args else next(iter(kwargs.values()))
      if simultaneous_is_used(site, B, x.shape, want, token):
        sub = {k: {leaf: probes[k][site.path + (leaf,)] for leaf in ("kernel", "bias")
                   if site.path + (leaf,) in probes[k]} for k in stat_keys}
        return _simultaneous_dense(ctx.module, site, B, x, want, scale, sub,
                                   jax.tree.map(lambda z: z.shape, sub))
      if simultaneous_norm_is_used(site, want, token):
        sub = {k: {leaf: probes[k][site.path + (leaf,)] for leaf in ("scale", "bias")
                   if site.path + (leaf,) in probes[k]} for k in stat_keys}
        return _simultaneous_norm(ctx.module, site, B, x, want, scale, sub,
                                  jax.tree.map(lambda z: z.shape, sub))
      y = next_fun(*args, **kwargs)
      if site.in_axis is None:
        y = jnp.broadcast_to(y, (B,) + y.shape)
      sub = {k: {leaf: probes[k][site.path + (leaf,)] for leaf in _LEAVES[_KIND[type(ctx.module)]]
                 if site.path + (leaf,) in probes[k]} for k in stat_keys}
      if site.kind == "attend" and site.tied and not token:
        sub = {}
      res = {"x": x}
      carrier_shapes = ()
      if site.kind == "lookup" and site.tied:
        attend = next(s for s in sites if s.path == site.path and s.kind == "attend")
        D = y.shape[-1]
        carrier_shapes = ((B, attend.rows, D),) if token else (
            (B, attend.rows, site.num_rows), (B, attend.rows, D))
      if site.kind == "attend" and site.tied:
        res["carrier"] = carriers[site.path]
      shapes = jax.tree.map(lambda z: z.shape, sub)
      fn = _stats_fn(site, B, token, want, scale, shapes)
      y, carrier = _tap(y, res, sub, fn, carrier_shapes)
      if site.kind == "lookup" and site.tied:
        ids = _lead(x, site.in_axis, B).reshape(B, -1)
        carriers[site.path] = (carrier[0], ids) if token else carrier
      return y

    with nn.intercept_methods(interceptor):
      return loss_fn(p, batch).mean()

  loss, (grads, probe_cts) = jax.value_and_grad(objective, argnums=(0, 1))(params, probes)

  def tree(flat: dict):
    return jax.tree_util.tree_unflatten(treedef, [flat[k] for k in keys])

  return loss, GradStats(
      count=jnp.asarray(count, _F32),
      sum=jax.tree.map(lambda g: g.astype(_F32) * scale, grads),
      coordinate_stats={k: tree(probe_cts[k]) for k in stat_keys if k not in example_keys},
      example_stats={k: tree(probe_cts[k]) for k in stat_keys if k in example_keys},
      granularity=granularity,
      layers=tuple(layers),
  )
