"""Learning-rate sweeps: the best lr per variant, follow-up stages, their CSVs and figures.

An experiment with an `LrSearch` compares variants each at its own best learning rate:
the runner extends a variant's grid past an edge where its best lr lies (`follow_up_blocks`,
kind "extend"), then adds seeds at the best lr (kind "seeds").
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from experiments import figures as F
from experiments.report_md import md_table
from experiments.runs import DONE, curves_at, from_table
from experiments.sweep import Block, LrSearch, Sweep, fmt

CURVE_COLS = ("train/loss", "eval/loss", "train/lr", "train/grad_norm")


def best_lr(fin: pd.DataFrame, group_keys: Sequence[str], lr_key: str,
            seed_key: str = "train.seed", metric: str = "final_eval_loss") -> pd.DataFrame:
  """Per group: the lr with the lowest seed-mean final loss, and whether it is at an edge.

  Columns: group keys, lr_key, `loss_mean`, `loss_std`, `n_seeds`, `at_edge`,
  `grid` (sorted lrs tried), `n_diverged` (lrs of the grid that diverged).
  """
  rows = []
  completed = fin[fin["status"].isin(DONE)] if "status" in fin else fin
  for gvals, g in completed.groupby(list(group_keys), sort=False, dropna=False):
    gvals = gvals if isinstance(gvals, tuple) else (gvals,)
    per_lr = g.groupby(lr_key)[metric].agg(["mean", "std", "count"]).sort_index()
    lrs = list(per_lr.index)
    # Seed-0-only comparison first so extra seeds do not bias the choice of lr.
    if seed_key in g:
      s0 = g[g[seed_key] == g[seed_key].min()].groupby(lr_key)[metric].mean()
      best = s0.idxmin()
    else:
      best = per_lr["mean"].idxmin()
    i = lrs.index(best)
    rows.append({
        **dict(zip(group_keys, gvals, strict=False)),
        lr_key: best,
        "loss_mean": float(per_lr.loc[best, "mean"]),
        "loss_std": float(per_lr.loc[best, "std"]) if per_lr.loc[best, "count"] > 1 else 0.0,
        "n_seeds": int(per_lr.loc[best, "count"]),
        "at_edge": bool(np.isfinite(per_lr.loc[best, "mean"]) and (i == 0 or i == len(lrs) - 1)),
        "edge": "low" if i == 0 else ("high" if i == len(lrs) - 1 else ""),
        "grid": " ".join(fmt(float(x)) for x in lrs),
        "n_diverged": int((~np.isfinite(per_lr["mean"])).sum()),
    })
  return pd.DataFrame(rows)


def follow_up_blocks(sweep: Sweep, fin: pd.DataFrame, round_: int) -> tuple[list[Block], str]:
  """(blocks, kind): blocks extending a group's lr grid past an edge ("extend"), or else
  the extra seeds at each group's best lr ("seeds"); ([], "none") when nothing to add.

  Deterministic given the finished runs, so a re-launched sweep recomputes the same
  blocks (already finished ones are then skipped).
  """
  ls = sweep.lr_search
  if ls is None or fin.empty:
    return [], "none"
  best = best_lr(fin, ls.group_keys, ls.lr_key, ls.seed_key)
  seed0 = _first_seed(sweep, ls)
  blocks = []
  for _, b in best.iterrows():
    group = {k: from_table(b[k]) for k in ls.group_keys}
    grid = [float(x) for x in b["grid"].split()]
    if b["at_edge"] and round_ < ls.max_extend:
      lr = grid[0] / ls.factor if b["edge"] == "low" else grid[-1] * ls.factor
      blocks.append(Block({**{k: [v] for k, v in group.items()},
                           ls.lr_key: [_round_lr(lr)], ls.seed_key: [seed0]}))
  if blocks:
    return blocks, "extend"
  for _, b in best.iterrows():
    group = {k: from_table(b[k]) for k in ls.group_keys}
    if ls.seeds and np.isfinite(b["loss_mean"]):
      blocks.append(Block({**{k: [v] for k, v in group.items()},
                           ls.lr_key: [float(b[ls.lr_key])], ls.seed_key: list(ls.seeds)}))
  return blocks, ("seeds" if blocks else "none")


def _first_seed(sweep: Sweep, ls: LrSearch):
  for bl in sweep.blocks:
    if ls.seed_key in bl.grid:
      return bl.grid[ls.seed_key][0]
  return 0


def _round_lr(x: float) -> float:
  return float(f"{x:.3g}")


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path,
            group_keys: Sequence[str], lr_key: str = "optimizer.lr") -> None:
  """Writes finals.csv (every run), best.csv (best lr per group), curves.csv (best lr)."""
  out_dir = Path(out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)
  best = best_lr(fin, group_keys, lr_key)
  best.to_csv(out_dir / "best.csv", index=False)
  curves = curves_at(table, best, [*group_keys, lr_key], CURVE_COLS)
  curves.to_csv(out_dir / "curves.csv", index=False)


def figures(out_dir: Path, group_keys: Sequence[str], title: str,
            lr_key: str = "optimizer.lr", labeler=F.label) -> list[Path]:
  """u_curves.png (final eval loss vs lr) and curves_at_best.png, from the CSVs."""
  out_dir = Path(out_dir)
  fin = pd.read_csv(out_dir / "finals.csv")
  curves = pd.read_csv(out_dir / "curves.csv")
  pyplot = F.plt()
  fig, ax = pyplot.subplots(figsize=(6.5, 4.2))
  F.plot_u_curves(ax, fin, group_keys, lr_key, labeler=labeler)
  ax.set_title(f"{title}: final eval loss vs learning rate")
  ax.legend(fontsize=7)
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


def best_md(best: pd.DataFrame, group_keys: Sequence[str], lr_key: str = "optimizer.lr") -> str:
  """The best-lr table as Markdown, sorted by loss, edges flagged."""
  b = best.sort_values("loss_mean").copy()
  cols = [*group_keys, lr_key, "loss_mean", "loss_std", "n_seeds", "grid", "n_diverged", "at_edge"]
  b = b[cols].rename(columns={k: k.split(".")[-1] for k in [*group_keys, lr_key]})
  b = b.rename(columns={"loss_mean": "final eval loss (mean)", "loss_std": "std over seeds",
                        "grid": "lr grid", "n_diverged": "diverged lrs", "at_edge": "best at edge"})
  return md_table(b)
