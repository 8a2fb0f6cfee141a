"""The loop's plain train step against a nanodo-style step, paired (`scripts/
bench_throughput.py --nanodo`).

nanodo-style: `optax.adamw` with the plan's learning-rate schedule, β's, ε and weight
decay, updated by `jax.value_and_grad` of the mean loss of the same model, jitted with
its params and optimizer state donated. Ours: the compiled plain step the training loop
runs (`pergrad.train.step.Steps.train[B]`: its plain backend, microbatching, metrics and
state). Beside them, two controls that bound what a ratio can show:
  self   nanodo's step timed against a second copy of itself: the noise floor (no bound
         on ours is tighter than its interval's upper end, `pergrad.bounds.floored`);
  grad   nanodo's gradient alone (`jax.value_and_grad`, then θ − 1e-9 ḡ): the floor of any
         exact step of nanodo's FLOPs on the whole batch (the optimizer removed).
One rep times `steps_per_rep` consecutive steps of each program (one step of the tiny model
is tens of ms, too short against the machine's jitter), in rounds whose order alternates
(nanodo, ours, self, grad; then reversed), so drift hits all alike; rep i gives
ratio_i = t_i / t_nanodo,i, by wall clock and by the process's CPU time (`time.
process_time`, all threads: steadier when other processes share the cores); each as its
median and location (`paired.summary`).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pergrad.bench.paired import paired_ratios, summary


def _timed(step, steps: int) -> tuple[float, float]:
  """(wall, CPU) seconds per step of `steps` calls of `step`, synchronised at the end."""
  c0, t0 = time.process_time(), time.perf_counter()
  jax.block_until_ready([step() for _ in range(steps)][-1])
  return (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps


def versus_nanodo(plan, reps: int = 8, steps_per_rep: int = 5) -> dict:
  """{"ratio", "cpu_ratio": `summary` of ours / nanodo-style; "self", "grad": those of the
  controls (module docstring), "nanodo_s": median seconds per step, "backend"}."""
  from pergrad.loss import make_loss_fn
  from pergrad.model import Transformer
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps

  steps = Steps(plan, make_mesh())
  B, T = plan.data.batch_size, plan.data.seq_len
  tokens = np.random.default_rng(0).integers(0, plan.model.vocab_size, (B, T + 1), np.int32)
  host = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  batch = steps.put_batch(host)
  hp = plan.optimizer.hparams
  tx = optax.adamw(plan.optimizer.learning_rate, b1=hp.b1, b2=hp.b2, eps=hp.eps,
                   weight_decay=hp.weight_decay)
  loss_fn = make_loss_fn(Transformer(plan.model))

  def nanodo_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(p, batch).mean())(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  def grad_step(params, opt_state, batch):
    loss, grads = jax.value_and_grad(lambda p: loss_fn(p, batch).mean())(params)
    return jax.tree.map(lambda p, g: p - 1e-9 * g, params, grads), opt_state, loss

  state = steps.init(np.int32(0))
  nano_batch = {k: jnp.asarray(v) for k, v in host.items()}

  def theirs(fn):  # a donated (params, opt_state) pair of its own per program
    jitted = jax.jit(fn, donate_argnums=(0, 1))
    carry = [jax.tree.map(jnp.copy, state.params)]
    carry.append(tx.init(carry[0]))

    def step():
      *carry[:], loss = jitted(*carry, nano_batch)
      return loss
    return step

  def ours():
    nonlocal state
    state, m = steps.train[B](state, batch)
    return m

  programs = {"nanodo": theirs(nanodo_step), "ours": ours, "self": theirs(nanodo_step),
              "grad": theirs(grad_step)}
  for step in programs.values():
    _timed(step, 2)  # compiles, warms
  wall, cpu = {k: [] for k in programs}, {k: [] for k in programs}
  for i in range(reps):
    for name in list(programs)[::1 if i % 2 == 0 else -1]:
      w, c = _timed(programs[name], steps_per_rep)
      wall[name].append(w)
      cpu[name].append(c)
  ratio = lambda t, k: summary(paired_ratios(t[k], t["nanodo"]))
  return {"ratio": ratio(wall, "ours"), "cpu_ratio": ratio(cpu, "ours"),
          "self": {"ratio": ratio(wall, "self"), "cpu_ratio": ratio(cpu, "self")},
          "grad": {"ratio": ratio(wall, "grad"), "cpu_ratio": ratio(cpu, "grad")},
          "nanodo_s": float(np.median(wall["nanodo"])), "steps_per_rep": steps_per_rep,
          "backend": steps.stats_plan.backend}
