"""The run plan: what one training run does, as frozen plain dataclasses.

    plan = pergrad.configure.build_plan(cfg, n_devices)   # the only way from a config
    plan.model, plan.data, plan.optimizer, plan.stats, plan.batch, plan.train, plan.logging

The library takes these objects and never reads a config. `pergrad.configure` builds
them from the composed Hydra config, checking every cross-field rule once.

`fingerprint(plan.config)` is what makes two runs "the same run" (`resume_decision`):
the resolved config without the keys that may change when a run is resumed
(`RESUMABLE`: logging, evaluation and checkpoint cadence, the output directory, and
`train.steps` when the schedule is constant, so that a run can be extended). A key that a
run directory's config lacks (written before the key existed) matches when the new value
is the key's default (`RunPlan.defaults`), since that is what the older code did.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from omegaconf import OmegaConf

from pergrad.data import DataSpec
from pergrad.model import ModelSpec
from pergrad.optim import Optimizer
from pergrad.stats import StatsRequest
from pergrad.train.batch_schedule import BatchSchedule

CONFIG = "config.yaml"
SUMMARY = "summary.json"
# Keys (or key prefixes) that may differ between a run and its resumption.
RESUMABLE = ("logging", "name", "experiment", "dist", "data.tfds_dir", "train.out_dir",
             "train.eval_every", "train.eval_batches", "train.checkpoint_every",
             "train.keep_checkpoints", "stats.log_every", "stats.want", "stats.granularity",
             "stats.backend", "stats.microbatch_size")


@dataclasses.dataclass(frozen=True)
class StatsPlan:
  """What the train step asks the statistics engine for.

  request/backend: every step (what the optimizer reads). log_request/log_backend: on
  statistics-logging steps, the union of the optimizer's request and the logged
  statistics, computed in the same backward pass as the update (None: none logged).
  """

  request: StatsRequest
  backend: str
  log_request: StatsRequest | None = None
  log_backend: str | None = None
  log_every: int = 0
  microbatch_size: int | None = None

  def logs_at(self, k: int) -> bool:
    return self.log_request is not None and (k == 1 or k % self.log_every == 0)


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  """Length and cadences, in full-batch steps: units of data.batch_size examples.

  A fixed-batch run makes `steps` updates; with a batch-size schedule the run ends at the
  first update that reaches steps x B_max examples, and evaluations and checkpoints come
  at the updates that cross a multiple of eval_every (checkpoint_every) x B_max examples,
  so runs with different batch schedules are evaluated at the same tokens.
  """

  steps: int
  seed: int = 0
  eval_every: int = 100  # 0: only at the end
  eval_batches: int = 8  # 0: no evaluation
  checkpoint_every: int = 100  # 0: only at the end
  keep_checkpoints: int = 2

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


@dataclasses.dataclass(frozen=True)
class WandbSpec:
  mode: str = "disabled"  # online | offline | disabled
  project: str = "pergrad"
  entity: str | None = None
  group: str | None = None
  tags: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LoggingSpec:
  name: str = "run"
  log_every: int = 10
  progress: bool = True
  wandb: WandbSpec = WandbSpec()


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
  defaults: dict = dataclasses.field(default_factory=dict)  # flat key -> schema default


# --- same run? ---------------------------------------------------------------------------
def flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def fingerprint(config: dict) -> dict:
  """The flat keys of a resolved config that define the run (module docstring)."""
  resumable = RESUMABLE + (("train.steps",) if config["schedule"]["name"] == "constant" else ())
  return {k: v for k, v in flatten(config).items()
          if not any(k == r or k.startswith(r + ".") for r in resumable)}


def resume_decision(out_dir: Path, plan: RunPlan) -> str:
  """"new", "resume" or "completed" for `plan` in `out_dir`, before anything else.

  ValueError (one line) when `out_dir` holds a different run (naming the differing keys)
  or a diverged one.
  """
  saved = out_dir / CONFIG
  if not saved.exists():
    return "new"
  old = fingerprint(OmegaConf.to_container(OmegaConf.load(saved), resolve=True))
  new = fingerprint(json.loads(json.dumps(plan.config)))
  absent = object()
  same = lambda k: old.get(k, absent) == new.get(k) or (
      k not in old and k in plan.defaults and new.get(k) == plan.defaults[k])
  diff = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
          if not same(k)]
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
