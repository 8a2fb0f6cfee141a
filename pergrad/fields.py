"""Config field helpers: `Choice` (a fixed set of options), `resumable()`, `label()`, and the
checks that more than one floor shares (`positive`, `check_decay`).

A choice set is one str-Enum, defined next to the component that uses it, e.g.

    class Norm(Choice):
      layernorm = "layernorm"
      rmsnorm = "rmsnorm"

OmegaConf checks a composed value against it (a bad value fails at compose time, naming
the key and the options); the dataclass's `__post_init__` calls `Norm.check(value,
"model.norm")`, so a dataclass built in Python is checked too, and keeps the plain
string (what JSON, paths and f-strings see). OmegaConf 2.3 has no `typing.Literal`.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

RESUMABLE = "resumable"  # field metadata: the key may differ between a run and its resumption
LABEL = "label"  # field metadata: the key names or places a run, never changes what it writes


def resumable(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING):
  """A dataclass field a resumed run may change (`pergrad.config.plan.fingerprint` skips it)."""
  return dataclasses.field(default=default, default_factory=default_factory,
                           metadata={RESUMABLE: True})


def label(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING):
  """A field that only names or places a run (its output, caches, W&B, the progress bar): runs
  that differ only there are one run (`pergrad.config.plan.identity` skips it); resumable."""
  return dataclasses.field(default=default, default_factory=default_factory,
                           metadata={RESUMABLE: True, LABEL: True})


class Choice(str, enum.Enum):
  @classmethod
  def check(cls, value, key: str) -> str:
    """`value` (a member or its string) as a plain string; ValueError naming `key`."""
    try:
      return cls(value).value
    except ValueError:
      raise ValueError(f"{key}={value} is unknown; choose one of "
                       f"{', '.join(m.value for m in cls)}.") from None

  @classmethod
  def values(cls) -> tuple[str, ...]:
    return tuple(m.value for m in cls)


def positive(obj, prefix: str, *keys: str, zero: bool = False) -> None:
  """ValueError (one line) unless each field `keys` of `obj` is > 0 (>= 0 with zero=True)."""
  for key in keys:
    v = getattr(obj, key)
    if v is not None and (v < 0 if zero else v <= 0):
      raise ValueError(f"{prefix}.{key}={v} must be {'>= 0' if zero else '> 0'}"
                       f"{' (0 turns it off)' if zero else ''}.")


def check_decay(beta: float, key: str = "beta") -> float:
  """`beta` if it is an EMA decay, 0 <= beta < 1; else ValueError (one line) naming `key`."""
  if not 0.0 <= beta < 1.0:
    raise ValueError(f"{key}={beta} is outside [0, 1); choose an EMA decay in [0, 1).")
  return beta
