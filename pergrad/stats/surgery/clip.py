"""Per-example clipping by surgery: ĝ_b = w_b g_b, w_b = min(1, C/‖g_b‖), in one backward pass.

The backward pass differentiates the probes only (the parameters are constants), so
autodiff forms the input cotangents and no weight gradient. Each layer's tap hands over
what its leaves' per-example gradients are made of, as they are (no copy; g_b carries a
factor B, the batch mean's 1/B taken back in `finish`), and no per-example gradient tensor
unless `keeps_g` chooses it (`record_shapes`):
  - outer-product leaf, g_b = B·L_bᵀR_b (P×Q): its two factors, dense kernel
    L = A (input rows B×R×K), R = Δ (output cotangent rows B×R×L); an embedding's
    `attend` L = Δ (B×R×V), R = A (B×R×D); or G_b = A_bᵀΔ_b itself (`keeps_g`);
  - bias: Σ_r Δ_br; norm scale: Σ_r Δ_br ⊙ x̂_br; norm bias: Σ_r Δ_br (rows B×D);
  - embedding lookup: the rows Δ_br themselves with their ids (sparse, B×R×D).
After the pass (`finish`): per leaf ‖g_b‖² (`_sq_norms`), summed over leaves into w_b
(`clipping.clip_weights`); then Σ_b w_b g_b, for factors ONE contraction over (example,
row), Lᵀ(w⊙R), which replaces the plain step's weight-gradient contraction; and every
requested statistic of ĝ_b: Σ_b φ(ĝ_b), Σ_coords φ(ĝ_b) (no `clip_power` needed).
Cost over a plain step with factors: the norms, Σ_layers B·min(2R²(P+Q), 2RPQ), and one
more weight-gradient-sized contraction per layer where R ≥ PQ/(P+Q), which `keeps_g`
avoids.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from pergrad.stats import registry
from pergrad.stats.clipping import clip_weights
from pergrad.stats.surgery import formulas as sm
from pergrad.stats.surgery import frontends
from pergrad.stats.surgery.norm import normalized
from pergrad.stats.surgery.probes import F32, Call, Env, collector, lead, rows, shapes_of, zero_ct
from pergrad.stats.surgery.sites import Plan, Site, site_router
from pergrad.stats.types import GradStats

# The probe collections: an outer-product leaf's factors L and R (g_b = L_bᵀR_b), and
# every other leaf's record (rows B×N, or a lookup's rows B×R×D).
LEFT, RIGHT, CLIP = "left", "right", "clip"


def record_shapes(site: Site, leaf_shapes: dict, B: int, whole: bool = False) -> dict:
  """{collection: {role: shape}} of the site's records (module docstring); whole: the
  dense kernel's record is G_b (`keeps_g`)."""
  out: dict = {}
  for role, key in zip(site.leaves, site.keys, strict=True):
    shape, R = leaf_shapes[key], site.rows
    if _factored(site, role) and not whole:
      K, L = _kernel_kl(site, shape)
      out.setdefault(LEFT, {})[role] = (B, R, K)
      out.setdefault(RIGHT, {})[role] = (B, R, L)
    else:
      lookup = site.kind == "embed" and not site.attend
      out.setdefault(CLIP, {})[role] = (B, R, shape[-1]) if lookup else (B,) + tuple(shape)
  return out


def _factored(site: Site, role: str) -> bool:
  return (site.kind, role) == ("dense", "kernel") or site.attend


def _kernel_kl(site: Site, shape) -> tuple[int, int]:
  """(K, L) of a factored leaf g_b = L_bᵀR_b: its contracted (input) size and the rest (a
  tied output layer's table: V and D)."""
  K = int(np.prod(shape[:1] if site.attend else shape[:len(site.contract)]))
  return K, int(np.prod(shape)) // K


def keeps_g(site: Site, sites, method: str, leaf_shapes: dict) -> bool:
  """Whether a dense call's kernel record is G_b rather than its factors.

  For `dense_method="auto"`, per layer: G_b = A_bᵀΔ_b (B×K×L, formed once in its tap; norm
  and wᵀG from it, no second contraction) where it is no larger than its factors,
  KL ≤ R(K+L); that is also where the Gram norm would cost more than the contraction, so
  one threshold R* = KL/(K+L) picks the smaller record and the fewer FLOPs (mixed ghost
  clipping, Bu et al. 2022). The output layer (the last outer-product call) always keeps
  its factors: they are live anyway at the start of the backward pass, the step's peak,
  where G_b would add B·K·L. "separate": factors everywhere (no per-example tensor, +1
  contraction per layer where R ≥ R*); "simultaneous": G_b for every dense kernel but the
  output layer's, whatever its size."""
  last = [s for s in sites if s.kind == "dense" or s.attend][-1:]
  if method == "separate" or site.kind != "dense" or [site] == last:
    return False
  K, L = _kernel_kl(site, leaf_shapes[site.keys[site.leaves.index("kernel")]])
  return method == "simultaneous" or K * L <= site.rows * (K + L)


def clipped_stats(loss_fn, params, batch, request, options, plan: Plan):
  """(mean loss, GradStats of the clipped ĝ_b) of one batch (module docstring)."""
  B = plan.B
  env = Env(B=B, token=False, want=request.want, scale=float(B), options=options,
            sites=plan.sites)
  shapes = dict(zip(plan.keys, (x.shape for x in jax.tree.leaves(params)), strict=True))
  method = options.dense_method
  probes = {str(i): jax.tree.map(
      lambda s: jnp.zeros(s, F32),
      record_shapes(site, shapes, B, keeps_g(site, plan.sites, method, shapes)),
      is_leaf=lambda s: isinstance(s, tuple)) for i, site in enumerate(plan.sites)}
  index = {id(site): i for i, site in enumerate(plan.sites)}

  def objective(probes):
    ids = []

    def handler(site, layer):
      call = Call(site=site, layer=layer, probes=probes[str(index[id(site)])])
      return handle(env, call, ids)

    with frontends.route(site_router(plan, params, handler, every=True)):
      return loss_fn(params, batch).mean(), ids

  (loss, ids), records = jax.value_and_grad(objective, has_aux=True)(probes)
  return loss, finish(plan, records, ids, shapes, request.want, request.per_example_clip, B,
                      options.scan_unroll)


def handle(env: Env, call: Call, ids: list):
  """y of one layer call through an identity whose VJP puts the call's records (input
  rows and output cotangent rows as they are, unscaled: no copy) on its probes; a
  lookup's ids onto `ids`."""
  site, B = call.site, env.B
  whole = "kernel" in call.probes.get(CLIP, {})  # G_b, as `record_shapes` chose
  y = call.run()
  if site.in_axis is None:
    y = jnp.broadcast_to(y, (B,) + y.shape)
  if site.kind == "embed" and not site.attend:
    ids.append(lead(call.x, site.in_axis, B).reshape(B, -1))

  def records(x, dy):
    put, done = collector(shapes_of(call.probes))
    if site.kind == "dense":
      nfeat = dy.ndim - (x.ndim - len(site.contract)) - (site.in_axis is None)
      d = rows(dy, site.out_axis, B, tuple(range(-nfeat, 0)))
      a = rows(x, site.in_axis, B, site.contract)
      put({CLIP: jnp.einsum("brk,brl->bkl", a, d)} if whole else {LEFT: a, RIGHT: d},
          "kernel")
      put({CLIP: d.sum(axis=1)}, "bias")
    elif site.kind == "norm":  # x̂ waits for dy (`sm.zero_after`): not formed early
      a, d = rows(x, site.in_axis, B) + sm.zero_after(dy), rows(dy, site.out_axis, B)
      put({CLIP: (d * normalized(a, *site.norm)).sum(axis=1)}, "scale")
      put({CLIP: d.sum(axis=1)}, "bias")
    elif site.attend:
      put({LEFT: rows(dy, site.out_axis, B), RIGHT: rows(x, site.in_axis, B)}, "embedding")
    else:
      put({CLIP: rows(dy, site.out_axis, B)}, "embedding")
    return done()

  @jax.custom_vjp
  def f(y, x, probes):
    return y

  f.defvjp(lambda y, x, probes: (y, x), lambda x, dy: (dy, zero_ct(x), records(x, dy)))
  return f(y, call.x, call.probes)


def finish(plan: Plan, records: dict, ids: list, shapes: dict, want, clip: float,
           B: int, unroll: int | bool = 1) -> GradStats:
  """GradStats of the clipped per-example gradients from the sites' records
  ({site index: {collection: {role: record}}}) and the lookups' ids, in call order."""
  parts: dict = {k: {} for k in plan.keys}  # leaf -> {"factors"|"rows"|"sparse": record}
  lookup_ids = iter(ids)
  for i, site in enumerate(plan.sites):
    rec = records[str(i)]
    for role, key in zip(site.leaves, site.keys, strict=True):
      if role in rec.get(LEFT, {}):
        parts[key]["factors"] = (rec[LEFT][role], rec[RIGHT][role])
      elif site.kind == "embed":
        parts[key]["sparse"] = (next(lookup_ids), rec[CLIP][role])
      else:
        parts[key]["rows"] = rec[CLIP][role].reshape(B, -1)
  for k, p in parts.items():  # a leaf the loss never reaches: g_b = 0
    if not p:
      p["rows"] = jnp.zeros((B, int(np.prod(shapes[k]))), F32)
  z = sum(sm.zero_after(r) for r in jax.tree.leaves(records))  # the pass is over
  sq_B = sum(_sq_norms(p, shapes[k], z) for k, p in parts.items()) * float(B * B)
  v_B = clip_weights(sq_B, clip) * float(B)  # ĝ_b = w_b·B·(record's g_b)
  total, coord, example = {}, {}, {}
  for k, p in parts.items():
    total[k], st = _weighted(p, v_B, shapes[k], want, unroll)
    for name, v in st.items():
      into = example if registry.get(name).kind == "example" else coord
      into.setdefault(name, {})[k] = v.reshape(shapes[k]) if into is coord else v
  return GradStats(count=jnp.asarray(B, F32), sum=plan.tree(total),
                   coordinate_stats={n: plan.tree(v) for n, v in coord.items()},
                   example_stats={n: plan.tree(v) for n, v in example.items()},
                   granularity="example", rules=plan.rules)


def _on_narrower(factors, fn):
  """(L, R) with `fn` applied to the narrower factor (the fewer features per row): the
  cheaper place for a per-example weight or the zero that orders the computation."""
  left, right = factors
  if left.shape[-1] <= right.shape[-1]:
    return fn(left), right
  return left, fn(right)


def _sq_norms(p: dict, shape, z):
  """‖g_b‖²/B² of one leaf (float32[B]) from its unscaled records (module docstring):
    - factors: ⟨L_bL_bᵀ, R_bR_bᵀ⟩ (two R×R Grams, the "ghost norm") where it takes fewer
      FLOPs, `sm.ghost_norm_is_cheaper(R, P, Q, slack=1)`: 2R²(P+Q) + R² against
      2RPQ + PQ, about R(P+Q) < PQ; else Σ_coords (L_bᵀR_b)² from the per-example
      contraction, whose B×P×Q transient is then no larger than about the factors
      B×R×(P+Q) kept anyway;
    - tied table (lookup + attend, both uses summed before the norm):
      ‖L_bᵀR_b‖² + 2 Σ_{s,r} L_b[s, id_br] ⟨R_bs, row_br⟩ + ‖scatter(ids_b, rows_b)‖²
      (`sm.tied_example_stats`);
    - rows: Σ squares; lookup: sparse segment-sum (`sm.lookup_example_stats`).
  The narrower factor + z (a zero computed from every record, `sm.zero_after`): the
  per-example contraction or Gram waits for the end of the backward pass, instead of
  being formed while every activation is live."""
  norms = ("norms",)
  if "factors" in p:
    left, right = _on_narrower(p["factors"], lambda f: f + z)
  if "factors" in p and "sparse" in p:
    ids, rows_ = p["sparse"]
    return sm.tied_example_stats(ids, rows_, left, right, norms)["norms"]
  if "factors" in p:
    return sm.outer_example_stats(left, right, norms, slack=1.0)["norms"]
  if "sparse" in p:
    return sm.lookup_example_stats(*p["sparse"], shape[0], norms)["norms"]
  return jnp.square(p["rows"]).sum(axis=1)


def _weighted(p: dict, w_B, shape, want, unroll):
  """(Σ_b w_b g_b like the leaf, {statistic: value} of w_b g_b), g_b from the records:
  for factors one contraction Lᵀ(w⊙R) (w on the narrower factor); for rows (a kept G_b
  among them) wᵀrows; for a lookup scatter(ids, w·rows)."""
  stats = registry.select(want)
  if "rows" in p:  # wᵀg: a GEMV, no weighted copy of g unless a statistic needs it
    g = p["rows"]
    return (jnp.dot(w_B, g).reshape(shape),
            sm.flat_example_stats(g * w_B[:, None], stats) if stats else {})
  total, out, w = 0.0, {}, w_B[:, None, None]
  if "factors" in p:  # one contraction over (example, row), w on the narrower factor
    left, right = _on_narrower(p["factors"], lambda f: f * w)
    total = jnp.einsum("brp,brq->pq", left, right)
    if stats and "sparse" not in p:
      out = sm.outer_example_stats(left, right, stats)
  if "sparse" in p:
    ids, rows_ = p["sparse"]
    V, D = shape
    zeros = jnp.zeros((V, D), F32) + sm.zero_after(w_B)  # formed when w is, not early
    total = total + zeros.at[ids.reshape(-1)].add((rows_ * w).reshape(-1, D))
    if stats and "factors" in p:
      out = sm.tied_example_stats(ids, rows_ * w, left, right, stats, unroll=unroll)
    elif stats:
      out = sm.lookup_example_stats(ids, rows_ * w, V, stats)
  return total.reshape(shape), out
