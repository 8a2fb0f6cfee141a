"""Claim 2, mechanism: the measured signal-to-noise ratio at each stage of the sign chain.

Estimators (`pergrad.optim.diagnostics`, logged as `opt/<leaf>/snr2_<stage>` per
parameter leaf and `opt/all/snr2_<stage>` over all coordinates): squared SNRs as RATIOS
OF SUMS over coordinates, bias-corrected in the numerator (signed: ≈ 0 without signal,
never clipped before aggregating; validated against known truth in
`tests/test_estimators.py`),

    example  Σ(ḡ² − σ̂²/B) / Σσ̂²       estimates Σμ²/Σσ²
    batch    Σ(ḡ² − σ̂²/B) / Σ(σ̂²/B)   estimates Σμ²/(Σσ²/B)   (= B × example, by construction)
    ema      Σ(m² − V) / ΣV             SNR² of the EMA m = EMA_β(ḡ), V its tracked variance

Runs: every placement of the claim's chain (ema, batch, example; β = 0.9, weight decay 0;
not token, whose update needs token-level statistics in the same pass, so its runs cannot
log the example-level SNRs) at its own lr, the one sign_placement's search chose
(re-derived from its runs, `needs`), statistics every few steps, 3 seeds (at ci, SignEMA
alone at the config's lr, 1 seed). The statistics are those of the gradients along each
placement's own trajectory; the estimators do not depend on where the sign sits.

Per-leaf views (`experiments.leafwise`): a whole-model ratio of sums weighs each leaf by
its share of the signal and noise sums, which the normalization layers dominate with 0.19 %
of the parameters. Per run and stage, each leaf's SNR² is its mean over the second half of
training's logged steps; per seed, `rules.leaf_aggregates` gives the share of parameters
with SNR² > 1, the median over leaves and the parameter-weighted median, over all leaves
and without the normalization layers. The EMA gain SNR_ema/SNR_batch is reported for the
whole model and per leaf (parameter-weighted median over the leaves).

Sign agreement (`experiments.sign_counts`, when the runs log `sign/<leaf>/...` counts
against held-out batches): per placement, each seed's counts pooled over the second half
of training, the share of resolved coordinates where sign(u) agrees with sign(E g) and the
cosine of the sign step with E g; "not logged" otherwise. Reported, not part of the verdict.

Figures: `snr_over_training.png`, left, the whole-model SNR √max(snr2, 0) of each stage
(mean over seeds, band = min-max); right, the EMA gain against √((1+β)/(1−β)), its value
for a mean gradient constant across steps (a drifting mean gives less: √((1+βρ)/(1−βρ))
for an AR(1) drift of coefficient ρ). `snr_per_layer.png`: the per-leaf snr2 of each stage
over the second half of training (mean over logged steps and seeds), symmetric log axis.

Verdict (`RULE`): in every placement's runs, ema > batch on each seed's parameter-weighted
median over the leaves other than the normalization layers. batch vs example is not
tested: batch = B × example by construction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import calibrate, leafwise, lr_search, sign_counts
from experiments import rules as vd
from experiments import verdict as vd_text
from experiments.figures import plot_curves, plt, savefig, style
from experiments.record import ROWS, Experiment, Inputs, Report, register
from experiments.rules import is_norm_leaf, weighted_median
from experiments.runs import leaf_of, stat_columns, x_examples
from experiments.sweep import Block, Sweep, base_for, experiment_value
from experiments.verdict import fmt_num, md_table
from pergrad.analysis import ema_gain

NAME = "snr"
TITLE = "measured SNR at each stage of the sign chain"
CLAIM = ("The ranking of sign placements follows the SNR at each stage: per-example SNR < "
         "batch-mean SNR < EMA SNR, so the sign is best applied after the EMA.")
STAGES = ("snr2_example", "snr2_batch", "snr2_ema")  # worst first
# The runs' sign placements (cpu, paper): the claim's chain. The token placement updates
# from token-level statistics, and one backward pass computes one granularity, so its runs
# cannot log the example-level SNRs.
PLACEMENTS = ("ema", "batch", "example")
PLACEMENT = "optimizer.placement"
BETA = float(experiment_value(NAME, "optimizer.b1"))
SEEDS = {"ci": (0,), "cpu": (0, 1, 2), "paper": (0, 1, 2)}
IDS = ["run", "train.seed", "step", "examples_seen"]
VIEW = "weighted_median_no_norm"  # the per-leaf view the verdict reads
RULE = ("Per placement's runs, per seed and stage, each leaf's SNR² is its mean over the "
        "second half of training's logged steps; the seed's value is the parameter-weighted "
        "median over the leaves other than the normalization layers (not the whole-model "
        "ratio of sums, which those layers dominate with 0.19 % of the parameters in the "
        "cpu runs). "
        "Expected ema > batch in every placement's runs (batch = B × example by "
        "construction, so that pair is not tested), each pair " + vd.PAIR_WIN + ": "
        + vd.PAIRS_VERDICT + ".")
PAPER = "SNR per-example < batch < EMA (argument; the measured plot is not known)"
EFFECT = constant_mean_gain_sq = (1 + float(experiment_value(NAME, "optimizer.b1"))) / (
    1 - float(experiment_value(NAME, "optimizer.b1"))) - 1  # SNR²_ema − SNR²_batch, in SNR²_batch
RERUN = f"re-run `python scripts/reproduce.py {NAME} --preset <preset>`"


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


def analyze(runs, out_dir: Path) -> None:
  table, fin = runs.table, runs.finals
  """snr_per_leaf.csv (per leaf) and snr_all.csv (whole model), long tables of snr2."""
  out_dir = Path(out_dir)
  _long(table, leaves=True).to_csv(out_dir / "snr_per_leaf.csv", index=False)
  _long(table, leaves=False).to_csv(out_dir / "snr_all.csv", index=False)
  ids = IDS + ([PLACEMENT] if PLACEMENT in table else [])
  t = table.assign(examples_seen=x_examples(table))
  signs = sign_counts.long(t, ids)
  if len(signs):
    signs.to_csv(out_dir / sign_counts.CSV, index=False)
  leafwise.write_sizes(table, out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)


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
  return leafwise.second_half(all_df).groupby(["train.seed", "stage"])["snr2"].mean(
  ).unstack("stage")


def leaf_means(per_leaf: pd.DataFrame) -> pd.DataFrame:
  """[placement,] train.seed, stage, leaf, snr2: each leaf's mean over the second half of
  its run's logged steps."""
  keys = ([PLACEMENT] if PLACEMENT in per_leaf else []) + ["train.seed", "stage", "leaf"]
  return leafwise.second_half(per_leaf).groupby(keys, dropna=False)["snr2"].mean(
  ).reset_index()


def leaf_views(means: pd.DataFrame, sizes: dict[str, int]) -> pd.DataFrame:
  """Per [placement,] seed and stage: share of parameters with SNR² > 1, median and
  parameter-weighted median over leaves, all leaves and `_no_norm`."""
  keys = [c for c in means.columns if c not in ("leaf", "snr2")]
  size = means["leaf"].map(sizes).astype(float)  # num/den = snr2 per leaf
  views = leafwise.per_seed_views(means.assign(num=means["snr2"] * size, den=size), sizes, keys)
  return views[keys + [f"{v}{s}" for v in leafwise.VIEWS for s in ("", "_no_norm")]]


def leaf_gains(means: pd.DataFrame) -> pd.DataFrame:
  """[placement,] leaf, gain: SNR_ema/SNR_batch of each leaf's seed-mean SNR²s."""
  by = [PLACEMENT] if PLACEMENT in means else []
  w = means.groupby(by + ["leaf", "stage"], dropna=False)["snr2"].mean().unstack("stage")
  if not {"snr2_ema", "snr2_batch"} <= set(w.columns):
    return pd.DataFrame(columns=by + ["leaf", "gain"])
  return w.assign(gain=np.asarray(ema_gain(w["snr2_ema"].to_numpy(float),
                                           w["snr2_batch"].to_numpy(float)), float)
                  ).reset_index()[by + ["leaf", "gain"]]


def median_gain(gains: pd.DataFrame, sizes: dict[str, int]) -> float:
  """Parameter-weighted median of the per-leaf EMA gains over the leaves other than the
  normalization layers (leaves without a gain, SNR² ≤ 0 at a stage, left out)."""
  g = gains[~gains["leaf"].map(is_norm_leaf) & np.isfinite(gains["gain"].astype(float))]
  return weighted_median(g["gain"].to_numpy(float), g["leaf"].map(sizes).to_numpy(float))


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
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
    piv = leafwise.second_half(leaf_runs).groupby(["leaf", "stage"])["snr2"].mean().unstack("stage")
    piv = piv[[s for s in STAGES if s in piv]]
    piv.plot.bar(ax=ax, width=0.8)
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.axhline(0, color="k", lw=0.5)
    ax.set_xticklabels([lbl[-28:] for lbl in piv.index], rotation=70, fontsize=6, ha="right",
                       rotation_mode="anchor")
  ax.set_title("per-leaf SNR² (Σ signal / Σ noise in the leaf), second half of training"
               + (f", {_placements(per_leaf)[0]} runs" if _placements(per_leaf)[0] else ""))
  paths.append(savefig(fig, out_dir / "snr_per_layer.png"))
  return paths


def _whole_model(all_df: pd.DataFrame) -> tuple[str, pd.DataFrame]:
  """The whole-model (opt/all) SNR²s and EMA gain per placement, as text and a table."""
  parts, tables = [], []
  for k in _placements(all_df):
    seeds = per_seed(_of(all_df, k))
    stages = [st for st in STAGES if st in seeds]
    mean = seeds.mean()
    part = (("" if k is None else f"{k} runs ({len(seeds)} seeds): ")
            + ", ".join(f"{st.replace('snr2_', '')} {fmt_num(float(mean[st]))}" for st in stages))
    if {"snr2_ema", "snr2_batch"} <= set(stages):
      part += f", EMA gain {fmt_num(float(ema_gain(mean['snr2_ema'], mean['snr2_batch'])))}"
    parts.append(part)
    tables.append(seeds.reset_index().assign(**({} if k is None else {PLACEMENT: k})))
  num = pd.concat(tables, ignore_index=True)
  return "; ".join(parts), num[[c for c in [PLACEMENT, "train.seed", *STAGES] if c in num]]


def _sign_text(out_dir: Path) -> tuple[str, str]:
  """Sign agreement per placement (finding text, Markdown table), or "not logged"."""
  counts = sign_counts.read(out_dir)
  if counts.empty:
    return ("Sign agreement with E g: not logged (no sign/<leaf>/... counts in these runs).",
            "")
  keys = [PLACEMENT] if PLACEMENT in counts else []
  pooled = sign_counts.pooled(counts, keys + ["train.seed"])
  mean = pooled.groupby(keys + ["leaf"], dropna=False)[list(sign_counts.SUMMARY)].agg(
      ["mean", "std"])
  parts = []
  for idx, r in mean.iterrows():
    idx = idx if isinstance(idx, tuple) else (idx,)
    name = " ".join(str(x) for x in idx)
    parts.append(f"{name}: agreement {fmt_num(r[('agree', 'mean')])} ± "
                 f"{fmt_num(r[('agree', 'std')])} on {fmt_num(r[('resolved', 'mean')])} of the "
                 f"coordinates, alignment {fmt_num(r[('alignment', 'mean')])} ± "
                 f"{fmt_num(r[('alignment', 'std')])}")
  text = ("Sign agreement with E g (held-out batches; counts pooled over the second half of "
          "training, mean ± std over seeds; reported, not in the verdict): " + "; ".join(parts)
          + ".")
  cols = keys + ["train.seed", "leaf", *sign_counts.SUMMARY]
  return text, ("\n\nSign agreement per run (pooled over the second half of training; "
                "`no norm`: every leaf but the normalization layers):\n\n" + md_table(pooled[cols]))


def report(out_dir: Path) -> Report:
  out_dir = Path(out_dir)
  path = out_dir / "snr_all.csv"
  all_df = pd.read_csv(path) if path.exists() else pd.DataFrame()
  if all_df.empty:
    return Report(verdict="not measured", rule=RULE, ours=f"no SNR² logged: {RERUN}")
  whole, whole_md = _whole_model(all_df)
  whole = ("Whole model (ratios of sums over all coordinates, each seed's mean over the "
           "second half of training, mean over seeds): " + whole + f". A mean gradient "
           f"constant across steps gives an EMA gain √((1+β)/(1−β)) = "
           f"{constant_mean_gain():.2f} at β = {BETA:g}, a drifting one less.")
  sign_text, sign_md = _sign_text(out_dir)
  whole_md = ("Per run (placement, seed), whole-model SNR² (ratio of sums over all "
              "coordinates; signed), mean over the second half of training:\n\n"
              + md_table(whole_md))
  sizes, leaf_path = leafwise.read_sizes(out_dir), out_dir / "snr_per_leaf.csv"
  per_leaf = pd.read_csv(leaf_path) if leaf_path.exists() else pd.DataFrame()
  if sizes is None or per_leaf.empty:
    return Report(verdict="not measured", rule=RULE, ours=f"no per-leaf SNR² or leaf sizes: {RERUN}",
                  checks=(whole, sign_text), numbers_md=whole_md + sign_md)
  means = leaf_means(per_leaf)
  views, gains = leaf_views(means, sizes), leaf_gains(means)
  if PLACEMENT in views:  # SignEMA's runs first
    views = views.sort_values(PLACEMENT, kind="stable", key=lambda s: s.map(
        {k: i for i, k in enumerate(_placements(views))}))
  pairs, parts = [], []
  for k in _placements(views):
    v, tag = _of(views, k), "" if k is None else f"{k}:"
    groups = {tag + st.replace("snr2_", ""): v[v["stage"] == st][VIEW].dropna().tolist()
              for st in ("snr2_ema", "snr2_batch")}
    pairs += vd.decide(groups, [(tag + "ema", tag + "batch")], lower_is_better=False)[1]
    m = v.groupby("stage")[VIEW].mean()
    g = median_gain(_of(gains, k), sizes)
    parts.append(("" if k is None else f"{k} runs: ") + ", ".join(
        f"{st.replace('snr2_', '')} {fmt_num(float(m[st]))}" for st in STAGES if st in m)
        + f", per-leaf EMA gain (parameter-weighted median, no norm) {fmt_num(g)}")
  verdict = vd.verdict_of(pairs)
  cal = calibrate.calibrate("pair", calibrate.pooled_std(
      [views[views["stage"] == st][VIEW].dropna().tolist() for st in ("snr2_ema", "snr2_batch")]),
      int(views["train.seed"].nunique()), EFFECT * float(views[views["stage"] == "snr2_batch"][VIEW].mean()))
  gain_md = (gains.pivot_table(index="leaf", columns=PLACEMENT, values="gain").reset_index()
             if PLACEMENT in gains and len(gains) else gains)
  return Report(verdict=calibrate.gate(verdict, cal), rule=RULE, paper=PAPER, calibration=cal.row(),
                ours=vd_text.outcomes(pairs), checks=(*parts, *(p.sentence() for p in pairs), whole, sign_text),
                numbers_md="Per run and stage, per-leaf SNR² aggregated over leaves (`_no_norm`: "
                "without the normalization layers):\n\n" + md_table(views)
                + "\n\nPer-leaf EMA gain SNR_ema/SNR_batch:\n\n" + md_table(gain_md) + "\n\n"
                + whole_md + sign_md)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["2"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("sign_placement",)))
