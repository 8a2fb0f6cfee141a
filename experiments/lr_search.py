"""Learning-rate searches in the experiments' reports: the validity guards of the chosen lrs,
the lrs another experiment's search chose, its CSVs, figures and Markdown. The search itself
(`best_lr`, the follow-up rounds) is `pergrad.sweep.rounds`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from pergrad.analysis import guards
from pergrad.analysis import plots as F
from pergrad.analysis.markdown import md_table
from pergrad.analysis.runs import (
  curves_at,
  fmt,
  from_table,
  read_csv,
  write_csv,
)
from pergrad.sweep import Block, Sweep, family, is_rung, scale_value
from pergrad.sweep.growth import same, select_seeds
from pergrad.sweep.rounds import WARMUP, best_lr, factor_of, marked_finals, with_warmup


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


def load_best(out_dir: Path) -> pd.DataFrame:
  """best.csv with `values`: the fresh seeds' losses, [inf] for a group diverged at every lr;
  `attrs["unscored"]`: the groups that chose no lr (unscored.csv, `selected`)."""
  best = read_csv(Path(out_dir) / "best.csv")
  best["values"] = [_floats(v) or ([math.inf] if r else [])  # a cell "4.01 inf", empty or NaN
                    for v, r in zip(best["fresh_losses"], best["all_diverged"], strict=True)]
  path = Path(out_dir) / UNSCORED
  best.attrs["unscored"] = list(read_csv(path)["group"]) if path.is_file() else []
  return best


UNSCORED = "unscored.csv"  # `best_lr`'s groups with no lr every selection seed finished


def selected(best: pd.DataFrame) -> guards.Guard:
  """`guards.selected` of a `load_best` table: no searched group left without a chosen lr."""
  return guards.selected(best.attrs.get("unscored", []))


def tuned_best(inputs, experiment: str) -> pd.DataFrame:
  """`best_lr` of `experiment`'s own search, from its runs (FileNotFoundError if not run)."""
  from pergrad.analysis.runs import aggregate
  from pergrad.sweep.record import get

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
            seed_key: str = "train.seed") -> None:
  """finals.csv (each run's warmup from its config), best.csv (`best_lr` on the selection seeds
  of the plan the runs came from, `select_seeds`), unscored.csv (its groups that chose no lr,
  if any) and curves.csv (at the chosen lr: the fresh seeds', else the selection seeds')."""
  out_dir, table, fin = Path(out_dir), runs.table, with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, out_dir / "finals.csv")
  best = write_best(fin, runs.sweep, out_dir, group_keys, lr_key, seed_key)
  own = ["select_seed", "n_seeds"]  # the group's, carried to its curves
  cols = ["train/loss", "eval/loss", "train/lr", "train/grad_norm", *own]
  curves = curves_at(table, best, [*group_keys, lr_key], cols)
  if seed_key in curves and not best.empty:
    selection = [fmt(from_table(x)) in fmt(from_table(s)).split()
                 for x, s in zip(curves[seed_key], curves["select_seed"], strict=True)]
    curves = curves[~((curves["n_seeds"] > 0) & np.array(selection, bool))]
  write_csv(curves.drop(columns=own, errors="ignore"), out_dir / "curves.csv")


def write_best(fin: pd.DataFrame, sweep: Sweep | None, out_dir: Path, group_keys: Sequence[str],
               lr_key: str = "optimizer.lr", seed_key: str = "train.seed") -> pd.DataFrame:
  """best.csv: `best_lr` of `fin` on `sweep`'s selection seeds (no sweep: each group's lowest
  seed); unscored.csv: the groups that chose no lr, if any (`selected` reads it)."""
  best = best_lr(fin, group_keys, lr_key, seed_key,
                 select_seed=select_seeds(sweep) if sweep is not None else None)
  write_csv(best, Path(out_dir) / "best.csv")
  if best.attrs["unscored"]:
    write_csv(pd.DataFrame({"group": best.attrs["unscored"]}), Path(out_dir) / UNSCORED)
  return best


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
