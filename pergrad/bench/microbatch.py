"""The plain step's gradient whole or microbatched (`pergrad.train.plain`): paired time
ratios and parity, what `chunk_for`'s rule rests on (`scripts/bench_throughput.py
--microbatch`).

For one plan (model, batch size) and a plain backend, the direct ḡ of the whole batch
and the sum over chunks of `chunk` examples are each jitted once, then timed in the
bracketed order of `pergrad.bench.paired` (B V B V ... B) on the same random tokens: the
ratio microbatched / direct per rep, its median and location (`paired.summary`); and the
largest relative difference of the two ḡ over the leaves (max |a − b| / max |a| per leaf).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from pergrad.bench.paired import bracketed, paired_ratios, summary


def plain_microbatch(plan, backend: str, chunk: int, reps: int = 10) -> dict:
  """{"ratio": `summary` of microbatched / direct, "direct_s": median seconds, "max_rel_diff"}."""
  import pergrad.stats as pstats
  from pergrad.loss import make_loss_fn
  from pergrad.model import Transformer, init_params
  from pergrad.train import plain

  B, T = plan.data.batch_size, plan.data.seq_len
  loss_fn = make_loss_fn(Transformer(plan.model))
  params = init_params(plan.model, jax.random.PRNGKey(0), T)
  tokens = np.random.default_rng(0).integers(0, plan.model.vocab_size, (B, T + 1), np.int32)
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}
  request = pstats.StatsRequest()
  direct = jax.jit(lambda p, b: pstats.compute(loss_fn, p, b, request, backend=backend))
  micro = jax.jit(lambda p, b: plain.mean_gradient(
      loss_fn, p, b, request, pstats.StatsOptions(microbatch_size=chunk), backend))

  def timed(f):
    t0 = time.perf_counter()
    out = jax.block_until_ready(f(params, batch))
    return time.perf_counter() - t0, out

  (_, (_, a)), (_, (_, b)) = timed(direct), timed(micro)  # compiles
  rel = max(float(jnp.max(jnp.abs(x - y)) / jnp.max(jnp.abs(x)))
            for x, y in zip(jax.tree.leaves(a.mean), jax.tree.leaves(b.mean), strict=True))
  base, var = [timed(direct)[0]], []
  for _ in range(reps):
    var.append(timed(micro)[0])
    base.append(timed(direct)[0])
  return {"ratio": summary(paired_ratios(var, bracketed(base))),
          "direct_s": float(np.median(base)), "max_rel_diff": rel}
