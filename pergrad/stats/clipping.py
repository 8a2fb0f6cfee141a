"""Per-example clipping's weights, the one home both the vmap and the surgery backend read.

A clipped gradient is ĝ_b = w_b g_b with w_b = min(1, C/‖g_b‖), ‖·‖ over the whole model;
every statistic of the ĝ_b follows from the w_b (`vmap.py`, `surgery/clip.py`). The loop
(`reference.py`) clips each g_b itself: it is the independent reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def clip_weights(sq_norms_B: jax.Array, clip: float) -> jax.Array:
  """w_b = min(1, C/‖g_b‖) from ‖g_b‖² (1 where ‖g_b‖ = 0)."""
  norms_B = jnp.sqrt(sq_norms_B)
  return jnp.where(norms_B > clip, clip / jnp.where(norms_B > 0, norms_B, 1.0), 1.0)
