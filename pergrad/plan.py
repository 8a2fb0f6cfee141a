"""The run's config schema and plan: what one training run does, as frozen dataclasses.

    plan = pergrad.configure.build_plan(cfg, n_devices)   # the only way from a config
    plan.model, plan.data, plan.optimizer, plan.stats, plan.batch, plan.train, plan.logging

`Config` is the schema of the whole config: one frozen dataclass per node (model:
`ModelSpec`, data: `DataSpec`, optimizer: an `OptimizerConfig` subclass, schedule:
`ScheduleConfig`, batch: `BatchConfig`, train: `TrainSpec`, logging: `LoggingSpec`,
stats: `StatsSpec`, dist: `DistSpec`). Hydra composes `configs/` against it
(`pergrad.config` stores it) and the library takes the same objects, each checked on
construction (`__post_init__`); `pergrad.configure` builds the plan, checking the
rules that span nodes. Adding a setting is one field in one of these dataclasses.

`fingerprint(plan.config)` is what makes two runs "the same run" (`resume_decision`):
the resolved config without the keys that may change when a run is resumed, declared on
their fields (`resumable()`: logging, evaluation and checkpoint cadence, the output
directory, ...), and without `train.steps` when the schedule is constant, so that a run
can be extended.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any

import yaml

from pergrad.data import DataSpec
from pergrad.fields import RESUMABLE, Choice, resumable
from pergrad.model import ModelSpec
from pergrad.optim import Optimizer
from pergrad.optim.configs import OptimizerConfig
from pergrad.optim.schedule import ScheduleConfig
from pergrad.stats import StatsRequest
from pergrad.stats.api import StatsBackend
from pergrad.stats.request import Granularity
from pergrad.train.batch_schedule import BatchConfig, BatchSchedule

CONFIG = "config.yaml"
SUMMARY = "summary.json"
def _tuple(obj, *keys: str) -> None:
  for key in keys:
    object.__setattr__(obj, key, tuple(getattr(obj, key)))


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """Length and cadences, in full-batch steps: units of data.batch_size examples.

  A fixed-batch run makes `steps` updates; with a batch-size schedule the run ends at the
  first update that reaches steps x B_max examples, and evaluations and checkpoints come
  at the updates that cross a multiple of eval_every (checkpoint_every) x B_max examples,
  so runs with different batch schedules are evaluated at the same tokens.
  """

  steps: int = 400  # resumable with a constant schedule (`fingerprint`)
  seed: int = 0  # parameter initialisation
  eval_every: int = resumable(100)  # 0: only at the end
  eval_batches: int = resumable(8)  # 0: no evaluation
  checkpoint_every: int = resumable(100)  # 0: only at the end
  keep_checkpoints: int = resumable(2)
  out_dir: str | None = resumable(None)  # null: Hydra's run directory
  # When every checkpoint in the run directory is unreadable: start again from step 0
  # (true) instead of stopping with an error (false).
  restart: bool = resumable(False)

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"train.steps={self.steps} must be >= 1.")
    for key in ("eval_every", "checkpoint_every", "eval_batches"):
      if getattr(self, key) < 0:
        raise ValueError(f"train.{key}={getattr(self, key)} must be >= 0 (0 turns it off).")
    if self.keep_checkpoints < 1:
      raise ValueError(f"train.keep_checkpoints={self.keep_checkpoints} must be >= 1.")

  def evals_at(self, before: int, after: int, unit: int) -> bool:
    """Whether the update that took the examples seen from `before` to `after` evaluates
    (unit = B_max examples per full-batch step)."""
    return self.eval_batches > 0 and _crosses(before, after, unit, self.eval_every,
                                              self.steps)

  def checkpoints_at(self, before: int, after: int, unit: int) -> bool:
    return _crosses(before, after, unit, self.checkpoint_every, self.steps)

  def done(self, seen: int, unit: int) -> bool:
    return seen >= self.steps * unit


def _crosses(before: int, after: int, unit: int, every: int, steps: int) -> bool:
  """The end of the run (steps x unit examples), or a multiple of every x unit, lies in
  (before, after]."""
  if after >= steps * unit:
    return True
  return every > 0 and after // (every * unit) > before // (every * unit)


class WandbMode(Choice):
  online = "online"
  offline = "offline"  # no account, no network; `wandb sync` later
  disabled = "disabled"


@dataclasses.dataclass(frozen=True)
class WandbSpec:
  mode: WandbMode = WandbMode.offline
  project: str = "pergrad"
  entity: str | None = None
  group: str | None = None
  tags: tuple[str, ...] = ()

  def __post_init__(self):
    object.__setattr__(self, "mode", WandbMode.check(self.mode, "logging.wandb.mode"))
    _tuple(self, "tags")


@dataclasses.dataclass(frozen=True)
class LoggingSpec:
  log_every: int = 10
  progress: bool = True  # tqdm progress bar
  wandb: WandbSpec = WandbSpec()

  def __post_init__(self):
    if self.log_every < 1:
      raise ValueError(f"logging.log_every={self.log_every} must be >= 1.")


@dataclasses.dataclass(frozen=True)
class StatsSpec:
  """Per-example gradient statistics logged during training (see pergrad.stats)."""

  backend: StatsBackend = resumable(StatsBackend.auto)
  granularity: Granularity = resumable(Granularity.example)
  want: tuple[str, ...] = resumable(())  # e.g. [mean, sq, sign, norms]
  log_every: int = resumable(0)  # 0: never log statistics
  microbatch_size: int | None = resumable(None)
  # Track the EMA SNR (pergrad.optim.track_snr) so that the logged diagnostics include
  # opt/<leaf>/snr2_ema. It needs 'sq' at EVERY step (per-example statistics in the train
  # step), so it is off unless an experiment asks for it.
  track_snr: bool = False
  # Track the gradient noise scale every step (pergrad.optim.diagnostics.track_gns):
  # per-example norms in every train step, raw terms gns/<group>/{G2,S} and EMA-smoothed
  # B_simple per layer type and total in metrics.jsonl.
  gns: bool = False
  # EMA decay of S and |G|² (pergrad.train.metrics.resmooth redoes it offline)
  gns_alpha: float = 0.95
  gns_tied: str = "include"  # a tied embedding: "include" (once) or "exclude" (nanoGNS)
  # Leaves whose statistics are computed and logged (and the GNS tracked): layer types
  # (norm, attention, mlp, embedding, unembedding) or path patterns; []: every leaf.
  # E.g. stats.layers=[norm]: normalization layers only (Gray et al.'s predictor).
  layers: tuple[str, ...] = ()
  # Log how often the update's sign agrees with sign(E g) (pergrad.train.heldout): on
  # statistics-logging steps, E g is estimated from a held-out set of this many times
  # data.batch_size examples, drawn apart from the training stream; 0: off.
  sign_agreement: int = resumable(0)

  def __post_init__(self):
    object.__setattr__(self, "backend", StatsBackend.check(self.backend, "stats.backend"))
    object.__setattr__(self, "granularity",
                       Granularity.check(self.granularity, "stats.granularity"))
    _tuple(self, "want", "layers")
    if self.log_every < 0:
      raise ValueError(f"stats.log_every={self.log_every} must be >= 0 (0: never).")
    if self.sign_agreement < 0:
      raise ValueError(f"stats.sign_agreement={self.sign_agreement} must be >= 0 (0: off; n: "
                       "a held-out set of n x data.batch_size examples, e.g. 4).")
    if self.sign_agreement and not self.log_every:
      raise ValueError(f"stats.sign_agreement={self.sign_agreement} is logged on "
                       "statistics-logging steps, but stats.log_every=0; set stats.log_every "
                       "(e.g. 10) or stats.sign_agreement=0.")


@dataclasses.dataclass(frozen=True)
class DistSpec:
  """Multi-process runs (`pergrad.train.distributed`): one process per host or GPU."""

  coordinator_address: str | None = None  # host:port of process 0; null: single process
  num_processes: int | None = None
  process_id: int | None = None
  auto: bool = True  # initialize from a multi-task SLURM job or TPU slice's environment
  timeout_s: int = 300  # give up when not every process has joined within this time

  def __post_init__(self):
    if self.timeout_s < 1:
      raise ValueError(f"dist.timeout_s={self.timeout_s} must be >= 1 (seconds).")


@dataclasses.dataclass(frozen=True)
class Config:
  """The whole config (`configs/config.yaml` extends it)."""

  model: ModelSpec = ModelSpec()
  data: DataSpec = DataSpec()
  optimizer: OptimizerConfig = OptimizerConfig()  # the schema of optimizer=<name>
  schedule: ScheduleConfig = ScheduleConfig()
  logging: LoggingSpec = resumable(LoggingSpec())
  stats: StatsSpec = StatsSpec()
  batch: BatchConfig = BatchConfig()
  train: TrainSpec = TrainSpec()
  dist: DistSpec = resumable(DistSpec())
  name: str = resumable("run")  # free-form run name (W&B run name, sweep tables)
  experiment: Any = resumable(None)  # set by configs/experiment/*.yaml (free-form tag)
  # Modules imported before the plan is built (`pergrad.config.load_plugins`): user code
  # that registers statistics (`pergrad.stats.register`) or optimizers
  # (`pergrad.optim.configs.register`).
  plugins: tuple[str, ...] = resumable(())

  def __post_init__(self):
    _tuple(self, "plugins")


@dataclasses.dataclass(frozen=True)
class StatsPlan:
  """What the train step asks the statistics engine for.

  request/backend: every step (what the optimizer reads). log_request/log_backend: on
  statistics-logging steps, the union of the optimizer's request and the logged
  statistics, computed in the same backward pass as the update (None: none logged).
  sign_agreement/sign_backend: on those steps, the update's sign agreement with a held-out
  mean gradient (`pergrad.train.heldout`; 0: off).
  """

  request: StatsRequest
  backend: str
  log_request: StatsRequest | None = None
  log_backend: str | None = None
  log_every: int = 0
  microbatch_size: int | None = None
  sign_agreement: int = 0  # held-out size in batches (0: off; `pergrad.train.heldout`)
  sign_backend: str | None = None  # the backend of the held-out statistics

  def logs_at(self, k: int) -> bool:
    return self.log_request is not None and (k == 1 or k % self.log_every == 0)


@dataclasses.dataclass(frozen=True)
class RunPlan:
  model: ModelSpec
  data: DataSpec
  optimizer: Optimizer
  stats: StatsPlan
  batch: BatchSchedule
  train: TrainSpec
  logging: LoggingSpec
  config: dict  # the resolved config, plain (written to config.yaml and W&B)
  name: str = "run"


# --- same run? ---------------------------------------------------------------------------
def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def resumable_keys(cls: type = Config, prefix: str = "") -> tuple[str, ...]:
  """The flat keys of `cls` declared `resumable()` (a node: all keys under it)."""
  hints = typing.get_type_hints(cls)
  out = []
  for f in dataclasses.fields(cls):
    if f.metadata.get(RESUMABLE):
      out.append(prefix + f.name)
    elif dataclasses.is_dataclass(hints[f.name]):
      out.extend(resumable_keys(hints[f.name], f"{prefix}{f.name}."))
  return tuple(out)


def fingerprint(config: dict) -> dict:
  """The flat keys of a resolved config that define the run (module docstring)."""
  skip = resumable_keys() + (("train.steps",) if config["schedule"]["name"] == "constant"
                             else ())
  return {k: v for k, v in flatten(config).items()
          if not any(k == r or k.startswith(r + ".") for r in skip)}


def resume_decision(out_dir: Path, plan: RunPlan) -> str:
  """"new", "resume" or "completed" for `plan` in `out_dir`, before anything else.

  ValueError (one line) when `out_dir` holds a different run (naming the differing keys)
  or a diverged one.
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
  summary = json.loads((out_dir / SUMMARY).read_text()) if (out_dir / SUMMARY).exists() else {}
  if summary.get("status") == "diverged":
    raise ValueError(
        f"{summary.get('error', 'the run diverged')} (recorded in {out_dir / SUMMARY}; delete "
        "that file to try again).")
  if summary.get("status") == "completed" and summary.get("steps") == plan.train.steps:
    return "completed"
  return "resume"
