"""Learning-rate sweeps: the best lr per variant, follow-up stages, their CSVs and figures.

The lr policy. An experiment with an `LrSearch` compares variants ("groups"), each at its
own learning rate, chosen on ONE seed and reported on OTHERS:

1. Selection: each group's lr is the one with the lowest final eval loss of the
   selection seed (the first seed of the sweep's blocks, seed 0) alone.
2. Extension (`follow_up_blocks`, kind "extend"): a group whose chosen lr lies at an edge
   of its grid gets the next lr past that edge (by `factor`), up to `max_extend` times; a
   group whose every run diverged gets the next lr BELOW its grid, until a run trains or
   its lowest lr is `diverged_floor` (100) times below the lowest lr of its first grid.
3. Fresh seeds (kind "seeds"): each group that trained is re-run at its chosen lr with the
   fresh seeds `LrSearch.seeds` (1, 2, 3 at the cpu preset).
4. Reporting: the numbers of a group (`loss_mean`, `loss_std`, `n_seeds` of best.csv, and
   every verdict) are those of the fresh seeds ONLY; the selection seed's value at the
   chosen lr is kept apart (`select_loss`) and never averaged in, since the lr was picked
   because that value was low (selection bias).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from experiments import figures as F
from experiments.report_md import md_table
from experiments.runs import DONE, curves_at, from_table
from experiments.sweep import Block, LrSearch, Sweep, fmt

CURVE_COLS = ("train/loss", "eval/loss", "train/lr", "train/grad_norm")
POLICY = ("each group's lr is chosen on seed 0 alone and its numbers are the mean ± std "
          "of fresh seeds at that lr, never seed 0")


def _is_null(v) -> bool:
  return v is None or (isinstance(v, float) and math.isnan(v))


def _same(a, b) -> bool:
  """Equality of override values read back from tables (None ~ NaN, floats ~ close)."""
  if _is_null(a) or _is_null(b):
    return _is_null(a) and _is_null(b)
  if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)) \
      and not isinstance(a, bool) and not isinstance(b, bool):
    return math.isclose(float(a), float(b), rel_tol=1e-6)
  return a == b


def _values(text) -> list[float]:
  """`"4.01 4.02 inf"` (a best.csv cell) -> [4.01, 4.02, inf]; empty/NaN -> []."""
  if _is_null(text) or not str(text).strip():
    return []
  return [float(x) for x in str(text).split()]


def best_lr(fin: pd.DataFrame, group_keys: Sequence[str], lr_key: str,
            seed_key: str = "train.seed", metric: str = "final_eval_loss",
            select_seed=None) -> pd.DataFrame:
  """Per group: the lr chosen on the selection seed, and the fresh seeds' numbers there.

  The selection seed is `select_seed`, else the group's lowest seed. Columns: group keys,
  lr_key (the chosen lr), `select_seed`, `select_loss` (the selection seed's loss there),
  `loss_mean`, `loss_std`, `n_seeds` (over the OTHER seeds at the chosen lr only; NaN, NaN,
  0 when there are none; a diverged seed makes the mean inf), `fresh_seeds`,
  `fresh_losses` (space-separated), `at_edge`, `edge`, `grid` (sorted lrs tried on the
  selection seed), `n_diverged` (lrs of the grid whose selection run diverged),
  `all_diverged` (every one did).
  """
  rows = []
  completed = fin[fin["status"].isin(DONE)] if "status" in fin else fin
  for gvals, g in completed.groupby(list(group_keys), sort=False, dropna=False):
    gvals = gvals if isinstance(gvals, tuple) else (gvals,)
    has_seed = seed_key in g
    sel = (select_seed if select_seed is not None else g[seed_key].min()) if has_seed else None
    s0 = g[g[seed_key] == sel] if has_seed else g
    if s0.empty:  # no selection run in this group: nothing was selected
      continue
    per_lr = s0.groupby(lr_key)[metric].mean().sort_index()
    lrs = list(per_lr.index)
    finite = np.isfinite(per_lr.to_numpy(dtype=float))
    best = per_lr.idxmin() if finite.any() else lrs[0]
    i = lrs.index(best)
    fresh = g[(g[seed_key] != sel) & np.isclose(g[lr_key].astype(float), float(best),
                                                 rtol=1e-9)] if has_seed else g.iloc[:0]
    fresh = fresh.sort_values(seed_key) if has_seed else fresh
    vals = [float(v) if np.isfinite(v) else math.inf for v in fresh[metric]]
    finite_vals = all(np.isfinite(vals))
    rows.append({
        **dict(zip(group_keys, gvals, strict=False)),
        lr_key: best,
        "select_seed": from_table(sel) if has_seed else None,
        "select_loss": float(per_lr.loc[best]),
        "loss_mean": (float(np.mean(vals)) if finite_vals else math.inf) if vals else math.nan,
        "loss_std": float(np.std(vals, ddof=1)) if len(vals) > 1 and finite_vals else math.nan,
        "n_seeds": len(vals),
        "fresh_seeds": " ".join(fmt(from_table(x)) for x in fresh[seed_key]) if has_seed else "",
        "fresh_losses": " ".join(repr(v) for v in vals),
        "at_edge": bool(finite[i] and (i == 0 or i == len(lrs) - 1)),
        "edge": "low" if i == 0 else ("high" if i == len(lrs) - 1 else ""),
        "grid": " ".join(fmt(float(x)) for x in lrs),
        "n_diverged": int((~finite).sum()),
        "all_diverged": bool(not finite.any()),
    })
  return pd.DataFrame(rows)


def follow_up_blocks(sweep: Sweep, fin: pd.DataFrame, round_: int) -> tuple[list[Block], str]:
  """(blocks, kind) of follow-up round `round_` (0, 1, ...; see the module's lr policy).

  Per group: the next lr past an edge where its chosen lr lies (while `round_ <
  max_extend`), or the next lr below its grid if every run diverged (while its lowest lr
  is above `diverged_floor` times below the lowest lr of its first grid), else the fresh
  seeds at its chosen lr. kind is "extend" when any group extends (the settled groups'
  fresh seeds come along), else "seeds", or "none" when nothing is to be run. All-diverged
  groups get no seeds. Deterministic given the finished runs, so a re-launched sweep
  recomputes the same blocks (already finished ones are then skipped). Every round can add
  runs until `LrSearch.rounds`.
  """
  ls = sweep.lr_search
  if ls is None or fin.empty:
    return [], "none"
  seed0 = _first_seed(sweep, ls)
  best = best_lr(fin, ls.group_keys, ls.lr_key, ls.seed_key, select_seed=seed0)
  extend, seeds = [], []
  for _, b in best.iterrows():
    group = {k: from_table(b[k]) for k in ls.group_keys}
    one = {k: [v] for k, v in group.items()}
    grid = [float(x) for x in b["grid"].split()]
    if b["all_diverged"]:
      low = _first_grid_low(sweep, ls, group)
      floor = (low if low is not None else grid[-1]) / ls.diverged_floor
      if grid[0] > floor * (1 + 1e-6):
        extend.append(Block({**one, ls.lr_key: [_round_lr(grid[0] / ls.factor)],
                             ls.seed_key: [seed0]}))
      continue
    if b["at_edge"] and round_ < ls.max_extend:
      lr = grid[0] / ls.factor if b["edge"] == "low" else grid[-1] * ls.factor
      extend.append(Block({**one, ls.lr_key: [_round_lr(lr)], ls.seed_key: [seed0]}))
      continue
    if ls.seeds and np.isfinite(b["select_loss"]):
      seeds.append(Block({**one, ls.lr_key: [float(b[ls.lr_key])],
                          ls.seed_key: list(ls.seeds)}))
  if extend:
    return extend + seeds, "extend"
  return seeds, ("seeds" if seeds else "none")


def _first_grid_low(sweep: Sweep, ls: LrSearch, group: dict) -> float | None:
  """The lowest lr of the sweep's first-stage blocks that run `group`."""
  lows = []
  for bl in sweep.blocks:
    if ls.lr_key not in bl.grid:
      continue
    if all(k not in bl.grid or any(_same(v, x) for x in bl.grid[k]) for k, v in group.items()):
      lows.append(min(float(x) for x in bl.grid[ls.lr_key]))
  return min(lows) if lows else None


def _first_seed(sweep: Sweep, ls: LrSearch):
  for bl in sweep.blocks:
    if ls.seed_key in bl.grid:
      return bl.grid[ls.seed_key][0]
  return 0


def _round_lr(x: float) -> float:
  return float(f"{x:.3g}")


def load_best(out_dir: Path, group_keys: Sequence[str], lr_key: str = "optimizer.lr",
              seed_key: str = "train.seed") -> pd.DataFrame:
  """best.csv with a `values` column: the fresh seeds' losses as a list, or [inf] for a
  group that diverged at every lr (it has no fresh seed). Recomputed from finals.csv when
  best.csv predates the fresh-seed columns."""
  out_dir = Path(out_dir)
  best = pd.read_csv(out_dir / "best.csv")
  if "fresh_losses" not in best:
    best = best_lr(pd.read_csv(out_dir / "finals.csv"), group_keys, lr_key, seed_key)
  # A group that diverged at every lr has no fresh seed; its (diverged, unbiased) seed-0
  # run stands for it, so that it loses to every group that trained.
  best["values"] = [_values(v) or ([math.inf] if r else [])
                    for v, r in zip(best["fresh_losses"], best["all_diverged"], strict=True)]
  return best


def tuned_lr(inputs, experiment: str, where: dict) -> float:
  """The lr that `experiment`'s own search chose for the group `where` (e.g.
  {"optimizer.placement": "ema"}), re-derived from its runs (`inputs.sweep_dir(experiment)`,
  same preset and extras; `best_lr` as its `analyze` does): how the descriptive experiments
  (snr, moments, batch_scaling, gns_*) run a variant at its tuned lr. One clear error, before
  any run, when that search has not been run yet."""
  from experiments.record import get
  from experiments.runs import aggregate, finals

  sdir = inputs.sweep_dir(experiment)
  table = aggregate(sdir) if sdir.is_dir() else pd.DataFrame()
  if table.empty:
    raise FileNotFoundError(
        f"{sdir} holds no runs: this sweep runs at the lr that {experiment}'s search chose; "
        f"run `python scripts/reproduce.py {experiment} --preset {inputs.preset}` first "
        "(with the same --sweeps-root)")
  ls = get(experiment).sweep(inputs.preset).lr_search
  best = best_lr(finals(table), ls.group_keys, ls.lr_key, ls.seed_key)
  rows = best
  for k, v in where.items():
    col = rows[k] if k in rows else pd.Series([None] * len(rows), index=rows.index)
    rows = rows[[_same(from_table(c), v) for c in col]]
  if len(rows) != 1:
    raise ValueError(f"{sdir}: {len(rows)} groups of {experiment} match {where}; expected "
                     f"exactly one (re-run `python scripts/reproduce.py {experiment}`)")
  return float(rows[ls.lr_key].iloc[0])


def by_label(best: pd.DataFrame, labeler: Callable[[dict], str]) -> dict[str, list[float]]:
  """{label of a group: its fresh seeds' losses} from `load_best`."""
  return {labeler(r): list(r["values"]) for r in best.to_dict("records")}


def group_lines(best: pd.DataFrame, labeler: Callable[[dict], str],
                lr_key: str = "optimizer.lr") -> str:
  """One clause per group, best fresh mean first: `label: mean ± std (n=k) at lr X`."""
  from experiments.verdict import summarize

  recs = sorted(best.to_dict("records"),
                key=lambda r: (np.nan_to_num(r["loss_mean"], nan=np.inf), r["select_loss"]))
  return "; ".join(f"{labeler(r)}: diverged at every lr (seed 0)" if r.get("all_diverged")
                   else f"{labeler(r)}: {summarize(r['values']).text()} at lr "
                   f"{fmt(float(r[lr_key]))}" for r in recs)


def search_notes(best: pd.DataFrame, labeler: Callable[[dict], str]) -> str:
  """Sentences on all-diverged groups ("diverged at every lr from X down to Y") and on
  chosen lrs at a grid edge; '' when none."""
  notes = []
  for r in best.to_dict("records"):
    if r.get("all_diverged"):
      grid = [float(x) for x in str(r["grid"]).split()]
      notes.append(f"`{labeler(r)}` diverged at every lr from {fmt(max(grid))} down to "
                   f"{fmt(min(grid))} (seed 0).")
  edges = [labeler(r) for r in best.to_dict("records") if r.get("at_edge")]
  if edges:
    notes.append(f"Caution: chosen lr at an edge of the grid for {edges} (extended as far "
                 "as allowed; see best.csv).")
  return " ".join(notes)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path,
            group_keys: Sequence[str], lr_key: str = "optimizer.lr",
            seed_key: str = "train.seed") -> None:
  """Writes finals.csv (every run), best.csv (chosen lr per group: the selection seed's
  value and the fresh seeds' mean ± std), curves.csv (at the chosen lr: the fresh seeds'
  curves, or the selection seed's where a group has no fresh seed)."""
  out_dir = Path(out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)
  best = best_lr(fin, group_keys, lr_key, seed_key)
  best.to_csv(out_dir / "best.csv", index=False)
  curves = curves_at(table, best, [*group_keys, lr_key], CURVE_COLS)
  if seed_key in curves and not best.empty:
    sel = {tuple(from_table(r[k]) for k in group_keys): (r["select_seed"], r["n_seeds"])
           for r in best.to_dict("records")}
    def keep(r) -> bool:
      key = tuple(from_table(r[k]) for k in group_keys)
      s, n = next((v for k, v in sel.items()
                   if all(_same(a, b) for a, b in zip(k, key, strict=True))), (None, 0))
      return n == 0 or not _same(r[seed_key], s)
    curves = curves[[keep(r) for r in curves.to_dict("records")]]
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


def best_md(best: pd.DataFrame, group_keys: Sequence[str], lr_key: str = "optimizer.lr",
            extra: Sequence[str] = ()) -> str:
  """The chosen-lr table as Markdown, sorted by the fresh seeds' mean, edges flagged."""
  b = best.assign(_o=best["loss_mean"].fillna(np.inf)).sort_values(["_o", "select_loss"])
  cols = [*group_keys, lr_key, "select_loss", "loss_mean", "loss_std", "n_seeds", "grid",
          "n_diverged", "at_edge", *extra]
  b = b[cols].rename(columns={k: k.split(".")[-1] for k in [*group_keys, lr_key]})
  b = b.rename(columns={"lr": "lr (chosen on seed 0)",
                        "select_loss": "seed-0 loss (selection only)",
                        "loss_mean": "final eval loss, fresh seeds (mean)",
                        "loss_std": "std over fresh seeds", "n_seeds": "fresh seeds",
                        "grid": "lr grid", "n_diverged": "diverged lrs",
                        "at_edge": "chosen at edge"})
  return md_table(b)
