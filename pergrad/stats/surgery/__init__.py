"""Surgery backend: per-example / per-token gradient statistics in ONE backward pass.

The model stays as written (Flax Linen, Flax NNX, or plain JAX calling `pergrad.stats.taps`:
`frontends.route`). The output y of every standard layer call goes through an identity
`jax.custom_vjp` "tap" whose extra zero-valued "probe" inputs, keyed by the parameter
leaves' paths, receive the statistics as cotangents: in the backward pass each tap sees its
layer's input A and output cotangent Δ, and one `jax.value_and_grad` w.r.t. (params,
probes) yields the batch-mean gradient and all statistics, in float32 whatever the
compute dtype. Samples (GradStats.count = n):
- granularity "example" (n = B): g_b = ∇ loss_b = B · A_bᵀ Δ_b (each cotangent carries 1/B);
- granularity "token" (n = B·T): g_bt = B·T · a_bt δ_btᵀ, the contribution of token (b, t)
  THROUGH THAT TOKEN'S ACTIVATIONS, scaled so that the mean over tokens is the batch
  gradient; not the gradient of token t's loss (δ_bt carries every later token's loss).
  Every coordinate statistic whose φ is multiplicative: φ(A)ᵀφ(Δ) per dense layer.
`sites.make_plan` traces the model into `Site`s, one per layer call, and `proof` refuses a
parameter that reaches the loss outside them; `HANDLERS` maps each layer kind to the module
that computes its statistics (`dense`, `embed`, `norm`: each states its methods);
`surgery_stats` runs the pass, sending each call whose leaves are not selected to the fast
weight-gradient path (`plain_call`, also the "contraction" backend); per-example clipping:
`clip.py`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from pergrad.stats import registry, vmap
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest
from pergrad.stats.surgery import clip, cuts, dense, embed, frontends, lifted, norm, sites
from pergrad.stats.surgery.memo import memo
from pergrad.stats.surgery.probes import F32, Call, Env
from pergrad.stats.surgery.sites import Unsupported, make_plan
from pergrad.stats.types import GradStats

# Layer kind (`Site.kind`) -> handler(env, call) -> the layer's output y.
HANDLERS = {"dense": dense.handle, "embed": embed.handle, "norm": norm.handle}


def surgery_stats(loss_fn, params, batch, request: StatsRequest, options: StatsOptions):
  """Mean loss and GradStats of per-example (or per-token) gradients, one backward pass.

  Args:
    loss_fn: (params, batch) -> float32[B] per-example losses, built from Flax linen
      modules of the supported types (Dense, DenseGeneral, Embed, LayerNorm, RMSNorm).
    params: the parameter tree.
    batch: pytree of arrays with a leading example axis B.
    request: statistics (`want`), granularity "example" (n = B samples) or "token"
      (n = B·T samples), and `layers`: the leaves that get statistics
      (`pergrad.layer_types`; empty: all). A layer call none of whose leaves is selected
      takes the fast weight-gradient path (`plain_call`, no tap): its statistics are
      zeros and cost nothing.
    options: `dense_method` and `scan_unroll` (`StatsOptions`).
  Returns:
    (mean loss, GradStats) with sum = n · ∇(mean loss) and the requested sums.
  """
  plan = make_plan(loss_fn, params, batch, request)
  if plan.refused:
    raise plan.refusal()
  return _surgery_pass(loss_fn, params, batch, request, options, plan)[:2]


def _surgery_pass(loss_fn, params, batch, request: StatsRequest, options: StatsOptions, plan,
                  cut_leaves=()):
  """`surgery_stats` on `plan`, whose refused leaves' calls run untouched (their
  statistics zeros: `surgery_vmap_stats` fills them); with (loss, stats) the `cuts.Cuts` of
  the refused leaves `cut_leaves` (indices in tree order) and their per-example gradients
  (example axis as `vmap.reduced` reads it), read from this pass (`cuts`)."""
  if request.per_example_clip is not None:
    loss, stats = clip.clipped_stats(loss_fn, params, batch, request, options, plan)
    return loss, stats, cuts.Cuts(), []
  B, token = plan.B, request.granularity == "token"
  count = B * plan.T if token else B
  stat_keys = list(registry.select(request.want))
  example_keys = set(registry.select(request.want, "example"))
  shapes = dict(zip(plan.keys, (x.shape for x in jax.tree.leaves(params)), strict=True))
  objective, probes = _objective(loss_fn, params, request, options, plan)
  cut, per_example = cuts.Cuts(), []
  lifts = any(s.lifted >= 0 and s.proven and s.selected for s in plan.sites) and stat_keys
  closed = jax.make_jaxpr(objective)(params, probes, batch) if cut_leaves or lifts else None
  if cut_leaves:
    cut = _cuts(loss_fn, params, batch, request, options, plan, closed, cut_leaves)
  if cut.leaves or lifts:
    loss, grads, probe_cts, lifted_cts, cut_cts = lifted.value_and_grad(
        closed, params, probes, batch, cuts.zeros(cut), cuts.edit(cut))
    probe_cts = lifted.merged(probe_cts, lifted_cts, [s for s in plan.sites if s.lifted >= 0],
                              example_keys, B, shapes)
    if cut.leaves:
      per_example = cuts.per_example(cut, closed, jax.tree.leaves((params, probes, batch)),
                                     cut_cts, B, -1 if options.vmap_layout == "last" else 0)
  else:
    loss, (grads, probe_cts) = jax.value_and_grad(objective, argnums=(0, 1))(params, probes,
                                                                             batch)
  return loss, GradStats(
      count=jnp.asarray(count, F32),
      sum=jax.tree.map(lambda g: g.astype(F32) * float(count), grads),
      coordinate_stats={k: plan.tree(probe_cts[k]) for k in stat_keys if k not in example_keys},
      example_stats={k: plan.tree(probe_cts[k]) for k in stat_keys if k in example_keys},
      granularity=request.granularity,
      layers=tuple(request.layers),
      rules=plan.rules,
  ), cut, per_example


def _cuts(loss_fn, params, batch, request, options, plan, closed, leaves) -> cuts.Cuts:
  """`cuts.find` of `leaves` on `closed`, the objective's jaxpr at B, and its trace at B+1
  (none where that trace fails: a model bound to its batch size keeps the whole-loss vmap)."""
  B = plan.B
  obj1, probes1 = _objective(loss_fn, params, request, options, dataclasses.replace(plan, B=B + 1))
  batch1 = jax.tree.map(lambda x: jax.ShapeDtypeStruct((B + 1,) + x.shape[1:], x.dtype), batch)
  try:
    closed1 = jax.make_jaxpr(obj1)(params, probes1, batch1)
  except Exception:  # noqa: BLE001 - no cut: the exact whole-loss vmap serves the leaves
    return cuts.Cuts()
  return cuts.find(closed, closed1, len(plan.keys), leaves, B)


@memo
def cut_paths(loss_fn, params, batch, request: StatsRequest) -> tuple[str, ...]:
  """The refused leaves whose per-example gradients `surgery_vmap_stats` reads through their
  example-free slice (`cuts`), from abstract traces (params and batch may be shapes)."""
  plan = make_plan(loss_fn, params, batch, request)
  _, paths, _ = sites.leaf_keys(params)
  leaves = tuple(i for i, p in enumerate(paths) if p in dict(plan.refused))
  if not leaves:
    return ()
  objective, probes = _objective(loss_fn, params, request, StatsOptions(), plan)
  closed = jax.make_jaxpr(objective)(params, probes, batch)
  got = _cuts(loss_fn, params, batch, request, StatsOptions(), plan, closed, leaves)
  return tuple(paths[i] for i in got.leaves)


def _objective(loss_fn, params, request: StatsRequest, options: StatsOptions, plan):
  """(objective(params, probes, batch) -> mean loss with every layer call routed to its
  handler, the zero probes), at the plan's batch size."""
  want, B, token = request.want, plan.B, request.granularity == "token"
  stat_keys = list(registry.select(want))
  example_keys = set(registry.select(want, "example"))
  shapes = dict(zip(plan.keys, (x.shape for x in jax.tree.leaves(params)), strict=True))
  probes = {k: {key: jnp.zeros((B,) if k in example_keys else shp, F32)
                for key, shp in shapes.items()} for k in stat_keys}

  def objective(p, probes, batch):
    env = Env(B=B, token=token, want=want, scale=float(B * plan.T if token else B),
              options=options, sites=plan.sites)

    def handler(site, layer):
      if not site.selected:
        return plain_call(env, site, layer)
      if site.lifted >= 0:  # inside scan / remat: placeholders (`lifted`)
        sub = {k: {leaf: lifted.placeholder((site.lifted, k, leaf), (B,) if k in example_keys
                                            else layer.params[leaf].shape)
                   for leaf in site.leaves} for k in stat_keys}
      else:
        sub = {k: {leaf: probes[k][key] for leaf, key in zip(site.leaves, site.keys,
                                                             strict=True)} for k in stat_keys}
      return HANDLERS[site.kind](env, Call(site=site, layer=layer, probes=sub))

    with frontends.route(sites.site_router(plan, p, handler if stat_keys else None,
                                           every=True)):
      return loss_fn(p, batch).mean()

  return objective, probes


def surgery_vmap_stats(loss_fn, params, batch, request: StatsRequest, options: StatsOptions):
  """Surgery for the leaves its proof shows exact, and for the refused ones, per example:
  through their example-free slice from the same backward pass where `cuts` can read it
  (B × the slice), else jax.vmap(jax.grad) of loss_b with respect to those leaves alone
  (the rest held constant; B × the network); both reduced as the vmap backend does
  (`vmap.reduced`). Exact on every leaf; example granularity, no per-example clipping
  (the clip weights need every leaf's norm first)."""
  plan = make_plan(loss_fn, params, batch, request)
  _, paths, _ = sites.leaf_keys(params)
  refused = dict(plan.refused)
  loss, stats, cut, per_example = _surgery_pass(
      loss_fn, params, batch, request, options, plan,
      tuple(i for i, p in enumerate(paths) if p in refused))
  if not plan.refused:
    return loss, stats
  flat = dict(zip(plan.keys, jax.tree.leaves(params), strict=True))
  fast = {plan.keys[i]: g for i, g in zip(cut.leaves, per_example, strict=True)}
  gone = {k for k, p in zip(plan.keys, paths, strict=True) if p in refused and k not in fast}
  part = {}
  if fast:
    part["fast"] = vmap.reduced(fast, plan.B, request, options)
  if gone:
    def loss_alone(r, b):
      return loss_fn(plan.tree({**flat, **r}), b)
    _, part["slow"] = vmap.vmap_stats(loss_alone, {k: flat[k] for k in gone}, batch, request,
                                      options)

  def swap(tree, got):
    return plan.tree({k: got[k] if k in got else v for k, v in zip(
        plan.keys, jax.tree.leaves(tree), strict=True)})

  return loss, stats.replace(
      coordinate_stats={k: swap(v, {key: p.coordinate_stats[k][key] for p in part.values()
                                    for key in p.coordinate_stats[k]})
                        for k, v in stats.coordinate_stats.items()},
      example_stats={k: swap(v, {key: p.example_stats[k][key] for p in part.values()
                                 for key in p.example_stats[k]})
                     for k, v in stats.example_stats.items()})


def plain_call(env: Env, site, layer):
  """y of a layer call without statistics on the fast weight-gradient path: a dense
  kernel's gradient as one contraction (`dense.contracted`), a norm's backward from the
  x̂ kept (`norm.simultaneous_norm`, no statistic asked), any other call as it is."""
  if site.kind == "dense" and site.in_axis is not None and site.plain_dot:
    return dense.contracted(layer, site, env.B)
  if site.kind == "norm" and site.in_axis is not None and not env.token:
    return norm.simultaneous_norm(dataclasses.replace(env, want=()),
                                  Call(site=site, layer=layer, probes={}))
  return layer.run()


def contraction_stats(loss_fn, params, batch, request: StatsRequest, options: StatsOptions):
  """Mean loss and GradStats("mean"): ḡ with every layer call on the fast weight-gradient
  path (`plain_call`); a model the planner cannot read (`make_plan` raises `Unsupported`) gets
  `jax.value_and_grad`'s, the same gradient."""
  del options  # "mean" alone
  B = jax.tree.leaves(batch)[0].shape[0]
  try:
    plan = make_plan(loss_fn, params, batch, request)
  except Unsupported:
    plan = env = None
  else:
    env = Env(B=plan.B, token=False, want=(), scale=float(plan.B), options=StatsOptions(),
              sites=plan.sites)

  def objective(p):
    if plan is None:
      return loss_fn(p, batch).mean()
    with frontends.route(sites.site_router(plan, p, lambda s, y: plain_call(env, s, y),
                                           every=True)):
      return loss_fn(p, batch).mean()

  loss, grads = jax.value_and_grad(objective)(params)
  return loss, GradStats(count=jnp.asarray(B, F32),
                         sum=jax.tree.map(lambda g: g.astype(F32) * B, grads))
