"""The sign-placement family: where the sign sits in "g_i -> mean -> EMA -> update".

With per-example gradients g_i (i = 1..B), their mean ḡ and EMA_β(x)_t =
β·EMA_{t-1} + (1-β)·x_t (debiased by 1/(1-β^t) unless stated), the update u is:

    example:  u = EMA_β( mean_i sign(g_i) )      sign before the batch mean
    token:    u = EMA_β( mean_j sign(c_j) )      same over per-token contributions c_j
    batch:    u = EMA_β( sign(ḡ) )                sign of the batch mean; β = 0: signSGD
    ema:      u = sign( EMA_β(ḡ) )                SignEMA (Signum) = optax.signum

(times -lr, later in the chain). Only SignEMA is confirmed from the paper (Roulet &
Agarwala, arXiv 2510.00236) and `optax.signum`; the other formulas and debiasing the EMA of
signs (every placement's first steps full-sized; no change to `ema`) are this project's
reading. Each placement chains optax's pieces (`optax.ema`, `optax.scale_by_sign`) and one
step that reads the mean of signs from the `grad_stats` extra argument.
"""

from __future__ import annotations

import optax

from pergrad.fields import check_decay
from pergrad.optim.common import f32, require_stats
from pergrad.optim.configs import Placement
from pergrad.optim.hparams import traced
from pergrad.stats.request import StatsRequest

PLACEMENTS = Placement.values()


def sign_mean_from_stats(granularity: str) -> optax.GradientTransformationExtraArgs:
  """Replaces the incoming updates by mean_i sign(g_i) read from `grad_stats`."""
  who = f"sign placement '{granularity}'"

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del updates, params, extra_args
    stats = require_stats(grad_stats, who, need=("sign",), granularity=granularity)
    return f32(stats.sign_mean), state

  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update_fn)


def scale_by_sign_placement(placement: str, beta: float, *, debias: bool = True
                            ) -> optax.GradientTransformationExtraArgs:
  """The direction u of the sign family (module docstring); the incoming updates are ḡ.

  Args:
    placement: "example" | "token" | "batch" | "ema".
    beta: EMA decay in [0, 1).
    debias: divide the EMA by 1 - β^t (ignored by "ema", where it cannot matter).

  Returns:
    A transformation whose `update(updates, state, params, grad_stats=...)` needs
    `grad_stats` with the sign statistic for "example"/"token", and ignores it
    for "batch"/"ema".
  """
  if placement not in PLACEMENTS:
    raise ValueError(f"unknown sign placement {placement!r}; choose one of {PLACEMENTS}")
  if not traced(beta):  # else checked where built
    check_decay(beta)
  if placement == "ema":
    # Exactly optax.signum without the learning rate: no debiasing before a sign.
    return optax.chain(optax.ema(beta, debias=False), optax.scale_by_sign())
  if placement == "batch":
    return optax.chain(optax.scale_by_sign(), optax.ema(beta, debias=debias))
  return optax.chain(sign_mean_from_stats(placement), optax.ema(beta, debias=debias))


def request_for_placement(placement: str) -> StatsRequest:
  """The statistics that `scale_by_sign_placement(placement)` reads."""
  if placement in ("example", "token"):
    return StatsRequest(want=("mean", "sign"), granularity=placement)
  return StatsRequest()
