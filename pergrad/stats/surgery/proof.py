"""The planner's proof that surgery's statistics are exact for a model, or its refusal.

Surgery computes a leaf's per-example statistics from the layer calls that use it (the
calls' inputs and output cotangents). That is exact when, and only when, each parameter
leaf reaches the loss through those calls alone, and each call's input carries the
example axis where the plan says so. `prove` shows both from the jaxpr of loss_fn, traced
once (abstractly, at plan time: nothing runs per step) with every layer call that owns
parameters replaced by an opaque primitive `layer_call_p`(x, *params):

  - every use of a parameter leaf's value is a `layer_call_p` operand in a parameter slot,
    through views (reshape, transpose, squeeze, expand_dims, dtype casts, copies) and
    into `jax.jit` sub-jaxprs; any other use (a raw matmul `x @ W.T`, a penalty ‖W‖² in
    the loss, the input of a layer, an operand of scan / remat / cond / custom_vjp,
    where the plan would see one call for many) is refused, naming the leaf and the use;
  - a layer call under `jax.vmap` (a per-example model vmapped over the batch: its input
    has no example axis there) or under differentiation inside loss_fn is refused;
  - a call the plan takes as shared across the batch (input without an example axis, a
    position table on arange(T)) must have an input independent of the batch.

A refusal is an `Unsupported` (`sites.unsupported`); backend="auto" then runs vmap.
"""

from __future__ import annotations

import itertools

import jax
import jax.extend.core as jcore
from jax.interpreters import ad, batching

from pergrad.stats.surgery import frontends


class Unsupported(ValueError):
  """A model for which surgery cannot be shown exact (the vmap backend serves it)."""


def unsupported(reason: str) -> Unsupported:
  """The refusal, one line: the reason (naming the leaf and the use) and the way out."""
  err = Unsupported(f"surgery backend: {reason}; use backend='vmap', which supports any model.")
  err.reason = reason
  return err


# Operations that only re-view a value: a leaf seen through them is still the leaf.
VIEWS = frozenset({"reshape", "transpose", "squeeze", "expand_dims", "convert_element_type",
                   "copy", "copy_p", "reduce_precision"})
JIT = frozenset({"pjit", "jit"})

layer_call_p = jcore.Primitive("pergrad_layer_call")


def _abstract(x, *params, index, name, leaves, shape, dtype):
  del x, params, index, name, leaves
  return jax.core.ShapedArray(shape, dtype)


def _under_vmap(args, dims, *, name, leaves, **_):
  raise unsupported(f"'{leaves[0]}': its layer call ({name}) is inside jax.vmap (a "
                    "per-example model vmapped over the batch); call the model on the batch")


def _differentiated(primals, tangents, *, name, leaves, **_):
  raise unsupported(f"'{leaves[0]}': its layer call ({name}) is differentiated inside loss_fn")


layer_call_p.def_abstract_eval(_abstract)
batching.primitive_batchers[layer_call_p] = _under_vmap
ad.primitive_jvps[layer_call_p] = _differentiated


def prove(loss_fn, params, batch, keys, paths, outs, shared, owners=None) -> None:
  """Raises `Unsupported` unless surgery is exact for loss_fn (module docstring).

  Args:
    keys, paths: every parameter leaf's key and "a/b" path, in tree order.
    outs: (shape, dtype) of each layer call with parameters, in call order, at this batch.
    shared: the indices of the calls whose input the plan takes as shared across the batch.
    owners: {path: "<class> at '<module>'"}: the module other than a standard layer that
      holds the leaf, named in a refusal of it.
  """
  path_of = dict(zip(keys, paths, strict=True))
  n_leaves = len(keys)

  def run(p, b):
    ids = {id(v): k for k, v in zip(keys, jax.tree.leaves(p), strict=True)}
    count = itertools.count()

    def handler(call):
      roles = [r for r, v in call.params.items() if id(v) in ids]  # constants: no site
      if not roles:
        return call.run()
      i = next(count)
      shape, dtype = outs[i]
      leaves = tuple(path_of.get(ids.get(id(call.params[r])), f"{call.name} {r}") for r in roles)
      return layer_call_p.bind(call.x, *(call.params[r] for r in roles), index=i,
                               name=call.name, leaves=leaves, shape=shape, dtype=dtype)

    with frontends.route(handler):
      return loss_fn(p, b)

  closed = jax.make_jaxpr(run)(params, batch)
  invars = closed.jaxpr.invars
  leaf = {v: paths[i] for i, v in enumerate(invars[:n_leaves])}
  dep = set(invars[n_leaves:])
  batch_fed: dict[int, bool] = {}
  try:
    _walk(closed.jaxpr, leaf, dep, batch_fed)
  except Unsupported as e:
    owner = (owners or {}).get(getattr(e, "leaf", None))
    if owner is None:
      raise
    raise unsupported(f"cannot handle {owner}, which owns parameters: {e.reason}") from None
  for i in shared:
    if batch_fed.get(i):
      raise unsupported(f"layer call {i}'s input has no example axis but depends on the batch "
                        "(mixes examples, or is inside a per-example transform)")


def _vars(vs):
  return [v for v in vs if isinstance(v, jcore.Var)]


def _walk(jaxpr, leaf: dict, dep: set, batch_fed: dict) -> None:
  """Follows every leaf's value through `jaxpr` (module docstring); fills `dep` (the vars
  that depend on the batch) and batch_fed[call index] = whether the call's input does."""
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    ins = _vars(eqn.invars)
    if eqn.primitive is layer_call_p:
      x = eqn.invars[0]
      if isinstance(x, jcore.Var) and x in leaf:
        raise unsupported(f"'{leaf[x]}' is the input of a layer call ({eqn.params['name']}), "
                          "not one of its parameters")
      batch_fed[eqn.params["index"]] = isinstance(x, jcore.Var) and x in dep
    elif name in JIT:
      inner = eqn.params["jaxpr"].jaxpr
      inner_leaf = {iv: leaf[ov] for ov, iv in zip(eqn.invars, inner.invars, strict=True)
                    if isinstance(ov, jcore.Var) and ov in leaf}
      inner_dep = {iv for ov, iv in zip(eqn.invars, inner.invars, strict=True)
                   if isinstance(ov, jcore.Var) and ov in dep}
      _walk(inner, inner_leaf, inner_dep, batch_fed)
      for iv, ov in zip(inner.outvars, eqn.outvars, strict=True):
        if isinstance(iv, jcore.Var) and iv in inner_leaf:
          leaf[ov] = inner_leaf[iv]
        if isinstance(iv, jcore.Var) and iv in inner_dep:
          dep.add(ov)
      continue
    elif name in VIEWS and ins and ins[0] in leaf:
      leaf[eqn.outvars[0]] = leaf[ins[0]]
    else:
      for v in ins:
        if v in leaf:
          err = unsupported(f"'{leaf[v]}' reaches the loss outside its layer calls (used by "
                            f"{_what(eqn)}), so its per-example gradient is not the layer's")
          err.leaf = leaf[v]
          raise err
    if any(v in dep for v in ins):
      dep.update(eqn.outvars)


def _what(eqn) -> str:
  """The offending use, in words."""
  name = eqn.primitive.name
  words = {"dot_general": "a matmul", "scan": "jax.lax.scan (nn.scan, nnx.scan)",
           "checkpoint": "jax.checkpoint / remat", "remat": "jax.checkpoint / remat",
           "while": "a while loop", "cond": "jax.lax.cond",
           "custom_vjp_call": "a custom_vjp function", "custom_jvp_call": "a custom_jvp function"}
  return f"{name}: {words[name]}" if name in words else name
