"""The training state: a pytree of arrays (step, params, optimizer state, RNG key).

It is created directly with its shardings by a jitted init (no host copy of the
parameters), and saved / restored whole by Orbax (`checkpoint.py`). The data order
needs no state of its own: example i is a pure function of (data.seed, i), and the
examples seen (with the last update's batch size) are in the learning-rate
transformation's state (`pergrad.train.step.token_schedule`).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from pergrad.model import ModelSpec, init_params


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: number of updates done
  params: Any
  opt_state: Any
  rng: jax.Array  # uint32[2] raw key (reserved for stochastic layers / sampling)


def make_init_fn(spec: ModelSpec, tx: optax.GradientTransformation,
                 seq_len: int) -> Callable[[jax.Array], TrainState]:
  """seed (int32 scalar) -> TrainState, a pure function (jit it with out_shardings)."""

  def init(seed: jax.Array) -> TrainState:
    key = jax.random.PRNGKey(seed)
    init_key, rng = jax.random.split(key)
    params = init_params(spec, init_key, seq_len)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      opt_state=tx.init(params), rng=rng)

  return init
