"""G1 (Gray et al. 2024), cost: per-example gradient norms of every layer at a small cost, of
the normalization layers at none. The statistics benchmark restricted to per-example norms
(`overhead`); bounds: all layers 1 + 1/3 (one extra contraction), norm layers 1.01 (< 1 % of
the parameters).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import overhead
from pergrad import bounds as timing
from pergrad.analysis.markdown import md_table
from pergrad.analysis.plots import plt, savefig
from pergrad.analysis.report import not_measured
from pergrad.analysis.rules import (
  FAILS,
  NOT_REPRODUCED,
  UNDETERMINED,
  quartiles,
)
from pergrad.analysis.runs import read_csv, write_csv
from pergrad.analysis.verdict import gated
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register

NAME = "norm_cost"
TITLE = "the cost of per-example gradient norms (all layers, normalization layers only)"
CLAIM = ("Per-example gradient norms of every layer can be computed simultaneously with the "
         "weight gradient at a small FLOP cost, and those of the normalization layers at no "
         "throughput cost (Gray et al., arXiv 2411.00999).")
PAPER = "norm layers only: no throughput cost; all layers: small FLOP cost"
BENCH = {k: {**v, "stat_sets": ("norms",), "layout_first": False} for k, v in {
    "ci": {"presets": ("micro",), "batch_sizes": (4,), "reps": 3},
    "cpu": {"presets": ("tiny", "medium"), "batch_sizes": (8, 32), "medium_batch_sizes": (8,),
            "reps": 11},
    "paper": {"presets": ("small", "paper"), "batch_sizes": (32, 128), "reps": 15}}.items()}
BOUNDS = (("surgery/norms", "all layers", overhead.flop_bound("norms")),
          ("surgery/norms@norm", "normalization layers only", 1.01))
EFFECT = declared(NAME, "effect")  # configs/experiment/norm_cost.yaml (capped at bound − 1)
REP_CAP = declared(NAME, "rep_cap")
RULE = (f"All-layer norms within {BOUNDS[0][2]:.3g}× and normalization-layer norms within "
        f"{BOUNDS[1][2]:g}× the fastest plain step in FLOPs and time; per shape, {timing.BOUND}; "
        "the median shape's verdict, and FLOPs' median, over shapes: reproduced if every "
        "bound holds, not reproduced if one fails, partly reproduced if one holds (a bound not "
        "measured holds nothing), else undetermined: not separable. " + overhead.REPS)
describe_setup = functools.partial(overhead.describe_setup, benches=BENCH)


def paired_rows(df: pd.DataFrame) -> pd.DataFrame:
  """One row per variant and rep: its paired time ratio (paired.csv)."""
  return pd.DataFrame([
      {"preset": r["preset"], "B": r["B"], "variant": f"{r['backend']}/{r['stats']}",
       "baseline": r["baseline"], "rep": i, "time_ratio": x, "flops_ratio": r["flops_ratio"],
       "peak_ratio": r["peak_ratio"]}
      for r in df.to_dict("records") for i, x in enumerate(json.loads(str(r["time_ratios"])))])


def analyze(runs, out_dir):
  write_csv(overhead.bench_table(runs, out_dir), Path(out_dir) / "norm_cost.csv")
  df = read_csv(Path(out_dir) / "norm_cost.csv")  # the time ratios as the CSV holds them
  write_csv(paired_rows(df), Path(out_dir) / "paired.csv")


def summary(pairs: pd.DataFrame) -> pd.DataFrame:
  """Per shape and variant: FLOP ratio, the paired time ratios' median and quartiles, peak."""
  q = lambda i: ("time_ratio", lambda x: float(quartiles(x)[i]))
  return pairs.groupby(["preset", "B", "variant"], sort=False).agg(
      baseline=("baseline", "first"), flops_ratio=("flops_ratio", "first"),
      time_median=("time_ratio", "median"), time_q25=q(0), time_q75=q(1),
      time_ratios=("time_ratio", lambda x: json.dumps([float(v) for v in x])),
      peak_ratio=("peak_ratio", "first"), reps=("time_ratio", "size")).reset_index()


def figures(out_dir):
  pairs = read_csv(Path(out_dir) / "paired.csv")
  fig, ax = plt().subplots(figsize=(9, 4.5))
  groups = list(pairs.groupby(["preset", "B", "variant"], sort=False))
  ax.boxplot([g["time_ratio"] for _, g in groups], orientation="horizontal")
  ax.set_yticks(range(1, len(groups) + 1), [f"{p} B={b} {v}" for (p, b, v), _ in groups],
                fontsize=7)
  for *_, limit in BOUNDS:
    ax.axvline(limit, color="gray", ls=":", lw=0.8)
  ax.set_xlabel("time / fastest plain step (paired per rep)")
  return [savefig(fig, Path(out_dir) / "norm_cost.png")]


def measured(pairs: pd.DataFrame, crit: float | None = None) -> tuple[pd.DataFrame, dict]:
  """(`summary` of the paired reps; {bound: `overhead.judged` at `crit`})."""
  s = summary(pairs)
  t = s.rename(columns={"time_median": "time_ratio", "time_q25": "time_ratio_q25",
                        "time_q75": "time_ratio_q75"})
  t["backend"] = t["variant"].str.split("/").str[0]
  return s, {what: overhead.judged(t, t[t["variant"] == v], limit, crit=crit)
             for v, what, limit in BOUNDS}


def is_open(df: pd.DataFrame, crit: float) -> bool:
  """A measured time bound undetermined at the look of critical t `crit` (`overhead.launch`)."""
  return any(m["time_outcome"] == UNDETERMINED for m in measured(paired_rows(df), crit)[1].values()
             if np.isfinite(m["flops"]))


launch = functools.partial(overhead.launch, benches=BENCH, is_open=is_open, cap=REP_CAP)


def report(out_dir):
  des, crit, reps_text, _ = overhead.reading(read_csv(Path(out_dir) / "norm_cost.csv"))
  s, ms = measured(read_csv(Path(out_dir) / "paired.csv"), crit)
  done = {what: m for what, m in ms.items() if np.isfinite(m["flops"])}
  checks = tuple(overhead.text(w, m) if w in done else f"{w}: not measured" for w, m in ms.items())
  if not done:
    return not_measured(RULE, "", paper=PAPER, checks=checks, numbers_md=md_table(s))
  outs = {what: overhead.side(m) for what, m in done.items()}
  cals = {what: overhead.time_calibration(m, int(s["reps"].median()), EFFECT.value, des)
          for what, m in done.items()}  # each bound's own (a free variant at 1.01's)
  verdict = NOT_REPRODUCED if FAILS in outs.values() else overhead.of_sides(
      outs, missing=[w for w in ms if w not in done])
  return gated(verdict, cals, checks=(*checks, reps_text, declared_text(EFFECT, REP_CAP)),
               decided=list(cals),  # an undetermined bound reads partly reproduced
               rule=RULE, paper=PAPER, numbers_md=md_table(s),
               ours=", ".join(f"{w}: {o}" for w, o in outs.items()))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row="G1. Every layer's per-example norms, cheaply",
    papers_test=True, rank=8, stream=1, launch=launch, analyze=analyze, figures=figures,
    report=report, describe_setup=describe_setup))
