"""DP-SGD's noise as a link of the optimizer's chain (`build_optimizer` adds it when
optimizer.noise_multiplier > 0)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from pergrad.optim.schedule import step_args


def add_clipped_noise(noise_multiplier: float, clip: float, max_batch_size: int, seed: int = 0
                      ) -> optax.GradientTransformationExtraArgs:
  """DP-SGD's noise on the mean of B clipped per-example gradients: u + (σ·C/B)·ξ,
  ξ ~ N(0, I) (noise σ·C on the clipped sum). Stateless: B is the update's batch size
  (extra argument `batch_size`, a static int; None: max_batch_size) and ξ is drawn from
  fold_in(PRNGKey(seed), examples_seen), unique per update and the same after a resume."""

  def update(updates, state, params=None, **extra_args):
    del params
    seen, batch_size = step_args("add_clipped_noise", max_batch_size, **extra_args)
    std = noise_multiplier * clip / batch_size
    key = jax.random.fold_in(jax.random.PRNGKey(seed), seen)
    leaves, treedef = jax.tree.flatten(updates)
    keys = jax.random.split(key, len(leaves))
    noisy = [u + jnp.asarray(std, u.dtype) * jax.random.normal(k, u.shape, u.dtype)
             for u, k in zip(leaves, keys, strict=True)]
    return jax.tree.unflatten(treedef, noisy), state

  return optax.GradientTransformationExtraArgs(optax.init_empty_state, update)
