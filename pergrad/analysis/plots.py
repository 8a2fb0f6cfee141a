"""Matplotlib helpers for run tables: loss-vs-lr U-curves, mean curves over seeds, styling."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pergrad.analysis.runs import fmt, from_table


def plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as pyplot
  return pyplot


def label(group: dict) -> str:
  return ", ".join(f"{k.split('.')[-1]}={fmt(from_table(v))}" for k, v in group.items())


def plot_u_curves(ax, fin: pd.DataFrame, group_keys, lr_key: str, labeler=label,
                  metric: str = "final_eval_loss"):
  """Final loss vs learning rate per group (mean over seeds, error bar = std); diverged runs as
  crosses at the top of the axis, runs more than `window` nats above the best as triangles."""
  window, finite = 3.0, fin.loc[np.isfinite(fin[metric]), metric]
  lo = finite.min() if len(finite) else 0.0
  top = min(finite.max() if len(finite) else 1.0, lo + window)
  cap = top + 0.1 * (top - lo + 1e-9)
  for gvals, g in fin.groupby(list(group_keys), sort=False, dropna=False):  # keys: tuples
    agg = g.groupby(lr_key)[metric].agg(
        mean=lambda s: s.mean(), std=lambda s: s[np.isfinite(s)].std()).sort_index()
    high = np.isfinite(agg["mean"]) & (agg["mean"] > top)
    agg.loc[high, "mean"] = np.nan  # drawn as a triangle at the top, not on the curve
    ok = np.isfinite(agg["mean"])
    line, = ax.plot(agg.index[ok], agg["mean"][ok], "o-",
                    label=labeler(dict(zip(group_keys, gvals, strict=False))))
    if ok.any():
      ax.errorbar(agg.index[ok], agg["mean"][ok], yerr=agg["std"][ok].fillna(0), fmt="none",
                  ecolor=line.get_color(), capsize=2)
    for mask, marker in ((~ok & ~high, "x"), (high, "^")):
      if mask.any():
        ax.plot(agg.index[mask], [cap] * int(mask.sum()), marker, color=line.get_color(), ms=8)
  ax.set_xscale("log")
  style(ax, xlabel=lr_key, grid=True,
        ylabel=metric.replace("_", " ") + f" (x diverged, ^ > best + {window:g})")


def plot_curves(ax, curves: pd.DataFrame, group_keys, y: str, x: str = "examples_seen",
                seed_key: str = "train.seed", labeler=label):
  """Mean curve per group over seeds, with the min-max band across seeds."""
  for gvals, g in curves.groupby(list(group_keys), sort=False, dropna=False):  # keys: tuples
    g = g.dropna(subset=[y])
    if g.empty:
      continue
    agg = g.groupby(x)[y].agg(["mean", "min", "max", "count"]).sort_index()
    n = int(g[seed_key].nunique()) if seed_key in g else 1
    name = labeler(dict(zip(group_keys, gvals, strict=False)))
    line, = ax.plot(agg.index, agg["mean"], label=name + (f" ({n} seeds)" if n > 1 else ""))
    if n > 1:
      ax.fill_between(agg.index, agg["min"], agg["max"], color=line.get_color(), alpha=0.2)
  style(ax, xlabel=x.replace("_", " "), ylabel=y, grid=True)


def style(ax, *, legend=None, grid=False, **labels):
  """`ax.set` of the labels given (title, xlabel, ylabel, yscale), a legend of font size `legend`
  when anything drawn has a label, a grid."""
  ax.set(**{k: v for k, v in labels.items() if v is not None})
  if legend is not None and ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=legend)
  if grid:
    ax.grid(alpha=0.3)


def savefig(fig, path: Path) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=80)
  plt().close(fig)
  return path
