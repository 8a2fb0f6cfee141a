"""Matplotlib helpers of the experiments' figures (drawn from their CSVs only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.runs import from_table
from experiments.sweep import fmt


def plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as pyplot
  return pyplot


def label(group: dict) -> str:
  return ", ".join(f"{k.split('.')[-1]}={fmt(from_table(v))}" for k, v in group.items())


def plot_u_curves(ax, fin: pd.DataFrame, group_keys, lr_key: str, labeler=label,
                  metric: str = "final_eval_loss"):
  """Final loss vs learning rate per group (mean over seeds, error bar = std).

  Diverged runs are drawn as crosses at the top of the axis; runs that finished far above
  the best (more than `window` nats) as triangles there, so they do not squash the rest.
  """
  window = 3.0
  finite = fin[np.isfinite(fin[metric])]
  top = finite[metric].max() if not finite.empty else 1.0
  lo = finite[metric].min() if not finite.empty else 0.0
  top = min(top, lo + window)
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


def style(ax, *, title=None, xlabel=None, ylabel=None, yscale=None, legend=None, grid=False):
  """Sets what is given: titles and labels, the y scale, a legend of that font size (when
  anything drawn has a label), a grid."""
  for setter, value in ((ax.set_title, title), (ax.set_xlabel, xlabel),
                        (ax.set_ylabel, ylabel), (ax.set_yscale, yscale)):
    if value is not None:
      setter(value)
  if legend is not None and ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=legend)
  if grid:
    ax.grid(alpha=0.3)


def savefig(fig, path: Path) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt().close(fig)
  return path
