"""Optimizer configs: one dataclass per optimizer, and the registry of optimizers.

Plain Python (no JAX): the schema's `optimizer` node is these dataclasses, into which Hydra
merges `configs/optimizer/<name>.yaml`. Every optimizer is one entry

    REGISTRY.get(name) = Entry(config=<dataclass>, build="module:function" or a callable)

where `build(cfg, hp) -> Direction` returns the optimizer's direction (an optax
transformation) and the statistics it reads; `pergrad.optim.build` wraps it in the chain
every optimizer shares (clipping, weight decay, learning-rate schedule). A plugin adds one
with a config dataclass subclassing `OptimizerConfig` (or `MomentumConfig`, `AdamConfig`),
`name = "<name>"` and its fields checked in `__post_init__`; a `build`; and
`register("<name>", NameConfig, build)`; then `plugins=[module] optimizer=<name>`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from pergrad.fields import Choice, check_decay
from pergrad.registry import Registry


class LrScaling(Choice):
  """lr x (B / B_ref)^κ with κ = `exponent`: none 0, sqrt 1/2, linear 1."""

  none = "none"
  sqrt = "sqrt"
  linear = "linear"

  @property
  def exponent(self) -> float:
    return {"none": 0.0, "sqrt": 0.5, "linear": 1.0}[self.value]


class Placement(Choice):
  example = "example"  # EMA(mean_i sign(g_i))
  token = "token"  # EMA(mean_t sign(token contributions))
  batch = "batch"  # EMA(sign(mean g))
  ema = "ema"  # sign(EMA(mean g)) = SignEMA = optax.signum


class AdamVariant(Choice):
  adam = "adam"
  micro_adam = "micro_adam"
  micro_adam_var = "micro_adam_var"
  micro_adam_msq = "micro_adam_msq"
  mix = "mix"


@dataclasses.dataclass
class OptimizerConfig:
  """Fields every optimizer has: the chain around its direction (sgd: this alone)."""

  name: str = "sgd"  # the registry entry (set by optimizer=<name>)
  lr: float = 3e-3  # peak learning rate at batch size `ref_batch_size`
  weight_decay: float = 0.0  # decoupled (AdamW-style), times the learning rate
  clip_norm: float | None = None  # global-norm clipping of the mean gradient
  per_example_clip: float | None = None  # clip each g_i before every statistic
  noise_multiplier: float = 0.0  # DP-SGD: N(0, (σ·C)²) on the clipped sum (C: per_example_clip)
  lr_scaling: LrScaling = LrScaling.none  # lr x (B / ref_batch_size)^k, k = 0, 1/2, 1
  ref_batch_size: int = 32  # B_ref of lr = lr * (B / B_ref) ** kappa

  def __post_init__(self):
    self.lr_scaling = LrScaling.check(self.lr_scaling, "optimizer.lr_scaling")
    if not self.lr > 0:
      raise ValueError(f"optimizer.lr={self.lr} must be positive")
    if self.weight_decay < 0:
      raise ValueError(f"optimizer.weight_decay={self.weight_decay} must be >= 0")
    if self.clip_norm is not None and self.clip_norm <= 0:
      raise ValueError(f"optimizer.clip_norm={self.clip_norm} must be positive (or null)")
    if self.ref_batch_size < 1:
      raise ValueError(f"optimizer.ref_batch_size={self.ref_batch_size} must be positive")
    if self.noise_multiplier < 0 or (self.noise_multiplier and self.per_example_clip is None):
      raise ValueError(f"optimizer.noise_multiplier={self.noise_multiplier} must be >= 0, and "
                       "> 0 only with optimizer.per_example_clip set (the noise is σ·C).")


@dataclasses.dataclass
class MomentumConfig(OptimizerConfig):
  """An EMA of the gradient (momentum, sign family)."""

  name: str = "momentum"
  b1: float = 0.9  # momentum / first-moment EMA decay (sign family: the EMA beta)
  sde_scaling: bool = False  # with lr_scaling=sqrt, also scale 1-b and eps (Malladi et al.)

  def __post_init__(self):
    super().__post_init__()
    check_decay(self.b1, "optimizer.b1")
    if self.sde_scaling and self.lr_scaling != "sqrt":
      raise ValueError(
          f"sde_scaling=true goes with lr_scaling=sqrt (Malladi et al.), got lr_scaling="
          f"{self.lr_scaling}; set optimizer.lr_scaling=sqrt or optimizer.sde_scaling=false")


@dataclasses.dataclass
class SignConfig(MomentumConfig):
  name: str = "sign"
  placement: Placement = Placement.ema  # where the sign is taken (before or after the EMA)

  def __post_init__(self):
    super().__post_init__()
    self.placement = Placement.check(self.placement, "optimizer.placement")


@dataclasses.dataclass
class AdamConfig(MomentumConfig):
  """A second-moment EMA and ε (adam, adamw, the Adam family)."""

  name: str = "adamw"
  b2: float = 0.95  # second-moment EMA decay
  eps: float = 1e-8  # added to the square root of the second moment
  eps_root: float = 0.0  # epsilon inside the square root

  def __post_init__(self):
    super().__post_init__()
    check_decay(self.b2, "optimizer.b2")
    if self.eps < 0 or self.eps_root < 0:
      raise ValueError(f"optimizer.eps={self.eps} and optimizer.eps_root={self.eps_root} "
                       "must be >= 0")


@dataclasses.dataclass
class AdamFamilyConfig(AdamConfig):
  name: str = "adam_family"
  variant: AdamVariant = AdamVariant.adam  # the second moment s the update divides by
  mix_a: float = 1.0  # variant=mix: s = mix_a * mu2_hat + mix_b * sigma2_hat
  mix_b: float = 0.0  # variant=mix: weight of sigma2_hat

  def __post_init__(self):
    super().__post_init__()
    self.variant = AdamVariant.check(self.variant, "optimizer.variant")


@dataclasses.dataclass
class Entry:
  config: type  # dataclass, subclass of OptimizerConfig
  build: str | Callable[[Any, Any], tuple]  # "module:function" (imported lazily) or callable


REGISTRY: Registry[Entry] = Registry("optimizer", hint="a plugin adds one with "
                                    "pergrad.optim.register")


def register(name: str, config: type, build: str | Callable, *, replace: bool = False) -> None:
  """Adds optimizer `name` (see the module docstring); ValueError if it exists."""
  if not (dataclasses.is_dataclass(config) and issubclass(config, OptimizerConfig)):
    raise ValueError(f"optimizer {name!r}: its config must be a dataclass subclassing "
                     "OptimizerConfig.")
  REGISTRY.register(name, Entry(config=config, build=build), replace=replace)


def optimizer_config(name: str = "adamw", **fields) -> OptimizerConfig:
  """The config dataclass of optimizer `name` with `fields` set (enums or their values)."""
  return REGISTRY.get(name).config(name=name, **fields)


register("sgd", OptimizerConfig, "pergrad.optim.builders:sgd")
register("momentum", MomentumConfig, "pergrad.optim.builders:momentum")
for _name in ("adam", "adamw"):  # one direction: the chain adds the weight decay
  register(_name, AdamConfig, "pergrad.optim.builders:adam")
register("sign", SignConfig, "pergrad.optim.builders:sign")
register("adam_family", AdamFamilyConfig, "pergrad.optim.builders:adam_family")
REGISTRY.seal()
