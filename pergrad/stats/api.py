"""`compute`: one entry point for per-example / per-token gradient statistics.

    loss, stats = compute(loss_fn, params, batch, want=("mean", "sq"), backend="auto")
    loss, stats = compute(loss_fn, params, batch, request, options, backend="surgery")

`loss_fn(params, batch) -> float32[B]` gives per-example losses (`pergrad.loss`); the
batch loss is their mean, so the batch gradient ḡ is the mean of the per-example
gradients g_1..g_B. `stats` is a `GradStats` (sums + count, see `types.py`); "mean" is
always filled, "sq" / "sign" / "norms" when asked. What to compute is a `StatsRequest`;
how, a `StatsOptions`; which backend, a name of the table `backends.REGISTRY` (the
built-in ones listed there), or "auto", decided once per model and platform by `decide`:
surgery where its proof shows every leaf exact, surgery_vmap where it shows some, else
vmap, with a one-time warning naming the refused leaf. A request for "mean" alone takes a
plain step whatever the backend asked ("contraction" on CPU, "value_and_grad" elsewhere).

Everything is validated here, once, before the backend runs: the backend's declared
support, and for any request beyond the mean the preconditions (`separable.check`: a
model that mixes examples is refused on every backend; `alone.check_alone` for a backend
that runs each example alone). Everything static is plain Python, so `compute` can be
called inside `jax.jit`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx
from optax import microbatching

from pergrad.stats import alone, backends, registry, separable, surgery
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest
from pergrad.stats.surgery.memo import memo
from pergrad.stats.surgery.sites import Unsupported, leaf_rules, make_plan
from pergrad.stats.types import GradStats

PyTree = Any
LossFn = Callable[[PyTree, dict], jax.Array]



def decide(loss_fn, params, batch, request: StatsRequest, backend: str = "auto",
           platform: str | None = None) -> str:
  """The backend that computes `request` for loss_fn on `platform` (default: JAX's): the
  one decision of library calls (`compute`) and training (`pergrad.train.plain.decided`).
  `resolve_backend`'s choice, where "auto" asks for surgery then `surgery_or_vmap`'s, which
  reads the model (abstractly: params and batch may be shapes)."""
  which = resolve_backend(request, backend, platform)
  if backend == "auto" and which == "surgery":
    which = surgery_or_vmap(loss_fn, params, batch, request, platform)
  return which


def resolve_backend(request: StatsRequest, backend: str = "auto",
                    platform: str | None = None) -> str:
  """The backend that serves `request` before the model is known (`decide` then reads the
  model): "contraction", "value_and_grad", "vmap", "surgery", "loop" (or a registered
  one); `platform` (default JAX's) picks the plain step.

  Rule for "auto", read from the XLA:CPU benchmarks whose rows, clipping included, are
  results/cpu/overhead/bench.json and results/cpu/norm_cost (`scripts/reproduce.py
  overhead norm_cost --preset cpu`, `scripts/bench_stats.py`); not yet measured on an
  accelerator:
    - "mean" only, example granularity, no clipping -> "contraction" on CPU (faster than
      autodiff's step at equal FLOPs; a model the planner cannot read falls back to
      autodiff inside it), "value_and_grad" elsewhere;
    - token granularity -> "surgery" (the only backend with per-token statistics);
    - otherwise (example granularity, per-example clipping included) -> "surgery": with
      the simultaneous methods the faster of surgery and vmap, and with clipping the lower
      in peak memory. Surgery needs a model of standard layers that it can prove exact
      (`surgery/proof.py`); `compute` sends any other model to vmap (`surgery_or_vmap`).
  Raises ValueError when `backend` cannot serve the request, naming one that can.
  """
  if backend != "auto":
    backends.get(backend)
  if request.mean_only:  # a plain step, whatever backend serves statistics
    if backend in ("value_and_grad", "contraction"):
      return backend
    return "contraction" if (platform or jax.default_backend()) == "cpu" else "value_and_grad"
  which = backend
  if backend == "auto":
    which = "surgery"
  check_support(request, which)
  return which


_WARNED: set[tuple[str, str]] = set()


def surgery_or_vmap(loss_fn, params, batch, request: StatsRequest,
                    platform: str | None = None) -> str:
  """"surgery" where its proof shows every leaf exact for loss_fn (`surgery.proof`, at
  trace time); "surgery_vmap" where it shows some (the refused leaves' per-example
  gradients read through their example-free slice, `surgery/cuts.py`, or from vmap;
  example granularity, no clipping); else "vmap"; the last two with a one-time warning
  naming the refused leaf and the use; the refusal itself where no other backend serves
  the request (per-token statistics), or both refusals where vmap's per-example losses are
  not the batch's (`alone.check_alone`: both fallbacks run examples alone). On XLA:CPU
  surgery_vmap only where every refused leaf is read through its slice: there it took less
  time and peak memory than whole-model vmap, and with a refused leaf left to the whole-loss
  vmap more (results/bench_fallback.json, `scripts/bench_fallback.py`); not yet measured on
  an accelerator."""
  try:
    plan = make_plan(loss_fn, params, batch, request)
    if not plan.refused:
      return "surgery"
    e = plan.refusal()
    partial = len(plan.refused) < len(plan.keys) and (
        (platform or jax.default_backend()) != "cpu"
        or set(surgery.cut_paths(loss_fn, params, batch, request)) == set(dict(plan.refused)))
  except Unsupported as err:
    e, partial = err, False
  for which in ("surgery_vmap",) * partial + ("vmap",):
    try:
      check_support(request, which)
    except ValueError:
      continue
    try:
      alone.check_alone(loss_fn, params, batch)
    except Unsupported as e_alone:
      raise Unsupported(f"pergrad.stats: no backend is exact for this loss_fn: surgery refused "
                        f"it ({e.reason}) and {str(e_alone).removeprefix('pergrad.stats: ')}"
                        ) from None
    if (e.reason, which) not in _WARNED:
      _WARNED.add((e.reason, which))
      how = ("takes the refused leaves' per-example gradients from vmap (backend="
             "'surgery_vmap', the rest by surgery)" if which == "surgery_vmap" else
             "falls back to backend='vmap'")
      warnings.warn(f"pergrad.stats: surgery is not exact for this model ({e.reason}); "
                    f"backend='auto' {how}.", stacklevel=3)
    return which
  raise e


def check_support(request: StatsRequest, backend: str) -> None:
  """ValueError (one line, naming a backend that can) unless `backend`'s table entry
  supports `request`: its granularity, per-example clipping, statistics."""
  entry = backends.get(backend)
  if not entry.statistics and not request.mean_only:
    raise ValueError(
        f"backend='{backend}' computes the mean gradient alone, not {request}; use "
        "backend='auto'.")
  if request.granularity not in entry.granularities:
    raise ValueError(
        f"granularity='{request.granularity}' is not supported by backend='{backend}' (it "
        "computes per-example gradients only); use backend='surgery' (or 'auto') for "
        "per-token statistics.")
  clip = request.per_example_clip is not None
  if clip and entry.clip is None:
    raise ValueError(
        f"per_example_clip is not supported by backend='{backend}' (its statistics are reduced "
        "before any per-example gradient exists); use backend='surgery', 'vmap' or 'loop'.")
  asked = registry.select(request.want)
  if clip and entry.clip == "clip_power":
    for k in asked:
      if registry.get(k).clip_power is None:
        raise ValueError(
            f"statistic '{k}' has no clip_power, so backend '{backend}' cannot apply "
            "per_example_clip to it; use backend='loop', which clips each gradient explicitly.")
  if request.granularity == "token":
    for k in asked:
      if not registry.get(k).multiplicative:
        raise ValueError(
            f"statistic '{k}' has a non-multiplicative φ, so backend '{backend}' cannot "
            "compute it per token; use granularity='example' (backend 'surgery', 'vmap' or "
            "'loop').")


def batch_size(batch: PyTree) -> int:
  """The common leading axis of the batch's leaves; ValueError if there is none."""
  sizes = {x.shape[0] if getattr(x, "ndim", 0) else None for x in jax.tree.leaves(batch)}
  if not sizes or None in sizes or len(sizes) != 1:
    shapes = jax.tree.map(lambda x: getattr(x, "shape", ()), batch)
    raise ValueError(
        f"every batch leaf must have the same leading (example) axis; got shapes {shapes}.")
  (size,) = sizes
  if size < 1:
    raise ValueError("the batch is empty (leading axis of size 0).")
  return size


def check_microbatch(microbatch_size: int | None, B: int) -> None:
  """ValueError (one line) unless `microbatch_size` is None or a positive divisor of B."""
  if microbatch_size is None:
    return
  if not (isinstance(microbatch_size, int) and microbatch_size > 0 and B % microbatch_size == 0):
    raise ValueError(
        f"microbatch_size={microbatch_size} must be a positive divisor of the batch size "
        f"B={B}; choose a divisor of B or null.")


def compute(
    loss_fn: LossFn,
    params: PyTree,
    batch: PyTree,
    request: StatsRequest | None = None,
    options: StatsOptions | None = None,
    *,
    backend: str = "auto",
    want: str | Sequence[str] = ("mean",),
    granularity: str = "example",
    per_example_clip: float | None = None,
    microbatch_size: int | None = None,
) -> tuple[jax.Array, GradStats]:
  """Mean loss and gradient statistics of `loss_fn` over `batch`.

  Args:
    loss_fn: (params, batch) -> float32[B] per-example losses.
    params: the parameters (any pytree of float arrays).
    batch: pytree of arrays with a leading example axis B.
    request: what to compute (`StatsRequest`: statistics, granularity, per-example
      clipping, layer selection); None: the shortcuts below.
    options: how (`StatsOptions`); None: the defaults, with the shortcut below.
    backend: "auto" | a name of `backends.REGISTRY` ("vmap", "surgery", "loop",
      "value_and_grad" or a registered one).
    want, granularity, per_example_clip: shortcuts for
      `StatsRequest(want, granularity, per_example_clip)` when `request` is None.
    microbatch_size: shortcut for `StatsOptions(microbatch_size=...)`.

  Returns:
    (loss, stats): loss = (1/B) Σ_b loss_b (float32 scalar) and a `GradStats`.

  Flax NNX as NNX users write it: `compute(lambda model, batch: ..., model, batch)` with an
  `nnx.Module` as params (its nnx.scan / nnx.remat / nnx.jit inside): the module is split
  into graph and parameter state here (`nnx.split`, merged inside the loss), before any
  transform of the engine's own, and the statistics are trees like that state. A loss_fn
  that does not read params (a model closed over) is refused in one line saying how to
  pass it. `options.microbatch_size` splits the batch into chunks processed one after the
  other (`optax.microbatching.microbatch`, a `fori_loop`), bounding the memory of
  per-example quantities; chunk statistics merge by addition (sums, counts) and
  concatenation (per-example norms). With the batch sharded over a ('data',) mesh, sums
  over the batch axis are global sums: the statistics are those of the whole global batch.
  """
  if nnx.graph.is_graph_node(params):  # an NNX module: its parameter state, merged inside
    loss_fn, params = nnx_split(loss_fn, params)
  if request is None:
    request = StatsRequest(want=want, granularity=granularity,
                           per_example_clip=per_example_clip)
  options = _options(options, microbatch_size)
  which = resolve_backend(request, backend)
  B = batch_size(batch)
  check_microbatch(options.microbatch_size, B)
  check_losses(loss_fn, params, batch, B)
  if not request.mean_only:  # every backend's per-example statistics need separable losses
    separable.check(loss_fn, params, batch)
  which = decide(loss_fn, params, batch, request, backend)
  entry = backends.get(which)
  if entry.alone and not request.mean_only:
    alone.check_alone(loss_fn, params, batch)
  # Layer types for `layers` and the noise-scale groups: one classifier, every backend.
  rules = leaf_rules(loss_fn, params, batch, request) if entry.statistics else ()

  chunk = options.microbatch_size
  chunk_fn = lambda p, b: entry.fn(loss_fn, p, b, request, options)
  if chunk is None or chunk == B or not entry.microbatch:
    loss, stats = chunk_fn(params, batch)
  else:
    loss, stats = _microbatched(chunk_fn, params, batch, chunk)
  if not entry.statistics:  # ḡ alone
    return loss, stats
  return loss, stats.replace(rules=rules, layers=request.layers)


def _options(options: StatsOptions | None, microbatch_size: int | None) -> StatsOptions:
  """`options` (default: `StatsOptions()`) with `compute`'s microbatch_size shortcut."""
  options = StatsOptions() if options is None else options
  if microbatch_size is None:
    return options
  if options.microbatch_size not in (None, microbatch_size):
    raise ValueError(
        f"microbatch_size={microbatch_size} and options.microbatch_size="
        f"{options.microbatch_size} disagree; give one of them.")
  return dataclasses.replace(options, microbatch_size=microbatch_size)


def check_losses(loss_fn, params, batch, B: int) -> None:
  """ValueError (one line) unless loss_fn reads params (`reads_params`) and returns
  per-example losses of shape (B,)."""
  reads_params(loss_fn, params, batch)
  out = jax.eval_shape(loss_fn, params, batch)
  if getattr(out, "shape", None) != (B,):
    raise ValueError(
        f"loss_fn must return per-example losses of shape ({B},), got "
        f"{getattr(out, 'shape', out)}; use pergrad.loss.make_loss_fn (no mean over the batch).")


# (loss_fn, graphdef) -> (loss of the parameter state, its cell holding the other state).
_MERGED: dict = {}


def nnx_split(loss_fn, module):
  """(loss of the parameter state, that state) of loss_fn(module, batch): `nnx.split`
  into graph, nnx.Param state and the rest (held in a cell, read when traced), merged
  inside the loss; one loss function per (loss_fn, graph), so plans are made once."""
  graphdef, state, rest = nnx.split(module, nnx.Param, ...)
  key = (loss_fn, graphdef)
  try:
    hash(key)
  except TypeError:  # a graph with unhashable static attributes: a loss per call
    key = object()
  if key not in _MERGED:
    cell: dict = {}
    # tree.map: Variables made afresh in the trace that runs the loss (NNX's transforms
    # inside, nnx.scan say, refuse Variables of another trace level)
    _MERGED[key] = (lambda p, b: loss_fn(nnx.merge(graphdef, *jax.tree.map(
        lambda a: a, (p, cell["rest"]))), b), cell)
  merged, cell = _MERGED[key] if isinstance(key, tuple) else _MERGED.pop(key)
  cell["rest"] = rest
  return merged, state


HOW_TO_PASS = ("pass the model as params: compute(lambda model, batch: ..., model, batch) "
               "(an nnx.Module is split into graph and state here), or nnx.split it and "
               "nnx.merge it inside loss_fn(params, batch)")


@memo
def reads_params(loss_fn, params, batch) -> None:
  """ValueError (one line, `HOW_TO_PASS`) unless loss_fn's losses depend on some float
  leaf of params (a model closed over would give zero gradients) or when loss_fn cannot
  be traced with NNX modules closed over (another trace level)."""
  try:
    closed = jax.make_jaxpr(loss_fn)(params, batch)
  except ValueError as e:
    if "trace level" not in str(e) and "graph node" not in str(e):
      raise
    raise ValueError(f"loss_fn closes over an NNX module that a transform cannot enter "
                     f"({str(e).splitlines()[0]}); {HOW_TO_PASS}.") from None
  jaxpr, leaves = closed.jaxpr, jax.tree.leaves(params)
  need = {v for v in jaxpr.outvars if isinstance(v, jax.extend.core.Var)}
  for eqn in reversed(jaxpr.eqns):
    if any(v in need for v in eqn.outvars):
      need.update(v for v in eqn.invars if isinstance(v, jax.extend.core.Var))
  floats = [v for v, x in zip(jaxpr.invars[:len(leaves)], leaves, strict=True)
            if jax.numpy.issubdtype(getattr(x, "dtype", None) or float, jax.numpy.inexact)]
  if floats and not any(v in need for v in floats):
    raise ValueError(f"loss_fn's losses do not depend on params (a model closed over?); "
                     f"{HOW_TO_PASS}.")


def _microbatched(chunk_fn: Callable, params: PyTree, batch: PyTree, microbatch_size: int):
  """Runs `chunk_fn` on chunks of `microbatch_size` examples and merges the results.

  Uses `optax.microbatching.microbatch` (a fori_loop; chunks are strided slices so
  that a batch sharded over devices stays sharded): sums, counts and every coordinate
  statistic are added, every example statistic (per-example norms, ...) concatenated
  back in example order.
  """
  B = batch_size(batch)
  SUM, CONCAT = microbatching.AccumulationType.SUM, microbatching.AccumulationType.CONCAT
  seen = []

  def fn(p, b):
    loss, stats = chunk_fn(p, b)
    seen.append(stats)
    out = dict(loss_sum=loss * batch_size(b), count=stats.count, sum=stats.sum)
    if stats.coordinate_stats:
      out["coordinate_stats"] = stats.coordinate_stats
    if stats.example_stats:
      out["example_stats"] = stats.example_stats
    return out

  shapes = jax.eval_shape(fn, params, jax.tree.map(lambda x: x[:microbatch_size], batch))
  acc = {k: CONCAT if k == "example_stats" else SUM for k in shapes}
  out = microbatching.microbatch(fn, argnums=1, microbatch_size=microbatch_size,
                                 accumulator=acc)(params, batch)
  stats = GradStats(count=out["count"], sum=out["sum"],
                    coordinate_stats=out.get("coordinate_stats"),
                    example_stats=out.get("example_stats"), granularity=seen[-1].granularity,
                    rules=seen[-1].rules)
  return out["loss_sum"] / B, stats
