"""`compute`: one entry point for per-example / per-token gradient statistics.

    loss, stats = compute(loss_fn, params, batch, want=("mean", "sq"), backend="auto")

`loss_fn(params, batch) -> float32[B]` gives per-example losses (`pergrad.loss`); the
batch loss is their mean, so the batch gradient ḡ is the mean of the per-example
gradients g_1..g_B. `stats` is a `GradStats` (sums + count, see `types.py`); "mean" is
always filled, "sq" / "sign" / "norms" when asked.

Backends (all return the same `GradStats`):
  - "vmap":    per-example gradients by `jax.vmap(jax.grad)`, reduced in the same jit
               (`vmap.py`); granularity "example" only; supports `per_example_clip`.
  - "surgery": one backward pass with custom VJPs that emit the statistics
               (`surgery.py`); granularities "example" and "token".
  - "loop":    a Python loop over examples (`reference.py`); a reference for tests.
  - "auto":    the cheapest backend that can supply the request (`resolve_backend`):
               surgery, or vmap with per-example clipping.
A request for "mean" alone (example granularity, no clipping) takes the plain
`jax.value_and_grad` path whatever the backend, since the mean needs nothing more.

`microbatch_size` splits the batch into chunks processed one after the other
(`optax.microbatching.microbatch`, a `fori_loop`), bounding the memory of per-example
quantities; chunk statistics merge by addition (sums, counts) and concatenation
(per-example norms).

Everything static (`want`, `granularity`, `backend`, `microbatch_size`,
`per_example_clip`) is plain Python, so `compute` can be called inside `jax.jit`.
With the batch sharded over a ('data',) mesh, sums over the batch axis are global
sums, so the statistics are those of the whole global batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from optax import microbatching

from pergrad.stats.request import StatsRequest
from pergrad.stats.types import GradStats

PyTree = Any
LossFn = Callable[[PyTree, dict], jax.Array]

BACKENDS = ("auto", "vmap", "surgery", "loop")
# What each concrete backend can supply (surgery raises its own error, naming the layer,
# for a model it cannot handle).
_SUPPORTS = {
    "vmap": dict(granularity=("example",), clip=True),
    "loop": dict(granularity=("example",), clip=True),
    "surgery": dict(granularity=("example", "token"), clip=False),
}


def resolve_backend(request: StatsRequest, backend: str = "auto") -> str:
  """The backend that serves `request`: "value_and_grad", "vmap", "surgery" or "loop".

  Rule for "auto" (from results/overhead and results/norm_cost, `scripts/reproduce.py
  overhead norm_cost --preset cpu`, measured on XLA:CPU):
    - "mean" only, example granularity, no clipping -> "value_and_grad";
    - token granularity -> "surgery" (the only backend with per-token statistics);
    - per-example clipping -> "vmap" (surgery reduces before any per-example gradient);
    - otherwise (example granularity) -> "surgery": with the simultaneous methods it took
      0.72-0.89x the time of value_and_grad for sq+sign and for all statistics on the
      tiny and medium presets, where vmap took 0.96-1.24x (before them surgery took
      1.43-1.48x and vmap was the rule); for norms 0.69-0.83x vs 0.90-1.06x. Surgery
      needs a model of standard Flax layers (its error names any other layer that owns
      parameters: use backend="vmap" there). Not yet measured on an accelerator.
  Raises ValueError when `backend` cannot serve the request, naming one that can.
  """
  if backend not in BACKENDS:
    raise ValueError(f"unknown backend={backend!r}; valid: {BACKENDS}.")
  if request.mean_only:
    return "value_and_grad"
  if backend == "auto":
    return "vmap" if request.per_example_clip is not None else "surgery"
  sup = _SUPPORTS[backend]
  if request.granularity not in sup["granularity"]:
    raise ValueError(
        f"granularity='{request.granularity}' is not supported by backend='{backend}' (it "
        "computes per-example gradients only); use backend='surgery' (or 'auto') for "
        "per-token statistics.")
  if request.per_example_clip is not None and not sup["clip"]:
    raise ValueError(
        f"per_example_clip is not supported by backend='{backend}' (its statistics are reduced "
        "before any per-example gradient exists); use backend='vmap' (or 'loop').")
  return backend


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
    *,
    want: str | Sequence[str] = ("mean",),
    granularity: str = "example",
    backend: str = "auto",
    microbatch_size: int | None = None,
    per_example_clip: float | None = None,
    request: StatsRequest | None = None,
) -> tuple[jax.Array, GradStats]:
  """Mean loss and gradient statistics of `loss_fn` over `batch`.

  Args:
    loss_fn: (params, batch) -> float32[B] per-example losses.
    params: the parameters (any pytree of float arrays).
    batch: pytree of arrays with a leading example axis B.
    want: statistic names (`STATISTICS`); "mean" is always computed.
    granularity: "example" (samples g_b, n = B) or "token" (per-token contributions,
      n = B·T, surgery only).
    backend: "auto" | "vmap" | "surgery" | "loop" (or an already resolved
      "value_and_grad").
    microbatch_size: process the batch in chunks of this many examples (must divide B).
    per_example_clip: clip each g_b to global norm C, g_b · min(1, C/‖g_b‖), before
      every statistic (vmap / loop); the loss is not affected.
    request: a `StatsRequest` in place of (want, granularity, per_example_clip), and
      with a layer selection (`StatsRequest.layers`).

  Returns:
    (loss, stats): loss = (1/B) Σ_b loss_b (float32 scalar) and a `GradStats`.
  """
  if request is None:
    request = StatsRequest(want=want, granularity=granularity,
                           per_example_clip=per_example_clip)
  want, granularity = request.want, request.granularity
  per_example_clip = request.per_example_clip
  which = backend if backend == "value_and_grad" else resolve_backend(request, backend)
  B = batch_size(batch)
  check_microbatch(microbatch_size, B)
  if microbatch_size == B:
    microbatch_size = None
  out = jax.eval_shape(loss_fn, params, batch)
  if getattr(out, "shape", None) != (B,):
    raise ValueError(
        f"loss_fn must return per-example losses of shape ({B},), got "
        f"{getattr(out, 'shape', out)}; use pergrad.loss.make_loss_fn (no mean over the batch).")

  if which == "value_and_grad":
    return _value_and_grad_stats(loss_fn, params, batch)
  loss, stats = _compute(loss_fn, params, batch, request, which, microbatch_size)
  return loss, stats.replace(layers=request.layers) if request.layers else stats


def _compute(loss_fn, params, batch, request: StatsRequest, which: str, microbatch_size):
  want, granularity = request.want, request.granularity
  per_example_clip = request.per_example_clip
  if which == "loop":  # already one example at a time: microbatching changes nothing
    from pergrad.stats import reference as loop
    return loop.loop_stats(loss_fn, params, batch, want=want, per_example_clip=per_example_clip)
  if which == "vmap":
    from pergrad.stats import vmap
    chunk_fn = lambda p, b: vmap.vmap_stats(
        loss_fn, p, b, want=want, per_example_clip=per_example_clip)
  else:
    from pergrad.stats import surgery
    chunk_fn = lambda p, b: surgery.surgery_stats(
        loss_fn, p, b, want=want, granularity=granularity, layers=request.layers)
  if microbatch_size is None:
    return chunk_fn(params, batch)
  return _microbatched(chunk_fn, params, batch, microbatch_size)


def _value_and_grad_stats(loss_fn: LossFn, params: PyTree, batch: PyTree):
  """The plain path: ḡ = ∇ (1/B) Σ_b loss_b; sum = B ḡ, count = B."""
  B = batch_size(batch)
  loss, grads = jax.value_and_grad(lambda p: loss_fn(p, batch).mean())(params)
  stats = GradStats(count=jnp.asarray(B, jnp.float32),
                    sum=jax.tree.map(lambda g: g * B, grads))
  return loss, stats


def _microbatched(chunk_fn: Callable, params: PyTree, batch: PyTree, microbatch_size: int):
  """Runs `chunk_fn` on chunks of `microbatch_size` examples and merges the results.

  Uses `optax.microbatching.microbatch` (a fori_loop; chunks are strided slices so
  that a batch sharded over devices stays sharded): sums, counts and every coordinate
  statistic are added, every example statistic (per-example norms, ...) concatenated
  back in example order.
  """
  B = batch_size(batch)
  SUM, CONCAT = microbatching.AccumulationType.SUM, microbatching.AccumulationType.CONCAT
  granularity = []

  def fn(p, b):
    loss, stats = chunk_fn(p, b)
    granularity.append(stats.granularity)
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
                    example_stats=out.get("example_stats"), granularity=granularity[-1])
  return out["loss_sum"] / B, stats
