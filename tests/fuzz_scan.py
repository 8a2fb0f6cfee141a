"""The fuzzer's scanned stack (hazard "scan", `fuzz_models`): two dense layers, their leaves
stacked [2, ...], run by a scan in each frontend's own way (`jax.lax.scan`, `nnx.scan`,
Linen `nn.scan`), the step under remat (`jax.checkpoint`, `nnx.remat`, `nn.remat`) where the
model's "scan_remat" says; h ← tanh(dense_l(h)) for l = 0, 1."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import nnx

from pergrad.stats import taps

LAYERS = 2


def plain(stack: dict, h, remat: bool):
  """lax.scan over {"kernel": [2, D, D], "bias": [2, D]}, through `taps.dense`."""
  step = lambda c, q: (jnp.tanh(taps.dense(c, q["kernel"], q["bias"])), None)
  return jax.lax.scan(jax.checkpoint(step) if remat else step, h, stack)[0]


def nnx_stack(D: int, rngs):
  """Two nnx.Linear(D, D), made by nnx.vmap: leaves [2, ...]."""
  @nnx.split_rngs(splits=LAYERS)
  @nnx.vmap(in_axes=(0,), out_axes=0)
  def make(r):
    return nnx.Linear(D, D, rngs=r)
  return make(rngs)


def nnx_scan(stack, h, remat: bool):
  """nnx.scan over the stacked layers, h the carry."""
  step = lambda lin, c: jnp.tanh(lin(c))
  step = nnx.remat(step) if remat else step
  return nnx.scan(step, in_axes=(0, nnx.Carry), out_axes=nnx.Carry)(stack, h)


class _LinenStep(nn.Module):
  features: int

  @nn.compact
  def __call__(self, c, _):
    return jnp.tanh(nn.Dense(self.features, name="lin")(c)), None


def linen(D: int, remat: bool) -> nn.Module:
  """The nn.scan module (name "stack"): params {"lin": {"kernel": [2, D, D], ...}}; call it
  on (h, None), its first output the new h."""
  step = nn.remat(_LinenStep, prevent_cse=False) if remat else _LinenStep
  return nn.scan(step, variable_axes={"params": 0}, split_rngs={"params": True},
                 length=LAYERS)(D, name="stack")
