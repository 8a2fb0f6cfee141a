"""The fuzzer's shapes of `params` as passed (`fuzz_models.TREES`): as the model holds them,
nested under a key with an unused leaf, or the output layer's leaves alone with the rest a
frozen constant closed over."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


def passed_name(m) -> str:
  """The top-level name of the leaves a "frozen" model passes (its output layer's)."""
  return "dhead" if m["head"] == "dense" else "wte"


def as_passed(m, model_loss, params, penalty, first, rng):
  """(loss_fn, params) with params passed as m["tree"] says (module constants: TREES), the
  penalty on the passed leaves."""
  if m["tree"] == "as_is":
    return lambda p, b: model_loss(p, b) + penalty(p, first), params
  if m["tree"] == "frozen":
    if m["frontend"] == "nnx":
      passed, frozen = nnx.split_state(params, nnx.PathContains(passed_name(m)), ...)
      join = lambda hp: nnx.merge_state(frozen, hp)
    else:
      passed = {passed_name(m): params[passed_name(m)]}
      frozen = {k: v for k, v in params.items() if k != passed_name(m)}
      join = lambda hp: {**frozen, **hp}
    leaf0 = lambda p: jax.tree.leaves(p)[0]
    return lambda hp, b: model_loss(join(hp), b) + penalty(hp, leaf0), passed
  extra = {"unused": jnp.asarray(rng.standard_normal((2, 3)), np.float32)}
  if m["tree"] == "extra" and m["frontend"] != "nnx":  # beside the model's own leaves
    inner = lambda q: {k: v for k, v in q.items() if k != "unused"}
    return (lambda q, b: model_loss(inner(q), b) + penalty(inner(q), first),
            {**params, **extra})
  wrapped = {"model": params, **(extra if m["tree"] == "extra" else {})}
  return lambda q, b: model_loss(q["model"], b) + penalty(q["model"], first), wrapped
