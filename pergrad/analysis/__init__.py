"""Analysis of pergrad runs: what analysis code (the `experiments` package, notebooks, your
own scripts) calls. The readers, rules and offline formulas are NumPy/pandas only (importing
this package or a submodule, or reading a table, imports no JAX); the functions that compose
a config or build a model's shapes import the library inside the call.

  runs        a sweep's run directories as one tidy table (a row per run and step, the swept
              values from the run names), finals, where a curve reaches a target
  leafwise    per-leaf tables of the logged `opt/`, `stats/` and `sign/` keys, per-leaf views
              of whole-model ratios, sign counts pooled over leaves
  rules       decision rules over seeds (pair wins, equivalence of curves, bounds on ratios,
              divergence), each stated in English beside its code
  calibrate   each rule's false-alarm rate and power, simulated at a comparison's own noise
  guards      validity guards checked before any verdict (bracketed, stable, warm, in regime,
              powered): a failed one makes the verdict "undetermined: <guard>"
  plots       matplotlib helpers (U-curves over learning rates, mean curves over seeds)

and here:

  read_records(path)                the records of a metrics.jsonl
  smooth(G2, S, alpha)              the GNS tracker's recurrence, offline (B_simple)
  resmooth(run_dir, alpha)          smooth on a run's logged gns/<group>/{G2,S} terms
  GNS_TOTAL                         the whole-model group of the logged gns/<group>/ terms
  ema_gain(snr2_ema, snr2_batch)    SNR_ema / SNR_batch from the logged SNR²s
  composed(overrides)               the config Hydra composes, as plain values
  scale_summary(overrides)          model and data sizes of a composed config
  n_params(overrides)               the parameter count of its model (no initialization)
  leaf_sizes(overrides)             {leaf path: parameter count} of its model, as logged
  layer_type(path)                  a leaf path's layer type ("norm", "mlp", ...; the GNS groups)

The statistics benchmark is `pergrad.bench.stats` (same floor: analysis does not import it).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from pergrad.fields import check_decay
from pergrad.files import METRICS, read_records
from pergrad.layer_types import layer_type

GNS_TOTAL = "total"
__all__ = ["GNS_TOTAL", "composed", "ema_gain", "layer_type", "leaf_sizes", "n_params",
           "read_records", "resmooth", "scale_summary", "smooth"]


def smooth(G2: Sequence[float], S: Sequence[float], alpha: float) -> dict[str, np.ndarray]:
  """The tracker's float32 recurrence on raw terms: e_t = α e_{t−1} + (1 − α) x_t, debiased
  by w_t = 1 − α^t (the EMA of ones); {"G2_ema", "S_ema", "b_simple" = S_ema / G2_ema}."""
  a, b, one = np.float32(alpha), np.float32(1.0 - alpha), np.float32(1.0)
  e_g, e_s, w = np.float32(0.0), np.float32(0.0), np.float32(0.0)
  rows: dict[str, list] = {"G2_ema": [], "S_ema": [], "b_simple": []}
  for g2, s in zip(np.asarray(G2, np.float32), np.asarray(S, np.float32), strict=True):
    e_g, e_s, w = a * e_g + b * g2, a * e_s + b * s, a * w + b * one
    wd = max(w, np.finfo(np.float32).tiny)
    rows["G2_ema"].append(e_g / wd)
    rows["S_ema"].append(e_s / wd)
    rows["b_simple"].append((e_s / wd) / (e_g / wd))
  return {k: np.asarray(v, np.float32) for k, v in rows.items()}


def resmooth(run_dir: str | Path, alpha: float) -> dict[str, dict[str, np.ndarray]]:
  """B_simple of every logged GNS group recomputed with EMA decay `alpha` from the raw
  terms "gns/<group>/{G2,S}" (`smooth`): {group: {"step", "G2", "S", "G2_ema", "S_ema",
  "b_simple"}}. The terms must be logged at every step from the first."""
  check_decay(alpha, "alpha")
  is_G2 = lambda k: k.startswith("gns/") and k.endswith("/G2")
  recs = [r for r in read_records(Path(run_dir) / METRICS) if any(map(is_G2, r))]
  groups = [k[len("gns/"):-len("/G2")] for k in (recs[0] if recs else {}) if is_G2(k)]
  if not groups:
    raise ValueError(f"{run_dir}/{METRICS} has no gns/<group>/G2 terms; train with "
                     "stats=gns (or stats.gns=true) to log them every step.")
  steps = np.asarray([r["step"] for r in recs])
  if not np.array_equal(steps, np.arange(steps[0], steps[0] + len(steps))):
    raise ValueError(f"{run_dir}: the gns terms are not logged at every step; the EMA "
                     "cannot be recomputed.")
  out = {}
  for g in groups:
    d = {"step": steps, "G2": np.asarray([r[f"gns/{g}/G2"] for r in recs]),
         "S": np.asarray([r[f"gns/{g}/S"] for r in recs])}
    out[g] = {**d, **smooth(d["G2"], d["S"], alpha)}
  return out


def ema_gain(snr2_ema, snr2_batch):
  """SNR_ema / SNR_batch = √(snr2_ema / snr2_batch), NaN unless both are > 0."""
  ok = (snr2_ema > 0) & (snr2_batch > 0)
  return np.sqrt(np.where(ok, snr2_ema, np.nan) / np.where(ok, snr2_batch, np.nan))


def _plan(overrides: Sequence[str]):
  from pergrad.config import build_plan, compose

  return build_plan(compose(list(overrides)))


def composed(overrides: Sequence[str]) -> dict:
  """The config `python -m pergrad.train OVERRIDES` would run, as plain values."""
  from pergrad.config import compose, to_plain

  return to_plain(compose(list(overrides)))


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
