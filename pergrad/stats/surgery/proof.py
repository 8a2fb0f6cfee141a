"""The planner's proof that surgery's statistics are exact for a model, leaf by leaf.

Surgery computes a leaf's per-example statistics from the layer calls that use it (the
calls' inputs and output cotangents). That is exact when, and only when, each parameter
leaf reaches the loss through those calls alone, and each call's input carries the
example axis where the plan says so. `prove` shows both from the jaxpr of loss_fn, traced
once (abstractly, at plan time: nothing runs per step) with every layer call that owns
parameters replaced by an opaque primitive `layer_call_p`(x, *params), and returns the
leaves it cannot show exact, each with its reason (the others are exact whatever those do:
a leaf's statistics read only its own calls' inputs and output cotangents). Refused:
  - a leaf used otherwise than as a `layer_call_p` parameter operand, through views, into
    `jax.jit` and remat bodies and, sliced, into scan bodies as xs (`_walk`, `lifted`: a raw
    matmul, a penalty, a scan constant or carry, cond / custom_vjp);
  - a layer call under `jax.vmap` (its leaves), or differentiated inside loss_fn (the model);
  - a call the plan takes as shared across the batch (input without an example axis: a
    position table on arange(T)) whose input depends on the batch, or whose output is used
    otherwise than broadcast against the example axis as a new leading axis
    (`_SharedUses`), so that surgery's explicit broadcast to B×... changes nothing.
A model it cannot read at all raises `Unsupported` (`sites.unsupported`).
"""

from __future__ import annotations

import itertools

import jax
import jax.extend.core as jcore
from jax.interpreters import ad, batching

from pergrad.stats.surgery import frontends, lifted


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


def _abstract(x, *params, shape, dtype, **_):
  del x, params
  return jax.core.ShapedArray(shape, dtype)


# (index, leaves, reason) of the calls refused while tracing (under jax.vmap), per `prove`.
_TRACE_REFUSALS: list = []


def _under_vmap(args, dims, *, name, leaves, shape, **params):
  """Records the refusal of the call's leaves and stands in for its batched output."""
  _TRACE_REFUSALS.append((leaves, f"its layer call ({name}) is inside jax.vmap (a "
                                  "per-example model vmapped over the batch); call the model "
                                  "on the batch"))
  n = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
  moved = [a if d is None else jax.numpy.moveaxis(a, d, 0) for a, d in zip(args, dims,
                                                                            strict=True)]
  out = layer_call_p.bind(*moved, name=name, leaves=leaves, shape=(n,) + tuple(shape),
                          **params)
  return out, 0


def _differentiated(primals, tangents, *, name, leaves, **_):
  raise unsupported(f"'{leaves[0]}': its layer call ({name}) is differentiated inside loss_fn")


layer_call_p.def_abstract_eval(_abstract)
batching.primitive_batchers[layer_call_p] = _under_vmap
ad.primitive_jvps[layer_call_p] = _differentiated


def prove(loss_fn, params, batch, keys, paths, outs, shared, keys_of) -> tuple[dict, dict,
                                                                                dict]:
  """({leaf path: reason} of the leaves surgery cannot show exact for loss_fn (module
  docstring), {}: every leaf is exact; {lifted call number: {role: (leaf path, depth)}} of
  the lifted calls (`lifted.lifts`) whose parameters are exactly leaves sliced `depth`
  times by scans; {lifted call number: the primitives around it, outermost first}). Raises
  `Unsupported` for a model it cannot read.

  Args:
    keys, paths: every parameter leaf's key and "a/b" path, in tree order.
    outs: (shape, dtype) of each layer call the plan counts, in call order, at this batch.
    shared: the indices of the calls whose input the plan takes as shared across the batch.
    keys_of: (LayerCall, {id(leaf): key}) -> {role: key}, {} for a call the plan does not
      count (its parameters are not all leaves of params: a transformed copy, a slice).
  """
  path_of = dict(zip(keys, paths, strict=True))
  n_leaves = len(keys)

  def run(p, b):
    ids = {id(v): k for k, v in zip(keys, jax.tree.leaves(p), strict=True)}
    count, serials = itertools.count(), itertools.count()

    def handler(call):
      roles = [r for r, v in call.params.items()  # constants of loss_fn: no site
               if v is not None and (id(v) in ids or isinstance(v, jax.core.Tracer))]
      if not roles:
        return call.run()
      counted = bool(keys_of(call, ids))
      i = next(count) if counted else -1
      j = next(serials) if not counted and lifted.lifts(call, ids) else -1
      if counted:
        shape, dtype = outs[i]
      else:
        out = jax.eval_shape(call.run)
        shape, dtype = out.shape, out.dtype
      leaves = tuple(path_of.get(ids.get(id(call.params[r])), f"{call.name} {r}") for r in roles)
      return layer_call_p.bind(call.x, *(call.params[r] for r in roles), index=i, lifted=j,
                               roles=tuple(roles), name=call.name, leaves=leaves,
                               shape=shape, dtype=dtype)

    with frontends.route(handler):
      return loss_fn(p, b)

  _TRACE_REFUSALS.clear()
  try:
    closed = jax.make_jaxpr(run)(params, batch)
    traced = list(_TRACE_REFUSALS)
  finally:
    _TRACE_REFUSALS.clear()
  invars = closed.jaxpr.invars
  leaf = {v: paths[i] for i, v in enumerate(invars[:n_leaves])}
  dep = set(invars[n_leaves:])
  refused: dict[str, str] = {}
  for leaves, reason in traced:
    for name in leaves:
      refused.setdefault(name, reason)
  calls: dict[int, tuple] = {}
  lift = {"sliced": {v: (p, 0) for v, p in leaf.items()}, "calls": {}, "inside": {},
          "stack": []}
  _walk(closed.jaxpr, leaf, dep, calls, refused, lift)
  B = next(x.shape[0] for x in jax.tree.leaves(batch) if x.ndim)
  walk = _SharedUses(set(shared), calls, dep, refused, B)
  walk(closed.jaxpr, {})
  for i in shared:
    fed, leaves, name = calls.get(i, (False, (), ""))
    if fed:
      for n in leaves:
        refused.setdefault(n, f"its layer call ({name}) has an input without an example axis "
                              "that depends on the batch (mixes examples, or is inside a "
                              "per-example transform)")
  return refused, lift["calls"], lift["inside"]


def _vars(vs):
  return [v for v in vs if isinstance(v, jcore.Var)]


def _walk(jaxpr, leaf: dict, dep: set, calls: dict, refused: dict, lift: dict) -> None:
  """Follows every leaf's value through `jaxpr` (module docstring); fills `dep` (the vars
  that depend on the batch), calls[call index] = (whether the call's input depends on the
  batch, its leaves, its name), refused[leaf path] = the first reason, and lift["calls"]
  (`prove`'s second result) from lift["sliced"] = {var: (leaf path, depth)}: the vars that
  are exactly a leaf sliced `depth` times along its leading axes.

  Every use of a parameter leaf's value must be a `layer_call_p` operand in a parameter
  slot, through views (reshape, transpose, squeeze, expand_dims, dtype casts, copies:
  `VIEWS`), into `jax.jit` and remat bodies, and into scan bodies as xs (sliced: `_scan`);
  any other use (a raw matmul `x @ W.T`, a penalty ‖W‖² in the loss, the input of a layer,
  a scan constant or carry, an operand of cond / custom_vjp, where the plan would see one
  call for many) refuses the leaf, naming the use."""
  sliced = lift["sliced"]
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    ins = _vars(eqn.invars)
    if eqn.primitive is layer_call_p:
      x, i = eqn.invars[0], eqn.params["index"]
      if isinstance(x, jcore.Var) and x in leaf:
        refused.setdefault(leaf[x], f"it is the input of a layer call ({eqn.params['name']}), "
                                    "not one of its parameters")
      got = [sliced.get(v) if isinstance(v, jcore.Var) else None for v in eqn.invars[1:]]
      if i < 0 and eqn.params["lifted"] >= 0 and all(got):
        lift["calls"][eqn.params["lifted"]] = dict(zip(eqn.params["roles"], got, strict=True))
        lift["inside"][eqn.params["lifted"]] = tuple(lift["stack"])
      elif i < 0:
        for v in eqn.invars[1:]:
          if isinstance(v, jcore.Var) and v in leaf:
            refused.setdefault(leaf[v], f"its {eqn.params['name']} call gets it as a traced "
                                        "argument or a transformed copy, not a leaf of params "
                                        "(pass each parameter array as it is in params)")
      calls[i] = (isinstance(x, jcore.Var) and x in dep, eqn.params["leaves"],
                  eqn.params["name"])
    elif name == lifted.SCAN:
      lift["stack"].append(name)
      _scan(eqn, leaf, dep, calls, refused, lift)
      lift["stack"].pop()
      continue
    elif name in JIT or name in lifted.REMAT:
      inner = eqn.params["jaxpr"]
      inner = getattr(inner, "jaxpr", inner)
      inner_leaf, inner_dep = _enter(eqn.invars, inner.invars, leaf, dep, sliced)
      lift["stack"].append(name)
      _walk(inner, inner_leaf, inner_dep, calls, refused, lift)
      lift["stack"].pop()
      _leave(inner.outvars, eqn.outvars, inner_leaf, inner_dep, leaf, dep, sliced)
      continue
    elif name in VIEWS and ins and ins[0] in leaf:
      leaf[eqn.outvars[0]] = leaf[ins[0]]
    else:
      for v in ins:
        if v in leaf:
          refused.setdefault(leaf[v], f"it reaches the loss outside its layer calls (used by "
                                      f"{_what(eqn)}), so its per-example gradient is not the "
                                      "layer's")
    if any(v in dep for v in ins):
      dep.update(eqn.outvars)


def _enter(outer, inner, leaf, dep, sliced, shift=None):
  """(leaf, dep) of a sub-jaxpr's invars from its operands; `sliced` follows, one level
  deeper for the operands whose index is in `shift` (a scan's xs)."""
  inner_leaf, inner_dep = {}, set()
  for k, (ov, iv) in enumerate(zip(outer, inner, strict=True)):
    if not isinstance(ov, jcore.Var):
      continue
    if ov in dep:
      inner_dep.add(iv)
    if ov in leaf:
      inner_leaf[iv] = leaf[ov]
    if ov in sliced and (shift is None or k in shift):
      path, depth = sliced[ov]
      sliced[iv] = (path, depth + (shift is not None))
  return inner_leaf, inner_dep


def _leave(inner, outer, inner_leaf, inner_dep, leaf, dep, sliced, carry=None):
  """The outputs of a sub-jaxpr back to its equation's outvars; for a scan (`carry`: its
  number of carries) a slice stacked again as ys is one level shallower."""
  for k, (iv, ov) in enumerate(zip(inner, outer, strict=True)):
    if not isinstance(iv, jcore.Var):
      continue
    if iv in inner_dep:
      dep.add(ov)
    if iv in inner_leaf:
      leaf[ov] = inner_leaf[iv]
    if iv in sliced and carry is None:
      sliced[ov] = sliced[iv]
    elif iv in sliced and k >= carry and sliced[iv][1] > 0:
      sliced[ov] = (sliced[iv][0], sliced[iv][1] - 1)


def _scan(eqn, leaf, dep, calls, refused, lift) -> None:
  """A scan equation: a leaf enters its body only as xs, exactly (each iteration's layer
  call then sees one slice W[l]: `lifted`); as a constant or carry, or a view of it as
  xs, it is refused (one layer call for every iteration: weights shared across layers)."""
  P = eqn.params
  nc, nk = P["num_consts"], P["num_carry"]
  body = P["jaxpr"].jaxpr
  sliced = lift["sliced"]
  for k, v in enumerate(eqn.invars):
    if isinstance(v, jcore.Var) and v in leaf and (k < nc + nk or v not in sliced):
      refused.setdefault(leaf[v], "it enters jax.lax.scan (nn.scan, nnx.scan) as a loop "
                                  "constant or carry, or reshaped: one layer call for every "
                                  "iteration (weights shared across layers); scan over the "
                                  "stacked leaf as it is in params, leading axis the layers")
  inner_leaf, inner_dep = _enter(eqn.invars, body.invars, leaf, dep, sliced,
                                 shift=set(range(nc + nk, len(eqn.invars))))
  while True:  # the carry depends on the batch once any iteration's output does
    _walk(body, inner_leaf, inner_dep, calls, refused, lift)
    more = {body.invars[nc + k] for k, v in enumerate(body.outvars[:nk])
            if isinstance(v, jcore.Var) and v in inner_dep} - inner_dep
    if not more:
      break
    inner_dep |= more
  for v in body.outvars[:nk]:
    if isinstance(v, jcore.Var) and v in inner_leaf:
      refused.setdefault(inner_leaf[v], "it is carried out of jax.lax.scan")
  _leave(body.outvars, eqn.outvars, inner_leaf, inner_dep, leaf, dep, sliced, nk)


# Elementwise operations through which a shared call's output, promoted by one leading
# axis, meets the batch: y[None] + x_B... is what surgery's broadcast to B×... computes.
ELEMENTWISE = frozenset({"add", "sub", "mul", "div", "max", "min", "select_n", "pow",
                         "add_any"})


class _SharedUses:
  """Refuses the leaves of a shared call (input without an example axis) whose output is
  used otherwise than broadcast against the example axis as a new leading axis: by a
  `broadcast_in_dim` (or reshape) to (1 | B, *y.shape), whose result only meets batch
  values in elementwise operations of leading size B (module docstring); any other use of
  its output (a slice of an ALiBi slope table on arange(H), a transpose of a [T, T, H] bias
  table) refuses its leaves."""

  def __init__(self, shared: set, calls: dict, dep: set, refused: dict, B: int):
    self.shared, self.calls, self.dep, self.refused, self.B = shared, calls, dep, refused, B

  def refuse(self, i: int, use: str) -> None:
    _, leaves, name = self.calls.get(i, (False, (), ""))
    for n in leaves:
      self.refused.setdefault(n, f"its layer call ({name}) has an input without an example "
                                 f"axis and its output is used by {use}, not broadcast "
                                 "against the batch, so surgery cannot give it the example axis")

  def __call__(self, jaxpr, taint: dict) -> dict:
    """taint: var -> (call index, "out" | "promoted"); returns the outvars' taints."""
    for eqn in jaxpr.eqns:
      name = eqn.primitive.name
      if eqn.primitive is layer_call_p and eqn.params["index"] in self.shared:
        taint[eqn.outvars[0]] = (eqn.params["index"], "out")
      hits = [(v, taint[v]) for v in _vars(eqn.invars) if v in taint]
      if not hits:
        continue
      if name in JIT:
        inner = eqn.params["jaxpr"].jaxpr
        inner_taint = {iv: taint[ov] for ov, iv in zip(eqn.invars, inner.invars, strict=True)
                       if isinstance(ov, jcore.Var) and ov in taint}
        out = self(inner, inner_taint)
        for iv, ov in zip(inner.outvars, eqn.outvars, strict=True):
          if isinstance(iv, jcore.Var) and iv in out:
            taint[ov] = out[iv]
        continue
      for v, (i, state) in hits:
        self._use(eqn, v, i, state, taint)
    return {v: taint[v] for v in _vars(jaxpr.outvars) if v in taint}

  def _use(self, eqn, v, i: int, state: str, taint: dict) -> None:
    name, out = eqn.primitive.name, eqn.outvars[0]
    y_shape = tuple(v.aval.shape)
    if state == "out" and name in ("broadcast_in_dim", "reshape"):
      shape = tuple(out.aval.shape)
      dims = eqn.params.get("broadcast_dimensions", tuple(range(1, len(y_shape) + 1)))
      if shape[1:] == y_shape and tuple(dims) == tuple(range(1, len(y_shape) + 1)):
        taint[out] = (i, "promoted")
        return
    if state == "promoted" and name in ELEMENTWISE:
      others = [u for u in _vars(eqn.invars) if u is not v]
      if any(u in self.dep for u in others) and all(
          tuple(o.aval.shape) == (self.B,) + y_shape[1:] for o in eqn.outvars):
        return
    self.refuse(i, _what(eqn))


def _what(eqn) -> str:
  """The offending use, in words."""
  name = eqn.primitive.name
  words = {"dot_general": "a matmul", "scan": "jax.lax.scan (nn.scan, nnx.scan)",
           "checkpoint": "jax.checkpoint / remat", "remat": "jax.checkpoint / remat",
           "remat2": "jax.checkpoint / remat",
           "while": "a while loop", "cond": "jax.lax.cond",
           "custom_vjp_call": "a custom_vjp function", "custom_jvp_call": "a custom_jvp function"}
  return f"{name}: {words[name]}" if name in words else name
