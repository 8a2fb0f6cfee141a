"""The lr search's rounds (`LrSearch`, the policy `POLICY`): the best lr per group (`best_lr`)
and the next round's blocks (`follow_up_blocks`), from a sweep's finished runs alone.

A diverged run (`rules.DIVERGED_RULE`, `marked_finals`) counts as +inf. Only the fresh seeds at
the chosen lr are reported (`loss_mean`, `loss_std`, `n_seeds`); the selection seeds' mean is
`select_loss`. A search runs its rounds as (`experiments.runner.launch_sweep` does)

    launch_blocks(sdir, sweep.base, sweep.blocks)
    for _ in range(sweep.lr_search.rounds):
      blocks, kind = follow_up_blocks(sweep, marked_finals(aggregate(sdir), sweep.base))
      launch_blocks(sdir, sweep.base, blocks)  # until kind is "seeds" or "none"
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from pergrad.analysis import rules
from pergrad.analysis.runs import finals, finished, fmt, from_table, run_setting
from pergrad.sweep import more_seeds
from pergrad.sweep.grid import Block, Sweep, config_extras
from pergrad.sweep.growth import (
  extensions,
  first_stage_fixed,
  first_stage_lrs,
  in_seeds,
  missing_lrs,
  select_seeds,
  tuned_blocks,
)


@functools.lru_cache(maxsize=32)
def vocab_size(overrides: tuple) -> int:
  """V of the config that `overrides` compose."""
  from pergrad.analysis import scale_summary

  return int(scale_summary(list(overrides))["vocab_size"])


def marked_finals(table: pd.DataFrame, base: dict, extra: Sequence[str] = ()) -> pd.DataFrame:
  """`runs.finals` with `rules.mark_diverged` on each run's eval history (V of the config that
  `base` and the config-changing `extra` overrides compose)."""
  fin = finals(table)
  if fin.empty or "eval/loss" not in table:
    return fin
  overrides = tuple(f"{k}={fmt(v)}" for k, v in base.items()) + tuple(config_extras(extra))
  return rules.mark_diverged(fin, vocab_size(overrides), table)


def best_lr(fin: pd.DataFrame, group_keys: Sequence[str], lr_key: str,
            seed_key: str = "train.seed", metric: str = "final_eval_loss",
            select_seed=None, each_seed: bool = False) -> pd.DataFrame:
  """Per group (a missing key reads as None): the lr chosen on the selection seeds (`select_seed`,
  one or a tuple; else the group's lowest), `select_loss` there, the fresh seeds' losses at it
  (a diverged seed makes the mean inf), the lr grid, its edges (`each_seed`: also where one
  selection seed's own lowest loss is at an edge) and divergences. A group with selection runs
  but no lr that every selection seed finished chooses nothing: it is named in
  `attrs["unscored"]` (`unscored_line`), never chosen on fewer seeds."""
  rows, unscored = [], []
  completed = finished(fin)
  completed = completed.assign(**{k: None for k in group_keys if k not in completed})
  has_seed = seed_key in completed
  if select_seed is not None:
    select_seed = tuple(select_seed) if isinstance(select_seed, (tuple, list)) else (select_seed,)
  for gvals, g in completed.groupby(list(group_keys), sort=False, dropna=False):  # keys: tuples
    sel = (select_seed if select_seed is not None else (g[seed_key].min(),)) if has_seed else ()
    s0 = g[in_seeds(g[seed_key], sel)] if has_seed else g
    if s0.empty:  # no selection run in this group: nothing was selected
      continue
    per_lr = s0.groupby(lr_key)[metric].mean().sort_index()
    if has_seed:  # an lr is scored on every selection seed, never on fewer (a run missing)
      per_lr = per_lr[s0.groupby(lr_key)[seed_key].nunique().reindex(per_lr.index) >= len(sel)]
      if per_lr.empty:
        unscored.append(unscored_line(dict(zip(group_keys, gvals, strict=False)), sel,
                                      s0[seed_key]))
        continue
    lrs = list(per_lr.index)
    finite = np.isfinite(per_lr.to_numpy(dtype=float))
    best = per_lr.idxmin() if finite.any() else lrs[0]
    i = lrs.index(best)
    edge = "low" if i == 0 else ("high" if i == len(lrs) - 1 else "")
    for _, d in (s0.groupby(seed_key) if each_seed and finite[i] and has_seed else ()):
      own = d.groupby(lr_key)[metric].mean().astype(float)  # a seed's own best at an edge
      own = own[np.isfinite(own)]
      j = lrs.index(own.idxmin()) if len(own) else -1
      edge = edge or ("low" if j == 0 else "high" if j == len(lrs) - 1 else "")
    fresh = (g[~in_seeds(g[seed_key], sel) & np.isclose(g[lr_key].astype(float), float(best),
                                                   rtol=1e-9)].sort_values(seed_key)
             if has_seed else g.iloc[:0])
    vals = [float(v) if np.isfinite(v) else math.inf for v in fresh[metric]]
    finite_vals = all(np.isfinite(vals))
    rows.append({
        **dict(zip(group_keys, gvals, strict=False)),
        lr_key: best,
        "select_seed": (from_table(sel[0]) if len(sel) == 1
                        else " ".join(fmt(from_table(x)) for x in sel)) if has_seed else None,
        "select_loss": float(per_lr.loc[best]),
        "loss_mean": (float(np.mean(vals)) if finite_vals else math.inf) if vals else math.nan,
        "loss_std": float(np.std(vals, ddof=1)) if len(vals) > 1 and finite_vals else math.nan,
        "n_seeds": len(vals),
        "fresh_seeds": " ".join(fmt(from_table(x)) for x in fresh[seed_key]) if has_seed else "",
        "fresh_losses": " ".join(repr(v) for v in vals),
        "at_edge": bool(finite[i] and edge),
        "edge": edge,
        "grid": " ".join(fmt(float(x)) for x in lrs),
        "n_diverged": int((~finite).sum()),
        "all_diverged": bool(not finite.any()),
        "diverged_lrs": " ".join(fmt(float(x)) for x in sorted(set(
            g.loc[~np.isfinite(g[metric].astype(float)), lr_key].astype(float)))),
        WARMUP: float(g[WARMUP].min()) if WARMUP in g else math.nan,
    })
  out = pd.DataFrame(rows, columns=None if rows else [*group_keys, lr_key, *BEST_COLUMNS, WARMUP])
  out.attrs["unscored"] = unscored
  return out


BEST_COLUMNS = ("select_seed", "select_loss", "loss_mean", "loss_std", "n_seeds", "fresh_seeds",
                "fresh_losses", "at_edge", "edge", "grid", "n_diverged", "all_diverged",
                "diverged_lrs")  # `best_lr`'s columns past the group keys and the lr


def unscored_line(group: dict, select: Sequence, ran: pd.Series) -> str:
  """'<group>: no lr ran on every selection seed (<select>; finished: <seeds>)'."""
  name = ", ".join(f"{k.split('.')[-1]}={fmt(from_table(v))}" for k, v in group.items())
  seeds = lambda xs: " ".join(fmt(from_table(x)) for x in sorted(set(xs)))
  return (f"{name}: no lr ran on every selection seed ({seeds(select)}; finished: "
          f"{seeds(ran) or 'none'})")


def common_seeds(best: pd.DataFrame) -> list:
  """The fresh seeds every group of `best_lr`'s table with fresh seeds ran at its chosen lr
  (a seeds round gives each group the same ones; an experiment may add more to one)."""
  sets = [set(str(s).split()) for s, n in zip(best["fresh_seeds"], best["n_seeds"],
                                              strict=True) if n > 0] if len(best) else []
  return sorted(int(float(s)) for s in set.intersection(*sets)) if sets else []


WARMUP = "warmup_steps"  # a run's warmup in optimizer steps, read from its Hydra config


def with_warmup(fin: pd.DataFrame, sweep_dir: Path) -> pd.DataFrame:
  """`fin` with WARMUP: each run's schedule.warmup_steps as its config records it, else as its
  name does (a swept value), else NaN (never guessed)."""
  if fin.empty:
    return fin.assign(**{WARMUP: []})
  named = fin.get("schedule.warmup_steps", pd.Series(math.nan, index=fin.index))
  w = [run_setting(Path(sweep_dir) / r, "schedule.warmup_steps") for r in fin["run"]]
  return fin.assign(**{WARMUP: [float(n) if x is None else float(x)
                                for x, n in zip(w, named, strict=True)]})


def factor_of(grid: Sequence[float]) -> float:
  """The grid's step: the smallest ratio of neighbouring values (1 with < 2 values)."""
  g = sorted(set(grid))
  return min((b / a for a, b in zip(g, g[1:], strict=False) if a > 0), default=1.0)


def follow_up_blocks(sweep: Sweep, fin: pd.DataFrame) -> tuple[list[Block], str]:
  """(blocks, kind) of the next follow-up round: per group the next lr past its edge (while the
  grid holds fewer than `max_extend` lrs past its first-stage grid on that side) or below an
  all-diverged grid (down to `diverged_floor`), else its fresh seeds; with `tuned`, the values
  added past an edge of a tuned value (`growth.tuned_blocks`); with `more`, once the fresh
  seeds (the pilot) have finished, the seeds that power an under-powered comparison
  (`more_seeds.blocks`). kind: "extend" (the settled groups' seeds come along), "pilot" (the
  fresh seeds, more may follow), "seeds" or "none". A function of the finished runs alone: a
  search stopped and resumed any number of times reaches the grid of one run through."""
  ls = sweep.lr_search
  if ls is None or fin.empty:
    return [], "none"
  seed0 = list(select_seeds(sweep))
  best = best_lr(fin, ls.group_keys, ls.lr_key, ls.seed_key, select_seed=tuple(seed0),
                 each_seed=ls.each_seed)
  extend, seeds, moving = [], [], []  # moving: the groups whose lr grid grows this round
  for _, b in best.iterrows():
    group = {k: from_table(b[k]) for k in ls.group_keys}
    if missing_lrs(sweep, group, b["grid"]):  # an added value's group, stopped: completed first
      continue
    one = {k: [v] for k, v in group.items()}
    grid, lr = [float(x) for x in b["grid"].split()], None
    first = first_stage_lrs(sweep, group)  # none: a group no first-stage block made, not extended
    if b["all_diverged"]:  # the floor: below the lowest lr of the first-stage blocks
      if grid[0] > min(first, default=grid[-1]) / ls.diverged_floor * (1 + 1e-6):
        lr = grid[0] / ls.factor
    elif b["at_edge"] and first and extensions(grid, first, b["edge"]) < ls.max_extend:
      lr = grid[0] / ls.factor if b["edge"] == "low" else grid[-1] * ls.factor
    elif ls.seeds and np.isfinite(b["select_loss"]):
      seeds.append(Block({**one, ls.lr_key: [float(b[ls.lr_key])],
                          ls.seed_key: list(ls.seeds)}, fixed=first_stage_fixed(sweep, group)))
    if lr is not None:  # the group's budget (its first-stage `fixed`) comes along
      extend.append(Block({**one, ls.lr_key: [float(f"{lr:.3g}")], ls.seed_key: seed0},
                          fixed=first_stage_fixed(sweep, group)))
      moving.append(group)
  waiting = False
  if ls.tuned is not None:  # "loss_mean": the search's own fresh seeds, as at its seeds round
    score = best if ls.tuned.metric == "select_loss" else best_lr(
        fin[in_seeds(fin[ls.seed_key], [*seed0, *ls.seeds])], ls.group_keys, ls.lr_key,
        ls.seed_key, select_seed=tuple(seed0))
    more, waiting = tuned_blocks(sweep, best, score, moving)
    extend += more
  if extend or waiting:
    return extend + seeds, "extend"
  if ls.more is not None:  # the fresh seeds were a pilot: more where under-powered
    more, waiting = more_seeds.blocks(sweep, fin, best, seed0)
    if waiting:
      return seeds, "pilot"
    seeds += more
  return seeds, "seeds" if seeds else "none"
