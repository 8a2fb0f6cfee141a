"""The precondition of every per-example statistic: loss_b depends on example b alone.

A model that mixes examples (h - h.mean(0), a BatchNorm in training mode, attention or
pooling over the batch axis, a loss normalised by a batch statistic, a sort or cumsum
over the batch) has per-example losses ℓ_b(θ; whole batch) whose gradients no backend
computes: vmap and the loop run each example as a batch of one (other statistics),
surgery reads layer inputs and cotangents that carry cross-example terms. `check` refuses
such a model, on every backend, before any statistic is computed.

What `check` shows, once per loss_fn and shapes (`sites.memo`), at B' = min(B, 4)
examples (the first B' of the batch and the params where concrete, seeded random
stand-ins of their shapes where traced): for every j, ℓ_j is bit for bit the same when
every OTHER example changes, in two rounds (float leaves: fresh random values; integer
leaves: to the other end of their range [min(0, least id in the batch), greatest], then
up by a random step within it, so that a count over the batch changes too; bool leaves:
negated). The batch and its 2B' variants run through one compiled program
(`jax.lax.map`: one executable, so a separable loss_fn computes ℓ_j of bit-identical
inputs identically and always passes). It is a value dependence, so mixing through
integer inputs (a loss normalised by the batch's token count) or under `stop_gradient`
is seen too. Its cost: one compile and 2B'+1 forward passes of B' examples, once.
Caveats: a dependence that is inactive at the point checked (a branch no example takes
there) is not seen, and a coincidental equality with random values is measure-zero; the
executable is assumed deterministic (XLA:CPU is; on GPU, XLA's reductions are,
scatter-adds may not be: a false refusal, never a silent acceptance); an integer leaf
that holds only zeros has no range to vary within and is not varied; a model whose
mixing needs more than 4 examples to show is not seen at B' = 4.

On a refusal, `culprit` replays the jaxpr eagerly on the batch and the failing variant
and names the first operation whose inputs agree on example j and whose output does not
(its primitive, user line and name stack: where the mixing is).
"""

from __future__ import annotations

import linecache
import os

import flax
import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np

from pergrad.stats.surgery.proof import JIT, Unsupported
from pergrad.stats.surgery.sites import memo

N_EXAMPLES = 4  # B': the examples the check uses
FIX = ("compute batch statistics outside the per-example loss (e.g. the mean over the batch "
       "in the aggregated loss), or use per-example normalization (LayerNorm, RMSNorm, or "
       "BatchNorm with use_running_average=True)")


def mixes(reason: str) -> Unsupported:
  """The refusal, one line: what mixes examples, why no backend is exact, the fix."""
  err = Unsupported(f"pergrad.stats: the per-example losses are not separable ({reason}), so "
                    f"no backend computes their per-example gradients; {FIX}.")
  err.reason = reason
  return err


@memo
def check(loss_fn, params, batch) -> None:
  """Raises `mixes(...)` unless loss_fn's per-example losses are separable (module
  docstring). B = 1 passes: one example cannot be mixed with another. A loss_fn that
  cannot run on B' < B examples is checked at B."""
  B = next(x.shape[0] for x in jax.tree.leaves(batch) if np.ndim(x))
  if B == 1:
    return
  with jax.ensure_compile_time_eval():
    try:
      _check_at(loss_fn, params, batch, min(B, N_EXAMPLES))
    except Unsupported:
      raise
    except Exception:  # noqa: BLE001 - a model bound to its batch size: check at B
      if B <= N_EXAMPLES:
        raise
      _check_at(loss_fn, params, batch, B)


def _check_at(loss_fn, params, batch, n: int) -> None:
  key = jax.random.PRNGKey(0)
  p = _stand_in(params, None, key)
  b = _stand_in(batch, n, jax.random.fold_in(key, 1))
  ranges = [(min(int(x.min()), 0), int(x.max())) if _concrete(x) and x.size else (0, 1)
            for x in jax.tree.leaves(batch)]
  changed = [(j, _others_changed(b, ranges, j, n, r, jax.random.fold_in(key, 2 + r * n + j)))
             for r in (0, 1) for j in range(n)]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), b, *(v for _, v in changed))
  losses = np.asarray(jax.jit(lambda p, bs: jax.lax.map(lambda x: loss_fn(p, x), bs))(
      p, stacked))
  for i, (j, variant) in enumerate(changed):
    if losses[0, j].tobytes() != losses[1 + i, j].tobytes():
      where = culprit(loss_fn, p, b, variant, j, n)
      raise mixes(f"example {j}'s loss changes when the other examples change"
                  + (f": first at {where}" if where else ""))


def _concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _stand_in(tree, n, key):
  """tree's leaves as concrete arrays (the first n examples where n is given): the values
  where concrete, else random ones of the same shape and dtype (floats N(0, 1/fan-in),
  integers in {0, 1}, bools random)."""
  leaves, treedef = jax.tree.flatten(tree)
  out = []
  for i, x in enumerate(leaves):
    shape = tuple(np.shape(x)) if n is None else (n,) + tuple(np.shape(x))[1:]
    if _concrete(x):
      out.append(jnp.asarray(x) if n is None else jnp.asarray(x)[:n])
      continue
    k = jax.random.fold_in(key, i)
    dtype = jnp.dtype(x.dtype)
    if jnp.issubdtype(dtype, jnp.floating):
      fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
      out.append((jax.random.normal(k, shape) / np.sqrt(fan_in)).astype(dtype))
    elif jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
      out.append(jax.random.bernoulli(k, 0.5, shape).astype(dtype))
    else:
      out.append(jnp.zeros(shape, dtype))
  return jax.tree.unflatten(treedef, out)


def _others_changed(batch, ranges, j: int, n: int, round_: int, key):
  """batch with every example but j changed (module docstring): round 0 takes float leaves
  to fresh values, integer leaves to the other end of their range (lo <-> hi, the rest to
  lo), bools negated; round 1 takes floats to other fresh values, integers up by a random
  step within their range (each value changes). ranges: each leaf's (lo, hi): [min(0,
  its least value in the whole batch), its greatest]; (0, 1) for a traced leaf."""
  leaves, treedef = jax.tree.flatten(batch)
  keep = (jnp.arange(n) == j)
  out = []
  for i, (x, (lo, hi)) in enumerate(zip(leaves, ranges, strict=True)):
    k = jax.random.fold_in(key, i)
    if jnp.issubdtype(x.dtype, jnp.floating):
      new = jax.random.normal(k, x.shape).astype(x.dtype)
    elif jnp.issubdtype(x.dtype, jnp.integer):
      step = jax.random.randint(k, x.shape, 1, jnp.maximum(hi - lo, 1) + 1).astype(x.dtype)
      new = (jnp.where(x == lo, hi, lo) if round_ == 0 else
             lo + (x - lo + step) % jnp.maximum(hi - lo + 1, 1))
    elif x.dtype == jnp.bool_:
      new = ~x
    else:
      new = x
    out.append(jnp.where(keep.reshape((n,) + (1,) * (x.ndim - 1)), x, new))
  return jax.tree.unflatten(treedef, out)


def culprit(loss_fn, params, base, variant, j: int, n: int) -> str:
  """The first operation of loss_fn whose inputs agree on example j between `base` and
  `variant` and whose output does not ("" if none is found), in words."""
  try:
    closed = jax.make_jaxpr(loss_fn)(params, base)
    flat = lambda b: jax.tree.leaves((params, b))
    return _first_mixing(closed.jaxpr, closed.consts, flat(base), flat(variant), j, n) or ""
  except Exception:  # noqa: BLE001 - the location is a hint; the refusal stands without it
    return ""


def _same(a, b, j: int, n: int) -> bool:
  """a and b agree on example j (along their first axis of size n; else everywhere)."""
  a, b = np.asarray(a), np.asarray(b)
  ax = next((i for i, d in enumerate(a.shape) if d == n), None)
  if ax is not None:
    a, b = np.take(a, j, ax), np.take(b, j, ax)
  return a.tobytes() == b.tobytes()


def _first_mixing(jaxpr, consts, ins_base, ins_var, j: int, n: int) -> str | None:
  env: dict = {}
  read = lambda v, k: v.val if isinstance(v, jcore.Literal) else env[v][k]
  for v, c in zip(jaxpr.constvars, consts, strict=True):
    env[v] = (c, c)
  for v, xb, xv in zip(jaxpr.invars, ins_base, ins_var, strict=True):
    env[v] = (xb, xv)
  for eqn in jaxpr.eqns:
    params = eqn.primitive.get_bind_params(eqn.params)
    ins = [[read(v, k) for v in eqn.invars] for k in (0, 1)]
    outs = [eqn.primitive.bind(*xs, **params) for xs in ins]
    if not eqn.primitive.multiple_results:
      outs = [[o] for o in outs]
    if (all(_same(a, b, j, n) for a, b in zip(*ins, strict=True))
        and not all(_same(a, b, j, n) for a, b in zip(*outs, strict=True))):
      if eqn.primitive.name in JIT:
        inner = eqn.params["jaxpr"]
        found = _first_mixing(inner.jaxpr, inner.consts, *ins, j, n)
        if found:
          return found
      return _words(eqn)
    for v, ob, ov in zip(eqn.outvars, *outs, strict=True):
      env[v] = (ob, ov)
  return None


_LIBS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, flax))
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # pergrad/


def _words(eqn) -> str:
  """'<primitive> at <file>:<line> `<source>` (in <name stack>)' of one jaxpr equation."""
  frames = getattr(eqn.source_info.traceback, "frames", []) or []
  user = [f for f in frames if not f.file_name.startswith(_LIBS + (_HERE + "stats" + os.sep,))]
  text = eqn.primitive.name
  if user:
    f = user[0]
    line = linecache.getline(f.file_name, f.line_num).strip()
    text += f" at {os.path.basename(f.file_name)}:{f.line_num}" + (f" `{line}`" if line else "")
  stack = str(eqn.source_info.name_stack)
  return text + (f" (in {stack})" if stack else "")
