"""The device mesh: one axis, 'data', over all local devices.

The batch is split along its leading (example) axis across the mesh; parameters and
optimizer state are replicated. On one device every sharding is a no-op.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "data"


def make_mesh(devices=None) -> Mesh:
  """A 1-D ('data',) mesh of `devices` (default: every local device)."""
  devices = list(devices if devices is not None else jax.local_devices())
  return Mesh(np.asarray(devices), (AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis split over 'data', other axes whole."""
  return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_divisible(batch_size: int, mesh: Mesh, what: str = "data.batch_size") -> None:
  """ValueError (one line) unless `batch_size` splits evenly over the mesh."""
  n = mesh.devices.size
  if batch_size % n:
    lo, hi = (batch_size // n) * n, (batch_size // n + 1) * n
    fix = f"{lo} or {hi}" if lo else f"{hi}"
    raise ValueError(
        f"{what}={batch_size} is not divisible by the {n} devices of the ('data',) mesh; "
        f"use a multiple of {n} (e.g. {what}={fix}).")
