"""G1 (Gray et al. 2024), cost: per-example gradient norms of every layer "simultaneously"
with the weight gradient, at a small cost; of the normalization layers alone, at none.

Runs the statistics benchmark restricted to per-example norms (`pergrad.bench.stats.run`,
stat set "norms"). Per shape (preset × batch size) the baseline is the fastest plain step
of `pergrad.bench.baselines` (value_and_grad, surgery asked for the mean alone, the
simultaneous method's weight-gradient contraction without per-example axes), and each
variant is timed right beside it, rep by rep:
  surgery           all layers; dense layers by the simultaneous method where it pays
                    (`pergrad.stats.surgery.dense.simultaneous_is_used`), Gram norm elsewhere
  surgery-separate  all layers; autodiff's weight gradient plus a separate per-example
                    contraction (or Gram norm)
  norms@norm        normalization layers only (`StatsRequest.layers=("norm",)`)
  vmap, micro_grad  all layers by per-example gradients (references)
  the plain candidates themselves (the baseline's own row: the noise of a null pair)
and reports XLA FLOPs (over the least of the plain candidates'), paired time ratios and
peak memory. No training runs.

Verdict (`RULE`): FLOP bounds are exact; a time bound is judged on the quartiles of the
paired per-rep ratios (`pergrad.bench.paired.judge`): holds when q75 is within it, fails
when q25 is above it, within noise when they straddle it. Over the benchmark's shapes the
medians of each statistic are taken.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import overhead
from experiments.figures import plt, savefig
from experiments.record import ROWS, Experiment, Report, register
from experiments.report_md import fmt_num, md_table
from pergrad.bench.paired import judge

NAME = "norm_cost"
TITLE = "the cost of per-example gradient norms (all layers, normalization layers only)"
CLAIM = ("Per-example gradient norms of every layer can be computed simultaneously with the "
         "weight gradient at a small FLOP cost, and those of the normalization layers at no "
         "throughput cost (Gray et al., arXiv 2411.00999).")
BENCH = {
    "ci": {"presets": ("micro",), "batch_sizes": (4,), "reps": 3, "stat_sets": ("norms",),
           "layout_first": False},
    "cpu": {"presets": ("tiny", "medium"), "batch_sizes": (8, 32), "medium_batch_sizes": (8,),
            "reps": 11, "stat_sets": ("norms",), "layout_first": False},
    "paper": {"presets": ("small", "paper"), "batch_sizes": (32, 128), "reps": 15,
              "stat_sets": ("norms",), "layout_first": False},
}
# (variant, what, bound on the time ratio, bound on the FLOP ratio)
BOUNDS = (
    ("surgery/norms", "all layers", 1.03, 1.05),
    ("surgery/norms@norm", "normalization layers only", 1.01, 1.01),
)
RULE = ("All-layer per-example norms (surgery) must cost ≤ 1.05x the FLOPs and ≤ 1.03x the "
        "time of the fastest plain step computing the same gradient, normalization-layer "
        "norms alone ≤ 1.01x the FLOPs and the time. FLOPs (XLA's count, exact) are the primary "
        "ratio; a time bound holds when the quartiles of the paired per-rep ratios (variant / "
        "plain step timed beside it) lie within it (q75 ≤ bound), fails when they lie above "
        "(q25 > bound), and is within noise when they straddle it. Medians over the "
        "benchmark's shapes: reproduced if every bound holds, not reproduced if one fails, "
        "partly reproduced otherwise.")
SETUP_MD = overhead.SETUP_MD


def launch(preset: str, sweep_dir: Path, *, dry_run: bool = False, echo=print):
  return overhead.launch(preset, sweep_dir, dry_run=dry_run, echo=echo, bench=BENCH[preset])


def describe_setup(preset: str) -> str:
  return overhead.describe_setup(preset, BENCH[preset])


def variant(row: dict) -> str:
  """backend/stats, with /granularity unless per example ("surgery/norms@norm")."""
  gran = row.get("granularity", "example")
  return f"{row['backend']}/{row['stats']}" + ("" if gran == "example" else f"/{gran}")


def paired(doc: dict) -> pd.DataFrame:
  """One row per (shape, variant, rep): the paired time ratio to that shape's baseline
  (`time_ratios` of the benchmark's rows), with the FLOP and peak-memory ratios."""
  out = []
  for r in doc["rows"]:
    for i, ratio in enumerate(r["time_ratios"]):
      out.append({"preset": r["preset"], "B": r["B"], "variant": variant(r),
                  "baseline": r["baseline"], "rep": i, "time_ratio": ratio,
                  "flops_ratio": r["flops_ratio"], "peak_ratio": r["peak_ratio"]})
  return pd.DataFrame(out)


def analyze(sweep_dir: Path, out_dir: Path) -> None:
  doc = json.loads((Path(sweep_dir) / "bench.json").read_text())
  (Path(out_dir) / "bench.json").write_text(json.dumps(doc, indent=1))
  overhead.records(doc).to_csv(Path(out_dir) / "norm_cost.csv", index=False)
  paired(doc).to_csv(Path(out_dir) / "paired.csv", index=False)


def summary(pairs: pd.DataFrame) -> pd.DataFrame:
  """Per shape and variant: FLOP ratio, median and quartiles of the paired time ratios,
  peak-memory ratio, and the baseline they are ratios to."""
  g = pairs.groupby(["preset", "B", "variant"], sort=False)
  return g.agg(baseline=("baseline", "first"), flops_ratio=("flops_ratio", "first"),
               time_median=("time_ratio", "median"),
               time_q25=("time_ratio", lambda x: float(np.percentile(x, 25))),
               time_q75=("time_ratio", lambda x: float(np.percentile(x, 75))),
               peak_ratio=("peak_ratio", "first"), reps=("rep", "count")).reset_index()


def decide(outcomes: list[str]) -> str:
  if not outcomes:
    return "not measured"
  if any(o == "fails" for o in outcomes):
    return "not reproduced"
  return "reproduced" if all(o == "holds" for o in outcomes) else "partly reproduced"


def figures(out_dir: Path) -> list[Path]:
  pairs = pd.read_csv(Path(out_dir) / "paired.csv")
  pyplot = plt()
  fig, ax = pyplot.subplots(figsize=(9, 4.5))
  labels = []
  for i, ((preset, B, var), g) in enumerate(pairs.groupby(["preset", "B", "variant"],
                                                            sort=False)):
    ax.boxplot(g["time_ratio"], positions=[i], widths=0.6, orientation="horizontal")
    labels.append(f"{preset} B={B} {var}")
  ax.set_yticks(range(len(labels)))
  ax.set_yticklabels(labels, fontsize=7)
  ax.axvline(1.0, color="k", lw=0.8)
  for _, _, bound, _ in BOUNDS:
    ax.axvline(bound, color="gray", ls=":", lw=0.8)
  ax.set_xlabel("time / fastest plain step (paired per rep)")
  ax.set_title("per-example gradient norms: time ratio per rep")
  return [savefig(fig, Path(out_dir) / "norm_cost.png")]


def report(out_dir: Path) -> Report:
  pairs = pd.read_csv(Path(out_dir) / "paired.csv")
  s = summary(pairs)
  outcomes, parts = [], []
  for variant, what, t_bound, f_bound in BOUNDS:
    rows = s[s["variant"] == variant]
    if rows.empty:
      parts.append(f"{what}: not measured")
      continue
    text = f"{what}:"
    if f_bound is not None:
      f = float(rows["flops_ratio"].median())
      fo = "holds" if f <= f_bound else "fails"
      outcomes.append(fo)
      text += f" FLOPs {fmt_num(f)}x vs ≤ {f_bound:g}: {fo};"
    med, q25, q75 = (float(rows[c].median()) for c in ("time_median", "time_q25", "time_q75"))
    o = judge(q25, q75, t_bound)
    outcomes.append(o)
    text += (f" time {fmt_num(med)}x [q25 {fmt_num(q25)}, q75 {fmt_num(q75)}] (medians over "
             f"{len(rows)} shapes of the paired per-rep ratios) vs ≤ {t_bound:g}: {o}")
    parts.append(text)
  sep = s[s["variant"] == "surgery-separate/norms"]
  if len(sep):
    parts.append(f"weight gradient and norms computed separately (surgery-separate): FLOPs "
                 f"{fmt_num(float(sep['flops_ratio'].median()))}x, time "
                 f"{fmt_num(float(sep['time_median'].median()))}x")
  base = ", ".join(f"{p} B={b}: {name}" for (p, b), name in
                   s.groupby(["preset", "B"], sort=False)["baseline"].first().items())
  measured = "; ".join(parts) + (
      f" (ratios to the fastest plain step computing the same gradient, timed beside each "
      f"variant in the same process; baseline per shape: {base}).")
  return Report(verdict=decide(outcomes), rule=RULE, finding=f"Rule: {RULE} {measured}",
                claim_row=measured, setup_md=SETUP_MD,
                numbers_md="FLOP ratios, paired time ratios per shape and variant (median and "
                "quartiles over reps) and peak-memory ratios, all to the baseline named:\n\n"
                + md_table(s))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["G1"], launch=launch, analyze=analyze,
    figures=figures, report=report, describe_setup=describe_setup))
