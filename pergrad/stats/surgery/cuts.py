"""The per-leaf fallback's cheap route: a refused leaf's per-example gradient read from
surgery's own batched backward pass, through the example-free slice of the leaf.

A refused leaf θ reaches the batched computation through F, the equations of the surgery
objective's jaxpr (top level) that depend on θ and on no batch input, probe or placeholder.
Where every value v of F that meets the batch is an operand of an elementwise arithmetic
equation (`BROADCASTS`) that broadcasts it against the example axis, v of rank 0 or of size
1 on that axis (the axis: the one output axis whose size follows the batch, from traces at
B and B+1), `find` cuts there: `edit` gives that equation v_B, v broadcast to size B on the
axis, through an identity tap whose zero probe receives ∂L/∂v_B, L = (1/B) Σ_b ℓ_b. Row b
is ∂ℓ_b/∂v / B (the equation reads row b of v_B for row b of its output alone, and the
model is separable: `separable.check`), so g_b(θ) = vjp(F)(B · row b), vmapped over b
(`per_example`): B × |F| instead of B × the network. A leaf with any other use of F's
values (a matmul or a jit with batch values, a value with the example axis made inside F,
an output of the loss) is not cut: `surgery_vmap_stats` keeps the whole-loss vmap for it.
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.extend.core as jcore
import jax.numpy as jnp

from pergrad.stats.surgery import lifted

F32 = jnp.float32
# Elementwise arithmetic that broadcasts an operand's size-1 axes (or a scalar) itself.
BROADCASTS = frozenset({"add", "sub", "mul", "div", "max", "min", "pow", "atan2", "rem"})


@dataclasses.dataclass(frozen=True)
class Cuts:
  """The cut leaves and where their slice meets the batch.

  Attributes:
    leaves: indices of the cut leaves among the params' leaves (tree order).
    ops: (equation index, operand position, example axis, shape of v_B) of each cut.
    eqns: indices of the equations that compute the cut operands from the params.
  """

  leaves: tuple[int, ...] = ()
  ops: tuple[tuple[int, int, int, tuple[int, ...]], ...] = ()
  eqns: tuple[int, ...] = ()


def _vars(vs):
  return [v for v in vs if isinstance(v, jcore.Var)]


def _grown(jaxpr, jaxpr1) -> dict | None:
  """{var: the axes whose size differs between the traces at B and B+1} (None: the two
  traces differ otherwise)."""
  if len(jaxpr.eqns) != len(jaxpr1.eqns):
    return None
  pairs = list(zip(jaxpr.invars, jaxpr1.invars, strict=True))
  for e, e1 in zip(jaxpr.eqns, jaxpr1.eqns, strict=True):
    if e.primitive.name != e1.primitive.name or len(e.outvars) != len(e1.outvars):
      return None
    pairs += zip(e.outvars, e1.outvars, strict=True)
  out = {}
  for v, v1 in pairs:
    s, s1 = tuple(getattr(v.aval, "shape", ())), tuple(getattr(v1.aval, "shape", ()))
    if len(s) != len(s1):
      return None
    out[v] = frozenset(i for i, (a, b) in enumerate(zip(s, s1, strict=True)) if a != b)
  return out


def find(closed, closed1, n_params: int, candidates, B: int) -> Cuts:
  """The `Cuts` of the leaves `candidates` (indices among the first n_params invars) of the
  closed jaxpr of objective(params, probes, batch) at B (`closed`) and B+1 (`closed1`)."""
  jaxpr = closed.jaxpr
  grown = _grown(jaxpr, closed1.jaxpr)
  if grown is None:
    return Cuts()
  batched = set(jaxpr.invars[n_params:])
  for e in jaxpr.eqns:
    if e.primitive is lifted.placeholder_p or any(v in batched for v in _vars(e.invars)):
      batched.update(e.outvars)
  leaves, ops = [], []
  for r in candidates:
    got = _cut(jaxpr, jaxpr.invars[r], batched, grown, B)
    if got:
      leaves.append(r)
      ops += [op for op in got if op not in ops]
  if not leaves:
    return Cuts()
  need = {jaxpr.eqns[i].invars[pos] for i, pos, _, _ in ops}
  eqns = []
  for i in reversed(range(max(i for i, *_ in ops))):
    e = jaxpr.eqns[i]
    if any(v in need for v in e.outvars):
      eqns.append(i)
      need.update(_vars(e.invars))
  return Cuts(leaves=tuple(leaves), ops=tuple(sorted(ops)), eqns=tuple(reversed(eqns)))


def _cut(jaxpr, leaf, batched: set, grown: dict, B: int) -> list | None:
  """The cuts of one leaf (`find`), or None where a value of its slice meets the batch
  otherwise (or never)."""
  dep, ops = {leaf}, []
  for i, e in enumerate(jaxpr.eqns):
    hits = [pos for pos, v in enumerate(e.invars) if isinstance(v, jcore.Var) and v in dep]
    if not hits:
      continue
    if not any(v in batched for v in e.outvars):  # in the slice F
      if any(grown[v] for v in e.outvars):
        return None  # a value with the example axis made inside F
      dep.update(e.outvars)
      continue
    for pos in hits:
      v = e.invars[pos]
      if not jnp.issubdtype(v.aval.dtype, jnp.inexact):
        continue  # no gradient flows through an integer or boolean value
      op = _broadcast(e, pos, grown, B)
      if op is None:
        return None
      ops.append((i, pos) + op)
  if any(v in dep for v in _vars(jaxpr.outvars)):
    return None
  return ops or None


def _broadcast(e, pos: int, grown: dict, B: int):
  """(example axis, shape of v_B) where operand `pos` of equation e is broadcast against
  the example axis by e itself (module docstring), else None."""
  if e.primitive.name not in BROADCASTS or len(e.outvars) != 1:
    return None
  out, v = e.outvars[0], e.invars[pos]
  axes, shape, vs = grown[out], tuple(out.aval.shape), tuple(v.aval.shape)
  if len(axes) != 1:
    return None
  (a,) = axes
  if shape[a] != B or (vs and (len(vs) != len(shape) or vs[a] != 1)):
    return None
  vs = vs or (1,) * len(shape)
  return a, vs[:a] + (B,) + vs[a + 1:]


@jax.custom_vjp
def _tap(x, z):
  """x; its cotangent also goes to the zero probe z (float32)."""
  del z
  return x


_tap.defvjp(lambda x, z: (x, None), lambda _, ct: (ct, ct.astype(F32)))


def zeros(cuts: Cuts) -> list:
  """The zero probes of the cuts (float32, shaped like v_B)."""
  return [jnp.zeros(shape, F32) for *_, shape in cuts.ops]


def edit(cuts: Cuts):
  """edit(i, operands, probes) for `lifted.evaluate`: each cut operand v as v_B, tapped."""
  at = {}
  for k, (i, pos, _, shape) in enumerate(cuts.ops):
    at.setdefault(i, []).append((k, pos, shape))

  def ed(i, ins, probes):
    if i not in at:
      return ins
    ins = list(ins)
    for k, pos, shape in at[i]:
      v = jnp.reshape(ins[pos], (1,) * len(shape) if not jnp.ndim(ins[pos]) else ins[pos].shape)
      ins[pos] = _tap(jnp.broadcast_to(v, shape), probes[k])
    return ins

  return ed


def per_example(cuts: Cuts, closed, args: list, cts: list, B: int, axis: int) -> list:
  """The cut leaves' per-example gradients (example axis `axis`), from the cotangents
  `cts` of the probes and the objective's flat arguments `args` (params, probes, batch)."""
  jaxpr = closed.jaxpr
  sub = types.SimpleNamespace(constvars=jaxpr.constvars, invars=jaxpr.invars,
                              eqns=[jaxpr.eqns[i] for i in cuts.eqns],
                              outvars=[jaxpr.eqns[i].invars[pos] for i, pos, _, _ in cuts.ops])

  def slice_(thetas):
    a = list(args)
    for r, t in zip(cuts.leaves, thetas, strict=True):
      a[r] = t
    return lifted.evaluate(sub, closed.consts, a, {})

  vs, pull = jax.vjp(slice_, [args[r] for r in cuts.leaves])

  def one(rows):
    return pull([(B * row).reshape(jnp.shape(v)).astype(jnp.result_type(v))
                 for row, v in zip(rows, vs, strict=True)])[0]

  return jax.vmap(one, in_axes=([a for _, _, a, _ in cuts.ops],), out_axes=axis)(cts)
