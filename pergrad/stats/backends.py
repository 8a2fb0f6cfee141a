"""The backend table: every way of computing `GradStats`, behind one signature.

    fn(loss_fn, params, batch, request, options) -> (mean loss, GradStats)

`loss_fn(params, batch) -> float32[B]`, `request` a `StatsRequest` (what), `options` a
`StatsOptions` (how). A backend may assume what `pergrad.stats.compute` checks before
calling it, once, from the entry's declared support: a batch with one leading example
axis B, per-example losses of shape (B,), a granularity it lists, per-example clipping
only where it declares it, and (at granularity "token") multiplicative statistics; it
sees one chunk of `options.microbatch_size` examples as its batch. Built in:

  value_and_grad  the plain ḡ = ∇ (1/B) Σ_b loss_b; "mean" alone (sum = B ḡ, count = B)
  contraction     the same ḡ, each dense kernel's gradient as one contraction over
                  (example, row) (`surgery.contraction_stats`)
  vmap            per-example gradients by `jax.vmap(jax.grad)`, reduced in the same jit
  surgery         one backward pass with custom VJPs that emit the statistics (and
                  per-example clipping without a second backward: `surgery/clip.py`)
  surgery_vmap    surgery for the proven leaves; refused ones by `surgery/cuts.py` or vmap
  loop            a Python loop over examples: a reference for tests
`register_backend` adds one (a user's, from a plugin module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from pergrad.registry import Registry
from pergrad.stats import reference, surgery, vmap
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import Granularity, StatsRequest
from pergrad.stats.types import GradStats

BackendFn = Callable[[Callable, Any, Any, StatsRequest, StatsOptions], tuple[jax.Array, GradStats]]
CLIPS = (None, "clip_power", "any")


@dataclasses.dataclass(frozen=True)
class Backend:
  """One table entry: the function and what it supports (checked by the dispatcher).

  Attributes:
    fn: the backend (module docstring).
    granularities: the granularities it computes.
    clip: per-example clipping: None (not supported), "clip_power" (statistics with a
      `clip_power` only: it weights instead of clipping each g_b), "any".
    statistics: False for a backend that computes "mean" alone.
    microbatch: False where chunking changes nothing (already one example at a time).
    alone: True where each example runs as a batch of one (vmap, the loop, surgery_vmap's
      pass for the refused leaves): its loss must then be its row of the batch's
      (`alone.check_alone`, checked by the dispatcher).
  """

  fn: BackendFn
  granularities: tuple[str, ...] = ("example",)
  clip: str | None = None
  statistics: bool = True
  microbatch: bool = True
  alone: bool = False

  def __post_init__(self):
    if not callable(self.fn):
      raise ValueError(f"backend fn={self.fn!r} must be callable.")
    bad = set(self.granularities) - set(Granularity.values())
    if not self.granularities or bad:
      raise ValueError(f"granularities={self.granularities}: choose among {Granularity.values()}.")
    if self.clip not in CLIPS:
      raise ValueError(f"clip={self.clip!r}; choose one of {CLIPS}.")


def value_and_grad_stats(loss_fn, params, batch, request: StatsRequest, options: StatsOptions):
  """ḡ = ∇ (1/B) Σ_b loss_b; sum = B ḡ, count = B."""
  del request, options  # "mean" alone; nothing to choose
  B = jax.tree.leaves(batch)[0].shape[0]
  loss, grads = jax.value_and_grad(lambda p: loss_fn(p, batch).mean())(params)
  stats = GradStats(count=jnp.asarray(B, jnp.float32),
                    sum=jax.tree.map(lambda g: g * B, grads))
  return loss, stats


REGISTRY: Registry[Backend] = Registry(
    "backend", hint="add one with pergrad.stats.register_backend", reserved=("auto",))
REGISTRY.register("value_and_grad", Backend(value_and_grad_stats, statistics=False,
                                            microbatch=False))
REGISTRY.register("contraction", Backend(surgery.contraction_stats, statistics=False,
                                         microbatch=False))
REGISTRY.register("vmap", Backend(vmap.vmap_stats, clip="clip_power", alone=True))
REGISTRY.register("surgery", Backend(surgery.surgery_stats, granularities=("example", "token"),
                                     clip="any"))
REGISTRY.register("surgery_vmap", Backend(surgery.surgery_vmap_stats, alone=True))
REGISTRY.register("loop", Backend(reference.loop_stats, clip="any", microbatch=False,
                                  alone=True))
REGISTRY.seal()


def register_backend(name: str, backend: Backend, *, replace: bool = False) -> Backend:
  """Adds `backend` to `REGISTRY` under `name` (then `compute(..., backend=name)`)."""
  if not isinstance(backend, Backend):
    raise ValueError(f"register_backend({name!r}, ...) takes a Backend(fn, ...), got "
                     f"{type(backend).__name__}.")
  return REGISTRY.register(name, backend, replace=replace)


def unregister_backend(name: str) -> None:
  """Removes a backend added by `register_backend`; no error if it is absent."""
  REGISTRY.unregister(name)


def get(name: str) -> Backend:
  """The table entry of `name`; ValueError naming the registered ones."""
  return REGISTRY.get(name)
