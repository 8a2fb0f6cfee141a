"""Claim 4: sqrt(B) learning-rate scaling gives near-identical loss-vs-examples curves.

Adam with lr = lr_ref · sqrt(B / B_ref) (`optimizer.lr_scaling=sqrt`) over a ladder of
batch sizes, every run seeing the same number of examples (steps = examples / B; the
warmup is also fixed in examples). Two seeds per batch size show the noise floor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.figures import plot_curves, plt, savefig, style
from experiments.report_md import fmt_num, md_table
from experiments.runs import x_examples
from experiments.sweep import Block, Sweep, base_for, scale_value

NAME = "batch_scaling"
TITLE = "square-root learning-rate scaling with batch size"
CLAIM = ("With lr ∝ sqrt(B), Adam's loss-vs-examples curves nearly coincide for small to "
         "medium batch sizes and separate at large batch sizes.")
KEY = "data.batch_size"


SIZES = {"ci": [4, 16], "cpu": [8, 16, 32, 64, 128, 256],
         "paper": [32, 64, 128, 256, 512, 1024, 2048]}


def _plan(preset: str):
  """(batch sizes, reference batch, examples per run, warmup examples, seeds).

  The reference run is the preset's scale (configs/scale/<preset>.yaml): its batch size,
  its steps and warmup steps times that batch size.
  """
  ref = int(scale_value(preset, "data.batch_size"))
  examples = ref * int(scale_value(preset, "train.steps"))
  warm = ref * int(scale_value(preset, "schedule.warmup_steps"))
  return SIZES[preset], ref, examples, warm, [0] if preset == "ci" else [0, 1]


def sweep(preset: str) -> Sweep:
  sizes, ref, examples, warm, seeds = _plan(preset)
  base = base_for(NAME, preset, **{"optimizer.ref_batch_size": ref})
  blocks = []
  for b in sizes:
    steps = max(examples // b, 1)
    evals = 4 if preset == "ci" else 10
    blocks.append(Block(
        {KEY: [b], "train.seed": seeds},
        fixed={"train.steps": steps, "train.eval_every": max(steps // evals, 1),
               "train.checkpoint_every": max(steps // 4, 1),
               "logging.log_every": max(steps // 40, 1),
               "schedule.warmup_steps": max(warm // b, 1)}))
  return Sweep(base, tuple(blocks), wall_estimate_min={"ci": 0.5, "cpu": 20}.get(preset))


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  out_dir = Path(out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  cols = [c for c in ("train/loss", "eval/loss", "train/lr") if c in t]
  t[["run", KEY, "train.seed", "step", "examples_seen", *cols]].to_csv(
      out_dir / "curves.csv", index=False)
  # Deviation of each batch size's eval curve from the reference batch size's, at the
  # reference's eval points (linear interpolation in examples seen), seed-averaged.
  ev = t.dropna(subset=["eval/loss"]) if "eval/loss" in t else t.iloc[:0]
  mean = ev.groupby([KEY, "examples_seen"])["eval/loss"].mean().reset_index()
  spread = ev.groupby([KEY, "examples_seen"])["eval/loss"].agg(lambda s: s.max() - s.min())
  ref_b = _ref(fin)
  rows = []
  ref = mean[mean[KEY] == ref_b].sort_values("examples_seen")
  for b, g in mean.groupby(KEY):
    g = g.sort_values("examples_seen")
    xs = ref["examples_seen"].values
    keep = (xs >= g["examples_seen"].min()) & (xs <= g["examples_seen"].max())
    xs = xs[keep][1:]  # skip the very first point (initial transient)
    if len(xs) == 0:
      continue
    yi = np.interp(xs, g["examples_seen"], g["eval/loss"])
    dev = yi - ref.set_index("examples_seen").loc[xs, "eval/loss"].values
    f = fin[fin[KEY] == b]
    rows.append({KEY: b, "final_eval_loss": float(f["final_eval_loss"].mean()),
                 "final_eval_loss_std": float(f["final_eval_loss"].std(ddof=1))
                 if len(f) > 1 else 0.0,
                 "max_abs_dev_from_ref": float(np.abs(dev).max()),
                 "mean_dev_from_ref": float(dev.mean()),
                 "seed_spread_ref": float(spread.loc[ref_b].mean()) if ref_b in spread else np.nan,
                 "n_seeds": int(len(f))})
  pd.DataFrame(rows).to_csv(out_dir / "collapse.csv", index=False)


def _ref(fin: pd.DataFrame) -> int:
  sizes = sorted(fin[KEY].unique())
  return int(sizes[len(sizes) // 2 - 1]) if len(sizes) > 2 else int(sizes[0])


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  curves = pd.read_csv(out_dir / "curves.csv")
  col = pd.read_csv(out_dir / "collapse.csv")
  pyplot = plt()
  fig, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
  lab = lambda g: f"B={int(g[KEY])}"
  plot_curves(axes[0], curves, [KEY], "eval/loss", labeler=lab)
  axes[0].set_title("Adam, lr ∝ sqrt(B): eval loss vs examples seen")
  y = curves["eval/loss"].dropna()
  if not y.empty:
    axes[0].set_ylim(y.min() - 0.05, np.percentile(y, 85) + 0.1)
  axes[0].legend(fontsize=7)
  if not col.empty:
    axes[1].errorbar(col[KEY], col["final_eval_loss"], yerr=col["final_eval_loss_std"],
                     fmt="o-", capsize=3)
    axes[1].set_xscale("log", base=2)
  style(axes[1], xlabel="batch size B", ylabel="final eval loss (same examples seen)",
        title="final eval loss vs batch size", grid=True)
  return [savefig(fig, out_dir / "batch_scaling.png")]


def report(out_dir: Path) -> dict:
  col = pd.read_csv(Path(out_dir) / "collapse.csv").sort_values(KEY)
  finals = dict(zip(col[KEY], col["final_eval_loss"], strict=False))
  sizes = list(col[KEY])
  small = sizes[: max(len(sizes) - 2, 1)]
  large = sizes[-2:] if len(sizes) > 2 else []
  # Seed noise of the batch sizes whose curves should coincide (not of the large ones).
  stds = col.loc[col[KEY].isin(small), "final_eval_loss_std"]
  noise = float(np.nanmax(stds)) if len(stds) else np.nan
  tol = max(0.02, 2 * noise) if np.isfinite(noise) else 0.02
  spread_small = max(finals[b] for b in small) - min(finals[b] for b in small)
  worst_large = max((finals[b] - min(finals.values()) for b in large), default=np.nan)
  collapse = spread_small <= tol
  breaks = bool(large) and worst_large > max(tol, 2 * spread_small)
  if len(sizes) < 3:
    verdict = "not tested (too few batch sizes in this preset)"
  elif collapse and breaks:
    verdict = "reproduced"
  elif collapse or breaks:
    verdict = "partly reproduced"
  else:
    verdict = "not reproduced"
  finding = ("Final eval loss after the same number of examples: " + ", ".join(
      f"B={int(b)}: {fmt_num(finals[b])}" for b in sizes)
      + f". Spread over B ≤ {int(small[-1])}: {fmt_num(spread_small)} nats "
      f"(tolerance {fmt_num(tol)} = max(0.02, 2× their largest seed std)); the two "
      f"largest B are worse "
      f"than the best by up to {fmt_num(worst_large)} nats.")
  return {"verdict": verdict, "finding": finding, "claim_row": finding,
          "numbers_md": md_table(col.rename(columns={KEY: "B"}))}
