"""The loop's plain train step against a nanodo-style step, paired (`scripts/
bench_throughput.py --nanodo`).

nanodo-style: `optax.adamw` with the plan's learning-rate schedule, β's, ε and weight
decay, updated by `jax.value_and_grad` of the mean loss of the same model, jitted with
its params and optimizer state donated. Ours: the compiled plain step the training loop
runs (`pergrad.train.step.Steps.train[B]`: its plain backend, microbatching, metrics and
state). Both on the same random tokens, timed in the bracketed order of
`pergrad.bench.paired` (nanodo's the baseline): ratio ours / nanodo per rep, quartiles.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pergrad.bench.paired import bracketed, paired_ratios, quartiles


def versus_nanodo(plan, reps: int = 8) -> dict:
  """{"ratio": quartiles of ours / nanodo-style, "nanodo_s": median seconds, "backend"}."""
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

  nano = jax.jit(nanodo_step, donate_argnums=(0, 1))
  state = steps.init(np.int32(0))
  theirs = [jax.tree.map(jnp.copy, state.params)]
  theirs.append(tx.init(theirs[0]))
  nano_batch = {k: jnp.asarray(v) for k, v in host.items()}

  def ours():
    nonlocal state
    t0 = time.perf_counter()
    state, m = steps.train[B](state, batch, steps.hparams)
    jax.block_until_ready(m)
    return time.perf_counter() - t0

  def nanodo():
    t0 = time.perf_counter()
    params, opt_state, loss = nano(*theirs, nano_batch)
    theirs[:] = [params, opt_state]
    jax.block_until_ready(loss)
    return time.perf_counter() - t0

  ours(), nanodo()  # compiles
  base, var = [nanodo()], []
  for _ in range(reps):
    var.append(ours())
    base.append(nanodo())
  return {"ratio": quartiles(paired_ratios(var, bracketed(base))),
          "nanodo_s": float(np.median(base)), "backend": plan.stats.backend}
