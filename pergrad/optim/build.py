"""`build_optimizer`: optimizer config -> Optimizer (transformation, statistics request,
schedule, trackers, and what the diagnostics read of it).

Every optimizer is one optax chain

    [clip_by_global_norm] -> direction -> [add_decayed_weights] -> -lr(examples seen, B)

whose update the train step calls alike for all of them:

    updates, state = opt.tx.update(stats.mean, state, params, grad_stats=stats,
                                   examples_seen=seen, batch_size=B)

The direction and the statistics it reads come from the optimizer's registry entry
(`pergrad.optim.configs.REGISTRY`; the built-ins: `pergrad.optim.builders`). The last link
(`scale_by_token_schedule`) is stateless: it indexes the lr schedule by the examples seen
(`pergrad.optim.schedule`). Weight decay is decoupled and multiplied by the lr (optax.adamw's
convention), on every parameter. The chain is built once; its numbers (lr, β's, ε, ...) enter
by `optax.inject_hyperparams` and live in its state (`pergrad.optim.hparams`).
"""

from __future__ import annotations

import importlib

import optax

from pergrad.optim import configs
from pergrad.optim.common import with_float32_state
from pergrad.optim.dp_noise import add_clipped_noise
from pergrad.optim.hparams import Hparams, inject, numbers
from pergrad.optim.moments import Moments
from pergrad.optim.schedule import (
  ScaledHparams,
  ScheduleConfig,
  by_examples,
  decay_steps,
  scale_by_token_schedule,
  scale_hparams,
  schedule_of,
)
from pergrad.optim.snr import track_snr as snr_tracker
from pergrad.optim.tracker import OFF, Tracker
from pergrad.optim.types import Optimizer, no_moments
from pergrad.stats.request import StatsRequest


def scaled_hparams(opt: configs.OptimizerConfig, batch_size: int) -> ScaledHparams:
  """Learning rate, β's and ε after batch-size scaling, for logging (an optimizer without
  β's or ε, e.g. sgd, gets the unused placeholders 0)."""
  get = lambda key: getattr(opt, key, 0.0)
  return scale_hparams(lr=opt.lr, b1=get("b1"), b2=get("b2"), eps=get("eps"),
                       eps_root=get("eps_root"), lr_scaling=opt.lr_scaling,
                       sde_scaling=bool(getattr(opt, "sde_scaling", False)),
                       batch_size=batch_size, ref_batch_size=opt.ref_batch_size)


def _builder(name: str):
  build = configs.REGISTRY.get(name).build
  if isinstance(build, str):
    module, _, fn = build.partition(":")
    build = getattr(importlib.import_module(module), fn)
  return build


def build_optimizer(opt: configs.OptimizerConfig, sched: ScheduleConfig, *, total_steps: int,
                    batch_size: int, track_snr: bool = False, gns: Tracker | None = None,
                    gns_layers: tuple[str, ...] = (),
                    batch_lr_scaling: str = "none", batch_lr_ref: int | None = None,
                    seed: int = 0) -> Optimizer:
  """Builds the optimizer of `opt` with the schedule of `sched` (module docstring).

  Args:
    opt: the optimizer's config dataclass (`pergrad.optim.optimizer_config(name, ...)`),
      checked on construction.
    sched: schedule config (checked on construction).
    total_steps: number of updates (the cosine decays over it).
    batch_size: global batch size B (for lr_scaling); with a batch-size schedule, the
      largest size, B_max (the schedule is indexed by examples seen / B_max).
    track_snr: the tracker `track_snr()` of the optimizer's b1 beside the chain
      (Optimizer.snr), so that `pergrad.optim.diagnostics` can report the EMA SNR; it adds
      'sq' to the request.
    gns: a GNS tracker (`pergrad.optim.noise_scale.track_gns`) beside the chain
      (Optimizer.gns); it adds 'norms' (per-example squared norms, every step) of the
      leaves `gns_layers` (layer types or path patterns; (): all) to the request.
    batch_lr_scaling: lr x (B / B_ref)^κ' for an update of B examples (none, sqrt,
      linear: κ' = 0, 1/2, 1); B_ref = batch_lr_ref (None: batch_size).
    seed: seeds the DP-SGD noise (`add_clipped_noise`) when optimizer.noise_multiplier > 0.

  Returns:
    Optimizer(tx, request, learning_rate, schedule, snr, gns, hparams, moments); raises
    ValueError on a bad setting, before any compute.

  The chain is built once, its numbers held in its state (`pergrad.optim.hparams.inject`);
  the diagnostics' trackers sit beside it (`_request`).
  """
  build = _builder(opt.name)
  if total_steps < 1:
    raise ValueError(f"total_steps={total_steps} must be >= 1")
  by_tokens = (batch_size, batch_lr_scaling, batch_lr_ref, sched.name == "step")
  by_examples(lambda tau: tau, *by_tokens)  # checks batch_lr_scaling before any compute
  hp = hparams_of(opt, sched, total_steps=total_steps, batch_size=batch_size, seed=seed)

  def lr_schedule(hp: Hparams) -> optax.Schedule:
    return schedule_of(sched.name, hp.lr, total_steps=hp.total_steps,
                       warmup_steps=hp.warmup_steps, final_lr_frac=hp.final_lr_frac,
                       halvings=hp.halvings)

  direction = build(opt, hp)  # checks the numbers, on their Python values
  clips = opt.clip_norm is not None and not direction.clips
  at_direction = (opt.noise_multiplier > 0) + clips  # the direction's state in the chain's

  def chain(hp: Hparams) -> optax.GradientTransformationExtraArgs:
    """The chain of the module docstring, of the numbers `hp` (arrays or tracers)."""
    parts = []
    if opt.noise_multiplier > 0:
      parts.append(add_clipped_noise(opt.noise_multiplier, opt.per_example_clip, batch_size,
                                     hp.noise_seed))
    if clips:
      parts.append(optax.clip_by_global_norm(hp.clip_norm))
    parts.append(build(opt, hp).tx)
    if opt.weight_decay > 0:
      parts.append(optax.add_decayed_weights(hp.weight_decay))
    parts.append(scale_by_token_schedule(lr_schedule(hp), *by_tokens))
    return optax.chain(*parts)

  request = _request(direction, opt, track_snr, gns, gns_layers)
  moments = (None if direction.moments is None else lambda opt_state: Moments(
      direction.moments(opt_state.inner_state[at_direction]), eps=numbers(opt_state).eps,
      eps_root=numbers(opt_state).eps_root))
  return Optimizer(tx=with_float32_state(inject(chain, hp)), request=request,
                   learning_rate=lr_schedule(hp),
                   schedule=lambda hp: by_examples(lr_schedule(hp), *by_tokens),
                   snr=snr_tracker(None) if track_snr else OFF,
                   gns=gns if gns is not None else OFF, hparams=hp,
                   moments=moments or no_moments)


def _request(direction, opt: configs.OptimizerConfig, track_snr: bool, gns: Tracker | None,
             gns_layers: tuple[str, ...]) -> StatsRequest:
  """The statistics a step computes: the direction's, and what the trackers beside the chain
  read (`Optimizer.snr`: 'sq'; `Optimizer.gns`: per-example 'norms' of `gns_layers`). The
  optimizer state is the same with or without the trackers; an Adam-family direction says
  where its moments are (`Direction.moments`), a direction that clips ḡ itself says so
  (`clips=True`) so that the statistics follow the clipping."""
  request = StatsRequest(want=direction.request.want + (("sq",) if track_snr else ()),
                         granularity=direction.request.granularity,
                         per_example_clip=opt.per_example_clip)
  if gns is None:
    return request
  if request.granularity != "example":
    raise ValueError(
        f"stats.gns needs per-example norms but the optimizer reads "
        f"{request.granularity}-level statistics; turn stats.gns off for this optimizer.")
  return request.union(("norms",), "example", gns_layers)


def hparams_of(opt: configs.OptimizerConfig, sched: ScheduleConfig, *, total_steps: int,
               batch_size: int, seed: int = 0) -> Hparams:
  """The numbers of `opt` and `sched` that `build_optimizer` reads, as Python numbers
  (`pergrad.optim.hparams`): β's and ε after batch-size scaling (`scaled_hparams`)."""
  hp = scaled_hparams(opt, batch_size)
  return Hparams(lr=hp.lr, b1=hp.b1, b2=hp.b2, eps=hp.eps, eps_root=hp.eps_root,
                 weight_decay=opt.weight_decay,
                 clip_norm=opt.clip_norm, total_steps=total_steps,
                 warmup_steps=sched.warmup_steps, final_lr_frac=sched.final_lr_frac,
                 halvings=(decay_steps(sched, total_steps, cut=False) if sched.name == "step"
                           else ()),
                 noise_seed=seed)
