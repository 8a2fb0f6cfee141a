"""Config -> run plan: the one place that reads `pergrad.config` (besides the CLI).

    cfg = compose(["model=tiny", "optimizer=sign"])   # or Hydra's cfg in an app
    plan = build_plan(cfg, n_devices)                  # pergrad.plan.RunPlan

`build_plan` turns the composed config into the schema's frozen dataclasses
(`OmegaConf.to_object`: each node checks its own fields), then checks the rules that
span nodes, once, each with one ValueError line naming the key and the fix, and
resolves the statistics backends once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pergrad import config as config_lib
from pergrad.model import TIED_EMBEDDING, ModelSpec
from pergrad.optim import build_optimizer
from pergrad.optim import configs as optim_registry
from pergrad.optim.diagnostics import track_gns
from pergrad.plan import Config, RunPlan, StatsPlan, StatsSpec
from pergrad.stats import StatsRequest, check_microbatch, resolve_backend
from pergrad.layer_types import LAYER_TYPES
from pergrad.stats.noise import TOTAL
from pergrad.train import batch_schedule
from pergrad.train.batch_schedule import BatchConfig, BatchSchedule
from pergrad.train.heldout import HELDOUT_REQUEST


def compose(overrides=(), config_name: str = "config") -> DictConfig:
  """The composed config of the shipped configs with Hydra `overrides` (outside a Hydra
  app); the modules of a `plugins=[...]` override are imported first."""
  from hydra import compose as hydra_compose
  from hydra import initialize_config_module

  config_lib.load_plugins(config_lib.plugins_in(overrides))
  with initialize_config_module(config_module=config_lib.CONFIGS_PACKAGE, version_base="1.3"):
    return hydra_compose(config_name=config_name, overrides=list(overrides))


def to_plain(cfg: Any) -> dict:
  """A config (DictConfig or `Config`) as plain Python: enums -> values."""
  if not isinstance(cfg, DictConfig):
    cfg = OmegaConf.structured(cfg)
  return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def to_config(cfg: Any) -> Config:
  """The composed config as the schema's dataclasses (each checks its fields)."""
  if isinstance(cfg, Config):
    return cfg
  _check_optimizer(cfg)
  return OmegaConf.to_object(cfg)


def build_plan(cfg: Any, n_devices: int = 1) -> RunPlan:
  """Validates `cfg` and returns the run plan (module docstring); ValueError on a bad key."""
  c = to_config(cfg)
  model, data, s = c.model, c.data, c.stats
  if data.seq_len > model.seq_len:
    raise ValueError(
        f"data.seq_len={data.seq_len} exceeds model.seq_len={model.seq_len} (the longest "
        "sequence the model supports); lower data.seq_len or raise model.seq_len.")
  for key in ("batch_size", "eval_batch_size"):
    b = getattr(data, key)
    if b % n_devices:
      lo, hi = (b // n_devices) * n_devices, (b // n_devices + 1) * n_devices
      raise ValueError(
          f"data.{key}={b} is not divisible by the {n_devices} devices of the ('data',) "
          f"mesh; use a multiple of {n_devices} (e.g. data.{key}={lo or hi}).")
  try:
    check_microbatch(s.microbatch_size, data.batch_size)
  except ValueError as e:
    raise ValueError(f"stats.{e}") from None

  batch = _batch_schedule(c.batch, data.batch_size, data.seq_len, n_devices, s)
  if batch.kind != "fixed" and getattr(c.optimizer, "sde_scaling", False):
    raise ValueError("optimizer.sde_scaling=true scales β and ε once for data.batch_size, "
                     "which a batch schedule changes; set optimizer.sde_scaling=false or "
                     "batch.kind=fixed.")
  opt = build_optimizer(c.optimizer, c.schedule, total_steps=c.train.steps,
                        batch_size=data.batch_size, track_snr=s.track_snr,
                        gns=_gns_tracker(s, model), gns_layers=s.layers,
                        batch_lr_scaling=batch.lr_scaling)
  return RunPlan(model=model, data=data, optimizer=opt, stats=_stats_plan(opt.request, s),
                 batch=batch, train=c.train, logging=c.logging, config=to_plain(cfg),
                 name=c.name)


def _batch_schedule(b: BatchConfig, max_size: int, seq_len: int, n_devices: int,
                    s: StatsSpec) -> BatchSchedule:
  """The batch schedule of config `batch` (one ValueError line on a bad setting)."""
  fields = {f.name: getattr(b, f.name) for f in dataclasses.fields(BatchConfig)}
  if b.kind == "fixed":
    return BatchSchedule(**{**fields, "sizes": (max_size,), "start": max_size})
  if b.start > max_size:
    raise ValueError(f"batch.start={b.start} exceeds data.batch_size={max_size} (the "
                     "largest size); lower batch.start.")
  sizes = b.sizes or batch_schedule.default_sizes(b.start, max_size)
  if sizes[-1] != max_size:
    raise ValueError(f"batch.sizes={list(sizes)} must end at data.batch_size={max_size} (the "
                     "size the schedule grows to); add it or change data.batch_size.")
  sched = BatchSchedule(**{**fields, "sizes": sizes},
                        ramp_examples=-(-b.ramp_tokens // seq_len))
  groups = (*LAYER_TYPES, TOTAL) if s.gns else None
  batch_schedule.check(sched, n_devices=n_devices, microbatch=s.microbatch_size,
                       gns_groups=groups)
  return sched


def _check_optimizer(cfg: DictConfig) -> None:
  """optimizer.name must be a registered optimizer, the one its schema was chosen by."""
  name = cfg.optimizer.name
  if name not in optim_registry.names():
    raise ValueError(
        f"optimizer.name={name} is not a registered optimizer (one of "
        f"{list(optim_registry.names())}); choose the optimizer with optimizer=<name> "
        "(configs/optimizer/<name>.yaml), not optimizer.name.")
  chosen = OmegaConf.get_type(cfg.optimizer)
  want = optim_registry.entry(name).config
  if chosen is not want:
    raise ValueError(
        f"optimizer.name={name} does not match the chosen optimizer config "
        f"({getattr(chosen, '__name__', chosen)}); choose the optimizer with "
        f"optimizer={name}, not optimizer.name.")


def _gns_tracker(s: StatsSpec, model: ModelSpec):
  """`pergrad.optim.diagnostics.track_gns` when stats.gns (ValueError on a bad alpha or tied)."""
  if not s.gns:
    return None
  try:
    return track_gns(s.gns_alpha, tied=s.gns_tied, layers=s.layers,
                     tied_leaf=TIED_EMBEDDING if model.tie_embeddings else None)
  except ValueError as e:
    raise ValueError(f"stats.{e}") from None


def _stats_plan(request: StatsRequest, s: StatsSpec) -> StatsPlan:
  backend = resolve_backend(request, s.backend)
  log_request = log_backend = None
  if s.log_every:
    # What is logged, plus 'sq', which the optimizer diagnostics read.
    log_request = request.union(s.want + ("sq",), s.granularity, s.layers)
    log_backend = resolve_backend(log_request, s.backend)
  sign_backend = resolve_backend(HELDOUT_REQUEST, s.backend) if s.sign_agreement else None
  return StatsPlan(request=request, backend=backend, log_request=log_request,
                   log_backend=log_backend, log_every=s.log_every,
                   microbatch_size=s.microbatch_size, sign_agreement=s.sign_agreement,
                   sign_backend=sign_backend)


