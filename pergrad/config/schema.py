"""The config schema: one plain dataclass per node of `configs/config.yaml`.

    model: ModelSpec        data: DataSpec          optimizer: an OptimizerConfig subclass
    schedule: ScheduleConfig batch: BatchConfig     train: TrainSpec
    logging: LoggingSpec    stats: StatsSpec        dist: DistSpec

Hydra composes `configs/` against `Config` (`pergrad.config.composer` stores it), so an
unknown key, a wrong type or an unknown choice fails at compose time naming the key;
`OmegaConf.to_object` then builds these dataclasses once, and each `__post_init__`
checks its own fields (one ValueError line naming the key). Rules that span nodes are
checked once, by `pergrad.config.plan.build_plan`. The dataclasses are plain (not
frozen) because Hydra merges into them; the `RunPlan` built from them is frozen.
Adding a setting is one field in one of these dataclasses; its trailing comment is
its line in `--help`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pergrad.config.batch import BatchConfig
from pergrad.data import DataSpec
from pergrad.fields import Choice, check_decay, label, resumable
from pergrad.layer_types import LAYER_TYPES
from pergrad.model import ModelSpec
from pergrad.optim.configs import OptimizerConfig
from pergrad.optim.schedule import ScheduleConfig
from pergrad.stats.request import Granularity

PATTERN_CHARS = "/*?["  # a stats.layers entry with one of these is a path pattern


DEFAULT_COMPILE_CACHE = "~/.cache/pergrad/jax"  # train.compile_cache's default


@dataclasses.dataclass
class TrainSpec:
  """Length and cadences, in full-batch steps: units of data.batch_size examples.

  A fixed-batch run makes `steps` updates; with a batch-size schedule the run ends at the
  first update that reaches steps x B_max examples, and evaluations and checkpoints come
  at the updates that cross a multiple of eval_every (checkpoint_every) x B_max examples,
  so runs with different batch schedules are evaluated at the same tokens.
  """

  steps: int = 400  # run length in full-batch steps (resumable with a constant schedule)
  seed: int = 0  # parameter initialisation and the DP-SGD noise (optimizer.noise_multiplier)
  eval_every: int = resumable(100)  # steps between evaluations; 0: only at the end
  eval_batches: int = resumable(8)  # validation batches per evaluation; 0: none
  checkpoint_every: int = resumable(100)  # steps between checkpoints; 0: only at the end
  keep_checkpoints: int = label(2)  # checkpoints kept on disk
  out_dir: str | None = label(None)  # run directory; null: Hydra's run directory
  # every checkpoint unreadable: start again from step 0 (true) or stop with an error
  restart: bool = label(False)
  # JAX's persistent compilation cache (pergrad.train.compile_cache); null: off; the
  # default directory gives way to the environment's PERGRAD_COMPILE_CACHE (tests: a temp dir)
  compile_cache: str | None = label(DEFAULT_COMPILE_CACHE)

  def __post_init__(self):
    if self.steps < 1:
      raise ValueError(f"train.steps={self.steps} must be >= 1.")
    for key in ("eval_every", "checkpoint_every", "eval_batches"):
      if getattr(self, key) < 0:
        raise ValueError(f"train.{key}={getattr(self, key)} must be >= 0 (0 turns it off).")
    if self.keep_checkpoints < 1:
      raise ValueError(f"train.keep_checkpoints={self.keep_checkpoints} must be >= 1.")

  def evals_at(self, before: int, after: int, max_batch_size: int) -> bool:
    """Whether the update that took the examples seen from `before` to `after` evaluates
    (max_batch_size examples per full-batch step)."""
    return self.eval_batches > 0 and _crosses(before, after, max_batch_size, self.eval_every,
                                              self.steps)

  def checkpoints_at(self, before: int, after: int, max_batch_size: int) -> bool:
    return _crosses(before, after, max_batch_size, self.checkpoint_every, self.steps)

  def done(self, seen: int, max_batch_size: int) -> bool:
    return seen >= self.steps * max_batch_size


def _crosses(before: int, after: int, max_batch_size: int, every: int, steps: int) -> bool:
  """The end of the run (steps x max_batch_size examples), or a multiple of every x
  max_batch_size, lies in (before, after]."""
  if after >= steps * max_batch_size:
    return True
  return every > 0 and after // (every * max_batch_size) > before // (every * max_batch_size)


class WandbMode(Choice):
  online = "online"
  offline = "offline"  # no account, no network; `wandb sync` later
  disabled = "disabled"


@dataclasses.dataclass
class WandbSpec:
  # W&B mode; WANDB_MODE / WANDB_DISABLED in the environment win (`build_plan`)
  mode: WandbMode = WandbMode.offline
  project: str = "pergrad"  # W&B project
  entity: str | None = None  # W&B entity (user or team); null: the default
  group: str | None = None  # W&B run group
  tags: tuple[str, ...] = ()  # W&B run tags

  def __post_init__(self):
    self.mode = WandbMode.check(self.mode, "logging.wandb.mode")
    self.tags = tuple(self.tags)


@dataclasses.dataclass
class LoggingSpec:
  log_every: int = 10  # steps between train-loss records
  progress: bool = label(True)  # tqdm progress bar
  figure: bool = label(True)  # curves.png at the end of the run (a sweep's: off, its report draws)
  wandb: WandbSpec = label(default_factory=WandbSpec)

  def __post_init__(self):
    if self.log_every < 1:
      raise ValueError(f"logging.log_every={self.log_every} must be >= 1.")


class GnsTied(Choice):
  include = "include"  # a tied embedding counts once, in the embedding group
  exclude = "exclude"  # a tied embedding is left out of the groups (nanoGNS)


@dataclasses.dataclass
class StatsSpec:
  """Per-example gradient statistics logged during training (see pergrad.stats)."""

  # auto, vmap, surgery, loop, or a backend a plugin registers (checked by `build_plan`)
  backend: str = resumable("auto")
  granularity: Granularity = resumable(Granularity.example)  # samples: examples or tokens
  want: tuple[str, ...] = resumable(())  # logged statistics, e.g. [mean, sq, sign, norms]
  log_every: int = resumable(0)  # steps between statistics records; 0: never
  microbatch_size: int | None = resumable(None)  # examples per chunk; null: whole batch
  # Track the EMA SNR (pergrad.optim.track_snr) so that the logged diagnostics include
  # opt/<leaf>/snr2_ema. It needs 'sq' at EVERY step (per-example statistics in the train
  # step), so it is off unless an experiment asks for it.
  track_snr: bool = False
  # Track the gradient noise scale every step (pergrad.optim.noise_scale.track_gns):
  # per-example norms in every train step, raw terms gns/<group>/{G2,S} and EMA-smoothed
  # B_simple per layer type and total in metrics.jsonl.
  gns: bool = False
  # EMA decay of S and |G|² (pergrad.analysis.resmooth redoes it offline)
  gns_alpha: float = 0.95
  gns_tied: GnsTied = GnsTied.include  # a tied embedding: include (once) or exclude
  # Leaves whose statistics are computed and logged (and the GNS tracked): layer types
  # (norm, attention, mlp, embedding, unembedding) or path patterns; []: every leaf.
  # E.g. stats.layers=[norm]: normalization layers only (Gray et al.'s predictor).
  layers: tuple[str, ...] = ()
  # Log how often the update's sign agrees with sign(E g) (pergrad.train.heldout): on
  # statistics-logging steps, E g is estimated from a held-out set of this many times
  # data.batch_size examples, drawn apart from the training stream; 0: off.
  sign_agreement: int = resumable(0)
  sign_lag: float = resumable(0.5)  # ρ of the sign agreement's trailing mean of held-out means

  def __post_init__(self):
    self.granularity = Granularity.check(self.granularity, "stats.granularity")
    self.gns_tied = GnsTied.check(self.gns_tied, "stats.gns_tied")
    self.want, self.layers = tuple(self.want), check_layers(self.layers)
    check_decay(self.gns_alpha, "stats.gns_alpha")
    if self.log_every < 0:
      raise ValueError(f"stats.log_every={self.log_every} must be >= 0 (0: never).")
    if self.sign_agreement < 0:
      raise ValueError(f"stats.sign_agreement={self.sign_agreement} must be >= 0 (0: off; n: "
                       "a held-out set of n x data.batch_size examples, e.g. 4).")
    if not 0 <= self.sign_lag < 1:
      raise ValueError(f"stats.sign_lag={self.sign_lag} must be in [0, 1) (the decay of the "
                       "trailing mean over logging steps; 0: no lag), e.g. 0.5.")
    if self.sign_agreement and not self.log_every:
      raise ValueError(f"stats.sign_agreement={self.sign_agreement} is logged on "
                       "statistics-logging steps, but stats.log_every=0; set stats.log_every "
                       "(e.g. 10) or stats.sign_agreement=0.")


def check_layers(layers) -> tuple[str, ...]:
  """stats.layers as a tuple; ValueError (one line) on an entry that is neither a layer
  type (`pergrad.layer_types.LAYER_TYPES`) nor a path pattern (one with / * ? or [)."""
  layers = tuple(layers)
  bad = [x for x in layers if not isinstance(x, str) or not x
         or (x not in LAYER_TYPES and not any(c in x for c in PATTERN_CHARS))]
  if bad:
    raise ValueError(f"stats.layers={list(layers)}: {bad[0]!r} is not a layer type; choose "
                     f"among {', '.join(LAYER_TYPES)}, or give a path pattern such as "
                     "'block_*/attn/*'.")
  return layers


@dataclasses.dataclass
class DistSpec:
  """Multi-process runs (`pergrad.train.distributed`): one process per host or GPU."""

  coordinator_address: str | None = None  # host:port of process 0; null: single process
  num_processes: int | None = None  # processes of the run; null: from the environment
  process_id: int | None = None  # this process's rank; null: from the environment
  auto: bool = True  # initialize from a multi-task SLURM job or TPU slice's environment
  timeout_s: int = 300  # give up when not every process joined within this many seconds

  def __post_init__(self):
    if self.timeout_s < 1:
      raise ValueError(f"dist.timeout_s={self.timeout_s} must be >= 1 (seconds).")


def _node(cls: type):
  return dataclasses.field(default_factory=cls)


@dataclasses.dataclass
class Config:
  """The whole config (`configs/config.yaml` extends it)."""

  model: ModelSpec = _node(ModelSpec)
  data: DataSpec = _node(DataSpec)
  optimizer: OptimizerConfig = _node(OptimizerConfig)  # the schema of optimizer=<name>
  schedule: ScheduleConfig = _node(ScheduleConfig)
  logging: LoggingSpec = resumable(default_factory=LoggingSpec)
  stats: StatsSpec = _node(StatsSpec)
  batch: BatchConfig = _node(BatchConfig)
  train: TrainSpec = _node(TrainSpec)
  dist: DistSpec = resumable(default_factory=DistSpec)
  name: str = label("run")  # free-form run name (W&B run name, sweep tables)
  experiment: Any = label(None)  # set by configs/experiment/*.yaml (free-form tag)
  # configs/experiment/*.yaml: effects, margins and regimes stated before the runs, each
  # {value, why}; read by the experiments' reports, never by training (free-form)
  declared: Any = resumable(None)
  # Modules imported before Hydra composes (`pergrad.config.composer.load_plugins`): user
  # code that registers statistics, backends or optimizers.
  plugins: tuple[str, ...] = resumable(())

  def __post_init__(self):
    self.plugins = tuple(self.plugins)
