"""Claim 3, mechanism: which term dominates Adam's second moment over training.

Per coordinate E[ḡ²] = μ² + σ²/B (Adam's v) and E[mean g_i²] = μ² + σ² (MicroAdam's v).
`pergrad.optim.diagnostics` logs, per leaf and over all coordinates, ratios of sums with the
signed μ̂² = ḡ² − σ̂²/B: snr2_batch = Σμ̂²/Σ(σ̂²/B), snr2_example = Σμ̂²/Σσ̂², and the shares of
μ̂², σ̂²/B, σ̂² in Adam's debiased v̂.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import leafwise
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.decide import READING, VERDICT
from pergrad.analysis.leafwise import is_norm_leaf
from pergrad.analysis.markdown import listing, sections
from pergrad.analysis.plots import plot_curves, plt, savefig, style
from pergrad.analysis.report import not_measured
from pergrad.analysis.runs import DONE, fmt, from_table, read_csv, write_csv, x_examples
from pergrad.analysis.verdict import pairs_report
from pergrad.sweep import SEEDS, Block, Sweep, base_for, family, scale_value, with_warmup
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, Inputs, Rung, register

NAME = "moments"
TITLE = "μ², σ²/B and σ² in Adam's second moment over training"
CLAIM = ("Adam's preconditioner v ≈ μ² + σ²/B: the paper's reading is that good "
         "preconditioning is dominated by μ² rather than by the variance σ².")
RATIOS = ("snr2_batch", "snr2_example")  # opt/<leaf>/<name>
MAGNITUDES = ("gbar2_mean", "mu2_mean", "var_mean")  # stats/<leaf>/<name>, per leaf only
SHARES = ("share_mu2", "share_var_b", "share_var")  # opt/<leaf>/<name>
IDS = ["run", "train.seed", "step", "examples_seen", "B"]  # B: NaN at the scale's batch size
WINDOWS = ("first", "second")  # halves of each run's logged steps, both declared in advance
VIEWS = {"all leaves": "ratio_of_sums", "no norm": "ratio_of_sums_no_norm"}
RULE = ("Per seed and cell (window: the first and the second half of the logged steps, both "
        "declared in advance; B: the scale's and 128; with and without the normalization "
        "layers), r = Σμ̂²/Σ(σ̂²/B) over the cell's leaves and steps (a ratio of sums). In each "
        f"cell, r against 1 (higher: μ² dominates Adam's v), {READING}; {VERDICT} "
        "(each cell's μ² expected to win). The parameter-weighted medians of the leaves' r are "
        "reported beside.")
PAPER = "v ≈ μ² + σ²/B dominated by μ² (qualitative)"
EFFECT = declared(NAME, "effect")  # r − 1, configs/experiment/moments.yaml
WINDOWS_D = declared(NAME, "windows")  # the halves, stated before the runs
assert WINDOWS_D.value == len(WINDOWS), "configs/experiment/moments.yaml: declared.windows"


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Adam at the lr the preconditioner search chose (ci: the config's), statistics logged."""
  fam = family(preset)  # a ladder rung: its family's grid on its own model and steps
  log_every = {"ci": 5, "cpu": 10, "paper": 100}[fam]
  base = base_for(NAME, preset, **{"stats.log_every": log_every},
                  **lr_search.adam_lr(inputs, preset))
  sizes = [None] if fam == "ci" else [None, 128]  # the scale's B, and B = 128 (r grows with B)
  examples = int(scale_value(preset, "data.batch_size")) * int(scale_value(preset, "train.steps"))
  blocks = tuple(Block({"optimizer.variant": ["adam"], "train.seed": list(SEEDS[fam]),
                        **({"data.batch_size": [b]} if b else {})},
                       fixed={"train.steps": examples // b} if b else {}) for b in sizes)
  # cpu: 3 runs at B = 32 (400 steps) + 3 at B = 128 (100 steps: the same examples)
  return Sweep(base, blocks, wall_estimate_min={"ci": 0.3, "cpu": 6}.get(preset))


def analyze(runs, out_dir: Path) -> None:
  """moments_per_leaf.csv, moments_all.csv: long tables IDS, [leaf,] quantity, value."""
  out_dir, table, fin = Path(out_dir), runs.table, runs.finals
  t = table.assign(examples_seen=x_examples(table), B=table.get("data.batch_size", np.nan))
  names = {**dict.fromkeys(MAGNITUDES, "stats"), **dict.fromkeys((*RATIOS, *SHARES), "opt")}
  long = leafwise.long_stats(t, IDS, names, "quantity", "value")[[*IDS, "value", "quantity",
                                                                    "leaf"]]
  whole = long["leaf"].isin(leafwise.WHOLE)
  write_csv(long[~whole], out_dir / "moments_per_leaf.csv")
  write_csv(long[whole].drop(columns="leaf"), out_dir / "moments_all.csv")
  leafwise.write_sizes(table, out_dir)
  write_csv(with_warmup(fin, runs.sweep_dir), out_dir / "finals.csv")


def at_ref(df: pd.DataFrame) -> pd.DataFrame:
  """The rows of the runs at the scale's batch size (the verdict's)."""
  return df[df["B"].isna()] if "B" in df else df


def per_seed(all_df: pd.DataFrame) -> pd.DataFrame:
  """Seed x quantity: mean over the second half of the logged steps (whole model)."""
  return leafwise.second_half(all_df).groupby(["train.seed", "quantity"])["value"].mean(
  ).unstack("quantity")


def sample_count(all_df: pd.DataFrame) -> float:
  """n of σ̂²/n (B examples): snr2_batch / snr2_example, an identity of the estimators."""
  w = all_df.pivot_table(index=["run", "step"], columns="quantity", values="value")
  n = (w["snr2_batch"] / w["snr2_example"]).replace([np.inf, -np.inf], np.nan).dropna()
  if n.empty:
    raise ValueError("moments: no step with both snr2_batch and snr2_example; re-run")
  return float(n.median())


def at_size(df: pd.DataFrame, b) -> pd.DataFrame:
  """The rows of the runs at batch size `b` (None: the scale's, `at_ref`)."""
  return at_ref(df) if b is None else df[df["B"] == b] if "B" in df else df[:0]


def leaf_views(out_dir: Path, window: str = "second", b=None) -> pd.DataFrame | None:
  """Per seed `leafwise.leaf_aggregates` of num = Σμ̂², den = Σσ̂²/n per leaf (the means over the
  `window` half of mu2_mean · D and var_mean · D / n) of the runs at batch size `b` (None: the
  scale's); None without them or leaf_params.csv."""
  sizes = leafwise.read_sizes(out_dir)
  per_leaf = read_csv(Path(out_dir) / "moments_per_leaf.csv")
  if sizes is None or per_leaf.empty:
    return None
  per_leaf = at_size(per_leaf, b)
  if not {"mu2_mean", "var_mean"} <= set(per_leaf["quantity"]):
    return None
  n = sample_count(at_size(read_csv(Path(out_dir) / "moments_all.csv"), b))
  half = leafwise.first_half if window == "first" else leafwise.second_half
  late = half(per_leaf[per_leaf["quantity"].isin(("mu2_mean", "var_mean"))])
  p = late.pivot_table(index=["train.seed", "leaf"], columns="quantity", values="value",
                       aggfunc="mean").reset_index()
  size = p["leaf"].map(sizes).astype(float)
  sums = p.assign(num=p["mu2_mean"] * size, den=p["var_mean"] * size / n)
  return leafwise.per_seed_views(sums[["train.seed", "leaf", "num", "den"]], sizes, ["train.seed"])


def figures(out_dir: Path) -> list[Path]:
  """moments_over_training.png: the whole-model ratios and shares, and each leaf's ratio."""
  out_dir = Path(out_dir)
  all_df = read_csv(out_dir / "moments_all.csv")
  leaf = read_csv(out_dir / "moments_per_leaf.csv").query("quantity == 'snr2_batch'")
  fig, axes = plt().subplots(1, 3, figsize=(16, 4.2))
  labels = {"snr2_batch": "Σμ̂² / Σσ̂²/B (Adam)", "snr2_example": "Σμ̂² / Σσ̂² (MicroAdam)"}
  panels = ((RATIOS, "ratio of sums over all coordinates",
             "μ² over the noise term of v (> 1: μ²-dominated)"),
            (SHARES, "Σ term / Σ v̂ (all coordinates)", "shares of μ̂², σ̂²/B, σ̂² in Adam's v̂"),
            ((), "Σμ̂² / Σσ̂²/B within the leaf", "per leaf, second half (orange: norm layers)"))
  if not leaf.empty:
    bars = leafwise.second_half(leaf).groupby("leaf")["value"].mean()
    axes[2].bar(range(len(bars)), bars.values,
                color=["C1" if is_norm_leaf(k) else "C0" for k in bars.index])
    axes[2].set_xticks(range(len(bars)), [lbl[-28:] for lbl in bars.index], rotation=70,
                       fontsize=6, ha="right", rotation_mode="anchor")
  for ax, (names, ylabel, title) in zip(axes, panels, strict=True):
    if all_df["quantity"].isin(names).any():
      plot_curves(ax, all_df[all_df["quantity"].isin(names)], ["quantity"], "value",
                  labeler=lambda g: labels.get(g["quantity"], g["quantity"]))
    if names != SHARES:  # a ratio: 1 where μ² equals the noise term
      ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-2)
    style(ax, ylabel=ylabel, title=title, legend=8)
  return [savefig(fig, out_dir / "moments_over_training.png")]


def report(out_dir: Path):
  raw = read_csv(Path(out_dir) / "moments_all.csv")
  all_df, big = at_ref(raw), raw[raw["B"].notna()] if "B" in raw else raw[:0]
  if all_df.empty or "snr2_batch" not in set(all_df["quantity"]):
    return not_measured(RULE, "μ̂²/(σ̂²/B) was not logged (opt/all/snr2_batch)", NAME)
  seeds = per_seed(all_df)
  whole = "Whole model, ratios of sums, mean over seeds: " + listing(seeds.mean().items())
  if len(big):
    whole += f"; at B = 128, snr2_batch per seed {per_seed(big)['snr2_batch'].round(3).tolist()}"
  numbers = sections("Per seed, whole model:", seeds.reset_index())
  fin = read_csv(Path(out_dir) / "finals.csv")
  unfinished = sorted(fin.loc[~fin["status"].isin(DONE), "run"]) if "status" in fin else []
  if unfinished:  # its halves would be of the steps it logged, not of its schedule
    return not_measured(RULE, f"runs not finished: {unfinished}", NAME, checks=(whole,),
                        numbers_md=numbers)
  views = leaf_views(out_dir)
  if views is None:
    return not_measured(RULE, "the per-leaf μ̂², σ̂² or the leaves' parameter counts "
                        "(leaf_params.csv) are missing", NAME, checks=(whole,), numbers_md=numbers)
  values, expected, rows = {}, [], []
  sizes = [None, *sorted(int(b) for b in big["B"].unique())] if len(big) else [None]
  for b in sizes:
    for w in WINDOWS:
      v = leaf_views(out_dir, w, b)
      for name, col in ([] if v is None else VIEWS.items()):
        cell = f"{w} half, B={'ref' if b is None else b}, {name}"
        r = {float(s): float(x) for s, x in zip(v["train.seed"], v[col], strict=True)
             if np.isfinite(x)}
        values[f"μ² ({cell})"], values[f"1 ({cell})"] = r, dict.fromkeys(r, 1.0)
        expected.append((f"μ² ({cell})", f"1 ({cell})"))
        rows.append({"window": w, "B": "ref" if b is None else b, "view": name,
                     "r_mean": float(np.mean(list(r.values()))) if r else np.nan,
                     "n_seeds": len(r),
                     "weighted_median": float(v["weighted_median" + (
                         "_no_norm" if col.endswith("_no_norm") else "")].mean())})
  m = views.mean(numeric_only=True)
  shares = listing((k, m[k]) for k in ("ratio_of_sums", "ratio_of_sums_no_norm",
                                         "norm_share_num", "norm_share_params"))
  size = lambda r: f"B={fmt(from_table(r.get('data.batch_size')) or 'ref')}"
  warm = lr_search.warm_of(fin, size, {size(r) for r in fin.to_dict("records")})
  return pairs_report(values, expected, rule=RULE, paper=PAPER, effect=EFFECT.value,
                      lower_is_better=False, checked=(warm, same_budget(out_dir)),
                      checks=(f"Second half at the scale's B, per leaf, mean over seeds: "
                              f"{shares}", whole, declared_text(EFFECT, WINDOWS_D)),
                      numbers_md=sections("r per cell (ratio of sums, mean over seeds; the "
                                          "leaves' parameter-weighted median beside):",
                                          pd.DataFrame(rows), views, numbers))


def ladder_value(out_dir: Path) -> float:
  """r = Σμ̂²/Σ(σ̂²/B), second half, the scale's B, no norm layers (NaN without runs)."""
  v = leaf_views(Path(out_dir), "second")
  return float(v["ratio_of_sums_no_norm"].mean()) if v is not None else np.nan


def rung_runs(b: int, steps: int, fam: str) -> list[tuple[int, int]]:
  """3 seeds at the scale's B, 3 at B = 128."""
  return [(b, steps)] * 3 + [(128, b * steps // 128)] * 3

RUNG = Rung("C3c", "C3c: r = Σμ̂²/Σ(σ̂²/B) (> 1: μ² dominates)", 1.0, ladder_value, rung_runs,
            one_sided=True)
EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row="C3c, ours: μ² against σ²/B in Adam's v", rank=7,
    stream=1, sweep=sweep, analyze=analyze, figures=figures, report=report,
    needs=("preconditioner",), rung=RUNG))
