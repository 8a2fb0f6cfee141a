"""The precondition of every per-example statistic: loss_b depends on example b alone.

A model that mixes examples (h - h.mean(0), a BatchNorm in training mode, attention or
pooling over the batch axis, a loss normalised by a batch statistic, a sort or cumsum
over the batch) has per-example losses ℓ_b(θ; whole batch) whose gradients no backend
computes: vmap and the loop run each example as a batch of one (other statistics),
surgery reads layer inputs and cotangents that carry cross-example terms. `check` refuses
such a model, on every backend, before any statistic is computed: at B' = min(B, 4)
examples, every ℓ_j must be bit for bit the same when every OTHER example changes. It is a
value dependence, so mixing through integer inputs (a loss normalised by the batch's token
count) or under `stop_gradient` is seen too; on a refusal `culprit` names the first
operation where the mixing is (its primitive, user line and name stack).

Caveats: a dependence that is inactive at the point checked (a branch no example takes
there) is not seen, nor one that needs more than 4 examples to show; a coincidental
equality with random values is measure-zero; an integer leaf that holds only zeros has no
range to vary within; the executable is assumed deterministic (XLA:CPU is; on GPU, XLA's
reductions are, scatter-adds may not be: a false refusal, never a silent acceptance).
"""

from __future__ import annotations

import linecache
import os

import flax
import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np

from pergrad.stats.surgery.memo import memo
from pergrad.stats.surgery.proof import JIT, Unsupported

N_EXAMPLES = 4  # B': the examples the check uses
# XLA:CPU options that compile the check's programs several times faster (they run a few
# forward passes of B' examples, once: their speed is moot).
FAST_CPU = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


FIX = ("compute batch statistics outside the per-example loss (e.g. the mean over the batch "
       "in the aggregated loss), or use per-example normalization (LayerNorm, RMSNorm, or "
       "BatchNorm with use_running_average=True)")


def fast_options() -> dict | None:
  return FAST_CPU if jax.default_backend() == "cpu" else None


def mixes(reason: str) -> Unsupported:
  """The refusal, one line: what mixes examples, why no backend is exact, the fix."""
  err = Unsupported(f"pergrad.stats: the per-example losses are not separable ({reason}), so "
                    f"no backend computes their per-example gradients; {FIX}.")
  err.reason = reason
  return err


@memo
def check(loss_fn, params, batch) -> None:
  """Raises `mixes(...)` unless loss_fn's per-example losses are separable (module
  docstring). B = 1 passes: one example cannot be mixed with another.

  Once per loss_fn and shapes (`memo.memo`), at B' = min(B, 4) examples (the first B' of
  the batch and the params where concrete, pseudo-random stand-ins of their shapes where
  traced): for every j, ℓ_j is bit for bit the same when every OTHER example changes, in
  two rounds (`_others_changed`: float leaves to fresh random values; integer leaves to the
  other end of their range [min(0, least id in the batch), greatest], then up by a random
  step within it, so that a count over the batch changes too; bool leaves negated). The
  batch and its 2B' variants run through one compiled program (`jax.lax.map`: one
  executable, so a separable loss_fn computes ℓ_j of bit-identical inputs identically and
  always passes). Its cost: one compile and 2B'+1 forward passes of B' examples, once."""
  at_few_examples(batch, lambda n: _check_at(loss_fn, params, batch, n),
                  "whether the per-example losses are separable: loss_fn did not run on its "
                  "own at {B} examples ({error}); per-example statistics need a loss_fn that "
                  "jax.jit can run alone on a batch")


def at_few_examples(batch, check_at, undetermined: str) -> None:
  """Runs check_at(n) at n = B' = min(B, N_EXAMPLES), else (loss_fn could not run on B'
  examples: a model bound to its batch size) at B; B = 1 passes. An `Unsupported` from
  check_at is raised as is; if loss_fn runs at neither, `Unsupported("pergrad.stats:
  undetermined " + undetermined.format(B=B, error=...))` with reason "undetermined"."""
  B = next(x.shape[0] for x in jax.tree.leaves(batch) if np.ndim(x))
  if B == 1:
    return
  for n in sorted({min(B, N_EXAMPLES), B}):
    try:
      return check_at(n)
    except Unsupported:
      raise
    except Exception as e:  # noqa: BLE001 - undetermined, refused below
      error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  err = Unsupported(f"pergrad.stats: undetermined {undetermined.format(B=B, error=error)}.")
  err.reason = "undetermined"
  raise err


def given_values(params, batch, n: int) -> tuple[list, list]:
  """The concrete leaves of params, and of batch its first n examples (traced leaves are
  left out: `stand_in` draws them)."""
  return ([x for x in jax.tree.leaves(params) if concrete(x)],
          [np.asarray(x)[:n] for x in jax.tree.leaves(batch) if concrete(x)])


def stand_ins(params, batch, p_given, b_given, n: int):
  """(params, the batch's first n examples) rebuilt from `given_values`, traced leaves
  drawn (`stand_in`)."""
  return (stand_in(params, p_given, None, seed=0), stand_in(batch, b_given, n, seed=1 << 20))


def _check_at(loss_fn, params, batch, n: int) -> None:
  given = given_values(params, batch, n)
  ranges = [(min(int(np.min(x)), 0), int(np.max(x))) if concrete(x) and np.size(x)
            else (0, 1) for x in jax.tree.leaves(batch)]
  order = [(r, j) for r in (0, 1) for j in range(n)]

  def points(p_given, b_given):  # (params, the batch and its 2n variants stacked)
    p, b = stand_ins(params, batch, p_given, b_given, n)
    changed = [_others_changed(b, ranges, j, n, r, seed=(2 + r * n + j) << 20)
               for r, j in order]
    return p, jax.tree.map(lambda *xs: jnp.stack(xs), b, *changed)

  def losses(p_given, b_given):
    p, stacked = points(p_given, b_given)
    # params rebuilt inside the map's body (tree.map): NNX Variables of that trace level,
    # which nnx.scan / nnx.remat inside the loss require
    return jax.lax.map(lambda x: loss_fn(jax.tree.map(lambda a: a, p), x), stacked)

  # lowered and run apart from any enclosing trace (compute may be called inside jax.jit)
  got = np.asarray(jax.jit(losses).lower(*given).compile(fast_options())(*given))
  for i, (_, j) in enumerate(order):
    if got[0, j].tobytes() != got[1 + i, j].tobytes():
      where = culprit(loss_fn, points, given, 1 + i, j, n)
      raise mixes(f"example {j}'s loss changes when the other examples change"
                  + (f": first at {where}" if where else ""))


def concrete(x) -> bool:
  """Whether x holds values (not a tracer, not a shape alone: `decide` reads shapes)."""
  return not isinstance(x, (jax.core.Tracer, jax.ShapeDtypeStruct))


def noise(shape, seed: int) -> jax.Array:
  """float32 values in [-1, 1) of `shape`: a hash of (index, seed) (a cheap pseudo-random
  stream that compiles in no time, unlike threefry on XLA:CPU)."""
  size = int(np.prod(shape))
  x = jax.lax.iota(jnp.uint32, size) * jnp.uint32(0x9E3779B9) + jnp.uint32(seed * 0x85EBCA6B
                                                                        % (1 << 32))
  for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B), (16, None)):
    x = x ^ (x >> shift)
    if mul is not None:
      x = x * jnp.uint32(mul)
  return ((x >> 8).astype(jnp.float32) * 2.0 ** -23 - 1.0).reshape(shape)


def stand_in(tree, given, n, seed: int):
  """tree with its concrete leaves taken from `given` (in order; the first n examples of
  the batch) and its traced ones drawn at random, same shape and dtype (floats
  uniform with variance ~1/fan-in, integers in {0, 1}, bools random; `noise`)."""
  leaves, treedef = jax.tree.flatten(tree)
  given, out = iter(given), []
  for i, x in enumerate(leaves):
    if concrete(x):
      out.append(next(given))
      continue
    shape = tuple(x.shape) if n is None else (n,) + tuple(x.shape)[1:]
    u, dtype = noise(shape, seed + i), jnp.dtype(x.dtype)
    if jnp.issubdtype(dtype, jnp.floating):
      fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
      out.append((u * np.sqrt(3.0 / fan_in)).astype(dtype))
    elif jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_:
      out.append((u > 0).astype(dtype))
    else:
      out.append(jnp.zeros(shape, dtype))
  return jax.tree.unflatten(treedef, out)


def _others_changed(batch, ranges, j: int, n: int, round_: int, seed: int):
  """batch with every example but j changed (`check`): round 0 takes float leaves
  to fresh values, integer leaves to the other end of their range (lo <-> hi, the rest to
  lo), bools negated; round 1 takes floats to other fresh values, integers up by a random
  step within their range (each value changes). ranges: each leaf's (lo, hi): [min(0,
  its least value in the whole batch), its greatest]; (0, 1) for a traced leaf."""
  leaves, treedef = jax.tree.flatten(batch)
  keep = (jnp.arange(n) == j)
  out = []
  for i, (x, (lo, hi)) in enumerate(zip(leaves, ranges, strict=True)):
    u = noise(x.shape, seed + i)
    if jnp.issubdtype(x.dtype, jnp.floating):
      new = (2.0 * u).astype(x.dtype)
    elif jnp.issubdtype(x.dtype, jnp.integer):
      step = (1 + ((u + 1) / 2 * max(hi - lo, 1)).astype(jnp.int32)).astype(x.dtype)
      new = (jnp.where(x == lo, hi, lo) if round_ == 0 else
             lo + (x - lo + step) % jnp.maximum(hi - lo + 1, 1))
    elif x.dtype == jnp.bool_:
      new = ~x
    else:
      new = x
    out.append(jnp.where(keep.reshape((n,) + (1,) * (x.ndim - 1)), x, new))
  return jax.tree.unflatten(treedef, out)


def culprit(loss_fn, points, given, i: int, j: int, n: int) -> str:
  """The first operation of loss_fn whose inputs agree on example j between the batch and
  its variant i (`points`) and whose output does not ("" if none is found), in words: its
  primitive, user line and name stack. It replays the jaxpr on the batch and the failing
  variant: one compiled program runs both and returns two flags per operation (jit-nested
  ones inlined)."""
  try:
    p, stacked = jax.eval_shape(points, *given)
    base = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), stacked)
    closed = jax.make_jaxpr(loss_fn)(p, base)
    eqns: list = []

    def flags(p_given, b_given):
      p, stacked = points(p_given, b_given)
      flat = lambda k: jax.tree.leaves((p, jax.tree.map(lambda x: x[k], stacked)))
      eqns.clear()
      out: list = []
      _replay(closed.jaxpr, closed.consts, flat(0), flat(i), j, n, eqns, out)
      return out

    got = jax.jit(flags).lower(*given).compile(fast_options())(*given)
    return next((_words(e) for e, (same_in, same_out) in zip(eqns, got, strict=True)
                 if bool(same_in) and not bool(same_out)), "")
  except Exception:  # noqa: BLE001 - the location is a hint; the refusal stands without it
    return ""


def _same(a, b, j: int, n: int):
  """Whether a and b agree bit for bit on example j (along their first axis of size n;
  else everywhere), as a traced bool."""
  a, b = jnp.asarray(a), jnp.asarray(b)
  ax = next((i for i, d in enumerate(a.shape) if d == n), None)
  if ax is not None:
    a, b = jnp.take(a, j, ax), jnp.take(b, j, ax)
  if jnp.issubdtype(a.dtype, jnp.floating):
    bits = jnp.dtype(f"uint{a.dtype.itemsize * 8}")
    a, b = jax.lax.bitcast_convert_type(a, bits), jax.lax.bitcast_convert_type(b, bits)
  elif not (jnp.issubdtype(a.dtype, jnp.integer) or a.dtype == jnp.bool_):
    return jnp.bool_(True)  # keys and other opaque types: not compared
  return jnp.all(a == b)


def _replay(jaxpr, consts, ins_base, ins_var, j, n, eqns: list, flags: list) -> list:
  """Evaluates jaxpr on both inputs (into jit sub-jaxprs), appending each operation and
  its flags (inputs agree on example j, outputs agree on example j); returns the outputs."""
  env: dict = {}
  read = lambda v, k: v.val if isinstance(v, jcore.Literal) else env[v][k]
  for v, c in zip(jaxpr.constvars, consts, strict=True):
    env[v] = (c, c)
  for v, xb, xv in zip(jaxpr.invars, ins_base, ins_var, strict=True):
    env[v] = (xb, xv)
  for eqn in jaxpr.eqns:
    ins = [[read(v, k) for v in eqn.invars] for k in (0, 1)]
    if eqn.primitive.name in JIT:
      inner = eqn.params["jaxpr"]
      outs = [_replay(inner.jaxpr, inner.consts, *ins, j, n, eqns, flags)[k] for k in (0, 1)]
    else:
      params = eqn.primitive.get_bind_params(eqn.params)
      outs = [eqn.primitive.bind(*xs, **params) for xs in ins]
      if not eqn.primitive.multiple_results:
        outs = [[o] for o in outs]
      agree = lambda xs, ys: jnp.all(jnp.stack([jnp.bool_(True)] + [
          _same(a, b, j, n) for a, b in zip(xs, ys, strict=True)]))
      eqns.append(eqn)
      flags.append((agree(*ins), agree(*outs)))
    for v, ob, ov in zip(eqn.outvars, *outs, strict=True):
      env[v] = (ob, ov)
  return [[read(v, k) for v in jaxpr.outvars] for k in (0, 1)]


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
