"""How often the update's sign agrees with sign(E g), logged during training.

    stats.sign_agreement=4 stats.log_every=10     # n_h = 4 batches, every 10th update

On each statistics-logging step k (`StatsPlan.logs_at`) with n_h = stats.sign_agreement
> 0, before update k:

  held-out set   n_h·B examples (B = data.batch_size, the largest size of a batch
                 schedule) from the training distribution, apart from the training
                 stream: examples n_h·s .. n_h·s + n_h·B − 1 (s = examples seen before
                 update k) of the example stream of seed data.seed + 2^63 (`HELDOUT_SEED`;
                 `pergrad.data.pipeline`: example i is a pure function of (seed, i)). The
                 draws are independent of every training batch, so the held-out mean h
                 is independent of the update given E g, and a resumed run logs the same.
  statistics     GradStats with mean and sq of those examples at θ_{k−1}, the parameters
                 update k is computed at: example granularity, no per-example clipping
                 (the target is the loss's E g), every leaf, backend `stats.backend`
                 ("auto": surgery), in chunks of stats.microbatch_size (default B), so
                 that its memory is that of one training step.
  direction      u = −(update k) = lr·(direction [+ weight decay·θ]): the step taken,
                 negated, so that sign(u) = sign(E g) means downhill. lr > 0 scales
                 every coordinate alike, so sign(u) is exactly the sign of the optimizer's
                 direction before the learning rate (for the sign family, the
                 signed/EMA'd direction) without dividing by lr; with weight decay it is
                 the sign of the decayed step, the one the parameters take.
  counts         `pergrad.stats.sign_agreement.per_leaf(u, held-out stats)`, logged raw
                 in the stats record as "sign/<leaf>/<field>" and "sign/total/<field>"
                 (fields of `SignCounts`: coords, agree_all, selected, agree, progress,
                 mu2; leaf names `pergrad.stats.noise.leaf_path`), so ratios pool over
                 leaves, steps and seeds by adding counts (`sign_agreement.summary`).

The training trajectory is untouched: the held-out statistics are a separate compiled
function of θ_{k−1} (`SignLog.stats`, called before the train step donates the state,
compiled ahead of time once per run), passed to the logging train step
(`pergrad.train.step.train_step(state, batch, heldout)`), which turns its update and
them into counts (`sign_metrics`) beside its other metrics.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

import pergrad.stats as pstats
from pergrad.config.plan import HELDOUT_REQUEST
from pergrad.stats import sign_agreement
from pergrad.stats.types import GradStats
from pergrad.train import mesh as mesh_lib

PyTree = Any
HELDOUT_SEED = 2**63  # the held-out stream's seed is data.seed + HELDOUT_SEED
PREFIX = "sign"


def heldout_seed(seed: int) -> int:
  """The seed of the held-out example stream of a run with data.seed = `seed`."""
  return seed + HELDOUT_SEED


class HeldOutData:
  """Host side: the held-out examples of the logging step after `seen` examples."""

  def __init__(self, data, n_h: int, batch_size: int, part: tuple[int, int] = (0, 1)):
    self._stream = copy.copy(data)  # the same windows and tokenizer, another seed
    self._stream.seed = heldout_seed(data.seed)
    self.n_h, self.size, self.part = n_h, n_h * batch_size, part

  def batch(self, seen: int) -> dict:
    """Examples n_h·seen .. n_h·seen + n_h·B − 1 of the held-out stream (this
    process's rows)."""
    return self._stream.train_examples(self.n_h * seen, self.size, self.part)


def heldout_stats(params: PyTree, batch: dict, *, loss_fn, backend: str,
                  options: pstats.StatsOptions) -> GradStats:
  """Mean and sq of the held-out batch's per-example gradients at `params`."""
  return pstats.compute(loss_fn, params, batch, HELDOUT_REQUEST, options, backend=backend)[1]


def sign_metrics(updates: PyTree, heldout: GradStats,
                 z: float = sign_agreement.Z) -> dict[str, jax.Array]:
  """{"sign/<leaf>/<field>": float32 scalar} of u = −updates against the held-out
  statistics, per leaf and "total" (module docstring)."""
  u = jax.tree.map(jnp.negative, updates)
  return {f"{PREFIX}/{leaf}/{field}": value
          for leaf, c in sign_agreement.per_leaf(u, heldout, z).items()
          for field, value in c._asdict().items()}


class SignLog:
  """The run's compiled held-out statistics `stats(params, batch)` and the abstract
  shape of their result (`abstract_stats`, replicated: the train step's argument)."""

  def __init__(self, plan, loss_fn, mesh, abstract_params: PyTree):
    sp = plan.stats
    B, T = plan.batch.max_size, plan.data.seq_len
    self.n_h = sp.sign_agreement
    repl = mesh_lib.replicated(mesh)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    options = dataclasses.replace(sp.options,
                                  microbatch_size=sp.options.microbatch_size or B)
    stats_fn = jax.jit(
        functools.partial(heldout_stats, loss_fn=loss_fn, backend=sp.sign_backend,
                          options=options),
        in_shardings=(jax.tree.map(lambda s: s.sharding, abstract_params), batch_sharding),
        out_shardings=repl)
    batch = {k: jax.ShapeDtypeStruct((self.n_h * B, T), jnp.int32, sharding=batch_sharding)
             for k in ("inputs", "targets")}
    self.stats = stats_fn.lower(abstract_params, batch).compile()
    self.abstract_stats = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=repl),
        jax.eval_shape(stats_fn, abstract_params, batch))
