"""The jitted functions of training: init, train step, statistics step, eval step.

    state, metrics = train_step(state, batch)      # every step
    scalars = stats_step(state, batch)             # only on statistics-logging steps
    loss = eval_step(params, batch)

`train_step` asks `pergrad.stats.compute` for exactly what the optimizer requests
(`opt.request`): for "mean" alone that is the plain `jax.value_and_grad` path, so a
run pays for per-example statistics only when its optimizer needs them. Per-layer
statistics and optimizer diagnostics for logging come from `stats_step`, a separate
jitted function called only on logging steps; it reads the state and never changes
it, so the trajectory does not depend on how often statistics are logged.

`Steps` jits each function once over a 1-D ('data',) mesh: explicit in/out
shardings (batch split on 'data', state replicated), the state donated to the
train step, and the state's shardings taken from `jax.eval_shape` of the init.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

import pergrad.stats as pstats
from pergrad.loss import make_loss_fn
from pergrad.model import ModelSpec, Transformer
from pergrad.optim import Optimizer, diagnostics
from pergrad.train import mesh as mesh_lib
from pergrad.train.state import TrainState, make_init_fn


def train_step(state: TrainState, batch: dict, *, loss_fn, opt: Optimizer, backend: str,
               microbatch_size: int | None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update θ_{k+1} = θ_k + tx(ḡ_k, stats_k); metrics are those of step k.

  Metrics: loss (mean over the batch at θ_k), grad_norm ‖ḡ‖, update_norm,
  param_norm ‖θ_{k+1}‖, lr (the effective learning rate of this update).
  """
  req = opt.request
  loss, stats = pstats.compute(
      loss_fn, state.params, batch, want=req.want, granularity=req.granularity,
      backend=backend, microbatch_size=microbatch_size, per_example_clip=req.per_example_clip)
  grads = stats.mean
  updates, opt_state = opt.tx.update(grads, state.opt_state, state.params, grad_stats=stats)
  params = optax.apply_updates(state.params, updates)
  metrics = {
      "loss": loss,
      "grad_norm": optax.tree.norm(grads),
      "update_norm": optax.tree.norm(updates),
      "param_norm": optax.tree.norm(params),
      "lr": jnp.asarray(opt.learning_rate(state.step), jnp.float32),
  }
  new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state, rng=state.rng)
  return new_state, metrics


def stats_step(state: TrainState, batch: dict, *, loss_fn, opt: Optimizer, backend: str,
               microbatch_size: int | None, want: tuple[str, ...],
               granularity: str) -> dict[str, jax.Array]:
  """Scalars for logging at θ_k on batch k: per-layer summaries of the statistics
  (`pergrad.stats.summaries.layer_summaries`, keys "stats/...") and the optimizer's
  diagnostics (`pergrad.optim.diagnostics`, keys "opt/...") evaluated on the optimizer
  state after this step's update (which is computed here and discarded).
  """
  req = opt.request
  _, log_stats = pstats.compute(loss_fn, state.params, batch, want=want,
                                granularity=granularity, backend=backend,
                                microbatch_size=microbatch_size)
  reusable = (granularity == req.granularity and req.per_example_clip is None
              and set(req.want) <= set(want))
  if reusable:
    opt_stats = log_stats
  else:
    _, opt_stats = pstats.compute(
        loss_fn, state.params, batch, want=req.want, granularity=req.granularity,
        backend=backend, microbatch_size=microbatch_size, per_example_clip=req.per_example_clip)
  _, opt_state = opt.tx.update(opt_stats.mean, state.opt_state, state.params,
                               grad_stats=opt_stats)
  out = dict(pstats.summaries.layer_summaries(log_stats))
  out.update(diagnostics(opt_state, log_stats))
  return out


def eval_step(params: Any, batch: dict, *, loss_fn) -> jax.Array:
  """Mean loss over the batch (float32 scalar)."""
  return loss_fn(params, batch).mean()


class Steps:
  """The compiled functions of one run (each jitted once, with explicit shardings)."""

  def __init__(self, spec: ModelSpec, opt: Optimizer, mesh: Mesh, *, seq_len: int,
               backend: str = "auto", microbatch_size: int | None = None,
               stats_want: tuple[str, ...] = ("mean",), stats_granularity: str = "example"):
    self.spec, self.opt, self.mesh = spec, opt, mesh
    self.loss_fn = make_loss_fn(Transformer(spec))
    repl = mesh_lib.replicated(mesh)
    self.batch_sharding = mesh_lib.batch_sharding(mesh)

    init = make_init_fn(spec, opt.tx, seq_len)
    self.abstract_state = jax.eval_shape(init, jnp.int32(0))
    self.state_shardings = jax.tree.map(lambda _: repl, self.abstract_state)
    self.init = jax.jit(init, out_shardings=self.state_shardings)

    common = dict(loss_fn=self.loss_fn, opt=opt, backend=backend,
                  microbatch_size=microbatch_size)
    self.train = jax.jit(
        functools.partial(train_step, **common),
        in_shardings=(self.state_shardings, self.batch_sharding),
        out_shardings=(self.state_shardings, repl),
        # Only the state is donated: no output has the batch's shape (XLA cannot reuse
        # it), and donating a batch that the statistics step also reads changed the train
        # step's result on CPU (measured: a race), so the batch is not donated.
        donate_argnames=("state",))
    self.stats = jax.jit(
        functools.partial(stats_step, **common, want=tuple(stats_want),
                          granularity=stats_granularity),
        in_shardings=(self.state_shardings, self.batch_sharding), out_shardings=repl)
    self.eval = jax.jit(
        functools.partial(eval_step, loss_fn=self.loss_fn),
        in_shardings=(self.state_shardings.params, self.batch_sharding), out_shardings=repl)

  def abstract_sharded_state(self) -> TrainState:
    """ShapeDtypeStructs with shardings (the restore target for Orbax)."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        self.abstract_state, self.state_shardings)

  def put_batch(self, batch: dict) -> dict:
    """Host batch -> device arrays split over the 'data' axis."""
    return jax.device_put(
        {k: batch[k] for k in ("inputs", "targets")}, self.batch_sharding)

