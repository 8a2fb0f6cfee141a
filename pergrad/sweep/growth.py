"""Where a search's grids start and how they grow: the first-stage lrs and tuned values of a
group (`LrSearch`, `Tuned`), the values added past an edge, the selection seeds."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

from pergrad.analysis.runs import fmt, from_table
from pergrad.sweep.grid import Block, Sweep


def in_seeds(col: pd.Series, seeds) -> pd.Series:
  return col.astype(float).isin([float(s) for s in seeds])


def same(a, b) -> bool:
  """Equality of override values read back from tables (None ~ NaN, floats ~ close)."""
  a, b = from_table(a), from_table(b)
  if a is None or b is None:
    return a is b
  num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)
  return math.isclose(float(a), float(b), rel_tol=1e-6) if num(a) and num(b) else a == b


def tuned_blocks(sweep: Sweep, best: pd.DataFrame, score: pd.DataFrame,
                 moving: Sequence[dict]) -> tuple[list[Block], bool]:
  """(blocks, waiting) of `LrSearch.tuned` this round, from `best` (`best_lr` of the runs) and
  `score` (the same on the search's selection and fresh seeds alone): the first-stage lrs an
  added value's group still misses (a stopped round is completed before anything is chosen
  from it); then, per family none of whose groups is `moving` or incomplete, the next value
  past the chosen one when it lies at an edge (`Tuned`). waiting: a family whose choice awaits
  the fresh seeds of this round (metric "loss_mean")."""
  ls, t = sweep.lr_search, sweep.lr_search.tuned
  seed0 = list(select_seeds(sweep))
  fam = lambda g: tuple(fmt(from_table(g[k])) for k in t.within)
  busy = {fam(g) for g in moving}
  blocks, waiting = [], False
  for _, b in best.iterrows():  # an added value's group completes its first lrs first
    group = {k: from_table(b[k]) for k in ls.group_keys}
    if missing := missing_lrs(sweep, group, b["grid"]):
      blocks.append(Block({**{k: [v] for k, v in group.items()}, ls.lr_key: missing,
                           ls.seed_key: seed0}, fixed=first_stage_fixed(sweep, group)))
      busy.add(fam(group))
  for _, g in score.groupby([*t.within], sort=False, dropna=False):
    rows = g.to_dict("records")
    first = first_stage_values(sweep, {k: from_table(rows[0][k]) for k in ls.group_keys})
    if fam(rows[0]) in busy or len(first) < 2:
      continue
    if t.metric == "loss_mean" and any(r["n_seeds"] < len(ls.seeds) and np.isfinite(
        r["select_loss"]) for r in rows):  # (a group diverged at every lr gets no seeds)
      waiting = True  # its seeds come in this round
      continue
    vals = np.array([r[t.metric] for r in rows], float)
    if not np.isfinite(vals).any():
      continue
    chosen = rows[int(np.nanargmin(np.where(np.isfinite(vals), vals, np.nan)))]
    measured = sorted(float(r[t.key]) for r in rows)
    here = from_table(chosen[t.key])
    edge = ("low" if math.isclose(float(here), measured[0], rel_tol=1e-9) else
            "high" if math.isclose(float(here), measured[-1], rel_tol=1e-9) else "")
    if not edge or extensions(measured, first, edge) >= t.max_extend or (
        new := t.next(here, edge)) is None:
      continue
    group = {**{k: from_table(chosen[k]) for k in ls.group_keys}, **t.point(new)}
    blocks.append(Block({**{k: [v] for k, v in group.items()},
                         ls.lr_key: first_stage_lrs(sweep, group), ls.seed_key: seed0},
                        fixed=first_stage_fixed(sweep, group)))
  return blocks, waiting


def missing_lrs(sweep: Sweep, group: dict, grid: str) -> list[float]:
  """The first-stage lrs that the group of a value `LrSearch.tuned` added has not run on its
  selection seeds (`grid`: best_lr's, the lrs it has); [] for any other group."""
  first = first_stage_values(sweep, group)
  if not first or any(same(group[sweep.lr_search.tuned.key], v) for v in first):
    return []
  have = [float(x) for x in str(grid).split()]
  return [x for x in first_stage_lrs(sweep, group)
          if not any(math.isclose(x, y, rel_tol=1e-6) for y in have)]


def _matching(sweep: Sweep, group: dict, skip: Sequence[str] = ()) -> list[Block]:
  """The first-stage blocks of the lr search whose values admit `group` (keys in `skip`, and a
  key the block lacks, match any)."""
  ls = sweep.lr_search
  value = lambda bl, k: bl.grid.get(k, [bl.fixed[k]] if k in bl.fixed else None)
  return [bl for bl in sweep.blocks if ls.lr_key in bl.grid
          and all(k in skip or value(bl, k) is None or any(same(v, x) for x in value(bl, k))
                  for k, v in group.items())]


def first_stage_values(sweep: Sweep, group: dict) -> list[float]:
  """The first-stage values of `LrSearch.tuned` in `group`'s family (none without `tuned`)."""
  t = sweep.lr_search.tuned
  if t is None or t.key not in group:
    return []
  skip = [k for k in group if k not in t.within]
  return sorted({float(x) for bl in _matching(sweep, group, skip) if t.key in bl.grid
                 for x in bl.grid[t.key]})


def _first_blocks(sweep: Sweep, group: dict) -> list[Block]:
  """The first-stage blocks of `group` (a block without a group key matches any); a group at a
  value `LrSearch.tuned` added: the block of its family's nearest value."""
  blocks = _matching(sweep, group)
  if not blocks and (t := sweep.lr_search.tuned) is not None and t.key in group:
    near = _matching(sweep, group, skip=tuple(t.point(group[t.key])))
    dist = lambda bl: min(abs(math.log(float(x) / float(group[t.key]))) for x in bl.grid[t.key])
    blocks = sorted((bl for bl in near if t.key in bl.grid), key=dist)[:1]
  return blocks


def first_stage_lrs(sweep: Sweep, group: dict) -> list[float]:
  """The lrs the first-stage blocks give `group` (`_first_blocks`)."""
  return sorted(float(x) for bl in _first_blocks(sweep, group)
                for x in bl.grid[sweep.lr_search.lr_key])


def first_stage_fixed(sweep: Sweep, group: dict) -> dict:
  """The `fixed` settings (steps, warmup, eval and log cadence) of `group`'s first-stage
  blocks (`_first_blocks`), which every block that grows the group's grid or adds its seeds
  inherits: a run of the group trains on the group's budget. Blocks of the group that fix a
  key differently are a plan error (ValueError)."""
  out: dict = {}
  for bl in _first_blocks(sweep, {k: v for k, v in group.items()
                                  if k in sweep.lr_search.group_keys}):
    for k, v in bl.fixed.items():
      if k in out and not same(out[k], v):
        raise ValueError(f"group {group}: its first-stage blocks fix {k} to {out[k]} and {v}; "
                         "give the group one budget")
      out[k] = v
  return out


def extensions(grid: Sequence[float], first: Sequence[float], edge: str) -> int:
  """How many lrs of `grid` lie past the first-stage grid `first` on side `edge` (low|high)."""
  tol = 1 + 1e-6
  return sum(x * tol < min(first) if edge == "low" else x > max(first) * tol for x in grid)


def select_seeds(sweep: Sweep) -> tuple:
  """The selection seeds of an lr search: the seeds of the first block that sets them."""
  ls = sweep.lr_search
  return next((tuple(bl.grid[ls.seed_key]) for bl in sweep.blocks
               if ls is not None and ls.seed_key in bl.grid), (0,))
