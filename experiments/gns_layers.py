"""G2 (Gray et al. 2024): the gradient noise scale per layer type over training, and the
normalization layers' GNS as a predictor of the total GNS.

Runs: Adam at its own best lr (re-derived from the preconditioner
search's runs; at ci the config's), per-example
norms of every layer at every step (`stats.gns`, surgery backend, one backward pass), 3
seeds. Each step logs the raw per-type terms |G|²_est and S_est (`track_gns`); here
they are re-smoothed offline (`pergrad.stats.noise.smooth`, the tracker's own recurrence) with
several EMA decays α, B_simple = EMA(S)/EMA(|G|²) per type. The model's embedding is
untied, so "include" and "exclude" (nanoGNS) give the same numbers.

The paper's analysis, our reading: regress the smoothed total B_simple on the smoothed
normalization-layer B_simple over training (steps past the EMA's warm-up, t ≥ 1/(1−α)):
slope, intercept and Pearson r per seed and α. Both series drift as the loss falls, which
alone correlates them; r is read as "the norm GNS tracks the total", not as independence.

Verdict (`RULE`): at the tracker's α (0.95), the predictor holds when the seeds' mean r
minus their std is ≥ R_MIN (0.9, our threshold: the paper's r is not available here),
fails when the mean plus the std is < R_MIN, is partly reproduced otherwise; fewer than
two seeds: undetermined.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from experiments.figures import plot_curves, plt, savefig, style
from experiments.record import ROWS, Experiment, Inputs, Report, register
from experiments.report_md import fmt_num, md_table
from experiments.runs import x_examples
from experiments.sweep import Block, Sweep, base_for, experiment_value
from pergrad.analysis import GNS_TOTAL, smooth

NAME = "gns_layers"
TITLE = "gradient noise scale per layer type; the normalization layers as predictor"
CLAIM = ("The gradient noise scale of the normalization layers alone predicts the total GNS "
         "of a transformer (a linear relation with high correlation once both are smoothed; "
         "Gray et al., arXiv 2411.00999).")
ALPHA = float(experiment_value(NAME, "stats.gns_alpha"))
ALPHAS = (0.9, ALPHA, 0.98, 0.99)
R_MIN = 0.9
SEEDS = {"ci": (0,), "cpu": (0, 1, 2), "paper": (0, 1, 2)}
NORM = "norm"
RULE = (f"At the tracker's EMA decay α = {ALPHA:g}, the Pearson r between the smoothed "
        f"total and normalization-layer B_simple over training (past t = 1/(1−α)) is high "
        f"when the seeds' mean r minus their std is ≥ {R_MIN:g} (our threshold): reproduced "
        f"then, not reproduced when the mean plus the std is < {R_MIN:g}, partly reproduced "
        "otherwise, undetermined with < 2 seeds.")


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Adam at its tuned lr (cpu, paper) with every step's GNS terms logged, seeds."""
  tuned = {} if preset == "ci" else {"optimizer.lr": lr_search.tuned_lr(
      inputs, "preconditioner", {"optimizer.variant": "adam", "optimizer.clip_norm": None})}
  base = base_for(NAME, preset, **tuned)
  blocks = (Block({"train.seed": list(SEEDS[preset])}),)
  return Sweep(base, blocks, wall_estimate_min={"ci": 0.3, "cpu": 4}.get(preset))


def terms(table: pd.DataFrame) -> pd.DataFrame:
  """Long table: run, train.seed, step, examples_seen, group, G2, S (every logged step)."""
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  groups = sorted({c.split("/")[1] for c in t.columns
                   if c.startswith("gns/") and c.endswith("/G2")})
  rows = []
  for g in groups:
    sub = t[["run", "train.seed", "step", "examples_seen", f"gns/{g}/G2", f"gns/{g}/S"]]
    sub = sub.dropna().rename(columns={f"gns/{g}/G2": "G2", f"gns/{g}/S": "S"})
    rows.append(sub.assign(group=g))
  cols = ["run", "train.seed", "step", "examples_seen", "group", "G2", "S"]
  return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def smoothed(terms_df: pd.DataFrame, alpha: float) -> pd.DataFrame:
  """terms_df plus G2_ema, S_ema, b_simple by the tracker's recurrence at `alpha`."""
  out = []
  for _, g in terms_df.sort_values("step").groupby(["run", "group"], sort=False):
    sm = smooth(g["G2"].to_numpy(), g["S"].to_numpy(), alpha)
    out.append(g.assign(**{k: v.astype(float) for k, v in sm.items()}, alpha=alpha))
  return pd.concat(out, ignore_index=True) if out else terms_df.assign(alpha=alpha)


def regression(sm: pd.DataFrame, alpha: float) -> pd.DataFrame:
  """Per run: least-squares total = slope · norm + intercept and Pearson r of smoothed
  B_simple, over steps t ≥ 1/(1−α)."""
  rows = []
  for run, g in sm.groupby("run", sort=False):
    wide = g.pivot_table(index="step", columns="group", values="b_simple")
    if NORM not in wide or GNS_TOTAL not in wide:
      continue
    wide = wide[wide.index >= 1.0 / (1.0 - alpha)].dropna(subset=[NORM, GNS_TOTAL])
    if len(wide) < 3:
      continue
    x, y = wide[NORM].to_numpy(float), wide[GNS_TOTAL].to_numpy(float)
    slope, intercept = np.polyfit(x, y, 1)
    rows.append({"run": run, "train.seed": g["train.seed"].iloc[0], "alpha": alpha,
                 "slope": float(slope), "intercept": float(intercept),
                 "r": float(np.corrcoef(x, y)[0, 1]), "n_steps": len(wide)})
  return pd.DataFrame(rows)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  """gns_terms.csv (raw terms), gns_smoothed.csv (α = ALPHA), gns_regression.csv."""
  out_dir = Path(out_dir)
  t = terms(table)
  t.to_csv(out_dir / "gns_terms.csv", index=False)
  smoothed(t, ALPHA).to_csv(out_dir / "gns_smoothed.csv", index=False)
  regs = [regression(smoothed(t, a), a) for a in ALPHAS] if len(t) else []
  (pd.concat(regs, ignore_index=True) if regs else pd.DataFrame()).to_csv(
      out_dir / "gns_regression.csv", index=False)
  fin.to_csv(out_dir / "finals.csv", index=False)


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  sm = pd.read_csv(out_dir / "gns_smoothed.csv")
  pyplot = plt()
  fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.2))
  if len(sm):
    late = sm[sm["step"] >= 1.0 / (1.0 - ALPHA)]
    plot_curves(axes[0], late, ["group"], "b_simple", labeler=lambda g: g["group"])
    style(axes[0], yscale="log", ylabel="B_simple = EMA(S) / EMA(|G|²)",
          title=f"GNS per layer type (α = {ALPHA:g}; mean over seeds, band = min-max)",
          legend=8)
    wide = late.pivot_table(index=["run", "step"], columns="group", values="b_simple")
    if NORM in wide and GNS_TOTAL in wide:
      for run, g in wide.groupby(level=0):
        axes[1].plot(g[NORM], g[GNS_TOTAL], ".", ms=2, label=str(run)[-12:])
      axes[1].set_xlabel("normalization layers' B_simple")
      axes[1].set_ylabel("total B_simple")
      axes[1].set_title("total vs normalization-layer GNS (each step)")
      axes[1].legend(fontsize=6)
      axes[1].grid(alpha=0.3)
  return [savefig(fig, out_dir / "gns_layers.png")]


def decide(rs: list[float]) -> str:
  rs = [r for r in rs if np.isfinite(r)]
  if len(rs) < 2:
    return "undetermined"
  m, s = float(np.mean(rs)), float(np.std(rs, ddof=1))
  if m - s >= R_MIN:
    return "reproduced"
  if m + s < R_MIN:
    return "not reproduced"
  return "partly reproduced"


def report(out_dir: Path) -> Report:
  path = Path(out_dir) / "gns_regression.csv"
  reg = pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()
  if reg.empty:
    return Report(verdict="not measured", rule=RULE, numbers_md="",
                  finding="no gns/norm and gns/total terms were logged (stats.gns off?).")
  at = reg[np.isclose(reg["alpha"], ALPHA)]
  verdict = decide(at["r"].tolist())
  by_alpha = reg.groupby("alpha").agg(r_mean=("r", "mean"), r_std=("r", "std"),
                                      slope_mean=("slope", "mean"), slope_std=("slope", "std"),
                                      seeds=("r", "count")).reset_index()
  sm = pd.read_csv(Path(out_dir) / "gns_smoothed.csv")
  last = sm[sm["step"] == sm["step"].max()].groupby("group")["b_simple"].mean()
  measured = (f"Pearson r of smoothed total vs normalization-layer B_simple at α = {ALPHA:g}: "
              + ", ".join(fmt_num(r) for r in at["r"]) + f" over {len(at)} seed(s) (slope "
              + ", ".join(fmt_num(s) for s in at["slope"]) + "); final B_simple per type: "
              + ", ".join(f"{g} {fmt_num(float(v))}" for g, v in last.items()) + ".")
  return Report(verdict=verdict, rule=RULE, finding=f"Rule: {RULE} {measured}",
                claim_row=measured,
                numbers_md="Regression of total on normalization-layer B_simple (per seed, "
                "by α):\n\n" + md_table(reg) + "\n\nBy α (mean and std over seeds):\n\n"
                + md_table(by_alpha))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["G2"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("preconditioner",)))
