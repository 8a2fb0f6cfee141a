"""The device mesh: one axis, 'data', over every device of every process.

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
  """A 1-D ('data',) mesh of `devices` (default: all devices, of all processes)."""
  devices = list(devices if devices is not None else jax.devices())
  return Mesh(np.asarray(devices), (AXIS,))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis split over 'data', other axes whole."""
  return NamedSharding(mesh, P(AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())
