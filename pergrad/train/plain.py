"""A step's gradient and statistics by their fastest exact path: the whole batch in one
pass, or sums over microbatches of `chunk` examples in a loop.

    loss, stats = mean_gradient(loss_fn, params, batch, request, options, backend)  # ḡ alone
    options = chunked(options, B, backend)   # a statistics backend's own loop, where faster
    stats_plan = decided(plan.stats, loss_fn, params, batch, platform)   # "auto" decided

`decided` decides each backend of the run once, where the model and the platform are
known, by the library's own decision (`pergrad.stats.decide`: auto reads the model's
proof, so a model surgery refuses in part trains on surgery_vmap, in whole on vmap).

Both give ḡ = (1/B) Σ_b ∇loss_b (the same sum in another order: equal to float32 rounding,
tested on every leaf). On CPU `chunk_for` splits a batch into chunks of
`AUTO_CHUNK[platform, backend]` examples where that divides it (small matmuls run from
cache; `scripts/bench_throughput.py --nanodo`, `--microbatch` measure it); on accelerators
(one large matmul is best) it does not. The chunks are strided slices
(`optax.microbatching.microbatch`), so a batch sharded over devices stays sharded;
stats.microbatch_size, when set, is the chunk. A statistics backend that microbatches
(`pergrad.stats.compute`'s loop) gets the same chunk (`chunked`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from optax import microbatching

import pergrad.stats as pstats
from pergrad.config.plan import HELDOUT_REQUEST, StatsPlan
from pergrad.stats.types import GradStats

# Examples per chunk where splitting is faster, by (platform, backend); backend None: any
# other backend (module docstring).
AUTO_CHUNK = {("cpu", None): 8, ("cpu", "value_and_grad"): 4}


def chunk_for(batch_size: int, platform: str, asked: int | None = None,
              backend: str | None = None) -> int | None:
  """The chunk of a step of `batch_size` examples on `backend`: `asked`
  (stats.microbatch_size) if set, else AUTO_CHUNK's (platform, backend) when it is smaller
  than the batch and divides it; None: the whole batch at once."""
  chunk = asked or AUTO_CHUNK.get((platform, backend), AUTO_CHUNK.get((platform, None)))
  return chunk if chunk and chunk < batch_size and batch_size % chunk == 0 else None


def decided(sp: StatsPlan, loss_fn, params, batch: dict, platform: str) -> StatsPlan:
  """`sp` with each backend decided for loss_fn on `platform` (`pergrad.stats.decide`;
  params and batch may be shapes), once, before any step is traced."""
  decide = lambda request, backend: pstats.decide(loss_fn, params, batch, request, backend,
                                                  platform)
  return dataclasses.replace(
      sp, backend=decide(sp.request, sp.backend),
      log_backend=decide(sp.log_request, sp.log_backend) if sp.log_request else None,
      sign_backend=decide(HELDOUT_REQUEST, sp.sign_backend) if sp.sign_backend else None)


def mean_gradient(loss_fn, params, batch: dict, request: pstats.StatsRequest,
                  options: pstats.StatsOptions, backend: str, platform: str | None = None
                  ) -> tuple[jax.Array, GradStats]:
  """(mean loss, GradStats of ḡ alone) of a plain backend (value_and_grad, contraction),
  over chunks where `chunk_for` splits the batch on `platform` (default JAX's; module
  docstring)."""
  B = jax.tree.leaves(batch)[0].shape[0]
  chunk = chunk_for(B, platform or jax.default_backend(), options.microbatch_size, backend)
  if chunk is None:
    return pstats.compute(loss_fn, params, batch, request, options, backend=backend)

  def sums(p, b):
    loss, stats = pstats.compute(loss_fn, p, b, request, options, backend=backend)
    return {"loss": loss * chunk, "sum": stats.sum}

  SUM = microbatching.AccumulationType.SUM
  out = microbatching.microbatch(sums, argnums=1, microbatch_size=chunk,
                                 accumulator={"loss": SUM, "sum": SUM})(params, batch)
  return out["loss"] / B, GradStats(count=jnp.asarray(B, jnp.float32), sum=out["sum"])


def chunked(options: pstats.StatsOptions, batch_size: int, backend: str,
            platform: str | None = None) -> pstats.StatsOptions:
  """`options` with `chunk_for`'s chunk on `platform` (default JAX's) when the backend
  computes statistics in its own microbatch loop and no chunk is set (module docstring)."""
  entry = pstats.backends.get(backend)
  if options.microbatch_size or not (entry.statistics and entry.microbatch):
    return options
  return dataclasses.replace(options, microbatch_size=chunk_for(
      batch_size, platform or jax.default_backend(), None, backend))
