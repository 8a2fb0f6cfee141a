"""`compute`: one entry point for per-example / per-token gradient statistics.

    loss, stats = compute(loss_fn, params, batch, want=("mean", "sq"), backend="auto")
    loss, stats = compute(loss_fn, params, batch, request, options, backend="surgery")

`loss_fn(params, batch) -> float32[B]` gives per-example losses (`pergrad.loss`); the
batch loss is their mean, so the batch gradient ḡ is the mean of the per-example
gradients g_1..g_B. `stats` is a `GradStats` (sums + count, see `types.py`); "mean" is
always filled, "sq" / "sign" / "norms" when asked.

What to compute is a `StatsRequest` (or its shortcuts want / granularity /
per_example_clip); how, a `StatsOptions` (microbatch size, surgery's dense method, scan
unrolling, vmap's layout); which backend, a name of the table `backends.REGISTRY`
(every backend has the signature fn(loss_fn, params, batch, request, options)):
  - "vmap":    per-example gradients by `jax.vmap(jax.grad)`, reduced in the same jit
               (`vmap.py`); granularity "example" only; supports `per_example_clip`.
  - "surgery": one backward pass with custom VJPs that emit the statistics
               (`surgery/`); granularities "example" and "token"; `per_example_clip`
               from per-example records of the taps (`surgery/clip.py`). Any model of
               standard Flax Linen / NNX layers, or calling `pergrad.stats.taps`.
  - "loop":    a Python loop over examples (`reference.py`); a reference for tests.
  - "auto":    the cheapest backend that can supply the request (`resolve_backend`):
               surgery where its planner proves it exact for the model, else vmap with
               a one-time warning (`surgery_or_vmap`).
A request for "mean" alone (example granularity, no clipping) takes a plain step whatever
the backend asked, since the mean needs nothing more: "contraction" on CPU (the fast
weight-gradient path), "value_and_grad" elsewhere, or whichever of the two is asked.
Everything is validated here, once, before the backend runs, including, for any request
beyond the mean, that loss_fn's per-example losses are separable (`separable.check`: a
model that mixes examples is refused on every backend, "auto" included), and, for a
backend that runs each example alone (vmap, loop), that each example's loss alone is its
row of the batch's (`alone.check_alone`: a loss divided by the batch's size, or drawing
randomness per batch, is refused there; "auto" then keeps to surgery or refuses).

`options.microbatch_size` splits the batch into chunks processed one after the other
(`optax.microbatching.microbatch`, a `fori_loop`), bounding the memory of per-example
quantities; chunk statistics merge by addition (sums, counts) and concatenation
(per-example norms).

Everything static (request, options, backend) is plain Python, so `compute` can be called
inside `jax.jit`. With the batch sharded over a ('data',) mesh, sums over the batch axis
are global sums, so the statistics are those of the whole global batch.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
from optax import microbatching

from pergrad.stats import alone, backends, registry, separable
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest
from pergrad.stats.surgery.sites import Unsupported, leaf_rules, make_plan
from pergrad.stats.types import GradStats

PyTree = Any
LossFn = Callable[[PyTree, dict], jax.Array]



def resolve_backend(request: StatsRequest, backend: str = "auto") -> str:
  """The backend that serves `request`: "contraction", "value_and_grad", "vmap", "surgery",
  "loop" (or a registered one).

  Rule for "auto" (from results/cpu/overhead and results/cpu/norm_cost,
  `scripts/reproduce.py overhead norm_cost --preset cpu`, measured on XLA:CPU):
    - "mean" only, example granularity, no clipping -> "contraction" on CPU (autodiff's
      step takes 1.13-1.31x its time at equal FLOPs, `scripts/bench_stats.py`; a model the
      planner cannot read falls back to autodiff inside it), "value_and_grad" elsewhere
      (not measured on an accelerator);
    - token granularity -> "surgery" (the only backend with per-token statistics);
    - otherwise (example granularity, per-example clipping included) -> "surgery": with
      the simultaneous methods it was the faster of surgery and vmap for sq+sign, norms
      and all statistics on the tiny and medium presets (both timed against the same plain
      step); with clipping (`scripts/bench_stats.py --stat-sets clip`, cpu presets, over the
      plain step, FLOPs / peak / median time) surgery 1.02-1.08x / 1.05-1.10x / 1.00-1.05x
      against vmap 1.005-1.011x / 1.09-1.24x / 1.17-1.47x. Surgery needs a model of
      standard layers that it can prove exact (`surgery/proof.py`); `compute` sends any
      other model to vmap (`surgery_or_vmap`). Not yet measured on an accelerator.
  Raises ValueError when `backend` cannot serve the request, naming one that can.
  """
  if backend != "auto":
    backends.get(backend)
  if request.mean_only:  # a plain step, whatever backend serves statistics
    if backend in ("value_and_grad", "contraction"):
      return backend
    return "contraction" if jax.default_backend() == "cpu" else "value_and_grad"
  which = backend
  if backend == "auto":
    which = "surgery"
  check_support(request, which)
  return which


_WARNED: set[str] = set()


def surgery_or_vmap(loss_fn, params, batch, request: StatsRequest) -> str:
  """"surgery" where its planner proves it exact for loss_fn (`surgery.proof`, at trace
  time), else "vmap" with a one-time warning naming the leaf and the use that surgery
  refused; the refusal itself where vmap cannot serve the request either (per-token
  statistics), or both refusals where vmap's per-example losses are not the batch's
  (`alone.check_alone`)."""
  try:
    make_plan(loss_fn, params, batch, request)
  except Unsupported as e:
    try:
      check_support(request, "vmap")
    except ValueError:
      raise e from None
    try:
      alone.check_alone(loss_fn, params, batch)
    except Unsupported as e_vmap:
      raise Unsupported(f"pergrad.stats: no backend is exact for this loss_fn: surgery refused "
                        f"it ({e.reason}) and {str(e_vmap).removeprefix('pergrad.stats: ')}"
                        ) from None
    if e.reason not in _WARNED:
      _WARNED.add(e.reason)
      warnings.warn(f"pergrad.stats: surgery is not exact for this model ({e.reason}); "
                    "backend='auto' falls back to backend='vmap'.", stacklevel=3)
    return "vmap"
  return "surgery"


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
  """
  if request is None:
    request = StatsRequest(want=want, granularity=granularity,
                           per_example_clip=per_example_clip)
  options = StatsOptions() if options is None else options
  if microbatch_size is not None:
    if options.microbatch_size not in (None, microbatch_size):
      raise ValueError(
          f"microbatch_size={microbatch_size} and options.microbatch_size="
          f"{options.microbatch_size} disagree; give one of them.")
    options = dataclasses.replace(options, microbatch_size=microbatch_size)
  which = resolve_backend(request, backend)
  B = batch_size(batch)
  check_microbatch(options.microbatch_size, B)
  out = jax.eval_shape(loss_fn, params, batch)
  if getattr(out, "shape", None) != (B,):
    raise ValueError(
        f"loss_fn must return per-example losses of shape ({B},), got "
        f"{getattr(out, 'shape', out)}; use pergrad.loss.make_loss_fn (no mean over the batch).")
  if not request.mean_only:  # every backend's per-example statistics need separable losses
    separable.check(loss_fn, params, batch)
  if backend == "auto" and which == "surgery":
    which = surgery_or_vmap(loss_fn, params, batch, request)
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
