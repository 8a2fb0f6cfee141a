"""The surface of pergrad that analysis code (the `experiments` package, notebooks) may use.

Experiments read run directories (metrics.jsonl, summary.json, config.yaml) and launch
the training and benchmark entry points (`python -m pergrad.train`, `pergrad.bench`); for
everything else they call the functions here, never training internals, so that those can
change behind this module. Imports are deferred: reading a table does not import JAX.

  read_records(path)                the records of a metrics.jsonl
  smooth(G2, S, alpha)              the GNS tracker's recurrence, offline (B_simple)
  GNS_TOTAL                         the whole-model group of the logged gns/<group>/ terms
  ema_gain(snr2_ema, snr2_batch)    SNR_ema / SNR_batch from the logged SNR²s
  composed(overrides)               the config Hydra composes, as plain values
  scale_summary(overrides)          model and data sizes of a composed config
  n_params(overrides)               the parameter count of its model (no initialization)
  leaf_sizes(overrides)             {leaf path: parameter count} of its model, as logged
  layer_type(path)                  a leaf path's layer type ("norm", "mlp", ...; the GNS groups)
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

GNS_TOTAL = "total"


def read_records(path: str | Path) -> list[dict]:
  """The records of a metrics.jsonl; a torn line (killed writer) is skipped."""
  from pergrad.train.metrics import read_records as read

  return read(path)


def smooth(G2, S, alpha: float) -> dict:
  """Debiased EMAs of the per-step terms |G|²_est and S_est and B_simple = EMA(S)/EMA(|G|²)
  with decay `alpha`, as the online tracker computes them."""
  from pergrad.stats.noise import smooth as smooth_

  return smooth_(G2, S, alpha)


def ema_gain(snr2_ema, snr2_batch):
  """SNR_ema / SNR_batch = √(snr2_ema / snr2_batch), NaN unless both are > 0."""
  from pergrad.stats.noise import ema_gain as gain

  return gain(snr2_ema, snr2_batch)


def composed(overrides: Sequence[str]) -> dict:
  """The config `python -m pergrad.train OVERRIDES` would run, as plain values."""
  from pergrad.config import compose, to_plain

  return to_plain(compose(list(overrides)))


def scale_summary(overrides: Sequence[str]) -> dict:
  """{model (its name), n_layers, d_model, n_heads, data (its name), vocab_size, tokenizer,
  batch_size, seq_len, steps} of the composed config, after the plan's checks."""
  from pergrad.config import build_plan, compose

  p = build_plan(compose(list(overrides)))
  m, d = p.model, p.data
  return {"model": p.config["model"]["name"], "n_layers": m.n_layers, "d_model": m.d_model,
          "n_heads": m.n_heads, "data": d.name, "vocab_size": d.vocab_size,
          "tokenizer": d.tokenizer, "batch_size": d.batch_size, "seq_len": d.seq_len,
          "steps": p.train.steps}


def n_params(overrides: Sequence[str]) -> int:
  """The number of parameters of the composed config's model (shapes only)."""
  import jax

  from pergrad.config import build_plan, compose
  from pergrad.model import init_params

  model = build_plan(compose(list(overrides))).model
  shapes = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)))


def leaf_sizes(overrides: Sequence[str]) -> dict[str, int]:
  """{leaf path ("block_0/attn/query/kernel", as in the logged "opt/<leaf>/..." keys):
  its parameter count} of the composed config's model (shapes only)."""
  import jax

  from pergrad.config import build_plan, compose
  from pergrad.model import init_params
  from pergrad.stats.noise import leaf_path

  model = build_plan(compose(list(overrides))).model
  shapes = jax.eval_shape(lambda: init_params(model, jax.random.key(0)))
  return {leaf_path(p): int(math.prod(x.shape))
          for p, x in jax.tree_util.tree_flatten_with_path(shapes)[0]}


def layer_type(path: str) -> str:
  """The layer type of a leaf path by the GNS groups' rules (`pergrad.layer_types`)."""
  from pergrad.layer_types import layer_type as kind

  return kind(path)
