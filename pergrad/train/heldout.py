"""How often the update's sign agrees with sign(E g), logged during training.

    stats.sign_agreement=4 stats.log_every=10     # n_h = 4 batches, every 10th update
    stats.sign_lag=0.5                            # ρ of the lagged target

On each statistics-logging step k with n_h = stats.sign_agreement > 0, before update k: the
held-out set is n_h·B examples of an example stream apart from training (seed data.seed +
2^63, `HELDOUT_SEED`), so its mean h is independent of the update given E g; its statistics
(mean, sq at θ_{k−1}, example granularity, no clipping) come from a separate compiled function
(`SignLog`). Each direction, the update u = −(update k) and every stage's ("example": the
mean of per-example signs, "batch": ḡ, "ema": the SNR tracker's m; `directions`), is counted
against h and against h̄ = EMA_ρ of the held-out means (`TrainState.lag`) with
`pergrad.stats.sign_agreement.per_leaf`, logged raw as "sign[_lag][_<stage>]/<leaf>/<field>"
(`prefix`, `sign_metrics`). The training trajectory is untouched.
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
from pergrad.optim import SnrTrackerState
from pergrad.stats import sign_agreement
from pergrad.stats.types import GradStats
from pergrad.train import mesh as mesh_lib

PyTree = Any
HELDOUT_SEED = 2**63  # the held-out stream's seed is data.seed + HELDOUT_SEED
PREFIX = "sign"
STAGES = ("example", "batch", "ema")  # the stage directions, beside the run's "update"


def prefix(direction: str = "update", lag: bool = False) -> str:
  """"sign[_lag][_<direction>]": the key prefix of a direction's counts against a target."""
  return PREFIX + ("_lag" if lag else "") + ("" if direction == "update" else f"_{direction}")


def heldout_seed(seed: int) -> int:
  """The seed of the held-out example stream of a run with data.seed = `seed`."""
  return seed + HELDOUT_SEED


class HeldOutData:
  """Host side: the held-out examples of the logging step after `seen` examples."""

  def __init__(self, data, n_h: int, batch_size: int, part: tuple[int, int] = (0, 1)):
    self._stream = copy.copy(data)  # the same windows and tokenizer, another seed
    self._stream.seed = heldout_seed(data.seed)
    self.n_h, self.batch_size, self.part = n_h, n_h * batch_size, part

  def batch(self, seen: int) -> dict:
    """Examples n_h·seen .. n_h·seen + n_h·B − 1 of the held-out stream (this
    process's rows)."""
    return self._stream.train_examples(self.n_h * seen, self.batch_size, self.part)


def heldout_stats(params: PyTree, batch: dict, *, loss_fn, backend: str,
                  options: pstats.StatsOptions) -> GradStats:
  """Mean and sq of the held-out batch's per-example gradients at `params`."""
  return pstats.compute(loss_fn, params, batch, HELDOUT_REQUEST, options, backend=backend)[1]


def directions(updates: PyTree, stats: GradStats, log_stats: GradStats | None = None,
               snr: Any = None) -> dict[str, PyTree]:
  """{"update": −updates} and the stages available (module docstring): "example" from the
  first of `stats` (the optimizer's), `log_stats` with 'sign' at example granularity for
  every leaf, "batch" = `stats.mean`, "ema" from a `track_snr` state `snr`."""
  out = {"update": jax.tree.map(jnp.negative, updates), "batch": stats.mean}
  signed = [s for s in (stats, log_stats) if s is not None and s.sum_sign is not None
            and s.granularity == "example" and not s.layers]
  if signed:
    out["example"] = signed[0].sign_mean
  if isinstance(snr, SnrTrackerState):
    out["ema"] = snr.mu
  return out


def sign_metrics(directions: dict[str, PyTree], heldout: GradStats,
                 lag: sign_agreement.LagState | None = None,
                 z: float = sign_agreement.Z) -> dict[str, jax.Array]:
  """{"<prefix>/<leaf>/<field>": float32 scalar} of each direction against the held-out
  statistics and, given the lag state (after this step's update), the lagged target; per
  leaf and "total" (module docstring)."""
  targets = {False: sign_agreement.current(heldout)}
  if lag is not None:
    targets[True] = sign_agreement.lagged(lag)
  return {f"{prefix(d, lagged)}/{leaf}/{field}": value
          for d, u in directions.items() for lagged, t in targets.items()
          for leaf, c in sign_agreement.per_leaf(u, t, z).items()
          for field, value in c._asdict().items()}


class SignLog:
  """The run's compiled held-out statistics `stats(params, batch)` and the abstract
  shape of their result (`abstract_stats`, replicated: the train step's argument).

  Held-out set: examples n_h·s .. n_h·s + n_h·B − 1 (s = examples seen before update k; B
  = data.batch_size, the largest of a batch schedule) of the stream of seed data.seed + 2^63
  (`pergrad.data.pipeline`: example i is a pure function of (seed, i)), so a resumed run logs
  the same. Statistics: backend `stats.backend`, every leaf, in chunks of
  stats.microbatch_size (default B): the memory of one training step. Direction u = lr ·
  (direction [+ weight decay·θ]): lr > 0 scales every coordinate alike, so sign(u) is the sign
  of the optimizer's direction (with weight decay: of the decayed step). u has the sign of
  "ema" in a SignEMA run, of "batch" in a batch run with β = 0, of "example" in an example run
  with β = 0 (tested). Targets: h (`sign_agreement.current`) and h̄ (`sign_agreement.lag_update`,
  checkpointed; h at the first logging step). Counts: `SignCounts` fields (coords, agree_all,
  selected, agree, progress, mu2) per leaf (`pergrad.stats.noise.leaf_path`) and total; ratios
  pool over leaves, steps and seeds by adding counts (`sign_agreement.summary`). The logging
  train step (`pergrad.train.step.train_step(state, batch, heldout)`) turns its update and
  them into counts and updates `TrainState.lag`, which the plain step carries through.
  """

  def __init__(self, plan, loss_fn, mesh, abstract_params: PyTree):
    sp = plan.stats
    batch_size, T = plan.batch.max_batch_size, plan.data.seq_len
    self.n_h = sp.sign_agreement
    repl = mesh_lib.replicated(mesh)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    options = dataclasses.replace(sp.options,
                                  microbatch_size=sp.options.microbatch_size or batch_size)
    stats_fn = jax.jit(
        functools.partial(heldout_stats, loss_fn=loss_fn, backend=sp.sign_backend,
                          options=options),
        in_shardings=(jax.tree.map(lambda s: s.sharding, abstract_params), batch_sharding),
        out_shardings=repl)
    batch = {k: jax.ShapeDtypeStruct((self.n_h * batch_size, T), jnp.int32, sharding=batch_sharding)
             for k in ("inputs", "targets")}
    self.stats = stats_fn.lower(abstract_params, batch).compile()
    self.abstract_stats = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=repl),
        jax.eval_shape(stats_fn, abstract_params, batch))
