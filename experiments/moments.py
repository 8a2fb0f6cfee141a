"""Claim 3, mechanism: which term dominates Adam's second moment over training.

Per coordinate E[ḡ²] = μ² + σ²/B (Adam's v) and E[mean g_i²] = μ² + σ² (MicroAdam's v).
We log, per layer, the medians over coordinates of the unbiased μ̂² = ḡ² − σ̂²/B, of
σ̂²/B and of σ̂², the fraction of coordinates with ḡ² > σ̂²/B ("mean-dominated"), and the
Adam family's shares of μ², σ²/B and σ² in v (`opt/<leaf>/...`), during an Adam run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.figures import plot_curves, plt, savefig, style
from experiments.report_md import fmt_num, md_table
from experiments.runs import leaf_of, stat_columns, x_examples
from experiments.sweep import Sweep, logged_run

NAME = "moments"
TITLE = "μ², σ²/B and σ² in Adam's second moment over training"
CLAIM = ("Adam's preconditioner v ≈ μ² + σ²/B: the paper's reading is that good "
         "preconditioning is dominated by μ² rather than by the variance σ².")

# Per-layer summaries logged by `pergrad.stats.summaries` ("stats/<leaf>/<name>").
QUANTITIES = {
    "gbar2": "mean_sq_median",        # median of ḡ² (what Adam's v averages)
    "sigma2_over_b": "var_over_n_median",  # median of σ̂²/B
    "sigma2": "var_median",           # median of σ̂² (≈ what MicroAdam's v adds to μ²)
    "frac_mean_dominated": "frac_mean_dominated",  # fraction with ḡ² > σ̂²/B (μ̂² > 0)
}
# Shares of the step's μ̂², σ̂²/B, σ̂² in Adam's debiased v̂ (`pergrad.optim.diagnostics`).
SHARES = {"share_mu2": "share_mu2", "share_var_b": "share_var_b", "share_var": "share_var"}


def sweep(preset: str) -> Sweep:
  return logged_run(NAME, preset, {"optimizer.variant": "adam"})


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  """moments_per_leaf.csv (long) and moments_median.csv (median over layers).

  μ̂² per layer is taken as median(ḡ²) − median(σ̂²/B): a difference of medians, an
  approximation of the median of μ̂² (which is not logged).
  """
  out_dir = Path(out_dir)
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  ids = ["run", "train.seed", "step", "examples_seen"]
  rows = []
  for q, name, prefix in [*((q, n, "stats") for q, n in QUANTITIES.items()),
                          *((q, n, "opt") for q, n in SHARES.items())]:
    for col in stat_columns(t, name, prefix):
      sub = t[ids + [col]].dropna(subset=[col])
      rows.append(sub.rename(columns={col: "value"}).assign(quantity=q, leaf=leaf_of(col)))
  long = (pd.concat(rows, ignore_index=True) if rows else
          pd.DataFrame(columns=[*ids, "value", "quantity", "leaf"]))
  if not long.empty:
    wide = long.pivot_table(index=[*ids, "leaf"], columns="quantity", values="value")
    if {"gbar2", "sigma2_over_b"} <= set(wide.columns):
      mu2 = (wide["gbar2"] - wide["sigma2_over_b"]).rename("value").reset_index()
      long = pd.concat([long, mu2.assign(quantity="mu2")], ignore_index=True)
  long.to_csv(out_dir / "moments_per_leaf.csv", index=False)
  layers = long[~long["leaf"].isin(["total", "all"])]
  med = layers.groupby([*ids, "quantity"])["value"].median().rename("median").reset_index()
  med.to_csv(out_dir / "moments_median.csv", index=False)
  fin.to_csv(out_dir / "finals.csv", index=False)


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  med = pd.read_csv(out_dir / "moments_median.csv")
  pyplot = plt()
  fig, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
  mag = med[med["quantity"].isin(["gbar2", "mu2", "sigma2_over_b", "sigma2"])].copy()
  mag["median"] = mag["median"].where(mag["median"] > 0)  # μ̂² can be < 0: not drawn on log
  if not mag.empty:
    plot_curves(axes[0], mag, ["quantity"], "median", labeler=lambda g: g["quantity"])
  style(axes[0], yscale="log", ylabel="median over layers of the per-layer median",
        title="ḡ², μ̂², σ̂²/B, σ̂² during an Adam run", legend=8)
  frac = med[med["quantity"] == "frac_mean_dominated"]
  if not frac.empty:
    plot_curves(axes[1], frac, ["quantity"], "median",
                labeler=lambda g: "frac. coords with ḡ² > σ̂²/B")
  shares = med[med["quantity"].isin(list(SHARES))]
  if not shares.empty:
    plot_curves(axes[1], shares, ["quantity"], "median", labeler=lambda g: g["quantity"])
  style(axes[1], yscale="log", ylabel="fraction / share (median layer)",
        title="shares of μ̂², σ̂²/B, σ̂² in Adam's v̂", legend=7)
  return [savefig(fig, out_dir / "moments_over_training.png")]


def report(out_dir: Path) -> dict:
  med = pd.read_csv(Path(out_dir) / "moments_median.csv")
  piv = med.groupby(["step", "quantity"])["median"].mean().unstack("quantity")
  if piv.empty or not {"mu2", "sigma2_over_b"} <= set(piv.columns):
    return {"verdict": "not measured", "finding": "μ̂² and σ̂²/B were not logged "
            "(stats/<leaf>/... keys missing from metrics.jsonl).", "numbers_md": ""}
  late = piv.iloc[len(piv) // 2:]
  ratio = float((late["mu2"] / late["sigma2_over_b"]).median())
  ratio_full = (float((late["mu2"] / late["sigma2"]).median()) if "sigma2" in late else np.nan)
  frac = float(late["frac_mean_dominated"].median()) if "frac_mean_dominated" in late else np.nan
  finding = (f"Second half of training, median layer: μ̂²/(σ̂²/B) = {fmt_num(ratio)} "
             f"(Adam's v is {'mean' if ratio > 1 else 'variance'}-dominated), μ̂²/σ̂² = "
             f"{fmt_num(ratio_full)} (MicroAdam's v is "
             f"{'mean' if ratio_full > 1 else 'variance'}-dominated); fraction of "
             f"mean-dominated coordinates {fmt_num(frac)}.")
  num = piv.iloc[np.unique(np.linspace(0, len(piv) - 1, 6).astype(int))].reset_index()
  return {"verdict": "measured (descriptive)", "finding": finding, "claim_row": finding,
          "numbers_md": md_table(num)}
