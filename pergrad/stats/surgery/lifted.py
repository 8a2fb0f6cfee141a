"""Surgery through `jax.lax.scan` (Linen `nn.scan`, `nnx.scan`) and `jax.checkpoint` (remat).

A layer call inside a scanned or rematerialised body sees its parameters as traced values
of the body (a slice W[l] of a stacked leaf W of shape [L, ...], or the leaf passed as an
argument), not as the leaves of params: it is a "lifted" call (`lifts`), numbered in call
order (the same in every trace of the model). `proof` follows each leaf into scan bodies
(its xs slices, depth + 1) and remat bodies and names the leaf each lifted call's
parameters are exactly; its tap takes zero-valued placeholder probes (`placeholder`) of
the per-slice shape. `value_and_grad` traces the forward pass to a jaxpr and evaluates it
again (`evaluate`) with every placeholder an input: stacked [L, ...] zeros that each scan
slices as extra xs, passed into remat bodies as arguments. The cotangent of a stacked
placeholder is then the layer's statistics per slice, [L, *slice], which is the stacked
leaf's coordinate statistic (per-example ones [L, B] are summed over the slices: a
per-example gradient of W is [B, L, ...], its statistics sum over every coordinate). No
global state is patched: the scan and remat primitives are read from the jaxpr.
"""

from __future__ import annotations

import jax
import jax.extend.core as jcore
import jax.numpy as jnp

F32 = jnp.float32
SCAN, REMAT = "scan", frozenset({"remat2", "checkpoint", "remat"})
INLINE = frozenset({"pjit", "jit", "closed_call", "core_call"})

placeholder_p = jcore.Primitive("pergrad_probe_placeholder")
placeholder_p.def_abstract_eval(lambda *, tag, shape: jax.core.ShapedArray(shape, F32))
placeholder_p.def_impl(lambda *, tag, shape: jnp.zeros(shape, F32))


def lifts(call, ids: dict) -> bool:
  """Whether a `LayerCall`'s parameters are all traced values that are not leaves of
  params as passed (a lifted call: inside a scan or remat body, or a jit'd function)."""
  given = [v for v in call.params.values() if v is not None]
  return bool(given) and all(isinstance(v, jax.core.Tracer) and id(v) not in ids
                             for v in given)


def resolved(lifts, lifted_keys: dict, key_of: dict, inside: dict) -> list:
  """The records of the lifted calls the proof resolved (`proof.prove`), with their leaves'
  keys and the primitives around them; a lifted call it did not see (a trace the model
  discards) has no site."""
  out = []
  for c1, c2 in lifts:
    got = lifted_keys.get(c1["lifted"])
    if got:
      keys = {r: key_of[path] for r, (path, _) in got.items()}
      where = inside.get(c1["lifted"], ())
      out.append(({**c1, "keys": keys, "inside": where}, {**c2, "keys": keys, "inside": where}))
  return out


# How a refusal names each lifting primitive.
WORDS = {SCAN: "jax.lax.scan (nn.scan, nnx.scan)", "jit": "jax.jit", "pjit": "jax.jit",
         **{r: "jax.checkpoint (remat)" for r in REMAT}}


def inside(site) -> str:
  """The primitives around a lifted call, in words, outermost first ("a / b")."""
  words = []
  for name in site.inside:
    w = WORDS.get(name, name)
    if w not in words:
      words.append(w)
  return " / ".join(words) or "a lifted transform"


def refusal(site, request) -> str:
  """Why a lifted call's leaves are refused, or "": shared across the batch, or
  per-example clipping (its two passes do not run through scans)."""
  if site.lifted < 0:
    return ""
  if site.in_axis is None:
    return f"its layer call inside {inside(site)} has an input without an example axis"
  if request.per_example_clip is not None:
    return f"per-example clipping of a layer call inside {inside(site)}"
  return ""


def placeholder(tag, shape) -> jax.Array:
  """A zero probe of `shape` that `value_and_grad` makes an input (its cotangent: tag)."""
  return placeholder_p.bind(tag=tag, shape=tuple(shape))


def _closed(j):
  return (j.jaxpr, j.consts) if hasattr(j, "consts") else (j, ())


def _where(jaxpr, lengths: tuple, out: dict) -> dict:
  """{tag: (enclosing scan lengths, per-slice shape)} of the placeholders in jaxpr."""
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if eqn.primitive is placeholder_p:
      out[eqn.params["tag"]] = (lengths, eqn.params["shape"])
    elif name == SCAN:
      _where(eqn.params["jaxpr"].jaxpr, lengths + (eqn.params["length"],), out)
    elif name in REMAT or name in INLINE:
      _where(_closed(eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")))[0], lengths, out)
    else:
      for sub in jcore.jaxprs_in_params(eqn.params):
        if _where(sub, lengths, {}):
          raise RuntimeError(f"surgery: a layer statistic inside {name} (not a scan, remat "
                             "or jit): the proof should have refused it")
  return out


def evaluate(jaxpr, consts, args, probes: dict, edit=None) -> list:
  """jaxpr's outputs on args, each placeholder taking probes[tag] (scan: sliced as xs;
  remat: passed as arguments; jit: inlined), every other equation bound as it is, the
  operands of the i-th (top-level) one replaced by edit(i, operands) where edit is given."""
  env = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]
  env.update(zip(jaxpr.constvars, consts, strict=True))
  env.update(zip(jaxpr.invars, args, strict=True))
  for i, eqn in enumerate(jaxpr.eqns):
    ins, name = [read(v) for v in eqn.invars], eqn.primitive.name
    ins = ins if edit is None else edit(i, ins)
    inner = _inner(eqn)
    if eqn.primitive is placeholder_p:
      outs = [probes[eqn.params["tag"]]]
    elif inner and name == SCAN:
      outs = _scan(eqn, ins, {t: probes[t] for t in inner})
    elif inner and name in REMAT:
      tags = sorted(inner, key=repr)
      body = eqn.params["jaxpr"]
      fn = lambda a, z, body=body, tags=tags: evaluate(*_closed(body), a,
                                                       dict(zip(tags, z, strict=True)))
      outs = jax.checkpoint(fn, prevent_cse=eqn.params["prevent_cse"],
                            policy=eqn.params["policy"])(ins, [probes[t] for t in tags])
    elif inner:
      outs = evaluate(*_closed(eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))), ins,
                      probes)
    else:
      outs = eqn.primitive.bind(*ins, **eqn.primitive.get_bind_params(eqn.params))
      outs = outs if eqn.primitive.multiple_results else [outs]
    for v, x in zip(eqn.outvars, outs, strict=True):
      if not isinstance(v, jcore.DropVar):
        env[v] = x
  return [read(v) for v in jaxpr.outvars]


def _inner(eqn) -> dict:
  """The placeholders inside one equation's sub-jaxprs ({} for a primitive without)."""
  found: dict = {}
  if eqn.primitive is not placeholder_p:
    for sub in jcore.jaxprs_in_params(eqn.params):
      _where(sub, (), found)
  return found


def _scan(eqn, ins, probes: dict) -> list:
  """One scan equation with its body evaluated by `evaluate`, placeholders as extra xs."""
  P = eqn.params
  nc, nk = P["num_consts"], P["num_carry"]
  body, body_consts = _closed(P["jaxpr"])
  consts, init, xs = ins[:nc], ins[nc:nc + nk], ins[nc + nk:]
  tags = sorted(probes, key=repr)

  def step(carry, sl):
    x, z = sl
    outs = evaluate(body, body_consts, [*consts, *carry, *x], dict(zip(tags, z, strict=True)))
    return outs[:nk], outs[nk:]

  carry, ys = jax.lax.scan(step, list(init), (list(xs), [probes[t] for t in tags]),
                           length=P["length"], reverse=P["reverse"], unroll=P["unroll"],
                           _split_transpose=P.get("_split_transpose", False))
  return [*carry, *ys]


def value_and_grad(closed, params, probes, batch, extra=None, edit=None):
  """(loss, ∇params, ∇probes, {tag: ∇ of its stacked placeholder}, ∇extra) of the closed
  jaxpr of objective(params, probes, batch), whose lifted layer calls' probes are
  placeholders (module docstring), evaluated with edit(i, operands, extra) (`evaluate`)."""
  where = _where(closed.jaxpr, (), {})
  zeros = {t: jnp.zeros(lengths + shape, F32) for t, (lengths, shape) in where.items()}

  def flat(p, pr, z, x):
    ed = None if edit is None else (lambda i, ins: edit(i, ins, x))
    return evaluate(closed.jaxpr, closed.consts, jax.tree.leaves((p, pr, batch)), z, ed)[0]

  loss, (g, pc, zc, xc) = jax.value_and_grad(flat, argnums=(0, 1, 2, 3))(
      params, probes, zeros, extra if extra is not None else {})
  return loss, g, pc, zc, xc


def merged(probe_cts: dict, lifted_cts: dict, sites, example_keys, B: int, shapes: dict):
  """probe_cts with each lifted site's leaves' statistics from its placeholders' cotangents:
  a coordinate statistic [L, *slice] as the stacked leaf's, a per-example one [L, B]
  summed over the slices."""
  out = {k: dict(v) for k, v in probe_cts.items()}
  for s in sites:
    for role, key in zip(s.leaves, s.keys, strict=True):
      for k in out:
        ct = lifted_cts.get((s.lifted, k, role))
        if ct is None:
          continue
        ct = ct.reshape(-1, B).sum(0) if k in example_keys else ct
        want = (B,) if k in example_keys else shapes[key]
        if tuple(ct.shape) != tuple(want):
          raise RuntimeError(f"surgery: the statistics of '{'/'.join(key)}' through scan have "
                             f"shape {ct.shape}, not {want}")
        out[k][key] = ct
  return out
