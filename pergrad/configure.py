"""Config -> run plan: the one place that reads `pergrad.config` (besides the CLI).

    cfg = compose(["model=tiny", "optimizer=sign"])   # or Hydra's cfg in an app
    plan = build_plan(cfg, n_devices)                  # pergrad.plan.RunPlan

`build_plan` checks every rule that needs no data and no compute, once, each with one
ValueError line naming the key and the fix; resolves the statistics backends once;
and turns enum values into plain strings (the one place where that happens).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from pergrad import config as config_lib
from pergrad.data import DataSpec
from pergrad.model import TIED_EMBEDDING, ModelSpec
from pergrad.optim import build_optimizer, optimizer_config
from pergrad.optim import configs as optim_registry
from pergrad.optim.diagnostics import track_gns
from pergrad.optim.schedule import ScheduleConfig
from pergrad.plan import LoggingSpec, RunPlan, StatsPlan, TrainSpec, WandbSpec
from pergrad.stats import StatsRequest, check_microbatch, resolve_backend
from pergrad.stats.layers import LAYER_TYPES
from pergrad.stats.noise import TOTAL
from pergrad.train import batch_schedule
from pergrad.train.batch_schedule import BatchSchedule

CONFIGS_DIR = Path(__file__).resolve().parents[1] / "configs"


def compose(overrides=(), config_name: str = "config") -> DictConfig:
  """The composed config of configs/ with Hydra `overrides` (outside a Hydra app)."""
  from hydra import compose as hydra_compose
  from hydra import initialize_config_dir

  config_lib.register()
  with initialize_config_dir(config_dir=str(CONFIGS_DIR), version_base="1.3"):
    return hydra_compose(config_name=config_name, overrides=list(overrides))


def to_plain(cfg: Any) -> dict:
  """A config (DictConfig, Config dataclass or dict) as plain Python: enums -> values."""
  if isinstance(cfg, dict):
    return cfg
  if not isinstance(cfg, DictConfig):
    cfg = OmegaConf.structured(cfg)
  return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def _spec(cls, d: dict, **extra):
  names = {f.name for f in dataclasses.fields(cls)}
  return cls(**{k: v for k, v in d.items() if k in names}, **extra)


def build_plan(cfg: Any, n_devices: int = 1) -> RunPlan:
  """Validates `cfg` and returns the run plan (module docstring); ValueError on a bad key."""
  c = to_plain(cfg)
  m, d, t, s, lg = c["model"], c["data"], c["train"], c["stats"], c["logging"]
  if t["steps"] < 1:
    raise ValueError(f"train.steps={t['steps']} must be >= 1.")
  for key in ("eval_every", "checkpoint_every", "eval_batches"):
    if t[key] < 0:
      raise ValueError(f"train.{key}={t[key]} must be >= 0 (0 turns it off).")
  if t["keep_checkpoints"] < 1:
    raise ValueError(f"train.keep_checkpoints={t['keep_checkpoints']} must be >= 1.")
  if lg["log_every"] < 1:
    raise ValueError(f"logging.log_every={lg['log_every']} must be >= 1.")
  if s["log_every"] < 0:
    raise ValueError(f"stats.log_every={s['log_every']} must be >= 0 (0: never).")
  model = _spec(ModelSpec, m)
  data = _spec(DataSpec, d)
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
    check_microbatch(s["microbatch_size"], data.batch_size)
  except ValueError as e:
    raise ValueError(f"stats.{e}") from None

  batch = _batch_schedule(c["batch"], data.batch_size, data.seq_len, n_devices, s)
  opt_cfg = _optimizer_config(cfg, c["optimizer"])
  if batch.kind != "fixed" and opt_cfg.sde_scaling:
    raise ValueError("optimizer.sde_scaling=true scales β and ε once for data.batch_size, "
                     "which a batch schedule changes; set optimizer.sde_scaling=false or "
                     "batch.kind=fixed.")
  opt = build_optimizer(opt_cfg, _spec(ScheduleConfig, c["schedule"]), total_steps=t["steps"],
                        batch_size=data.batch_size, track_snr=s["track_snr"],
                        gns=_gns_tracker(s, model), gns_layers=tuple(s["layers"]),
                        batch_lr_scaling=batch.lr_scaling)
  stats = _stats_plan(opt.request, s)
  w = lg["wandb"]
  logging = LoggingSpec(name=c["name"], log_every=lg["log_every"], progress=lg["progress"],
                        wandb=_spec(WandbSpec, {**w, "tags": tuple(w["tags"] or ())}))
  return RunPlan(model=model, data=data, optimizer=opt, stats=stats, batch=batch,
                 train=_spec(TrainSpec, t), logging=logging, config=c, defaults=_defaults())


def _defaults() -> dict:
  """The schema's default of every key (flat), for run directories written before a key
  existed (`pergrad.plan.resume_decision`)."""
  from pergrad.plan import flatten

  return flatten(to_plain(config_lib.Config()))


def _batch_schedule(b: dict, max_size: int, seq_len: int, n_devices: int,
                    s: dict) -> BatchSchedule:
  """The batch schedule of config `batch` (one ValueError line on a bad setting)."""
  if b["kind"] == "fixed":
    return BatchSchedule(sizes=(max_size,), start=max_size)
  if b["start"] > max_size:
    raise ValueError(f"batch.start={b['start']} exceeds data.batch_size={max_size} (the "
                     "largest size); lower batch.start.")
  sizes = tuple(b["sizes"]) or batch_schedule.default_sizes(b["start"], max_size)
  if sizes[-1] != max_size:
    raise ValueError(f"batch.sizes={list(sizes)} must end at data.batch_size={max_size} (the "
                     "size the schedule grows to); add it or change data.batch_size.")
  sched = BatchSchedule(kind=b["kind"], sizes=sizes, start=b["start"],
                        ramp_examples=-(-b["ramp_tokens"] // seq_len),
                        gns_factor=b["gns_factor"], gns_group=b["gns_group"],
                        every=b["every"], lr_scaling=b["lr_scaling"])
  groups = (*LAYER_TYPES, TOTAL) if s["gns"] else None
  batch_schedule.check(sched, n_devices=n_devices, microbatch=s["microbatch_size"],
                       gns_groups=groups)
  return sched


def _optimizer_config(cfg: Any, o: dict):
  """The optimizer's config dataclass; its name must be the one its schema was chosen by."""
  name = o["name"]
  if name not in optim_registry.names():
    raise ValueError(
        f"optimizer.name={name} is not a registered optimizer (one of "
        f"{list(optim_registry.names())}); choose the optimizer with optimizer=<name> "
        "(configs/optimizer/<name>.yaml), not optimizer.name.")
  chosen = OmegaConf.get_type(cfg.optimizer) if isinstance(cfg, DictConfig) else None
  want = optim_registry.entry(name).config
  if chosen is not None and chosen is not want:
    raise ValueError(
        f"optimizer.name={name} does not match the chosen optimizer config "
        f"({chosen.__name__}); choose the optimizer with optimizer={name}, not optimizer.name.")
  return optimizer_config(**o)


def _gns_tracker(s: dict, model: ModelSpec):
  """`pergrad.optim.diagnostics.track_gns` when stats.gns (ValueError on a bad alpha or tied)."""
  if not s["gns"]:
    return None
  try:
    return track_gns(s["gns_alpha"], tied=s["gns_tied"], layers=tuple(s["layers"]),
                     tied_leaf=TIED_EMBEDDING if model.tie_embeddings else None)
  except ValueError as e:
    raise ValueError(f"stats.{e}") from None


def _stats_plan(request: StatsRequest, s: dict) -> StatsPlan:
  backend = resolve_backend(request, s["backend"])
  log_request = log_backend = None
  if s["log_every"]:
    # What is logged, plus 'sq', which the optimizer diagnostics read.
    log_request = request.union(tuple(s["want"]) + ("sq",), s["granularity"],
                                tuple(s["layers"]))
    log_backend = resolve_backend(log_request, s["backend"])
  return StatsPlan(request=request, backend=backend, log_request=log_request,
                   log_backend=log_backend, log_every=s["log_every"],
                   microbatch_size=s["microbatch_size"])


