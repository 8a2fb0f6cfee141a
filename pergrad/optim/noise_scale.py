"""The gradient noise scale's tracker (Gray et al., arXiv 2411.00999).

`track_gns` reads the per-example squared norms of `grad_stats` ("norms") every step and
keeps, per group (`noise.groups_of`), the step's raw terms |G|²_est, S_est and their EMAs;
`gns_metrics(gns_state)` gives the "gns/<group>/..." keys, logged every step. The raw
terms are written with the 9 digits that round-trip a float32, so `pergrad.analysis.resmooth`
recomputes B_simple offline with any α.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from pergrad.fields import check_decay
from pergrad.layer_types import TYPE_RULES
from pergrad.optim.tracker import Tracker
from pergrad.stats import noise


class GnsTrackerState(NamedTuple):
  """Per group: this step's raw terms, their un-debiased EMAs, and the EMA weight."""

  G2: dict  # group -> float32: |G|²_est of the last step
  S: dict  # group -> float32: S_est of the last step
  ema_G2: dict  # group -> float32: α·ema + (1 − α)·G2
  ema_S: dict
  weight: jax.Array  # float32 w_t = α w_{t−1} + (1 − α) = 1 − α^t


def track_gns(alpha: float, *, tied_leaf: str | None = None, tied: str = "include",
              rules: Sequence[tuple[str, str]] = TYPE_RULES, layers: Sequence[str] = ()
              ) -> Tracker:
  """Tracks the GNS terms of every group (`noise.groups_of` on the parameter paths,
  restricted to `layers`) from `grad_stats`, which must hold per-example "norms" of those
  leaves (`build_optimizer(gns=...)` adds them to the optimizer's request)."""
  check_decay(alpha, "gns alpha")
  if tied not in noise.TIED:
    raise ValueError(f"gns tied={tied!r}; choose one of {noise.TIED}.")
  groups = lambda tree: noise.groups_of(noise.leaf_paths(tree), tied_leaf=tied_leaf,
                                        tied=tied, rules=rules, layers=layers)

  def init(params):
    zero = {g: jnp.float32(0.0) for g in groups(params)}
    return GnsTrackerState(G2=zero, S=dict(zero), ema_G2=dict(zero), ema_S=dict(zero),
                           weight=jnp.float32(0.0))

  def update(state, grad_stats, hparams=None):
    del hparams
    if grad_stats is None:
      raise ValueError("track_gns needs grad_stats with per-example 'norms' (stats.gns).")
    G2, S = noise.group_terms(grad_stats, groups(grad_stats.mean))
    return GnsTrackerState(
        G2=G2, S=S,
        ema_G2={g: noise.ema(alpha, state.ema_G2[g], G2[g]) for g in G2},
        ema_S={g: noise.ema(alpha, state.ema_S[g], S[g]) for g in S},
        weight=noise.ema(alpha, state.weight, jnp.float32(1.0)))

  return Tracker(init, update)


def gns_metrics(st: Any) -> dict[str, jax.Array]:
  """"gns/<group>/{G2,S}" (this step's raw terms: what `resmooth` reads), and the smoothed
  "gns/<group>/{G2_ema,S_ema}" (debiased) and "gns/<group>/b_simple" = S_ema / G2_ema,
  from the `track_gns` state `st`; {} for an empty state (the GNS is not tracked)."""
  if not isinstance(st, GnsTrackerState):
    return {}
  out = {}
  for g in st.G2:
    G2_ema = noise.debiased(st.ema_G2[g], st.weight)
    S_ema = noise.debiased(st.ema_S[g], st.weight)
    out.update({f"gns/{g}/G2": st.G2[g], f"gns/{g}/S": st.S[g], f"gns/{g}/G2_ema": G2_ema,
                f"gns/{g}/S_ema": S_ema, f"gns/{g}/b_simple": S_ema / G2_ema})
  return out
