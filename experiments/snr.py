"""Claim 2, mechanism: the measured signal-to-noise ratio at each stage of the sign chain.

`pergrad.optim.diagnostics` logs `opt/<leaf>/snr2_<stage>` (and `opt/all/`), ratios of sums
with the signed μ̂² = ḡ² − σ̂²/B: example Σμ̂²/Σσ̂², batch Σμ̂²/Σ(σ̂²/B) (= B × example), ema
Σ(m² − V)/ΣV (m = EMA_β(ḡ), V its tracked variance). A mean constant across steps gives an EMA
gain SNR_ema/SNR_batch of √((1+β)/(1−β)), a drifting one less.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import decide, ema_gain, leafwise
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.markdown import fmt_num, listing, sections
from pergrad.analysis.plots import plot_curves, plt, savefig, style
from pergrad.analysis.report import not_measured
from pergrad.analysis.runs import read_csv, write_csv, x_examples
from pergrad.analysis.verdict import pairs_report
from pergrad.sweep import SEEDS, Block, Sweep, base_for, experiment_value, with_warmup
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, Inputs, register

NAME = "snr"
TITLE = "measured SNR at each stage of the sign chain"
CLAIM = ("The ranking of sign placements follows the SNR at each stage: per-example SNR < "
         "batch-mean SNR < EMA SNR, so the sign is best applied after the EMA.")
STAGES = ("snr2_example", "snr2_batch", "snr2_ema")  # worst first
PLACEMENTS = ("ema", "batch", "example")  # token: its update needs token-level statistics
PLACEMENT = "optimizer.placement"
BETA = float(experiment_value(NAME, "optimizer.b1"))
IDS = ["run", "train.seed", "step", "examples_seen"]
VIEW = "weighted_median_no_norm"  # the per-leaf view the verdict reads
SIGN_CSV = "snr_sign.csv"  # the sign counts per logged step, summed over each pool's leaves
RULE = ("Per placement's runs, per seed and stage, each leaf's SNR² is its mean over the second "
        "half of training's logged steps; the seed's value is the parameter-weighted median over "
        "the leaves other than the normalization layers (not the whole-model ratio of sums, which "
        "those layers dominate with 0.19 % of the parameters in the cpu runs). Expected ema > "
        "batch in every placement's runs (batch = B × example by construction, so that pair is "
        f"not tested), each pair {decide.READING}: {decide.VERDICT}.")
PAPER = "SNR per-example < batch < EMA (argument; the measured plot is not known)"
EFFECT = declared(NAME, "effect")  # SNR²_ema − SNR²_batch in SNR²_batch (configs/experiment)
GAIN = float(np.sqrt((1 + BETA) / (1 - BETA)))  # SNR_ema / SNR_batch for a constant mean


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Each placement at its tuned lr (ci: SignEMA at the config's), statistics logged."""
  base = base_for(NAME, preset, **{"stats.log_every": {"ci": 5, "cpu": 10, "paper": 100}[preset]})
  seeds = list(SEEDS[preset])
  if preset == "ci":
    return Sweep(base, (Block({PLACEMENT: ["ema"], "train.seed": seeds}),), wall_estimate_min=0.3)
  return Sweep(base, tuple(Block({PLACEMENT: [k], "optimizer.lr": [lr_search.tuned_lr(
      inputs, "sign_placement", {PLACEMENT: k})], "train.seed": seeds}) for k in PLACEMENTS),
      wall_estimate_min={"cpu": 12}.get(preset))


def analyze(runs, out_dir: Path) -> None:
  """snr_per_leaf.csv, snr_all.csv (long tables of snr2), snr_sign.csv (the sign counts per
  step, summed over the leaves of each pool), leaf_params.csv."""
  out_dir, table = Path(out_dir), runs.table
  t = table.assign(examples_seen=x_examples(table))
  ids = IDS + _by(t)
  long = leafwise.long_stats(t, ids, dict.fromkeys(STAGES, "opt"), "stage", "snr2")
  whole = long["leaf"] == "all"
  write_csv(long[~whole], out_dir / "snr_per_leaf.csv")
  write_csv(long[whole].drop(columns="leaf"), out_dir / "snr_all.csv")
  signs = leafwise.sign_pools(leafwise.sign_long(t, ids))
  if len(signs):
    write_csv(signs, out_dir / SIGN_CSV)
  leafwise.write_sizes(table, out_dir)
  write_csv(with_warmup(runs.finals, runs.sweep_dir), out_dir / "finals.csv")


def _placements(df: pd.DataFrame) -> list:
  """The runs' placements, SignEMA first ([None] without the column)."""
  if PLACEMENT not in df or df[PLACEMENT].isna().all():
    return [None]
  have = list(dict.fromkeys(df[PLACEMENT].dropna()))
  return [k for k in PLACEMENTS if k in have] + [k for k in have if k not in PLACEMENTS]


def _by(df: pd.DataFrame) -> list[str]:
  return [PLACEMENT] if PLACEMENT in df else []


def whole_model(all_df: pd.DataFrame) -> pd.DataFrame:
  """Per [placement,] seed: each stage's opt/all SNR² over the second half, the EMA gain."""
  w = leafwise.second_half(all_df).groupby(_by(all_df) + ["train.seed", "stage"], dropna=False)[
      "snr2"].mean().unstack("stage").reset_index()
  if {"snr2_ema", "snr2_batch"} <= set(w):
    w["ema_gain"] = np.asarray(ema_gain(w["snr2_ema"], w["snr2_batch"]), float)
  return w


def leaf_views(means: pd.DataFrame, sizes: dict[str, int]) -> pd.DataFrame:
  """Per [placement,] seed and stage: the `leafwise.VIEWS` of the leaves' SNR² (`means`: per
  [placement,] seed, stage and leaf, the mean over the second half)."""
  keys = [c for c in means.columns if c not in ("leaf", "snr2")]
  size = means["leaf"].map(sizes).astype(float)  # num/den = snr2 per leaf
  views = leafwise.per_seed_views(means.assign(num=means["snr2"] * size, den=size), sizes, keys)
  return views[keys + [f"{v}{s}" for v in leafwise.VIEWS for s in ("", "_no_norm")]]


def leaf_gains(means: pd.DataFrame, sizes: dict[str, int]) -> pd.Series:
  """Per placement: the parameter-weighted median over the non-norm leaves (SNR² > 0) of the
  EMA gain of each leaf's seed-mean SNR²s."""
  w = means.groupby(_by(means) + ["leaf", "stage"], dropna=False)["snr2"].mean().unstack("stage")
  if not {"snr2_ema", "snr2_batch"} <= set(w.columns):
    return pd.Series(dtype=float)
  g = w.assign(gain=np.asarray(ema_gain(w["snr2_ema"], w["snr2_batch"]), float)).reset_index()
  g = g[~g["leaf"].map(leafwise.is_norm_leaf) & np.isfinite(g["gain"])]
  med = lambda x: leafwise.weighted_median(x["gain"], x["leaf"].map(sizes).to_numpy(float))
  return g.groupby(_by(g), dropna=False).apply(med) if _by(g) else pd.Series({None: med(g)})


def figures(out_dir: Path) -> list[Path]:
  """snr_over_training.png: each stage's whole-model SNR, the EMA gain against GAIN."""
  all_df = read_csv(Path(out_dir) / "snr_all.csv")
  fig, axes = plt().subplots(1, 2, figsize=(12, 4.2))
  by, name = _by(all_df), lambda g: f"{g[PLACEMENT]} run: " if PLACEMENT in g else ""
  if len(all_df):
    snr = all_df.assign(snr=np.sqrt(all_df["snr2"].clip(lower=0)))
    plot_curves(axes[0], snr[snr["snr"] > 0], by + ["stage"], "snr",
                labeler=lambda g: name(g) + g["stage"].replace("snr2_", ""))
    wide = all_df.pivot_table(index=IDS + by, columns="stage", values="snr2").reset_index()
    if {"snr2_ema", "snr2_batch"} <= set(wide.columns):
      wide = wide.assign(gain=ema_gain(wide["snr2_ema"], wide["snr2_batch"]), what="gain")
      plot_curves(axes[1], wide, by + ["what"], "gain", labeler=lambda g: name(g) + "EMA gain")
  axes[1].axhline(GAIN, color="k", ls="--", label="constant mean")
  style(axes[0], yscale="log", ylabel="√max(SNR², 0), all coordinates", title="SNR per stage",
        legend=7)
  style(axes[1], yscale="log", ylabel="SNR_ema / SNR_batch", title="EMA gain", legend=8)
  return [savefig(fig, Path(out_dir) / "snr_over_training.png")]


def _signs(out_dir: Path) -> tuple[str, str, str]:
  """Sign agreement with E g per placement and pool, why SignEMA wins (check sentences),
  Markdown."""
  counts = read_csv(out_dir / SIGN_CSV)
  if counts.empty:
    return "Sign agreement with E g: not logged (no sign/<leaf>/... counts in these runs)", "", ""
  if "direction" not in counts:  # an analysis older than the stage directions
    counts = counts.assign(direction="update", target="current")
  keys = _by(counts)
  pooled = leafwise.sign_pooled(counts, keys + ["train.seed", "direction", "target"])
  own = pooled[(pooled["direction"] == "update") & (pooled["target"] == "current")]
  m = own.groupby(keys + ["leaf"], dropna=False)[["agree", "resolved", "alignment"]].agg(
      ["mean", "std"])
  parts = [f"{' '.join(map(str, i if isinstance(i, tuple) else (i,)))}: agreement "
           f"{fmt_num(r[('agree', 'mean')])} ± {fmt_num(r[('agree', 'std')])} on "
           f"{fmt_num(r[('resolved', 'mean')])} of the coordinates, alignment "
           f"{fmt_num(r[('alignment', 'mean')])}" for i, r in m.iterrows()]
  means = pooled.groupby(keys + ["direction", "target", "leaf"], dropna=False)[
      list(leafwise.SUMMARY)].mean().reset_index()
  return ("Sign agreement with E g (held-out batches, pooled over the second half, mean ± std "
          "over seeds; not in the verdict): " + "; ".join(parts), _why(means, keys),
          sections("", "Sign agreement of each direction (the update's, and every stage's at "
                   "the same parameters) with the current and the lagged E g, mean over seeds:",
                   means, "Per run:",
                   pooled[keys + ["train.seed", "direction", "target", "leaf",
                                  *leafwise.SUMMARY]]))


def _why(means: pd.DataFrame, keys: list[str]) -> str:
  """Why SignEMA wins: agreement / alignment of each stage's direction with the current and
  the lagged E g on the same trajectories (no-norm leaves, mean over seeds)."""
  m = means[(means["leaf"] == leafwise.NO_NORM) & means["direction"].isin(PLACEMENTS)]
  pair = lambda v: f"{fmt_num(v['agree'])} / {fmt_num(v['alignment'])}"
  parts, targets = [], ("current", "lagged")
  for k, g in (m.groupby(keys, dropna=False) if keys else [(None, m)]):
    at = g.set_index(["target", "direction"])
    al = at["alignment"]
    text = "; ".join(f"{t} E g: " + listing(((d, at.loc[(t, d)]) for d in PLACEMENTS
                                             if (t, d) in at.index), fmt=pair)
                     for t in targets if t in at.index)
    text += "".join(f"; m's alignment with the {t} E g is "
                    f"{fmt_num(al[(t, 'ema')] / al[(t, 'batch')])} times ḡ's"
                    for t in targets if {(t, "ema"), (t, "batch")} <= set(at.index))
    parts.append((f"{k[0] if isinstance(k, tuple) else k} runs: " if keys else "") + text)
  return ("Why SignEMA wins: each stage's direction at the same parameters (example: mean of "
          "per-example signs, batch: ḡ, ema: m), agreement / alignment with the current and "
          "the lagged held-out E g (no-norm leaves, second half, mean over seeds): "
          + " | ".join(parts)) if parts else ""


def report(out_dir: Path):
  out_dir = Path(out_dir)
  all_df, per_leaf = read_csv(out_dir / "snr_all.csv"), read_csv(out_dir / "snr_per_leaf.csv")
  if all_df.empty:
    return not_measured(RULE, "no SNR² logged", NAME)
  whole = whole_model(all_df)
  m = (whole.groupby(_by(whole), dropna=False).mean(numeric_only=True).reset_index() if _by(whole)
       else whole.mean(numeric_only=True).to_frame().T)
  cols = [c for c in (*STAGES, "ema_gain") if c in m]
  name = lambda c: "EMA gain" if c == "ema_gain" else c.replace("snr2_", "")
  whole_text = (f"Whole model (ratio of sums, mean over seeds; a constant mean gives an EMA gain "
                f"{GAIN:.2f} at β = {BETA:g}): " + "; ".join(
                    (f"{r[PLACEMENT]} runs: " if PLACEMENT in r else "")
                    + listing((name(c), float(r[c])) for c in cols)
                    for r in m.to_dict("records")))
  sign_text, why_text, sign_md = _signs(out_dir)
  numbers = sections("Whole model, per run:", whole) + sign_md
  sizes = leafwise.read_sizes(out_dir)
  if sizes is None or per_leaf.empty:
    return not_measured(RULE, "no per-leaf SNR² or leaf sizes", NAME,
                        checks=(whole_text, sign_text, why_text), numbers_md=numbers)
  means = leafwise.second_half(per_leaf).groupby(
      _by(per_leaf) + ["train.seed", "stage", "leaf"], dropna=False)["snr2"].mean().reset_index()
  views, gains = leaf_views(means, sizes), leaf_gains(means, sizes)
  values, expected = {}, []
  for k in _placements(views):
    v, tag = (views, "") if k is None else (views[views[PLACEMENT] == k], f"{k}:")
    for st in ("snr2_ema", "snr2_batch"):
      at = v[v["stage"] == st]
      values[tag + st[5:]] = {float(s): float(x) for s, x in zip(at["train.seed"], at[VIEW],
                                                                  strict=True) if np.isfinite(x)}
    expected.append((tag + "ema", tag + "batch"))
  # each placement's pair on its own seeds, paired (the same runs' two stages), for an effect
  # (and margin) of EFFECT × that placement's batch SNR²
  scale = lambda b: EFFECT.value * float(np.mean(list(values[b].values()) or [math.nan]))
  pairs = [decide.compare(values[a], values[b], (a, b), effect=scale(b), margin=scale(b),
                          lower_is_better=False) for a, b in expected]
  gain_text = "Per-leaf EMA gain (parameter-weighted median, no norm): " + listing(
      ("all runs" if k is None else k, float(g)) for k, g in gains.items())
  fin = read_csv(Path(out_dir) / "finals.csv")
  arm = lambda r: str(r.get(PLACEMENT, "run"))
  warm = lr_search.warm_of(fin, arm, {arm(r) for r in fin.to_dict("records")})
  return pairs_report(values, expected, rule=RULE, paper=PAPER, effect=EFFECT.value,
                      lower_is_better=False, comparisons=pairs,
                      checked=(warm, same_budget(out_dir)),
                      checks=(gain_text, whole_text, sign_text, why_text, declared_text(EFFECT)),
                      numbers_md=sections("Per-leaf SNR² views (`_no_norm`: without the "
                                          "normalization layers):", views, numbers))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C2, ours: the SNR of each sign placement', rank=6,
    stream=0, sweep=sweep, analyze=analyze, figures=figures, report=report,
    needs=("sign_placement",)))
