"""Claim 3, mechanism: which term dominates Adam's second moment over training.

Per coordinate E[ḡ²] = μ² + σ²/B (Adam's v) and E[mean g_i²] = μ² + σ² (MicroAdam's v).
Estimators, all RATIOS OF SUMS over coordinates with the unbiased μ̂² = ḡ² − σ̂²/B in the
numerator (signed: ≈ 0, possibly < 0, where there is no signal; never clipped before
aggregating), validated against known truth in `tests/test_estimators.py`:

    snr2_batch     = Σ μ̂² / Σ (σ̂²/B)   μ² over Adam's noise term (> 1: v is μ²-dominated)
    snr2_example   = Σ μ̂² / Σ σ̂²       μ² over MicroAdam's noise term (= the above / B)
    share_mu2, share_var_b, share_var = Σ μ̂², Σ σ̂²/B, Σ σ̂² over Σ v̂ (Adam's debiased v)

per parameter leaf (`stats/<leaf>/...`, `opt/<leaf>/...`) and over all coordinates
(`stats/total/...`, `opt/all/...`), from `pergrad.stats.summaries` and
`pergrad.optim.diagnostics`, during Adam runs at Adam's best lr (3e-2 at cpu,
the preconditioner search's, weight decay 0 as there), 3 seeds (1 at ci). The medians over
coordinates used before (of ḡ², σ̂²/B, …, and a difference of medians for μ̂²) are gone:
a median of a per-coordinate ratio sits on a noise floor, and a difference of medians is
not the median (nor the mean) of μ̂².

Figures (`moments_over_training.png`): left, whole-model μ̂²/(σ̂²/B) and μ̂²/σ̂² over
training (mean over seeds, band = min-max) against 1; middle, the whole-model shares of
μ̂², σ̂²/B and σ̂² in Adam's v̂; right, per-leaf μ̂²/(σ̂²/B) over the second half of
training (mean over logged steps and seeds), symmetric log axis.

Verdict (noise-aware, `experiments.verdict.ordering` over seeds, higher is better): each
seed's mean over the second half of training of `opt/all/snr2_batch` against 1
(the σ²/B term in the same units): "reproduced" when μ² dominates Adam's v beyond the
seed spread, "not reproduced" when σ²/B does, otherwise a tie ("partly reproduced").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from experiments import verdict as vd
from experiments.figures import plot_curves, plt, savefig, style
from experiments.record import ROWS, Experiment, Inputs, Report, register
from experiments.report_md import fmt_num, md_table
from experiments.runs import leaf_of, stat_columns, x_examples
from experiments.sweep import Block, Sweep, base_for

NAME = "moments"
TITLE = "μ², σ²/B and σ² in Adam's second moment over training"
CLAIM = ("Adam's preconditioner v ≈ μ² + σ²/B: the paper's reading is that good "
         "preconditioning is dominated by μ² rather than by the variance σ².")

# Logged per leaf and whole-model by `pergrad.optim.diagnostics` ("opt/<leaf>/<name>").
RATIOS = ("snr2_batch", "snr2_example")
MAGNITUDES = ("gbar2_mean", "mu2_mean", "var_mean")  # per leaf only
# Shares of the step's μ̂², σ̂²/B, σ̂² in Adam's debiased v̂ (`pergrad.optim.diagnostics`).
SHARES = ("share_mu2", "share_var_b", "share_var")
SEEDS = {"ci": (0,), "cpu": (0, 1, 2), "paper": (0, 1, 2)}
IDS = ["run", "train.seed", "step", "examples_seen"]
WHOLE = ("total", "all")  # the whole-model "leaf" of stats/ and opt/ keys


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Adam at its own best lr (the one the preconditioner search chose, from its runs; at ci the
  config's), statistics logged, seeds."""
  log_every = {"ci": 5, "cpu": 10, "paper": 100}[preset]
  tuned = {} if preset == "ci" else {"optimizer.lr": lr_search.tuned_lr(
      inputs, "preconditioner", {"optimizer.variant": "adam", "optimizer.clip_norm": None})}
  base = base_for(NAME, preset, **{"stats.log_every": log_every}, **tuned)
  blocks = (Block({"optimizer.variant": ["adam"], "train.seed": list(SEEDS[preset])}),)
  return Sweep(base, blocks, wall_estimate_min={"ci": 0.3, "cpu": 8}.get(preset))


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  """moments_per_leaf.csv and moments_all.csv (whole model): long tables IDS, [leaf,]
  quantity, value."""
  out_dir = Path(out_dir)
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  rows = []
  for name, prefix in [*((n, "stats") for n in MAGNITUDES),
                       *((n, "opt") for n in (*RATIOS, *SHARES))]:
    for col in stat_columns(t, name, prefix):
      sub = t[IDS + [col]].dropna(subset=[col])
      rows.append(sub.rename(columns={col: "value"}).assign(quantity=name, leaf=leaf_of(col)))
  long = (pd.concat(rows, ignore_index=True) if rows else
          pd.DataFrame(columns=[*IDS, "value", "quantity", "leaf"]))
  whole = long["leaf"].isin(WHOLE)
  long[~whole].to_csv(out_dir / "moments_per_leaf.csv", index=False)
  long[whole].drop(columns="leaf").to_csv(out_dir / "moments_all.csv", index=False)
  fin.to_csv(out_dir / "finals.csv", index=False)


def _second_half(df: pd.DataFrame) -> pd.DataFrame:
  return df[df["step"] > df["step"].max() / 2] if len(df) else df


def per_seed(all_df: pd.DataFrame) -> pd.DataFrame:
  """Seed x quantity: mean over the second half of the logged steps (whole model)."""
  return _second_half(all_df).groupby(["train.seed", "quantity"])["value"].mean().unstack(
      "quantity")


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  if not (out_dir / "moments_all.csv").exists():  # results of the old (median) estimators
    return []
  all_df = pd.read_csv(out_dir / "moments_all.csv")
  per_leaf = pd.read_csv(out_dir / "moments_per_leaf.csv")
  pyplot = plt()
  fig, axes = pyplot.subplots(1, 3, figsize=(16, 4.2))
  ratios = all_df[all_df["quantity"].isin(RATIOS)]
  if not ratios.empty:
    plot_curves(axes[0], ratios, ["quantity"], "value", labeler=lambda g: {
        "snr2_batch": "Σμ̂² / Σσ̂²/B (Adam)", "snr2_example": "Σμ̂² / Σσ̂² (MicroAdam)"}[
            g["quantity"]])
  axes[0].axhline(1.0, color="k", ls="--", lw=0.8)
  axes[0].set_yscale("symlog", linthresh=1e-2)
  style(axes[0], ylabel="ratio of sums over all coordinates",
        title="μ² over the noise term of v (> 1: μ²-dominated)", legend=8)
  shares = all_df[all_df["quantity"].isin(SHARES)]
  if not shares.empty:
    plot_curves(axes[1], shares, ["quantity"], "value", labeler=lambda g: g["quantity"])
  axes[1].set_yscale("symlog", linthresh=1e-2)
  style(axes[1], ylabel="Σ term / Σ v̂ (all coordinates)",
        title="shares of μ̂², σ̂²/B, σ̂² in Adam's v̂", legend=8)
  leaf = per_leaf[per_leaf["quantity"] == "snr2_batch"]
  if not leaf.empty:
    bars = _second_half(leaf).groupby("leaf")["value"].mean()
    axes[2].bar(range(len(bars)), bars.values)
    axes[2].set_xticks(range(len(bars)))
    axes[2].set_xticklabels([lbl[-28:] for lbl in bars.index], rotation=70, fontsize=6)
  axes[2].axhline(1.0, color="k", ls="--", lw=0.8)
  axes[2].set_yscale("symlog", linthresh=1e-2)
  style(axes[2], ylabel="Σμ̂² / Σσ̂²/B within the leaf",
        title="per leaf, second half of training")
  return [savefig(fig, out_dir / "moments_over_training.png")]


def report(out_dir: Path) -> Report:
  path = Path(out_dir) / "moments_all.csv"
  all_df = pd.read_csv(path) if path.exists() else pd.DataFrame()
  if all_df.empty or "snr2_batch" not in set(all_df["quantity"]):
    return Report(verdict="not measured", finding="μ̂²/(σ̂²/B) was not logged "
                  "(opt/all/snr2_batch missing from metrics.jsonl): rerun.", numbers_md="")
  seeds = per_seed(all_df)
  r = seeds["snr2_batch"].dropna().tolist()
  verdict, pairs = vd.ordering({"μ²": r, "σ²/B": [1.0] * len(r)}, ["μ²", "σ²/B"],
                               lower_is_better=False)
  mean = seeds.mean()
  get = lambda k: fmt_num(float(mean[k])) if k in mean else "n/a"
  finding = (f"Second half of training, whole model (ratios of sums over all coordinates, "
             f"mean over {len(r)} seed(s)): Σμ̂²/Σ(σ̂²/B) = {get('snr2_batch')} "
             f"(Adam's v is {'μ²' if np.mean(r) > 1 else 'σ²/B'}-dominated on average), "
             f"Σμ̂²/Σσ̂² = {get('snr2_example')} (MicroAdam's v: "
             f"{'μ²' if mean.get('snr2_example', np.nan) > 1 else 'σ²'}-dominated); shares "
             f"of Adam's v̂: μ̂² {get('share_mu2')}, σ̂²/B {get('share_var_b')}. Rule: "
             + vd.RULE + " Here, with μ²/(σ²/B) against 1 (higher: μ² dominates): "
             + "; ".join(p.sentence() for p in pairs) + ".")
  return Report(verdict=verdict, finding=finding, claim_row=finding,
                numbers_md="Per seed, mean over the second half of training (whole model, "
                "ratios of sums; signed):\n\n" + md_table(seeds.reset_index()))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["3"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("preconditioner",)))
