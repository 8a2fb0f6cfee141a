"""What every surgery handler shares: the call's context, layouts, and the identity "tap".

A handler (`pergrad.stats.surgery.HANDLERS`) receives the `Env` of the whole
`surgery_stats` call and one intercepted layer `Call`, and returns the layer's output y.
The generic route is `tapped`: the layer's own forward, then an identity `jax.custom_vjp`
whose residual is the layer input and whose zero-valued probe inputs receive the
statistics as cotangents in the backward pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pergrad.stats.options import StatsOptions
from pergrad.stats.surgery import formulas as sm
from pergrad.stats.surgery.sites import Site
from pergrad.stats.taps import LayerCall

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Env:
  """What every layer call of one `surgery_stats` trace shares.

  Attributes:
    B: examples; token: per-token samples (else per-example); want: statistic names;
    scale: the sample count n (cotangents carry 1/n: a sample is n·A_bᵀΔ_b);
    options: `StatsOptions`; sites: the plan's sites;
    carriers: tied embedding's lookup -> attend values, filled during the forward pass.
  """

  B: int
  token: bool
  want: tuple[str, ...]
  scale: float
  options: StatsOptions
  sites: tuple[Site, ...]
  carriers: dict = dataclasses.field(default_factory=dict)

  def outer(self, left, right):
    """Statistics of the samples of an outer-product layer, cotangents unscaled."""
    if self.token:
      return sm.outer_token_stats(left, right, self.want, self.scale,
                                  unroll=self.options.scan_unroll)
    return sm.outer_example_stats(left, right, self.want, self.scale)

  def rowsum(self, v):
    """Statistics of a row-sum leaf (bias, norm scale) from scaled rows `flat(v)`."""
    if self.token:
      return sm.rowsum_token_stats(v, self.want)
    return sm.rowsum_example_stats(v, self.want)

  def flat(self, a):
    """B×R×F -> (B·R)×F per token; unchanged per example."""
    return a.reshape(-1, a.shape[-1]) if self.token else a


@dataclasses.dataclass(frozen=True)
class Call:
  """One layer call on its way through the backend: its site, the `taps.LayerCall` a
  frontend reported (input, parameters, own forward), its leaves' probes
  ({stat: {leaf: zeros}})."""

  site: Site
  layer: LayerCall
  probes: dict

  @property
  def x(self) -> jax.Array:
    return self.layer.x

  def run(self) -> jax.Array:
    return self.layer.run()


# --- layouts ------------------------------------------------------------------------
def lead(x, axis, B):
  """Example axis first (broadcast if the layer is shared across the batch)."""
  return jnp.broadcast_to(x, (B,) + x.shape) if axis is None else jnp.moveaxis(x, axis, 0)


def rows(x, axis, B, feat: tuple[int, ...] = (-1,), dtype=F32):
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


# --- probes -----------------------------------------------------------------------------
def shapes_of(probes: dict) -> dict:
  return jax.tree.map(lambda z: z.shape, probes)


def collector(shapes: dict):
  """(put, done): put(stats, leaf) files {stat: array} under out[stat][leaf], reshaped
  like the probe; done() gives the probe cotangents with the exact structure of the
  probes (zeros where none was put)."""
  out: dict = {}

  def put(stats: dict, leaf: str):
    for k, v in stats.items():
      if leaf in shapes.get(k, {}):
        out.setdefault(k, {})[leaf] = v.reshape(shapes[k][leaf])

  def done() -> dict:
    return {k: {leaf: out.get(k, {}).get(leaf, jnp.zeros(shp, F32)) for leaf, shp in sub.items()}
            for k, sub in shapes.items()}

  return put, done


def zero_ct(x, zero=0.0):
  """A zero cotangent for x (float0 for integer x); `zero` may be a traced 0."""
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.full_like(x, zero)
  return np.zeros(x.shape, jax.dtypes.float0)


# --- the tap ----------------------------------------------------------------------------
def tap(y, res: dict, probes: dict, stats_fn: Callable, carrier_shapes=()):
  """Identity on y (plus zero carriers out) whose VJP puts stats_fn's results on probes.

  stats_fn(res, dy, dcarriers) -> (probe cotangents like `probes`, {res key: cotangent}).
  """

  @jax.custom_vjp
  def f(y, res, probes):
    return y, tuple(jnp.zeros(s, F32) for s in carrier_shapes)

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
    res_cts = {k: res_cts[k] if k in res_cts else jax.tree.map(lambda a: zero_ct(a, done), v)
               for k, v in res.items()}
    return dy, res_cts, probe_cts

  f.defvjp(fwd, bwd)
  return f(y, res, probes)


def tapped(env: Env, call: Call, body: Callable, res: dict | None = None,
           probes: dict | None = None, carrier_shapes=()):
  """(y, carriers): the layer's own output (broadcast to B×... if its input is shared
  across the batch) through a tap whose backward pass runs
  body(res, dy, dcarriers, put) -> {res key: cotangent} (or None), with res = {"x": the
  layer input, **res} and put(stats, leaf) filing statistics on `probes` (default: the
  call's)."""
  y = call.run()
  if call.site.in_axis is None:
    y = jnp.broadcast_to(y, (env.B,) + y.shape)
  probes = call.probes if probes is None else probes
  shapes = shapes_of(probes)

  def stats_fn(res_, dy, dcarriers):
    put, done = collector(shapes)
    res_cts = body(res_, dy, dcarriers, put) or {}
    return done(), res_cts

  return tap(y, {"x": call.x, **(res or {})}, probes, stats_fn, carrier_shapes)
