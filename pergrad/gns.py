"""Gradient noise scale (GNS) from per-example gradient norms, tracked every step.

Definitions (McCandlish et al. 2018, arXiv 1812.06162; per-example form of Gray et al.,
arXiv 2411.00999; conventions of their reference code CerebrasResearch/nanoGNS). For one
optimizer batch of B per-example gradients g_1..g_B restricted to a block of parameters
(a leaf, a layer, a layer type, the whole model), with P = (1/B) Σ_b ‖g_b‖² and ‖ḡ‖² the
squared norm of the batch mean:

    |G|²_est = (B‖ḡ‖² − P) / (B − 1)      unbiased for ‖E g‖²
    S_est    = (P − ‖ḡ‖²) / (1 − 1/B)     unbiased for tr Σ (Σ = Cov g_b)

Both are sums over coordinates, so they ADD over disjoint blocks: a layer type's terms are
the sums of its leaves' terms. The two-batch form (`two_batch_terms`: small batches of b
examples, e.g. microbatches or devices, inside a big batch of B) is

    |G|²_est = (B‖G_B‖² − b·‖G_b‖²) / (B − b),   S_est = (‖G_b‖² − ‖G_B‖²) / (1/b − 1/B)

with ‖G_b‖² averaged over the small batches; b = 1 is the per-example form.

    B_simple = EMA_α(S_est) / EMA_α(|G|²_est)

in examples (sequences), since g_b is one sequence's gradient; in tokens it is T·B_simple
(T tokens per sequence), the unit Gray et al. and the batch-size literature quote.

each term smoothed separately (never the EMA of the per-step ratio, whose denominator
is noisy and can be ≤ 0), each debiased by its weight w_t = 1 − α^t (carried as the
recurrence w_t = α w_{t−1} + (1 − α)). `resmooth` runs the same float32 recurrences in
NumPy on the logged raw terms (written with the 9 digits that round-trip a float32): it
equals the online values to float32 rounding, not bit for bit, since the device may fuse
a multiply and an add into one FMA (XLA:CPU does) where NumPy rounds twice.

Layer types (`layer_type`): first match of `TYPE_RULES` (fnmatch on the leaf path
"block_0/attn/query/kernel"): normalization, unembedding, embedding, attention, mlp, else
"other". A tied embedding is one parameter used twice (lookup and unembedding): with
`tied="include"` it counts once, as "embedding", in its type and the total; with
`tied="exclude"` (nanoGNS's convention) it is left out of every group. Figures say which.

`track_gns` is an optax-style transformation (identity on the updates) that reads the
per-example squared norms of `grad_stats` ("norms") every step and keeps, per group, the
raw terms of the step and their EMAs; `metrics(opt_state)` gives "gns/<group>/..." keys
for metrics.jsonl, and `resmooth(run_dir, alpha)` recomputes B_simple offline from the
logged raw terms with any α (equal to the online values for the same α; tested).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from pergrad.optim import common
from pergrad.stats.layers import LAYER_TYPES, TYPE_RULES, layer_type, selects
from pergrad.stats.summaries import noise_terms
from pergrad.stats.types import GradStats

TOTAL = "total"
TIED = ("include", "exclude")


def leaf_paths(tree: Any) -> list[str]:
  """'block_0/attn/query/kernel' for every leaf, in tree order."""
  return [jax.tree_util.keystr(p, simple=True, separator="/")
          for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def groups_of(paths: Sequence[str], *, tied_leaf: str | None = None, tied: str = "include",
              rules: Sequence[tuple[str, str]] = TYPE_RULES, layers: Sequence[str] = ()
              ) -> dict[str, tuple[int, ...]]:
  """{group: leaf indices}: each layer type present, and "total" (every counted leaf).

  tied_leaf: the path of a tied embedding table (None: untied); `tied` says whether it is
  counted ("include", as "embedding") or left out of every group ("exclude", nanoGNS).
  layers: the statistics' layer selection (`pergrad.stats.layers`; empty: every leaf);
  "total" is then the total over the selected leaves.
  """
  if tied not in TIED:
    raise ValueError(f"gns tied={tied!r}; choose one of {TIED}.")
  if tied_leaf is not None and tied_leaf not in paths:
    raise ValueError(f"tied embedding leaf {tied_leaf!r} is not a parameter leaf.")
  counted = [i for i, p in enumerate(paths) if not (tied == "exclude" and p == tied_leaf)
             and selects(layers, p)]
  if not counted:
    raise ValueError(f"no parameter leaf is selected by layers={list(layers)} (types "
                     f"{LAYER_TYPES} or path patterns).")
  out: dict[str, list[int]] = {}
  for i in counted:
    out.setdefault(layer_type(paths[i], rules), []).append(i)
  ordered = {k: tuple(out[k]) for k in LAYER_TYPES if k in out}
  ordered[TOTAL] = tuple(counted)
  return ordered


def leaf_terms(stats: GradStats) -> tuple[list[jax.Array], list[jax.Array]]:
  """Per leaf (tree order): (|G|²_est, S_est) of one step's per-example norms (float32)."""
  if not stats.has("norms") or stats.granularity != "example":
    raise ValueError("GNS needs per-example squared norms: ask the statistics engine for "
                     "want=[..., 'norms'] at granularity 'example' (e.g. stats=gns).")
  B = stats.count.astype(jnp.float32)
  P = [jnp.mean(n.astype(jnp.float32)) for n in jax.tree.leaves(stats.sq_norms)]
  g2 = [jnp.sum(jnp.square(m.astype(jnp.float32))) for m in jax.tree.leaves(stats.mean)]
  terms = [noise_terms(B, p, g) for g, p in zip(g2, P, strict=True)]
  return [t[0] for t in terms], [t[1] for t in terms]


def group_terms(stats: GradStats, groups: Mapping[str, Sequence[int]]
                ) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
  """({group: |G|²_est}, {group: S_est}): sums of the leaves' terms over each group."""
  G2, S = leaf_terms(stats)
  add = lambda xs, idx: sum((xs[i] for i in idx), jnp.float32(0.0))
  return ({g: add(G2, idx) for g, idx in groups.items()},
          {g: add(S, idx) for g, idx in groups.items()})


def two_batch_terms(small_sq_norms, big_sq_norm, b_small: float, b_big: float):
  """(|G|²_est, S_est) from ‖G_b‖² of small batches of b_small examples (averaged over
  them) and ‖G_B‖² of the big batch of b_big (McCandlish et al. 2018, App. A.1)."""
  if not b_big > b_small >= 1:
    raise ValueError(f"two-batch GNS needs b_big > b_small >= 1, got {b_big}, {b_small}.")
  small = jnp.mean(jnp.asarray(small_sq_norms, jnp.float32))
  big = jnp.asarray(big_sq_norm, jnp.float32)
  G2 = (b_big * big - b_small * small) / (b_big - b_small)
  S = (small - big) / (1.0 / b_small - 1.0 / b_big)
  return G2, S


# --- the tracker ---------------------------------------------------------------------------
class GnsTrackerState(NamedTuple):
  """Per group: this step's raw terms, their un-debiased EMAs, and the EMA weight."""

  G2: dict  # group -> float32: |G|²_est of the last step
  S: dict  # group -> float32: S_est of the last step
  ema_G2: dict  # group -> float32: α·ema + (1 − α)·G2
  ema_S: dict
  weight: jax.Array  # float32 w_t = α w_{t−1} + (1 − α) = 1 − α^t


def _ema(alpha: float, old, new):
  return jnp.float32(alpha) * old + jnp.float32(1.0 - alpha) * new


def _debiased(ema, weight):
  return ema / jnp.maximum(weight, jnp.finfo(jnp.float32).tiny)


def track_gns(alpha: float, *, tied_leaf: str | None = None, tied: str = "include",
              rules: Sequence[tuple[str, str]] = TYPE_RULES, layers: Sequence[str] = ()
              ) -> optax.GradientTransformationExtraArgs:
  """Identity on the updates; tracks the GNS terms of every group (`groups_of` on the
  parameter paths, restricted to `layers`) from `grad_stats`, which must hold
  per-example "norms" of those leaves (ask for them with `request(layers)`)."""
  if not 0.0 <= alpha < 1.0:
    raise ValueError(f"gns alpha={alpha} is outside [0, 1); choose an EMA decay in [0, 1).")
  if tied not in TIED:
    raise ValueError(f"gns tied={tied!r}; choose one of {TIED}.")
  groups = lambda tree: groups_of(leaf_paths(tree), tied_leaf=tied_leaf, tied=tied,
                                  rules=rules, layers=layers)

  def init_fn(params):
    zero = {g: jnp.float32(0.0) for g in groups(params)}
    return GnsTrackerState(G2=zero, S=dict(zero), ema_G2=dict(zero), ema_S=dict(zero),
                           weight=jnp.float32(0.0))

  def update_fn(updates, state, params=None, *, grad_stats=None, **extra_args):
    del params, extra_args
    if grad_stats is None:
      raise ValueError("track_gns needs grad_stats with per-example 'norms' (stats.gns).")
    G2, S = group_terms(grad_stats, groups(grad_stats.mean))
    return updates, GnsTrackerState(
        G2=G2, S=S,
        ema_G2={g: _ema(alpha, state.ema_G2[g], G2[g]) for g in G2},
        ema_S={g: _ema(alpha, state.ema_S[g], S[g]) for g in S},
        weight=_ema(alpha, state.weight, jnp.float32(1.0)))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def find_state(opt_state: Any) -> GnsTrackerState | None:
  return common.find_state(opt_state, GnsTrackerState)


def metrics(opt_state: Any) -> dict[str, jax.Array]:
  """"gns/<group>/{G2,S}" (this step's raw terms: what `resmooth` reads), and the smoothed
  "gns/<group>/{G2_ema,S_ema}" (debiased) and "gns/<group>/b_simple" = S_ema / G2_ema."""
  st = find_state(opt_state)
  if st is None:
    return {}
  out = {}
  for g in st.G2:
    ema_G2, ema_S = _debiased(st.ema_G2[g], st.weight), _debiased(st.ema_S[g], st.weight)
    out.update({f"gns/{g}/G2": st.G2[g], f"gns/{g}/S": st.S[g], f"gns/{g}/G2_ema": ema_G2,
                f"gns/{g}/S_ema": ema_S, f"gns/{g}/b_simple": ema_S / ema_G2})
  return out


# --- offline -------------------------------------------------------------------------------
def smooth(G2: Sequence[float], S: Sequence[float], alpha: float) -> dict[str, np.ndarray]:
  """The tracker's EMAs over a sequence of raw terms, in the same float32 arithmetic:
  {"G2_ema", "S_ema", "b_simple"} per step (debiased)."""
  a, b, one = np.float32(alpha), np.float32(1.0 - alpha), np.float32(1.0)
  e_G2 = e_S = w = np.float32(0.0)
  rows = {"G2_ema": [], "S_ema": [], "b_simple": []}
  for g2, s in zip(np.asarray(G2, np.float32), np.asarray(S, np.float32), strict=True):
    e_G2, e_S, w = a * e_G2 + b * g2, a * e_S + b * s, a * w + b * one
    wd = max(w, np.finfo(np.float32).tiny)
    rows["G2_ema"].append(e_G2 / wd)
    rows["S_ema"].append(e_S / wd)
    rows["b_simple"].append((e_S / wd) / (e_G2 / wd))
  return {k: np.asarray(v, np.float32) for k, v in rows.items()}


def read_terms(run_dir: str | Path) -> dict[str, dict[str, np.ndarray]]:
  """{group: {"step", "G2", "S"}} from a run's metrics.jsonl (rows with gns/<group>/G2)."""
  rows: dict[str, dict[str, list]] = {}
  with open(Path(run_dir) / "metrics.jsonl") as f:
    for line in f:
      r = json.loads(line)
      for k, v in r.items():
        if k.startswith("gns/") and k.endswith("/G2") and f"{k[:-3]}/S" in r:
          g = k[len("gns/"):-len("/G2")]
          d = rows.setdefault(g, {"step": [], "G2": [], "S": []})
          d["step"].append(r["step"])
          d["G2"].append(v)
          d["S"].append(r[f"{k[:-3]}/S"])
  if not rows:
    raise ValueError(f"{run_dir}/metrics.jsonl has no gns/<group>/G2 terms; train with "
                     "stats=gns (or stats.gns=true) to log them every step.")
  return {g: {k: np.asarray(v) for k, v in d.items()} for g, d in rows.items()}


def resmooth(run_dir: str | Path, alpha: float) -> dict[str, dict[str, np.ndarray]]:
  """B_simple of every logged group recomputed with EMA decay `alpha` from the raw terms:
  {group: {"step", "G2", "S", "G2_ema", "S_ema", "b_simple"}}. The logged steps must be
  every step from the first (the tracker's EMA sees every step)."""
  if not 0.0 <= alpha < 1.0:
    raise ValueError(f"alpha={alpha} is outside [0, 1); choose an EMA decay in [0, 1).")
  out = {}
  for g, d in read_terms(run_dir).items():
    steps = d["step"]
    if len(steps) and not np.array_equal(steps, np.arange(steps[0], steps[0] + len(steps))):
      raise ValueError(f"{run_dir}: gns/{g} terms are not logged at every step; the EMA "
                       "cannot be recomputed.")
    out[g] = {**d, **smooth(d["G2"], d["S"], alpha)}
  return out
