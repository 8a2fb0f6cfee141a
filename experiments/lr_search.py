"""Learning-rate sweeps (`sweep.POLICY`): the best lr per group, follow-up stages, CSVs, figures.

A diverged run (`rules.DIVERGED_RULE`) counts as +inf. Only the fresh seeds at the chosen lr
are reported (`loss_mean`, `loss_std`, `n_seeds`); the selection seeds' mean is `select_loss`.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from experiments import more_seeds
from experiments.grids import (
  extensions,
  first_stage_fixed,
  first_stage_lrs,
  in_seeds,
  missing_lrs,
  same,
  select_seeds,
  tuned_blocks,
)
from experiments.markdown import md_table
from experiments.sweep import Block, Sweep, config_extras, family, is_rung, scale_value
from pergrad.analysis import guards, rules
from pergrad.analysis import plots as F
from pergrad.analysis.runs import (
  curves_at,
  finals,
  finished,
  fmt,
  from_table,
  read_csv,
  run_setting,
  write_csv,
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
  selection seed's own lowest loss is at an edge) and divergences."""
  rows = []
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
  return pd.DataFrame(rows)


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


def guards_of(best: pd.DataFrame, labeler: Callable[[dict], str], used=None) -> tuple:
  """(bracketed, stable, warm) of the `load_best` groups whose label is in `used` (all if None):
  each chosen lr strictly inside its grid, one grid step below the smallest lr at which any of
  its seeds diverged, and each group's runs warmed up ≥ `guards.MIN_WARMUP` steps."""
  recs = [r for r in best.to_dict("records") if used is None or labeler(r) in used]
  lrs = lambda v: [float(x) for x in str(v).split()] if from_table(v) is not None else []
  grid = {labeler(r): (lrs(r["grid"]), float(r["optimizer.lr"])) for r in recs}
  steps = [factor_of(g) for g, _ in grid.values() if len(g) > 1]
  div = {labeler(r): (float(r["optimizer.lr"]), lrs(r.get("diverged_lrs"))) for r in recs}
  warm = {labeler(r): float(r.get(WARMUP, math.nan)) for r in recs}
  stable = (guards.stable(div, min(steps, default=1.0)) if "diverged_lrs" in best or not recs
            else guards.Guard("stable", False, "best.csv records no divergences (diverged_lrs): "
                              "written by older code, re-analyse the sweep"))
  return guards.bracketed(grid), stable, guards.warm(warm)


def warm_of(fin: pd.DataFrame, labeler: Callable[[dict], str], used) -> guards.Guard:
  """`guards.warm` of the finals' runs whose label is in `used` (the fewest warmup steps each)."""
  w: dict[str, float] = {}
  for r in fin.to_dict("records"):
    if (k := labeler(r)) in used:
      x = float(r.get(WARMUP, math.nan))
      w[k] = min(w.get(k, math.inf), x) if math.isfinite(x) else math.nan
  return guards.warm(w)


def stable_of(fin: pd.DataFrame, labeler: Callable[[dict], str], labels) -> guards.Guard:
  """`guards.stable` (no step to spare: strictly below) of arms run at one fixed lr each (the
  finals' runs labelled in `labels`): no seed of the arm diverged at its lr."""
  arms: dict[str, tuple[float, list]] = {}
  for r in fin.to_dict("records"):
    if (k := labeler(r)) in labels:
      lr, div = arms.get(k, (float(r["optimizer.lr"]), []))
      bad = bool(r.get("diverged")) or not np.isfinite(float(r["final_eval_loss"]))
      arms[k] = (lr, [*div, float(r["optimizer.lr"])] if bad else div)
  return guards.stable(arms, 1.0)


def follow_up_blocks(sweep: Sweep, fin: pd.DataFrame) -> tuple[list[Block], str]:
  """(blocks, kind) of the next follow-up round: per group the next lr past its edge (while the
  grid holds fewer than `max_extend` lrs past its first-stage grid on that side) or below an
  all-diverged grid (down to `diverged_floor`), else its fresh seeds; with `tuned`, the values
  added past an edge of a tuned value (`grids.tuned_blocks`); with `more`, once the fresh
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


def load_best(out_dir: Path) -> pd.DataFrame:
  """best.csv with `values`: the fresh seeds' losses, [inf] for a group diverged at every lr."""
  best = read_csv(Path(out_dir) / "best.csv")
  best["values"] = [_floats(v) or ([math.inf] if r else [])  # a cell "4.01 inf", empty or NaN
                    for v, r in zip(best["fresh_losses"], best["all_diverged"], strict=True)]
  return best


def tuned_best(inputs, experiment: str) -> pd.DataFrame:
  """`best_lr` of `experiment`'s own search, from its runs (FileNotFoundError if not run)."""
  from experiments.record import get
  from pergrad.analysis.runs import aggregate

  sdir = inputs.sweep_dir(experiment)
  table = aggregate(sdir) if sdir.is_dir() else pd.DataFrame()
  sw = get(experiment).sweep_at(inputs.preset, inputs)
  ls = sw.lr_search
  if table.empty and inputs.dry_run:
    return planned_best(sw)
  if table.empty:
    raise FileNotFoundError(
        f"{sdir} holds no runs: this sweep runs at the lr that {experiment}'s search chose; "
        f"run `python scripts/reproduce.py {experiment} --preset {inputs.preset}` first "
        "(with the same --sweeps-root)")
  return best_lr(marked_finals(table, sw.base, inputs.extra), ls.group_keys, ls.lr_key,
                 ls.seed_key, select_seed=select_seeds(sw))


def planned_best(sw: Sweep) -> pd.DataFrame:
  """A dry run's stand-in for `tuned_best`: each first-stage group at the middle of its grid."""
  ls, rows = sw.lr_search, []
  for bl in sw.blocks:
    keys = [k for k in ls.group_keys if k in bl.grid]
    for p in Block({k: bl.grid[k] for k in keys}).points():
      lrs = sorted(bl.grid.get(ls.lr_key, [math.nan]))
      rows.append({**{k: None for k in ls.group_keys}, **p, ls.lr_key: lrs[len(lrs) // 2],
                   "select_loss": math.nan})
  return pd.DataFrame(rows)


def tuned_lr(inputs, experiment: str, where: dict) -> float:
  """The lr `experiment`'s search chose for the group `where` (e.g. {"optimizer.placement":
  "ema"})."""
  rows = tuned_best(inputs, experiment)
  for k, v in where.items():  # a group key missing from the table reads as None
    rows = rows[[same(c, v) for c in (rows[k] if k in rows else [None] * len(rows))]]
  if len(rows) != 1:
    raise ValueError(f"{inputs.sweep_dir(experiment)}: {len(rows)} groups of {experiment} "
                     f"match {where}; expected exactly one (re-run `python "
                     f"scripts/reproduce.py {experiment}`)")
  return float(rows["optimizer.lr"].iloc[0])


def adam_lr(inputs, preset: str) -> dict:
  """{"optimizer.lr": Adam's (unclipped) lr the preconditioner search chose}; at a ladder
  rung (no preconditioner search there) the lr lr_exponent's search chose at the scale's
  batch size (Adam, weight decay 0 as well); {} at ci."""
  if family(preset) == "ci":
    return {}
  if is_rung(preset):
    ref = int(scale_value(preset, "data.batch_size"))
    return {"optimizer.lr": tuned_lr(inputs, "lr_exponent", {"data.batch_size": ref})}
  return {"optimizer.lr": tuned_lr(
      inputs, "preconditioner", {"optimizer.variant": "adam", "optimizer.clip_norm": None})}


def by_label(best: pd.DataFrame, labeler: Callable[[dict], str], seeds=()) -> dict[str, dict]:
  """{label of a group: {fresh seed: its final eval loss}} from `load_best`; a group diverged
  at every lr ran no fresh seed: {each of `seeds` (the search's fresh seeds): inf}, a loss to
  any arm on every seed it shares."""
  out = {}
  for r in best.to_dict("records"):
    fresh, values = _floats(r["fresh_seeds"]), list(r["values"])
    out[labeler(r)] = (dict(zip(fresh, values, strict=True)) if len(fresh) == len(values)
                       else dict.fromkeys(map(float, seeds or fresh[:1] or [-1.0]), math.inf))
  return out


def _floats(cell) -> list[float]:
  """A best.csv cell of space-separated numbers ("4.01 inf"; empty or NaN: none)."""
  return [] if from_table(cell) is None else [float(x) for x in str(cell).split()]


def edges_note(best: pd.DataFrame, labeler: Callable[[dict], str]) -> str:
  """"Chosen lr at a grid edge for [...]" or "diverged at every lr: [...]" ('' when none)."""
  recs = best.to_dict("records")
  span = lambda g: f" (lr {g.split()[-1]} down to {g.split()[0]})" if isinstance(g, str) else ""
  div = [labeler(r) + span(r.get("grid")) for r in recs if r.get("all_diverged")]
  edge = [labeler(r) for r in recs if r.get("at_edge")]
  return " ".join(x for x in (f"Diverged at every lr: {div}." if div else "",
                              f"Chosen lr at a grid edge: {edge}." if edge else "") if x)


def analyze(runs, out_dir: Path, group_keys: Sequence[str], lr_key: str = "optimizer.lr",
            seed_key: str = "train.seed", select_seed=None) -> None:
  """finals.csv (each run's warmup from its config), best.csv (`best_lr`) and curves.csv (at
  the chosen lr: the fresh seeds', else the selection seeds')."""
  out_dir, table, fin = Path(out_dir), runs.table, with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, out_dir / "finals.csv")
  best = best_lr(fin, group_keys, lr_key, seed_key, select_seed=select_seed)
  write_csv(best, out_dir / "best.csv")
  own = ["select_seed", "n_seeds"]  # the group's, carried to its curves
  cols = ["train/loss", "eval/loss", "train/lr", "train/grad_norm", *own]
  curves = curves_at(table, best, [*group_keys, lr_key], cols)
  if seed_key in curves and not best.empty:
    selection = [fmt(from_table(x)) in fmt(from_table(s)).split()
                 for x, s in zip(curves[seed_key], curves["select_seed"], strict=True)]
    curves = curves[~((curves["n_seeds"] > 0) & np.array(selection, bool))]
  write_csv(curves.drop(columns=own, errors="ignore"), out_dir / "curves.csv")


def figures(out_dir: Path, group_keys: Sequence[str], title: str,
            lr_key: str = "optimizer.lr", labeler=F.label) -> list[Path]:
  """u_curves.png (final eval loss vs lr) and curves_at_best.png, from the CSVs."""
  out_dir = Path(out_dir)
  fin = read_csv(out_dir / "finals.csv")
  curves = read_csv(out_dir / "curves.csv")
  pyplot = F.plt()
  fig, ax = pyplot.subplots(figsize=(6.5, 4.2))
  F.plot_u_curves(ax, fin, group_keys, lr_key, labeler=labeler)
  F.style(ax, title=f"{title}: final eval loss vs learning rate", legend=7)
  paths = [F.savefig(fig, out_dir / "u_curves.png")]
  fig, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
  for ax, y in zip(axes, ("train/loss", "eval/loss"), strict=False):
    if y in curves:
      F.plot_curves(ax, curves, group_keys, y, labeler=labeler)
      finite = curves[y][np.isfinite(curves[y])]
      if not finite.empty:  # clip the initial transient so differences stay visible
        ax.set_ylim(finite.min() - 0.05, np.percentile(finite, 90) + 0.1)
  axes[0].set_title(f"{title}: each at its best lr")
  axes[1].legend(fontsize=7)
  paths.append(F.savefig(fig, out_dir / "curves_at_best.png"))
  return paths


def ranked(best: pd.DataFrame) -> pd.DataFrame:
  """`best_lr` rows sorted by the fresh seeds' mean (none: last), then the selection loss."""
  return best.assign(_o=best["loss_mean"].fillna(np.inf)).sort_values(
      ["_o", "select_loss"]).drop(columns="_o")


def best_md(best: pd.DataFrame, group_keys: Sequence[str], extra: Sequence[str] = ()) -> str:
  """The chosen-lr table as Markdown, `ranked`, edges flagged."""
  cols = [*group_keys, "optimizer.lr", "select_loss", "loss_mean", "loss_std", "n_seeds", "grid",
          "n_diverged", "at_edge", *extra]
  return md_table(ranked(best)[cols].rename(columns={
      **{k: k.split(".")[-1] for k in group_keys},
      "optimizer.lr": "lr (chosen on the selection seeds)",
      "select_loss": "selection-seed loss (selection only)",
      "loss_mean": "final eval loss, fresh seeds (mean)",
      "loss_std": "std over fresh seeds", "n_seeds": "fresh seeds", "grid": "lr grid",
      "n_diverged": "diverged lrs", "at_edge": "chosen at edge"}))
