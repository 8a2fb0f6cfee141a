"""The numbers a sweep varies, held in the optimizer's state (`optax.inject_hyperparams`).

    opt = build_optimizer(cfg, sched, total_steps=N, batch_size=B)
    opt.hparams                                   # Hparams of Python numbers (checked)
    state = opt.init(params, opt.hparams.as_arrays())   # the state holds them as arrays
    opt.numbers(state).lr                         # what the compiled step reads

`build_optimizer` builds the chain once, from an `Hparams`: the lr, β's and ε after
batch-size scaling, weight decay, the clipping norm, the schedule's step count, warmup, final
fraction and halving points, the DP-SGD noise seed. `inject` hands them to
`optax.inject_hyperparams`, so the optimizer state holds them (`state.hyperparams`) and the
train step reads them there: every point of an lr grid, every seed, every step count is the
same compiled program (served by JAX's persistent cache). What a config decides beyond these
numbers stays compiled in: the optimizer and its variant or placement, whether the chain
clips, decays weights or adds noise, the schedule's shape, the number of halving points, the
batch sizes. Each number is checked once, on its Python value; the transformations skip
their checks on traced values (`traced`).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax


class Hparams(NamedTuple):
  """The numbers `build_optimizer` reads from the config (module docstring)."""

  lr: Any  # the schedule's peak learning rate after batch-size scaling
  b1: Any
  b2: Any
  eps: Any
  eps_root: Any
  weight_decay: Any
  clip_norm: Any  # None: no clipping (structural)
  total_steps: Any  # the schedule's length N, in full-batch steps
  warmup_steps: Any
  final_lr_frac: Any
  halvings: Any  # the step schedule's halving points d_i (() or None: none)
  noise_seed: Any  # seeds the DP-SGD noise (train.seed)

  def as_arrays(self) -> Hparams:
    """float32 scalars (the halving points a float32 vector, None if there are none: no
    array of size 0, which Orbax cannot save; the seed int32), host NumPy arrays (no compiled
    conversion): what the optimizer state holds."""
    f32 = lambda x: None if x is None else np.asarray(x, np.float32)
    halvings = np.asarray(() if self.halvings is None else self.halvings, np.float32)
    return Hparams(*(f32(x) for x in self[:10]),
                   halvings=halvings.reshape(-1) if halvings.size else None,
                   noise_seed=np.asarray(self.noise_seed, np.int32))


def inject(chain: Callable[[Hparams], optax.GradientTransformation], hp: Hparams
           ) -> optax.GradientTransformationExtraArgs:
  """`optax.inject_hyperparams(chain)` over the fields of `hp`: its state holds
  `hp.as_arrays()` (`state.hyperparams`, float32; a None clip_norm stays structural) and
  each update applies `chain` of those numbers."""

  def inner(**numbers):
    return chain(Hparams(**numbers))

  keyword = inspect.Parameter.KEYWORD_ONLY
  inner.__signature__ = inspect.Signature(  # what inject_hyperparams binds: Hparams' fields
      [inspect.Parameter(f, keyword, default=None) for f in Hparams._fields])
  numbers = {f: x for f, x in hp.as_arrays()._asdict().items() if x is not None}
  return optax.inject_hyperparams(inner, hyperparam_dtype=jnp.float32)(**numbers)


def numbers(opt_state: Any) -> Hparams:
  """The numbers an `inject`ed optimizer state holds, as an Hparams (of arrays)."""
  held = opt_state.hyperparams
  return Hparams(**{f: held.get(f) for f in Hparams._fields})


def holding(opt_state: Any, hp: Hparams) -> Any:
  """`opt_state` holding the numbers of `hp` (arrays or tracers of `as_arrays`' structure)."""
  held = {f: x for f, x in hp._asdict().items() if f in opt_state.hyperparams}
  return opt_state._replace(hyperparams=held)


def traced(*values: Any) -> bool:
  """Whether any of `values` is a tracer: a number the optimizer's build has checked
  already (module docstring), which a transformation then does not check again."""
  return any(isinstance(v, jax.core.Tracer) for v in values)
