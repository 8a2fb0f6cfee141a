"""Optimizer configs: one dataclass per optimizer, and the registry of optimizers.

Pure Python (no JAX), so that Hydra can check `configs/optimizer/<name>.yaml` against
its dataclass before anything heavy is imported. Every optimizer is one entry

    REGISTRY[name] = Entry(config=<dataclass>, build="module:function" or a callable)

where `build(cfg, hp) -> (direction, StatsRequest)` returns the optimizer's direction
(an optax transformation) and the statistics it reads; `pergrad.optim.build` wraps it
in the chain every optimizer shares (clipping, weight decay, learning-rate schedule).

How to add an optimizer (three files):
  1. here: its config dataclass (subclass `OptimizerConfig`, add its fields) and
     `register("name", NameConfig, "pergrad.optim.name:build")`;
  2. `pergrad/optim/name.py`: `def build(cfg, hp) -> tuple[direction, StatsRequest]`;
  3. `configs/optimizer/name.yaml`: `defaults: [name_schema, _self_]` and its values.
From user code (no edit of this file): `register(...)` with a callable, then
`pergrad.config.register()` stores the schema for Hydra.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable


class LrScaling(str, enum.Enum):
  none = "none"
  sqrt = "sqrt"
  linear = "linear"


class Placement(str, enum.Enum):
  example = "example"  # EMA(mean_i sign(g_i))
  token = "token"  # EMA(mean_t sign(token contributions))
  batch = "batch"  # EMA(sign(mean g))
  ema = "ema"  # sign(EMA(mean g)) = SignEMA = optax.signum


class AdamVariant(str, enum.Enum):
  adam = "adam"
  micro_adam = "micro_adam"
  micro_adam_var = "micro_adam_var"
  micro_adam_msq = "micro_adam_msq"
  mix = "mix"


@dataclasses.dataclass
class OptimizerConfig:
  """Fields every optimizer has (the chain around its direction and batch-size scaling)."""

  name: str = "adamw"  # the registry entry (set by configs/optimizer/<name>.yaml)
  lr: float = 3e-3  # peak learning rate at batch size `ref_batch_size`
  b1: float = 0.9  # momentum / first-moment EMA decay (sign family: the EMA beta)
  b2: float = 0.95
  eps: float = 1e-8
  eps_root: float = 0.0  # epsilon inside the square root
  weight_decay: float = 0.0  # decoupled (AdamW-style), times the learning rate
  clip_norm: float | None = None  # global-norm clipping of the mean gradient
  per_example_clip: float | None = None  # clip each g_i before every statistic (vmap/loop)
  lr_scaling: LrScaling = LrScaling.none
  ref_batch_size: int = 32  # B_ref of lr = lr * (B / B_ref) ** kappa
  sde_scaling: bool = False  # with lr_scaling=sqrt, also scale 1-b and eps (Malladi et al.)


@dataclasses.dataclass
class SignConfig(OptimizerConfig):
  name: str = "sign"
  placement: Placement = Placement.ema


@dataclasses.dataclass
class AdamFamilyConfig(OptimizerConfig):
  name: str = "adam_family"
  variant: AdamVariant = AdamVariant.adam
  mix_a: float = 1.0  # variant=mix: s = mix_a * mu2_hat + mix_b * sigma2_hat
  mix_b: float = 0.0


@dataclasses.dataclass(frozen=True)
class Entry:
  config: type  # dataclass, subclass of OptimizerConfig
  build: str | Callable[[Any, Any], tuple]  # "module:function" (imported lazily) or callable


REGISTRY: dict[str, Entry] = {}


def register(name: str, config: type, build: str | Callable, *, replace: bool = False) -> None:
  """Adds optimizer `name` (see the module docstring); ValueError if it exists."""
  if not (dataclasses.is_dataclass(config) and issubclass(config, OptimizerConfig)):
    raise ValueError(f"optimizer {name!r}: its config must be a dataclass subclassing "
                     "OptimizerConfig.")
  if name in REGISTRY and not replace:
    raise ValueError(f"optimizer {name!r} is already registered; pass replace=True.")
  REGISTRY[name] = Entry(config=config, build=build)


def unregister(name: str) -> None:
  REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
  return tuple(REGISTRY)


def entry(name: str) -> Entry:
  if name not in REGISTRY:
    raise ValueError(f"unknown optimizer {name!r}; choose one of {names()}")
  return REGISTRY[name]


def optimizer_config(name: str = "adamw", **fields) -> OptimizerConfig:
  """The config dataclass of optimizer `name` with `fields` set (enums or their values)."""
  return entry(name).config(name=name, **fields)


for _name in ("sgd", "momentum", "adam", "adamw"):
  register(_name, OptimizerConfig, f"pergrad.optim.build:{_name}")
register("sign", SignConfig, "pergrad.optim.build:sign")
register("adam_family", AdamFamilyConfig, "pergrad.optim.build:adam_family")
