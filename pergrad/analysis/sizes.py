"""The config `python -m pergrad.train OVERRIDES` would run, and its model's sizes (shapes
only: no initialization). The library is imported inside the calls, so importing this module
imports no JAX."""

from __future__ import annotations

import functools
import math
from typing import Sequence


def _plan(overrides: Sequence[str]):
  from pergrad.config import build_plan, compose

  return build_plan(compose(list(overrides)))


def composed(overrides: Sequence[str]) -> dict:
  """The config `python -m pergrad.train OVERRIDES` would run, as plain values."""
  from pergrad.config import compose, to_plain

  return to_plain(compose(list(overrides)))


def identity(config: dict) -> dict:
  """A resolved config's keys that define what its run computes (`pergrad.config.plan.identity`)."""
  from pergrad.config.plan import identity as of

  return of(config)


def scale_summary(overrides: Sequence[str]) -> dict:
  """{model, n_layers, d_model, n_heads, data, vocab_size, tokenizer, batch_size, seq_len,
  steps} of the composed config, after the plan's checks."""
  p = _plan(overrides)
  m, d = p.model, p.data
  return {"model": p.config["model"]["name"], "n_layers": m.n_layers, "d_model": m.d_model,
          "n_heads": m.n_heads, "data": d.name, "vocab_size": d.vocab_size,
          "tokenizer": d.tokenizer, "batch_size": d.batch_size, "seq_len": d.seq_len,
          "steps": p.train.steps}


def _shapes(overrides: Sequence[str]):
  import jax

  from pergrad.model import init_params

  model = _plan(overrides).model
  return jax.eval_shape(lambda: init_params(model, jax.random.key(0)))


def n_params(overrides: Sequence[str]) -> int:
  """The number of parameters of the composed config's model (shapes only)."""
  return int(sum(leaf_sizes(overrides).values()))


def leaf_sizes(overrides: Sequence[str]) -> dict[str, int]:
  """{leaf path ("block_0/attn/query/kernel", as in the logged "opt/<leaf>/..." keys):
  its parameter count} of the composed config's model (shapes only; composed once per
  process and overrides)."""
  return dict(_leaf_sizes(tuple(overrides)))


@functools.lru_cache(maxsize=64)
def _leaf_sizes(overrides: tuple) -> tuple:
  import jax

  from pergrad.stats.noise import leaf_path

  flat = jax.tree_util.tree_flatten_with_path(_shapes(overrides))[0]
  return tuple((leaf_path(p), int(math.prod(x.shape))) for p, x in flat)
