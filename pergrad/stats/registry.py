"""The registry of gradient statistics: each statistic is defined once, here (or in user code).

    ps.register(ps.Statistic(name="abs", kind="coordinate", phi=jnp.abs, clip_power=1,
                             multiplicative=True, doc="Σ_n |g_n| per coordinate"))

Every backend then computes it (`want=("mean", "abs")`), with microbatching, per-example
clipping and `GradStats.merge`; it is read as `grad_stats.coord("abs")`. The recipe:
README.md, "How to add ...".

Kinds (n samples g_1..g_n: examples, or tokens at granularity "token"):
  - "coordinate": Σ_n φ(g_n) per parameter coordinate, a tree like params; merged over
    microbatches / devices / `GradStats.merge` by addition.
  - "example": Σ_coords φ(g_b) per example and per parameter leaf, leaves float32[B];
    merged by concatenation along the example axis (granularity "example" only).

Requirements on φ (elementwise, float32 -> float32): φ(0) = 0 (surgery's sparse embedding
and padding paths rely on it). `clip_power` p states φ(w·g) = w^p φ(g) for w ≥ 0 (vmap's
per-example clipping; None: only the loop backend clips it). `multiplicative` states
φ(a·b) = φ(a)·φ(b), which surgery's per-token Σ_t φ(a_t δ_tᵀ) = φ(A)ᵀφ(Δ) needs.
"mean" is not a registered statistic: the gradient sum is always computed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from pergrad.registry import Registry

KINDS = ("coordinate", "example")


@dataclasses.dataclass(frozen=True)
class Statistic:
  """One registered statistic; see the module docstring for the meaning of each field.

  Attributes:
    name: the key in `want` and in `GradStats` (not "mean").
    kind: "coordinate" (Σ_n φ(g_n), like params, merged by addition) or "example"
      (Σ_coords φ(g_b), float32[B] per leaf, merged by concatenation).
    phi: the elementwise φ (float32 array -> float32 array), with φ(0) = 0.
    clip_power: p with φ(w·g) = w^p φ(g) for a clip weight w ≥ 0; None if none exists.
    multiplicative: φ(a·b) = φ(a)·φ(b) (needed for per-token statistics by surgery).
    doc: one line of math, e.g. "Σ_n g_n² per coordinate".
    summarize: optional (leaf value, count n) -> {suffix: scalar}, logged per leaf as
      "stats/<leaf>/<suffix>"; None: the generic summary (`summaries.layer_summaries`).
  """

  name: str
  kind: str
  phi: Callable[[jax.Array], jax.Array]
  clip_power: float | None = None
  multiplicative: bool = False
  doc: str = ""
  summarize: Callable[[jax.Array, jax.Array], dict[str, Any]] | None = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name.isidentifier() or self.name == "mean":
      raise ValueError(f"Statistic name {self.name!r} must be an identifier other than 'mean'.")
    if self.kind not in KINDS:
      raise ValueError(f"Statistic '{self.name}': kind={self.kind!r} must be one of {KINDS}.")
    if not callable(self.phi):
      raise ValueError(f"Statistic '{self.name}': phi must be callable (elementwise φ).")
    if self.clip_power is not None and not self.clip_power >= 0:
      raise ValueError(f"Statistic '{self.name}': clip_power={self.clip_power} must be >= 0 "
                       "or None.")


REGISTRY: Registry[Statistic] = Registry(
    "statistic", hint="add one with pergrad.stats.register", reserved=("mean",))


def register(stat: Statistic, *, replace: bool = False) -> Statistic:
  """Adds `stat` to `REGISTRY` under its name (`Registry.register`)."""
  if not isinstance(stat, Statistic):
    raise TypeError(f"register() takes a Statistic, got {type(stat).__name__}.")
  return REGISTRY.register(stat.name, stat, replace=replace)


def unregister(name: str) -> None:
  """Removes a registered statistic (not a built-in one); no error if it is absent."""
  REGISTRY.unregister(name)


def get(name: str) -> Statistic:
  """The registered statistic `name` (ValueError naming the valid ones if unknown)."""
  return REGISTRY.get(name)


def names(kind: str | None = None) -> tuple[str, ...]:
  """Registered statistic names in registration order (of one kind if given); no "mean"."""
  return tuple(k for k, s in REGISTRY.items() if kind is None or s.kind == kind)


def select(want: Sequence[str], kind: str | None = None) -> tuple[str, ...]:
  """The registered statistics in `want` (of one kind if given), in registration order."""
  want = set(want)
  return tuple(k for k in names(kind) if k in want)


class _StatisticsView(Sequence):
  """Live, ordered view ("mean", *registered names): `STATISTICS` in `pergrad.stats`."""

  def _names(self) -> tuple[str, ...]:
    return ("mean",) + names()

  def __getitem__(self, i):
    return self._names()[i]

  def __len__(self) -> int:
    return 1 + len(REGISTRY)

  def __iter__(self) -> Iterator[str]:
    return iter(self._names())

  def __contains__(self, x) -> bool:
    return x == "mean" or x in REGISTRY

  def __eq__(self, other) -> bool:
    return isinstance(other, (tuple, list, _StatisticsView)) and tuple(self) == tuple(other)

  def __hash__(self):
    return hash(tuple(self))

  def __repr__(self) -> str:
    return repr(self._names())


STATISTICS = _StatisticsView()


# --- built-ins -----------------------------------------------------------------------------
register(Statistic("sq", "coordinate", jnp.square, clip_power=2, multiplicative=True,
                   doc="Σ_n g_n² per coordinate (second moment, variance)"))
register(Statistic("sign", "coordinate", jnp.sign, clip_power=0, multiplicative=True,
                   doc="Σ_n sign(g_n) per coordinate (sign agreement)"))
register(Statistic("norms", "example", jnp.square, clip_power=2, multiplicative=True,
                   doc="‖g_b‖² = Σ_coords g_b² per example and leaf"))
REGISTRY.seal()
