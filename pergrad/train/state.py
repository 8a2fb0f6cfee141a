"""The training state: a pytree of arrays, everything training needs to know.

    step           int32: updates done
    params         the model's parameters θ_k
    opt_state      the optimizer chain's state (`pergrad.optim.build`), which holds the
                   optimizer's numbers: lr, β's, ε, ... (`pergrad.optim.hparams`)
    examples_seen  int32: examples seen by the updates so far (the learning-rate
                   schedule is indexed by it, `pergrad.optim.schedule`)
    batch_size     int32: B of the last update (0 before the first)
    lr             float32: the last update's learning rate (0 before the first)
    snr, gns       the trackers' states beside the optimizer (`pergrad.optim.tracker`;
                   `optax.EmptyState()` when off); gns holds the controller's B_simple
    lag            the trailing mean of the held-out means of the sign-agreement log
                   (`pergrad.stats.sign_agreement.LagState`, updated on its logging steps;
                   `optax.EmptyState()` when stats.sign_agreement=0)

It is created directly with its shardings by a jitted init (no host copy of the
parameters), and saved / restored whole by Orbax (`checkpoint.py`). The data order
needs no state of its own: example i is a pure function of (data.seed, i).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from pergrad.model import ModelSpec, init_params
from pergrad.optim import Optimizer
from pergrad.stats.sign_agreement import lag_init


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  examples_seen: jax.Array
  batch_size: jax.Array
  lr: jax.Array
  snr: Any
  gns: Any
  lag: Any = optax.EmptyState()


def make_init_fn(spec: ModelSpec, opt: Optimizer, seq_len: int,
                 lag: bool = False) -> Callable[..., TrainState]:
  """(seed (int32 scalar), hparams) -> TrainState, a pure function (jit it with
  out_shardings); hparams: the optimizer's numbers as arrays, which its state holds
  (`Optimizer.init`; None: its own), so that one compiled init serves every seed and
  learning rate; `lag`: with the sign agreement's lag state."""

  def init(seed: jax.Array, hparams: Any = None) -> TrainState:
    init_key = jax.random.split(jax.random.PRNGKey(seed))[0]
    params = init_params(spec, init_key, seq_len)
    zero = lambda dtype=jnp.int32: jnp.zeros((), dtype)
    return TrainState(step=zero(), params=params, opt_state=opt.init(params, hparams),
                      examples_seen=zero(), batch_size=zero(), lr=zero(jnp.float32),
                      snr=opt.snr.init(params), gns=opt.gns.init(params),
                      lag=lag_init(params) if lag else optax.EmptyState())

  return init
