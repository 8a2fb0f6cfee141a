"""Per-example clipping by surgery: ĝ_b = w_b g_b, w_b = min(1, C/‖g_b‖), in one backward pass.

The backward pass differentiates the probes only (the parameters are constants), so
autodiff forms the input cotangents and no weight gradient. Each layer's tap turns its
input A and output cotangent Δ into a per-example record of every leaf (g_b = B·A_bᵀΔ_b
carries the batch mean's 1/B back):
  - dense kernel (and an embedding's `attend`): G_b = B·A_bᵀΔ_b (B×K×L, the contraction
    the plain weight gradient would have been, kept per example);
  - bias: B·Σ_r Δ_br; norm scale: B·Σ_r Δ_br ⊙ x̂_br; norm bias: B·Σ_r Δ_br (B×D);
  - embedding lookup: the rows B·Δ_br themselves with their ids (sparse, B×R×D).
After the pass (`finish`), per leaf, with D_b the dense records' sum and (ids_b, rows_b)
the sparse ones:

    ‖g_b‖² = ‖D_b‖² + 2 Σ_r ⟨D_b[id_br], row_br⟩ + ‖scatter(ids_b, rows_b)‖²

summed over leaves gives w_b (`vmap.clip_weights`), then Σ_b w_b g_b = wᵀD +
scatter(ids, w·rows) (a tied table adds both uses before any norm), and every requested
statistic of ĝ_b = w_b g_b: Σ_b φ(ĝ_b), Σ_coords φ(ĝ_b) (no `clip_power` needed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pergrad.stats import registry
from pergrad.stats import surgery_math as sm
from pergrad.stats.surgery import frontends
from pergrad.stats.surgery.norm import normalized
from pergrad.stats.surgery.sites import Plan, Site, site_router
from pergrad.stats.surgery.tap import F32, Call, Env, lead, rows, tapped
from pergrad.stats.types import GradStats
from pergrad.stats.vmap import clip_weights

CLIP = "clip"  # the probe collection that carries the records


def record_shapes(site: Site, leaf_shapes: dict, B: int) -> dict:
  """role -> the shape of the site's per-example record of that leaf."""
  out = {}
  for role, key in zip(site.leaves, site.keys, strict=True):
    shape = leaf_shapes[key]
    out[role] = (B, site.rows, shape[-1]) if site.kind == "embed" and not site.attend \
        else (B,) + tuple(shape)
  return out


def clipped_stats(loss_fn, params, batch, request, options, plan: Plan):
  """(mean loss, GradStats of the clipped ĝ_b) of one batch (module docstring)."""
  B = plan.B
  env = Env(B=B, token=False, want=request.want, scale=float(B), options=options,
            sites=plan.sites)
  shapes = dict(zip(plan.keys, (x.shape for x in jax.tree.leaves(params)), strict=True))
  probes = {str(i): {CLIP: {role: jnp.zeros(shp, F32)
                            for role, shp in record_shapes(site, shapes, B).items()}}
            for i, site in enumerate(plan.sites)}
  index = {id(site): i for i, site in enumerate(plan.sites)}

  def objective(probes):
    ids = []

    def handler(site, layer):
      call = Call(site=site, layer=layer, probes=probes[str(index[id(site)])])
      return handle(env, call, ids)

    with frontends.route(site_router(plan, params, handler, every=True)):
      return loss_fn(params, batch).mean(), ids

  (loss, ids), cts = jax.value_and_grad(objective, has_aux=True)(probes)
  records = {i: c[CLIP] for i, c in cts.items()}
  return loss, finish(plan, records, ids, shapes, request.want, request.per_example_clip, B)


def handle(env: Env, call: Call, ids: list):
  """y of one layer call, its records put on its probes; a lookup's ids onto `ids`."""
  site, B, s = call.site, env.B, env.scale

  def body(res, dy, dcarriers, put):
    x = res["x"]
    if site.kind == "dense":
      nfeat = dy.ndim - (x.ndim - len(site.contract)) - (site.in_axis is None)
      a = rows(x, site.in_axis, B, site.contract)
      d = rows(dy, site.out_axis, B, tuple(range(-nfeat, 0))) * s
      put({CLIP: jnp.einsum("brk,brl->bkl", a, d)}, "kernel")
      put({CLIP: d.sum(axis=1)}, "bias")
    elif site.kind == "norm":
      a, d = rows(x, site.in_axis, B), rows(dy, site.out_axis, B) * s
      put({CLIP: (d * normalized(a, *site.norm)).sum(axis=1)}, "scale")
      put({CLIP: d.sum(axis=1)}, "bias")
    elif site.attend:
      a, d = rows(x, site.in_axis, B), rows(dy, site.out_axis, B) * s
      put({CLIP: jnp.einsum("brv,brd->bvd", d, a)}, "embedding")
    else:
      put({CLIP: rows(dy, site.out_axis, B) * s}, "embedding")

  if site.kind == "embed" and not site.attend:
    ids.append(lead(call.x, site.in_axis, B).reshape(B, -1))
  return tapped(env, call, body)[0]


def finish(plan: Plan, records: dict, ids: list, shapes: dict, want, clip: float,
           B: int) -> GradStats:
  """GradStats of the clipped per-example gradients from the sites' records
  ({site index: {role: record}}) and the lookups' ids (module docstring)."""
  dense, sparse = {}, {}
  lookup_ids = iter(ids)
  for i, site in enumerate(plan.sites):
    for role, key in zip(site.leaves, site.keys, strict=True):
      r = records[str(i)][role]
      if site.kind == "embed" and not site.attend:
        sparse.setdefault(key, []).append((next(lookup_ids), r))
      else:
        dense[key] = r if key not in dense else dense[key] + r
  per_leaf = {k: _example(dense.get(k), sparse.get(k), shapes[k], B) for k in plan.keys}
  sq = {k: _sq_norms(*v, shapes[k]) for k, v in per_leaf.items()}
  w_B = clip_weights(sum(sq.values()), clip)
  total, coord, example = {}, {}, {}
  for k, (g, sp) in per_leaf.items():
    total[k], st = _weighted(g, sp, w_B, shapes[k], want)
    for name, v in st.items():
      into = example if registry.get(name).kind == "example" else coord
      into.setdefault(name, {})[k] = v.reshape(shapes[k]) if into is coord else v
  return GradStats(count=jnp.asarray(B, F32), sum=plan.tree(total),
                   coordinate_stats={n: plan.tree(v) for n, v in coord.items()},
                   example_stats={n: plan.tree(v) for n, v in example.items()},
                   granularity="example", rules=plan.rules)


def _example(g, sparse, shape, B):
  """(dense part B×N or None, sparse part (ids B×R, rows B×R×D) or None) of one leaf; a
  dense and a sparse part (a tied table) are added into one dense B×V×D."""
  sp = None
  if sparse:
    sp = tuple(jnp.concatenate(xs, axis=1) for xs in zip(*sparse, strict=True))
  if g is not None and sp is not None:
    g = g.at[jnp.arange(B)[:, None], sp[0]].add(sp[1])
    sp = None
  return (None if g is None else g.reshape(B, -1)), sp


def _sq_norms(g, sp, shape):
  """‖g_b‖² of one leaf (float32[B])."""
  if g is not None:
    return jnp.square(g).sum(axis=1)
  return sm.lookup_example_stats(*sp, shape[0], ("norms",))["norms"]


def _weighted(g, sp, w_B, shape, want):
  """(Σ_b w_b g_b like the leaf, {statistic: value} of the clipped ĝ_b = w_b g_b)."""
  stats = registry.select(want)
  if g is not None:  # wᵀg: a GEMV, no weighted copy of g unless a statistic needs it
    total = jnp.dot(w_B, g).reshape(shape)
    return total, (sm.flat_example_stats(g * w_B[:, None], stats) if stats else {})
  ids, rows_ = sp
  rw = rows_ * w_B[:, None, None]
  V, D = shape
  total = jnp.zeros((V, D), F32).at[ids.reshape(-1)].add(rw.reshape(-1, D))
  return total, (sm.lookup_example_stats(ids, rw, V, stats) if stats else {})
