"""The numbers a sweep varies, held apart from the optimizer's structure.

    opt = build_optimizer(cfg, sched, total_steps=N, batch_size=B)
    opt.hparams                           # Hparams of Python numbers (checked)
    opt.at(opt.hparams.as_arrays())       # the same optimizer reading them as arrays

`build_optimizer` assembles every optimizer from an `Hparams`: the lr, β's and ε after
batch-size scaling, weight decay, the clipping norm, the schedule's step count, warmup, final
fraction and halving points, the DP-SGD noise seed. The train step takes them as an argument
(`pergrad.train.step`), so every point of an lr grid, every seed, every step count is the
same compiled program (served by JAX's persistent cache). What a config decides beyond these
numbers stays compiled in: the optimizer and its variant or placement, whether the chain
clips, decays weights or adds noise, the schedule's shape, the number of halving points, the
batch sizes. Each number is checked once, on its Python value; the transformations skip
their checks on traced values (`traced`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np


class Hparams(NamedTuple):
  """What `build_optimizer` reads from the config's numbers (module docstring). The
  first six are `pergrad.optim.schedule.ScaledHparams`' fields, what a builder reads."""

  peak_lr: Any  # the schedule's peak after batch-size scaling
  b1: Any
  b2: Any
  eps: Any
  eps_root: Any
  batch_ratio: Any  # κ_B = B / B_ref
  weight_decay: Any
  clip_norm: Any  # None: no clipping (structural)
  total_steps: Any  # the schedule's length N, in full-batch steps
  warmup_steps: Any
  final_lr_frac: Any
  halvings: Any  # the step schedule's halving points d_i (() for other schedules)
  noise_seed: Any  # seeds the DP-SGD noise (train.seed)

  def as_arrays(self) -> Hparams:
    """float32 scalars (the halving points a float32 vector, the seed int32), host NumPy
    arrays (no compiled conversion): what the compiled step takes."""
    f32 = lambda x: None if x is None else np.asarray(x, np.float32)
    return Hparams(*(f32(x) for x in self[:11]),
                   halvings=np.asarray(self.halvings, np.float32).reshape(-1),
                   noise_seed=np.asarray(self.noise_seed, np.int32))


def traced(*values: Any) -> bool:
  """Whether any of `values` is a tracer: a number the optimizer's build has checked
  already (module docstring), which a transformation then does not check again."""
  return any(isinstance(v, jax.core.Tracer) for v in values)
