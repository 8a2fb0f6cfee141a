"""Losses. The per-example loss is the mean token cross-entropy of one sequence;
the batch loss is the mean over examples, so the batch gradient is the mean of the
per-example gradients (the convention every statistic in `pergrad.stats` uses).

A batch is a dict {"inputs": int32[B, T], "targets": int32[B, T]}.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

Batch = dict[str, jax.Array]
# (params, batch) -> per-example losses float32[B]
PerExampleLossFn = Callable[[object, Batch], jax.Array]


def per_example_xent(logits_BxTxV: jax.Array, targets_BxT: jax.Array) -> jax.Array:
  """loss_b = (1/T) sum_t -log softmax(logits_bt)[target_bt]  ->  float32[B]."""
  xent_BxT = optax.softmax_cross_entropy_with_integer_labels(
      logits_BxTxV.astype(jnp.float32), targets_BxT)
  return xent_BxT.mean(axis=-1)


def make_loss_fn(model: nn.Module) -> PerExampleLossFn:
  """Per-example loss of a Flax LM: (params, batch) -> float32[B]."""

  def loss_fn(params, batch: Batch) -> jax.Array:
    logits_BxTxV = model.apply({"params": params}, batch["inputs"])
    return per_example_xent(logits_BxTxV, batch["targets"])

  return loss_fn
