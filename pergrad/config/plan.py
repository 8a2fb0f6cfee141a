"""Config -> the frozen run plan, checked once.

    cfg = compose(["model=tiny", "optimizer=sign"])   # pergrad.config.composer
    plan = build_plan(cfg, n_devices)                  # RunPlan
    plan.model, plan.data, plan.optimizer, plan.stats, plan.batch, plan.train, plan.logging

`build_plan` turns the composed config into the schema's dataclasses once
(`OmegaConf.to_object`: each node checks its own fields), checks the rules that span
nodes, each with one ValueError line naming the key and the fix, resolves the
statistics backends (a plugin's registered backend is chosen by name; "auto" is kept, and
decided once the model and the platform are known, by `pergrad.stats.decide`:
`pergrad.train.plain.decided`), and returns a frozen `RunPlan`.

`fingerprint(plan.config)` is what makes two runs "the same run" (`resume_decision`):
the resolved config without the keys that may change when a run is resumed, declared on
their fields (`pergrad.fields.resumable`: logging, evaluation and checkpoint cadence, the
output directory, ...), and without `train.steps` when the schedule is constant, so that
a run can be extended (never shortened: `pergrad.train.run_dir.check_not_past`). A run
directory also records its data (`DATA`); a resume on other data is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from pergrad.config import batch as batch_lib
from pergrad.config.batch import BatchSchedule
from pergrad.config.schema import Config, LoggingSpec, StatsSpec, TrainSpec, WandbMode
from pergrad.data import DataSpec
from pergrad.data import identity as data_identity
from pergrad.fields import LABEL, RESUMABLE
from pergrad.files import SUMMARY
from pergrad.layer_types import LAYER_TYPES
from pergrad.model import TIED_EMBEDDING, ModelSpec
from pergrad.optim import Optimizer, build_optimizer, track_gns
from pergrad.optim.configs import REGISTRY as OPTIMIZERS
from pergrad.optim.schedule import decay_steps
from pergrad.stats import StatsOptions, StatsRequest, check_microbatch, resolve_backend
from pergrad.stats import backends as backends_lib
from pergrad.stats.noise import TOTAL

CONFIG = "config.yaml"
DATA = "data.json"  # a run directory's record of its data (pergrad.data.identity)
# What the sign-agreement log computes on the held-out set (`pergrad.train.heldout`).
HELDOUT_REQUEST = StatsRequest(want=("mean", "sq"))


@dataclasses.dataclass(frozen=True)
class StatsPlan:
  """What the train step asks the statistics engine for.

  request/backend: every step (what the optimizer reads); each backend as asked ("auto"
  until `pergrad.train.plain.decided` decides it for the model). log_request/log_backend: on
  statistics-logging steps, the union of the optimizer's request and the logged
  statistics, computed in the same backward pass as the update (None: none logged).
  options: how (stats.microbatch_size). sign_agreement/sign_backend/sign_lag: on logging
  steps, the sign agreement with a held-out mean gradient and with its trailing mean of
  decay sign_lag (`pergrad.train.heldout`; 0: off).
  """

  request: StatsRequest
  backend: str
  options: StatsOptions = StatsOptions()
  log_request: StatsRequest | None = None
  log_backend: str | None = None
  log_every: int = 0
  sign_agreement: int = 0
  sign_backend: str | None = None
  sign_lag: float = 0.5

  def logs_at(self, k: int) -> bool:
    return self.log_request is not None and (k == 1 or k % self.log_every == 0)


@dataclasses.dataclass(frozen=True)
class RunPlan:
  """What one training run does. Built by `build_plan` only; the library reads it and
  never changes it (its nodes are the schema's checked dataclasses)."""

  model: ModelSpec
  data: DataSpec
  optimizer: Optimizer
  stats: StatsPlan
  batch: BatchSchedule
  train: TrainSpec
  logging: LoggingSpec
  config: dict  # the resolved config, plain (written to config.yaml and W&B)
  name: str = "run"


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
  if s.backend != "auto" and s.backend not in backends_lib.REGISTRY:
    raise ValueError(
        f"stats.backend={s.backend} is not a registered backend; choose one of auto, "
        f"{', '.join(backends_lib.REGISTRY)} (a plugin adds one with "
        "pergrad.stats.register_backend, listed in plugins=[module]).")

  halvings = (decay_steps(c.schedule, c.train.steps) if c.schedule.name == "step" else None)
  batch = batch_lib.resolve(c.batch, max_batch_size=data.batch_size, seq_len=data.seq_len,
                            n_devices=n_devices, microbatch=s.microbatch_size,
                            gns_groups=(*LAYER_TYPES, TOTAL) if s.gns else None,
                            decay_steps=halvings)
  if batch.kind != "fixed" and getattr(c.optimizer, "sde_scaling", False):
    raise ValueError("optimizer.sde_scaling=true scales β and ε once for data.batch_size, "
                     "which a batch schedule changes; set optimizer.sde_scaling=false or "
                     "batch.kind=fixed.")
  gns = (track_gns(s.gns_alpha, tied=s.gns_tied, layers=s.layers,
                   tied_leaf=TIED_EMBEDDING if model.tie_embeddings else None)
         if s.gns else None)
  opt = build_optimizer(c.optimizer, c.schedule, total_steps=c.train.steps,
                        batch_size=data.batch_size, track_snr=s.track_snr, gns=gns,
                        gns_layers=s.layers, batch_lr_scaling=batch.lr_scaling,
                        batch_lr_ref=batch.lr_ref, seed=c.train.seed)
  logging, config = _wandb_from_env(c.logging, to_plain(cfg))
  return RunPlan(model=model, data=data, optimizer=opt, stats=_stats_plan(opt.request, s),
                 batch=batch, train=c.train, logging=logging, config=config, name=c.name)


def _check_optimizer(cfg: DictConfig) -> None:
  """optimizer.name must be a registered optimizer, the one its schema was chosen by."""
  name = cfg.optimizer.name
  if name not in OPTIMIZERS:
    raise ValueError(
        f"optimizer.name={name} is not a registered optimizer (one of "
        f"{list(OPTIMIZERS.names())}); choose the optimizer with optimizer=<name> "
        "(configs/optimizer/<name>.yaml), not optimizer.name.")
  chosen = OmegaConf.get_type(cfg.optimizer)
  if chosen is not OPTIMIZERS.get(name).config:
    raise ValueError(
        f"optimizer.name={name} does not match the chosen optimizer config "
        f"({getattr(chosen, '__name__', chosen)}); choose the optimizer with "
        f"optimizer={name}, not optimizer.name.")


def _wandb_from_env(logging: LoggingSpec, config: dict) -> tuple[LoggingSpec, dict]:
  """logging.wandb.mode, overridden by WANDB_MODE or WANDB_DISABLED in the environment
  (W&B's convention: the environment wins); the resolved config records the mode used."""
  mode = os.environ.get("WANDB_MODE")
  if os.environ.get("WANDB_DISABLED", "").lower() in ("true", "1", "yes"):
    mode = "disabled"
  if not mode:
    return logging, config
  mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)
  mode = WandbMode.check(mode, "the environment's WANDB_MODE")
  wandb = dataclasses.replace(logging.wandb, mode=mode)
  config["logging"]["wandb"]["mode"] = mode
  return dataclasses.replace(logging, wandb=wandb), config


def _stats_plan(request: StatsRequest, s: StatsSpec) -> StatsPlan:
  """The statistics plan, each backend as asked, checked against its request
  (`resolve_backend`: one ValueError line where it cannot serve it)."""
  asked = lambda r: resolve_backend(r, s.backend) and s.backend
  backend = asked(request)
  log_request = log_backend = None
  if s.log_every:
    # What is logged, plus 'sq', which the optimizer diagnostics read.
    log_request = request.union(s.want + ("sq",), s.granularity, s.layers)
    log_backend = asked(log_request)
  sign_backend = asked(HELDOUT_REQUEST) if s.sign_agreement else None
  return StatsPlan(request=request, backend=backend,
                   options=StatsOptions(microbatch_size=s.microbatch_size),
                   log_request=log_request, log_backend=log_backend, log_every=s.log_every,
                   sign_agreement=s.sign_agreement, sign_backend=sign_backend,
                   sign_lag=s.sign_lag)


# --- same run? ---------------------------------------------------------------------------
def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def marked_keys(mark: str = RESUMABLE, cls: type = Config, prefix: str = "") -> tuple[str, ...]:
  """The flat keys of `cls` whose field carries `mark` (a node: all keys under it)."""
  hints = typing.get_type_hints(cls)
  out = []
  for f in dataclasses.fields(cls):
    if f.metadata.get(mark):
      out.append(prefix + f.name)
    elif dataclasses.is_dataclass(hints[f.name]):
      out.extend(marked_keys(mark, hints[f.name], f"{prefix}{f.name}."))
  return tuple(out)


def _without(config: dict, skip: tuple[str, ...]) -> dict:
  return {k: v for k, v in flatten(config).items()
          if not any(k == r or k.startswith(r + ".") for r in skip)}


def fingerprint(config: dict) -> dict:
  """The flat keys of a resolved config that define the run (module docstring)."""
  steps = ("train.steps",) if config["schedule"]["name"] == "constant" else ()
  return _without(config, marked_keys(RESUMABLE) + steps)


def identity(config: dict) -> dict:
  """The flat keys of a resolved config that define what a run computes and writes: all but
  those marked `label()` (a finished run is reused for any run of the same identity)."""
  return _without(config, marked_keys(LABEL))


def resume_decision(out_dir: Path, plan: RunPlan) -> str:
  """"new", "resume" or "completed" for `plan` in `out_dir`, before anything else.

  ValueError (one line) when `out_dir` holds a different run (naming the differing keys),
  one trained on other data (`check_same_data`) or a diverged one.
  """
  saved = out_dir / CONFIG
  if not saved.exists():
    return "new"
  old = fingerprint(yaml.safe_load(saved.read_text()))
  new = fingerprint(json.loads(json.dumps(plan.config)))
  absent = object()
  diff = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
          if old.get(k, absent) != new.get(k, absent)]
  if diff:
    raise ValueError(
        f"{out_dir} holds a run with a different config ({'; '.join(diff[:4])}"
        f"{' ...' if len(diff) > 4 else ''}); a run directory holds one run: set another "
        "train.out_dir (or hydra.run.dir), or delete that directory.")
  check_same_data(out_dir, plan.data)
  summary = json.loads((out_dir / SUMMARY).read_text()) if (out_dir / SUMMARY).exists() else {}
  if summary.get("status") == "diverged":
    raise ValueError(
        f"{summary.get('error', 'the run diverged')} (recorded in {out_dir / SUMMARY}; delete "
        "that file to try again).")
  if summary.get("status") == "completed" and summary.get("steps") == plan.train.steps:
    return "completed"
  return "resume"


def check_same_data(out_dir: Path, spec: DataSpec) -> dict:
  """The identity of `spec`'s data (`pergrad.data.identity`); ValueError (one line naming
  the difference) when `out_dir` records that its run trained on other data (`DATA`)."""
  current = data_identity.identity(spec)
  recorded = out_dir / DATA
  if not recorded.exists():
    return current
  diff = data_identity.difference(json.loads(recorded.read_text()), current)
  if diff:
    raise ValueError(
        f"{out_dir} holds a run trained on other data ({'; '.join(diff)}); a run resumes on "
        "the data it started with: put that data back (data.path, data.tokenizer's cache in "
        "data.tfds_dir), or set another train.out_dir.")
  return current
