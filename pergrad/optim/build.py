"""`build_optimizer`: config -> (transformation, statistics request, learning-rate schedule).

Every optimizer is one optax chain

    [track_snr(b1)] -> [clip_by_global_norm] -> direction -> [add_decayed_weights] -> -lr(step)

whose update the train step calls alike for all of them:

    updates, state = opt.tx.update(stats.mean, state, params, grad_stats=stats)

Directions: sgd: ḡ; momentum: optax.trace(b1) (heavy ball); adam/adamw:
`scale_by_adam_family("adam")` (= optax.scale_by_adam); sign:
`scale_by_sign_placement`; adam_family: `scale_by_adam_family(variant)`. Weight
decay is decoupled and multiplied by the learning rate (optax.adamw's convention),
on every parameter. adam and adamw differ only in their config defaults.
"""

from __future__ import annotations

import enum
from typing import Any

import optax

from pergrad.config import OptimizerConfig, ScheduleConfig
from pergrad.optim.adam_family import request_for_variant, scale_by_adam_family
from pergrad.optim.common import with_float32_state
from pergrad.optim.diagnostics import track_snr as track_snr_tx
from pergrad.optim.schedule import ScaledHparams, make_schedule, scale_hparams
from pergrad.optim.sign import check_beta, request_for_placement, scale_by_sign_placement
from pergrad.optim.types import Optimizer, StatsRequest

NAMES = ("sgd", "momentum", "adam", "adamw", "sign", "adam_family")


def _value(x: Any) -> Any:
  """Enum members (from the typed config) -> their string values."""
  return x.value if isinstance(x, enum.Enum) else x


def scaled_hparams(opt: OptimizerConfig, batch_size: int) -> ScaledHparams:
  """Learning rate, β's and ε after batch-size scaling, for logging."""
  return scale_hparams(lr=opt.lr, b1=opt.b1, b2=opt.b2, eps=opt.eps, eps_root=opt.eps_root,
                       lr_scaling=_value(opt.lr_scaling), sde_scaling=bool(opt.sde_scaling),
                       batch_size=batch_size, ref_batch_size=opt.ref_batch_size)


def _check(opt: OptimizerConfig, name: str) -> None:
  if name not in NAMES:
    raise ValueError(f"unknown optimizer {name!r}; choose one of {NAMES}")
  if not opt.lr > 0:
    raise ValueError(f"optimizer.lr={opt.lr} must be positive")
  if opt.weight_decay < 0:
    raise ValueError(f"optimizer.weight_decay={opt.weight_decay} must be >= 0")
  if opt.clip_norm is not None and opt.clip_norm <= 0:
    raise ValueError(f"optimizer.clip_norm={opt.clip_norm} must be positive (or null)")
  check_beta(opt.b1, "optimizer.b1")
  check_beta(opt.b2, "optimizer.b2")
  if opt.eps < 0 or opt.eps_root < 0:
    raise ValueError(f"optimizer.eps={opt.eps} and optimizer.eps_root={opt.eps_root} "
                     "must be >= 0")
  if name == "sign" and _value(opt.placement) == "token" and opt.per_example_clip is not None:
    raise ValueError("optimizer.per_example_clip clips whole examples and cannot go with "
                     "placement=token; set optimizer.per_example_clip=null")


def build_optimizer(opt: OptimizerConfig, sched: ScheduleConfig, *, total_steps: int,
                    batch_size: int, track_snr: bool = False) -> Optimizer:
  """Builds the optimizer of `opt` with the schedule of `sched` (module docstring).

  Args:
    opt: optimizer config (dataclass or DictConfig with the same fields).
    sched: schedule config.
    total_steps: number of updates (the cosine decays over it).
    batch_size: global batch size B (for lr_scaling).
    track_snr: add `track_snr(b1)` to the chain, so that
      `pergrad.optim.diagnostics` can report the EMA SNR; it adds 'sq' to the request.

  Returns:
    Optimizer(tx, request, learning_rate); raises ValueError on a bad setting,
    before any compute.
  """
  name = _value(opt.name)
  _check(opt, name)
  hp = scaled_hparams(opt, batch_size)
  lr = make_schedule(_value(sched.name), hp.peak_lr, total_steps=total_steps,
                     warmup_steps=sched.warmup_steps, final_lr_frac=sched.final_lr_frac)

  clip_inside = name in ("adam", "adamw", "adam_family")  # clipping that the stats follow
  want, granularity = ("mean",), "example"
  if name == "sgd":
    direction = optax.identity()
  elif name == "momentum":
    direction = optax.trace(decay=hp.b1)
  elif name in ("adam", "adamw"):
    direction = scale_by_adam_family("adam", hp.b1, hp.b2, hp.eps, hp.eps_root,
                                     clip_norm=opt.clip_norm)
  elif name == "sign":
    placement = _value(opt.placement)
    direction = scale_by_sign_placement(placement, hp.b1)
    want, granularity = request_for_placement(placement)
  else:
    variant = _value(opt.variant)
    direction = scale_by_adam_family(variant, hp.b1, hp.b2, hp.eps, hp.eps_root, opt.mix_a,
                                     opt.mix_b, clip_norm=opt.clip_norm)
    want = request_for_variant(variant)

  parts = []
  if track_snr:
    parts.append(track_snr_tx(hp.b1))
    want = want if "sq" in want else want + ("sq",)
  if opt.clip_norm is not None and not clip_inside:
    parts.append(optax.clip_by_global_norm(opt.clip_norm))
  parts.append(direction)
  if opt.weight_decay > 0:
    parts.append(optax.add_decayed_weights(opt.weight_decay))
  parts.append(optax.scale_by_learning_rate(lr))

  request = StatsRequest(want=want, granularity=granularity,
                         per_example_clip=opt.per_example_clip)
  return Optimizer(tx=with_float32_state(optax.chain(*parts)), request=request,
                   learning_rate=lr)
