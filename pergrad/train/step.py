"""The jitted functions of training: init, train step (plain and logging), eval step.

    state, metrics = train_step(state, batch)            # metrics: loss, grad_norm, ...
    state, metrics = train_step(state, batch, heldout)   # logging step with sign agreement
    loss = eval_step(params, batch)

`train_step` is pure and always returns (state, metrics). It asks the statistics engine
ONCE per step (`pergrad.stats.compute`) and feeds the result to the optimizer and to the
trackers beside it (`Optimizer.snr`, `Optimizer.gns`), whose states it keeps in the
`TrainState` with the examples seen, the batch size and the learning rate of the update.
A statistics-logging step runs a second compiled variant that adds the logged statistics
after the update and apart from it (behind an `optimization_barrier`), so logging never
changes the trajectory (bit for bit: tested). `Steps` jits and compiles each function ahead
of time over a 1-D ('data',) mesh, once per allowed batch size: no step of the loop compiles.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

import pergrad.stats as pstats
from pergrad.config.plan import RunPlan
from pergrad.loss import make_loss_fn
from pergrad.model import Transformer
from pergrad.optim import Optimizer, diagnostics, gns_metrics
from pergrad.optim.hparams import numbers
from pergrad.stats import sign_agreement
from pergrad.stats.sign_agreement import lag_init
from pergrad.stats.types import GradStats
from pergrad.train import mesh as mesh_lib
from pergrad.train import plain
from pergrad.train.heldout import SignLog, directions, sign_metrics
from pergrad.train.state import TrainState, make_init_fn


def train_step(state: TrainState, batch: dict, heldout: GradStats | None = None, *, loss_fn,
               opt: Optimizer, request: pstats.StatsRequest, backend: str,
               options: pstats.StatsOptions, log_request: pstats.StatsRequest | None = None,
               log_backend: str | None = None, sign_lag: float = 0.5,
               platform: str | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update θ_{k+1} = θ_k + tx(ḡ_k, stats_k): (new state, metrics of step k).

  Metrics: loss (mean over the batch at θ_k), grad_norm ‖ḡ‖, update_norm,
  param_norm ‖θ_{k+1}‖, lr (the effective learning rate of this update, which depends on
  the examples seen and on B = the batch's static leading size); "gns/..."
  when the GNS is tracked (`gns_metrics`, every step); with `log_request` (a logging
  step), also "stats/..." and "opt/..." scalars; with `heldout` (the held-out statistics
  at θ_k), also the sign-agreement counts "sign.../..." of the update and of the stage
  directions against the held-out mean and its trailing mean (ρ = `sign_lag`), whose state
  `TrainState.lag` such a step updates and every other step carries through
  (`pergrad.train.heldout`). The update and the metrics above are the same operations with
  or without them (module docstring). The optimizer's numbers (lr, β's, ε, ...) are those
  its state holds (`pergrad.optim.hparams`), not constants. `backend`/`log_backend`:
  decided ones (`plain.decided`), not "auto"; `platform`: the mesh's (default JAX's).

  The update's statistics are those the optimizer and the trackers read (`plan.stats.request`;
  for "mean" alone the plain `jax.value_and_grad` path). The logging variant adds the
  per-layer summaries (`pergrad.stats.summaries`, "stats/...") and the diagnostics of the new
  optimizer and SNR-tracker states (`pergrad.optim.diagnostics`, "opt/..."); everything it
  reads from the update (θ_{k−1}, the batch, the statistics, the new states, the update) passes
  an `optimization_barrier`, so XLA neither fuses the logged computation into the update's nor
  shares its intermediates. When the logged request is the optimizer's (same backend), the
  logged statistics are the update's own; otherwise a second backward pass at θ_{k−1} on the
  same batch (the cost of logging).
  """
  B = batch["inputs"].shape[0]  # static: one compiled step per batch size
  if pstats.backends.get(backend).statistics:  # in chunks where faster (`plain.chunked`)
    loss, stats = pstats.compute(loss_fn, state.params, batch, request,
                                 plain.chunked(options, B, backend, platform), backend=backend)
  else:  # ḡ alone: the fastest exact path (microbatched on CPU)
    loss, stats = plain.mean_gradient(loss_fn, state.params, batch, request, options, backend,
                                      platform)
  grads = stats.mean
  seen, hparams = state.examples_seen, numbers(state.opt_state)
  updates, opt_state = opt.tx.update(grads, state.opt_state, state.params, grad_stats=stats,
                                     examples_seen=seen, batch_size=B)
  params = optax.apply_updates(state.params, updates)
  new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                         examples_seen=seen + B, batch_size=jnp.int32(B),
                         lr=opt.lr(state.opt_state, seen, B),
                         snr=opt.snr.update(state.snr, stats, hparams),
                         gns=opt.gns.update(state.gns, stats, hparams), lag=state.lag)
  metrics = {
      "loss": loss,
      "grad_norm": optax.tree.norm(grads),
      "update_norm": optax.tree.norm(updates),
      "param_norm": optax.tree.norm(params),
      "lr": new_state.lr,
      **gns_metrics(new_state.gns),  # every step when the GNS is tracked
  }
  if log_request is None and heldout is None:
    return new_state, metrics
  # The logged computation reads the update's inputs and results through barriers only.
  params_k, batch_k = jax.lax.optimization_barrier((state.params, batch))
  stats, opt_state, snr, updates = jax.lax.optimization_barrier(
      (stats, opt_state, new_state.snr, updates))
  opt_stats = stats
  if log_request is not None:
    if (log_request, log_backend) != (request, backend):
      stats = pstats.compute(loss_fn, params_k, batch_k, log_request,
                             plain.chunked(options, B, log_backend, platform),
                             backend=log_backend)[1]
    metrics.update(pstats.summaries.layer_summaries(stats))
    metrics.update(diagnostics(stats, opt.moments(opt_state), snr))
  if heldout is not None:
    if not isinstance(state.lag, sign_agreement.LagState):
      raise ValueError("held-out statistics need the lag state: make_init_fn(lag=True)")
    lag = sign_agreement.lag_update(state.lag, sign_agreement.current(heldout), sign_lag)
    new_state = new_state.replace(lag=lag)
    metrics.update(sign_metrics(directions(updates, opt_stats, stats, snr), heldout, lag))
  return new_state, metrics


def eval_step(params: Any, batch: dict, *, loss_fn) -> jax.Array:
  """Mean loss over the batch (float32 scalar)."""
  return loss_fn(params, batch).mean()


class Steps:
  """The compiled functions of one run (each jitted once, with explicit shardings).

  Explicit in/out shardings (batch split on 'data', state replicated), the state donated to
  the train step, the state's shardings from `jax.eval_shape` of the init. Both train-step
  variants are compiled ahead of time, once per allowed batch size of the batch schedule
  (`pergrad.train.batch_schedule`).
  """

  def __init__(self, plan: RunPlan, mesh: Mesh, loss_fn=None):
    """loss_fn: the per-example loss of the run's model (default: `plan.model`'s
    Transformer); its statistics backends are decided for it here (`plain.decided`)."""
    self.mesh = mesh
    opt, sp = plan.optimizer, plan.stats
    self.loss_fn = make_loss_fn(Transformer(plan.model)) if loss_fn is None else loss_fn
    platform = mesh.devices.flat[0].platform
    repl = mesh_lib.replicated(mesh)
    self.batch_sharding = mesh_lib.batch_sharding(mesh)

    # The optimizer's numbers are the init's arguments, which the optimizer state holds,
    # not constants: one program per run shape.
    self.hparams = jax.device_put(opt.hparams.as_arrays(), repl)
    init = make_init_fn(plan.model, opt, plan.data.seq_len, lag=bool(sp.sign_agreement))
    self.abstract_state = jax.eval_shape(init, jnp.int32(0), self.hparams)
    self.state_shardings = jax.tree.map(lambda _: repl, self.abstract_state)
    self.init_jit = jax.jit(init, out_shardings=self.state_shardings)
    self.init = lambda seed: self.init_jit(seed, self.hparams)
    # What a resumed run sets when its checkpoint lacks the lag state or holds an unwanted
    # one (stats.sign_agreement is resumable; older checkpoints have none).
    lag = (jax.jit(lag_init, out_shardings=self.state_shardings.lag) if sp.sign_agreement
           else lambda params: optax.EmptyState())
    self.fresh = {"lag": lambda state: lag(state.params)}

    def abstract_batch(B):
      return {k: jax.ShapeDtypeStruct((B, plan.data.seq_len), jnp.int32,
                                      sharding=self.batch_sharding)
              for k in ("inputs", "targets")}

    sp = plain.decided(sp, self.loss_fn, self.abstract_state.params,
                       abstract_batch(plan.batch.max_batch_size), platform)
    plan = dataclasses.replace(plan, stats=sp)
    self.stats_plan, options = sp, sp.options

    self.logs_at = sp.logs_at
    self.sign = (SignLog(plan, self.loss_fn, mesh, self.abstract_sharded_state().params)
                 if sp.sign_agreement and sp.log_request is not None else None)

    def jit_step(log_request=None, log_backend=None, heldout=False):
      step = functools.partial(train_step, loss_fn=self.loss_fn, opt=opt, request=sp.request,
                               backend=sp.backend, options=options, log_request=log_request,
                               log_backend=log_backend, sign_lag=sp.sign_lag,
                               platform=platform)

      return jax.jit(
          step,
          in_shardings=(self.state_shardings, self.batch_sharding)
          + ((repl,) if heldout else ()),
          out_shardings=(self.state_shardings, repl),
          # The batch is not donated: no output has its shape (XLA could not reuse it).
          donate_argnames=("state",))

    def compiled(fn, B, *heldout):  # ahead of time, before the loop
      return fn.lower(self.abstract_sharded_state(), abstract_batch(B), *heldout).compile()

    self.train_jit = jit_step()
    self.logged_jit = logged_jit = (
        jit_step(sp.log_request, sp.log_backend, self.sign is not None)
        if sp.log_request is not None else None)
    heldout = (self.sign.abstract_stats,) if self.sign is not None else ()
    sizes = plan.batch.sizes if plan.batch.kind != "fixed" else (plan.batch.max_batch_size,)
    # One compiled pair per allowed batch size (buckets), so a batch schedule never
    # compiles in the loop.
    self.train = {B: compiled(self.train_jit, B) for B in sizes}
    self.train_logged = ({B: compiled(logged_jit, B, *heldout) for B in sizes}
                         if logged_jit is not None else None)
    self.eval = jax.jit(
        functools.partial(eval_step, loss_fn=self.loss_fn),
        in_shardings=(self.state_shardings.params, self.batch_sharding), out_shardings=repl)

  def step(self, state: TrainState, batch: dict, k: int, heldout: dict | None = None):
    """Update k (1-based) with the batch's size: the logging variant on statistics-logging
    steps, there with the sign agreement against the `heldout` batch (a global batch,
    `put_batch`) when the run logs it (`pergrad.train.heldout`)."""
    B = batch["inputs"].shape[0]
    if not self.logs_at(k):
      return self.train[B](state, batch)
    if self.sign is None:
      return self.train_logged[B](state, batch)
    if heldout is None:
      raise ValueError(f"step {k} logs the sign agreement (stats.sign_agreement="
                       f"{self.sign.n_h}) but got no held-out batch.")
    stats = self.sign.stats(state.params, heldout)  # at θ_{k-1}, before the donation
    return self.train_logged[B](state, batch, stats)

  def abstract_sharded_state(self) -> TrainState:
    """ShapeDtypeStructs with shardings (the restore target for Orbax)."""
    return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                        self.abstract_state, self.state_shardings)

  def put_batch(self, batch: dict) -> dict:
    """This process's rows of the global batch -> global arrays split over 'data'."""
    return {k: jax.make_array_from_process_local_data(self.batch_sharding, batch[k])
            for k in ("inputs", "targets")}
