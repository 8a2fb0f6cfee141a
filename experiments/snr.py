"""Claim 2, mechanism: the measured signal-to-noise ratio at each stage of the sign chain.

Estimators (`pergrad.optim.diagnostics`, logged as `opt/<leaf>/snr2_<stage>` per
parameter leaf and `opt/all/snr2_<stage>` over all coordinates): squared SNRs as RATIOS
OF SUMS over coordinates, bias-corrected in the numerator,

    example  Σ(ḡ² − σ̂²/B) / Σσ̂²       estimates Σμ²/Σσ²
    batch    Σ(ḡ² − σ̂²/B) / Σ(σ̂²/B)   estimates Σμ²/(Σσ²/B)   (= B × example, by construction)
    ema      Σ(m² − V) / ΣV             SNR² of the EMA m = EMA_β(ḡ), V its tracked variance

Why these and not the median over coordinates of |value|/std, used before: that puts the
noisy estimate in the numerator, so a coordinate without signal still reads |t| (median
≈ 0.67 for the batch mean); the committed medians (batch 0.79, EMA 0.73) sat at that
floor. The ratios of sums read ≈ 0 without signal (they are signed; never clipped before
aggregating) and are validated against known truth in `tests/test_estimators.py`.

Runs: every placement of the claim's chain (ema, batch, example; β = 0.9, weight decay 0;
not token, whose update needs token-level statistics in the same pass) at its own
lr, the one sign_placement's search chose (re-derived from its runs, `needs`, so
`reproduce.py` runs sign_placement first), statistics every few steps, 3 seeds (at ci,
SignEMA alone at the config's lr, 1 seed). The statistics are those of the gradients along
each placement's own trajectory; the estimators do not depend on where the sign sits.

Figures: `snr_over_training.png`, left, the whole-model SNR √max(snr2, 0) of each stage
(ratio of sums over all coordinates; mean over seeds, band = min-max); right, the EMA gain
SNR_ema/SNR_batch against √((1+β)/(1−β)), its value for a mean gradient constant across
steps (a drifting mean gives less: √((1+βρ)/(1−βρ)) for an AR(1) drift of coefficient ρ).
`snr_per_layer.png`: the per-leaf snr2 of each stage over the second half of training
(ratio of sums within the leaf; mean over logged steps and seeds), on a symmetric log
axis since it may be < 0 where a leaf has no detectable signal.

Verdict (noise-aware, `experiments.verdict.ordering` over seeds, higher is better): on
each seed's mean over the second half of training of `opt/all/snr2_<stage>`, the expected
order is ema > batch > example in every placement's runs (all pairs of all placements
enter one `verdict_of`). batch > example is significant exactly when the signal
is detected (batch = B × example); ema > batch is the measured step of the mechanism.
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
from experiments.sweep import Block, Sweep, base_for, experiment_value
from pergrad.analysis import ema_gain

NAME = "snr"
TITLE = "measured SNR at each stage of the sign chain"
CLAIM = ("The ranking of sign placements follows the SNR at each stage: per-example SNR < "
         "batch-mean SNR < EMA SNR, so the sign is best applied after the EMA.")
STAGES = ("snr2_example", "snr2_batch", "snr2_ema")  # worst first
# The runs' sign placements (cpu, paper): the claim's chain. The token placement updates
# from token-level statistics, and one backward pass computes one granularity, so its runs
# cannot log the example-level SNRs (they failed so in the reproduction at da5c84b).
PLACEMENTS = ("ema", "batch", "example")
PLACEMENT = "optimizer.placement"
BETA = float(experiment_value(NAME, "optimizer.b1"))
SEEDS = {"ci": (0,), "cpu": (0, 1, 2), "paper": (0, 1, 2)}
IDS = ["run", "train.seed", "step", "examples_seen"]


def constant_mean_gain(beta: float = BETA) -> float:
  """SNR_ema / SNR_batch for a mean gradient constant across steps, once stationary."""
  return float(np.sqrt((1 + beta) / (1 - beta)))


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Each placement at its own lr (the one sign_placement's search chose; at ci
  SignEMA alone at the config's lr), statistics logged, seeds."""
  log_every = {"ci": 5, "cpu": 10, "paper": 100}[preset]
  base = base_for(NAME, preset, **{"stats.log_every": log_every})
  seeds = list(SEEDS[preset])
  if preset == "ci":
    return Sweep(base, (Block({"optimizer.placement": ["ema"], "train.seed": seeds}),),
                 wall_estimate_min=0.3)
  blocks = tuple(Block({"optimizer.placement": [k], "optimizer.lr": [lr_search.tuned_lr(
      inputs, "sign_placement", {"optimizer.placement": k})], "train.seed": seeds})
      for k in PLACEMENTS)
  return Sweep(base, blocks, wall_estimate_min={"cpu": 12}.get(preset))


def _long(table: pd.DataFrame, leaves: bool) -> pd.DataFrame:
  """run, seed, step, examples_seen, stage, [leaf,] snr2: per leaf, or opt/all."""
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  ids = IDS + ([PLACEMENT] if PLACEMENT in t else [])
  rows = []
  for stage in STAGES:
    for col in stat_columns(t, stage, "opt"):
      leaf = leaf_of(col)
      if (leaf == "all") == leaves:
        continue
      sub = t[ids + [col]].dropna(subset=[col]).rename(columns={col: "snr2"})
      rows.append(sub.assign(stage=stage, **({"leaf": leaf} if leaves else {})))
  cols = ids + ["stage"] + (["leaf"] if leaves else []) + ["snr2"]
  return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  """snr_per_leaf.csv (per leaf) and snr_all.csv (whole model), long tables of snr2."""
  out_dir = Path(out_dir)
  _long(table, leaves=True).to_csv(out_dir / "snr_per_leaf.csv", index=False)
  _long(table, leaves=False).to_csv(out_dir / "snr_all.csv", index=False)
  fin.to_csv(out_dir / "finals.csv", index=False)


def _second_half(df: pd.DataFrame) -> pd.DataFrame:
  return df[df["step"] > df["step"].max() / 2] if len(df) else df


def _placements(df: pd.DataFrame) -> list:
  """The runs' placements, SignEMA first ([None] for tables without the column)."""
  if PLACEMENT not in df or df[PLACEMENT].isna().all():
    return [None]
  have = list(dict.fromkeys(df[PLACEMENT].dropna()))
  return [k for k in PLACEMENTS if k in have] + [k for k in have if k not in PLACEMENTS]


def _of(df: pd.DataFrame, placement) -> pd.DataFrame:
  return df if placement is None else df[df[PLACEMENT] == placement]


def per_seed(all_df: pd.DataFrame) -> pd.DataFrame:
  """Seed x stage: mean over the second half of each run's logged steps of opt/all snr2."""
  late = pd.concat([_second_half(g) for _, g in all_df.groupby("run")]) if len(all_df) \
      else all_df
  return late.groupby(["train.seed", "stage"])["snr2"].mean().unstack("stage")


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  if not (out_dir / "snr_all.csv").exists():  # results of the old (median) estimators
    return []
  all_df = pd.read_csv(out_dir / "snr_all.csv")
  per_leaf = pd.read_csv(out_dir / "snr_per_leaf.csv")
  pyplot = plt()
  fig, axes = pyplot.subplots(1, 2, figsize=(12, 4.2))
  if not all_df.empty:
    by = [PLACEMENT] if PLACEMENT in all_df else []
    name = lambda g: (f"{g[PLACEMENT]} run: " if by else "")
    snr = all_df.assign(snr=np.sqrt(all_df["snr2"].clip(lower=0)))
    plot_curves(axes[0], snr[snr["snr"] > 0], by + ["stage"], "snr",
                labeler=lambda g: name(g) + g["stage"].replace("snr2_", ""))
    wide = all_df.pivot_table(index=IDS + by, columns="stage", values="snr2").reset_index()
    if {"snr2_ema", "snr2_batch"} <= set(wide.columns):
      wide = wide.assign(gain=ema_gain(wide["snr2_ema"], wide["snr2_batch"]), what="gain")
      plot_curves(axes[1], wide, by + ["what"], "gain",
                  labeler=lambda g: name(g) + "SNR_ema / SNR_batch")
  style(axes[0], yscale="log", ylabel="√max(SNR², 0), ratio of sums over all coordinates",
        title="SNR at each stage, each placement's runs", legend=7)
  axes[1].axhline(constant_mean_gain(), color="k", ls="--",
                  label=f"constant mean: √((1+β)/(1−β)) = {constant_mean_gain():.2f}")
  axes[1].axhline(1.0, color="gray", ls=":", label="no gain")
  style(axes[1], yscale="log", ylabel="EMA gain", title="EMA gain over one batch mean",
        legend=8)
  paths = [savefig(fig, out_dir / "snr_over_training.png")]
  fig, ax = pyplot.subplots(figsize=(9, 4.2))
  if not per_leaf.empty:
    leaf_runs = _of(per_leaf, _placements(per_leaf)[0])  # SignEMA's runs where present
    piv = _second_half(leaf_runs).groupby(["leaf", "stage"])["snr2"].mean().unstack("stage")
    piv = piv[[s for s in STAGES if s in piv]]
    piv.plot.bar(ax=ax, width=0.8)
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticklabels([lbl[-28:] for lbl in piv.index], rotation=70, fontsize=6)
  ax.set_title("per-leaf SNR² (Σ signal / Σ noise in the leaf), second half of training"
               + (f", {_placements(per_leaf)[0]} runs" if _placements(per_leaf)[0] else ""))
  paths.append(savefig(fig, out_dir / "snr_per_layer.png"))
  return paths


def report(out_dir: Path) -> Report:
  path = Path(out_dir) / "snr_all.csv"
  all_df = pd.read_csv(path) if path.exists() else pd.DataFrame()
  if all_df.empty:
    return Report(verdict="not measured", finding="no SNR² statistics were logged "
                  "(opt/all/snr2_* keys missing from metrics.jsonl, or results of the old median "
                  "estimators: rerun).", numbers_md="")
  pairs, parts, tables = [], [], []
  for k in _placements(all_df):
    seeds = per_seed(_of(all_df, k))
    stages = [st for st in STAGES if st in seeds]
    tag = "" if k is None else f"{k}:"
    groups = {tag + st.replace("snr2_", ""): seeds[st].dropna().tolist() for st in stages}
    best_first = [tag + st.replace("snr2_", "") for st in reversed(stages)]
    pairs += vd.ordering(groups, best_first, lower_is_better=False)[1]
    mean = seeds.mean()
    part = (("" if k is None else f"{k} runs ({len(seeds)} seeds): ")
            + ", ".join(f"{st.replace('snr2_', '')} {fmt_num(float(mean[st]))}" for st in stages))
    if {"snr2_ema", "snr2_batch"} <= set(stages):
      part += f", EMA gain {fmt_num(float(ema_gain(mean['snr2_ema'], mean['snr2_batch'])))}"
    parts.append(part)
    tables.append(seeds.reset_index().assign(**({} if k is None else {PLACEMENT: k})))
  verdict = vd.verdict_of(pairs)
  finding = ("Whole-model SNR² (Σ signal / Σ noise over all coordinates, each seed's mean "
             "over the second half of training, mean over seeds): " + "; ".join(parts)
             + f". EMA gain = SNR_ema/SNR_batch; a mean gradient constant across steps "
             f"gives √((1+β)/(1−β)) = {constant_mean_gain():.2f} at β = {BETA:g}, a drifting "
             "one less; batch = B × example by construction. Rule: " + vd.RULE
             + " Here, higher SNR² is better, expected ema > batch > example in every "
             "placement's runs: " + "; ".join(p.sentence() for p in pairs) + ".")
  num = pd.concat(tables, ignore_index=True)
  num = num[[c for c in [PLACEMENT, "train.seed", *STAGES] if c in num]]
  return Report(verdict=verdict, finding=finding, claim_row=finding,
                numbers_md="Per run (placement, seed), mean over the second half of training "
                "of the whole-model SNR² (ratio of sums over all coordinates; signed):\n\n"
                + md_table(num))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["2"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("sign_placement",)))
