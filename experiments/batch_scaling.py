"""Claim 4: with lr tuned at B_ref and scaled by √(B / B_ref), Adam's loss-vs-examples curves
collapse for small to medium B and separate at large B; √ does this better than linear or none.

Every run sees the same examples (≥ MIN_STEPS steps at the largest B), warmup and evals in
examples (the warmup long enough for `guards.MIN_WARMUP` steps at the largest B); B_ref runs
at Adam's tuned lr. The `sqrt_2x` arm (the largest B at twice the examples, where the curves
separate) tells "large B has too few steps in this budget" (its gap closes with more examples)
from "√ scaling breaks at large B" (it does not). lr_exponent fits lr*(B) ∝ B^α beside.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import calibrate, decide, guards, rules
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.markdown import md_table
from pergrad.analysis.plots import plot_curves, plt, savefig, style
from pergrad.analysis.runs import read_csv, write_csv
from pergrad.analysis.verdict import calibration_of, gated, key, outcomes, pairs_md
from pergrad.sweep import WARMUP, Block, Sweep, base_for, scale_value, with_warmup
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register

NAME = "batch_scaling"
TITLE = "square-root learning-rate scaling with batch size"
CLAIM = ("With lr tuned at a reference batch size and scaled by sqrt(B / B_ref), Adam's "
         "loss-vs-examples curves nearly coincide for small to medium batch sizes and separate "
         "at large ones; sqrt scaling does this better than linear or no scaling.")
PAPER = "curves coincide for small/medium B under √ scaling, separate at large B (qualitative)"
KEY, SCALING, SEED = "data.batch_size", "optimizer.lr_scaling", "train.seed"
REF = "optimizer.ref_batch_size"
SCALINGS = ("sqrt", "linear", "none")
LONG, LONG_FACTOR = "sqrt_2x", 2  # √ scaling at twice the examples (the largest B only)
SIZES = {"ci": [8, 32], "cpu": [4, 8, 16, 64, 128],  # cpu: spans B_simple (its report's guard)
         "paper": [32, 64, 128, 256, 512, 1024, 2048]}
LONG_SIZES = {"ci": [], "cpu": [128], "paper": [2048]}
SEEDS = {"ci": [0], "cpu": [0, 1, 2, 3, 4], "paper": [0, 1, 2, 3, 4]}
MARGIN_SEEDS = {"ci": [], "cpu": [100, 101, 102], "paper": [100, 101, 102]}  # B_ref only
CONTRAST_SEEDS = {"ci": [], "cpu": [0, 1, 2], "paper": [0, 1, 2]}
MIN_STEPS, N_EVALS = {"ci": 4, "cpu": 100, "paper": 200}, {"ci": 4, "cpu": 25, "paper": 40}
MIN_MARGIN_D, FALLBACK_D = declared(NAME, "min_margin"), declared(NAME, "fallback_margin")
MIN_MARGIN, MARGIN_SPREADS, FALLBACK_MARGIN = MIN_MARGIN_D.value, 3.0, FALLBACK_D.value
BELOW, ABOVE = declared(NAME, "below"), declared(NAME, "above")  # the regime, vs B_simple
B_SIMPLE = "gns/total/b_simple"  # tracked in B_ref's runs (stats.gns)
COLLAPSES, BREAKS, UNDETERMINED = "collapses", "breaks", "undetermined"
RULE = (f"Over the second half of training's eval points, per seed, the average of B's curve "
        "minus B_ref's (the same seeds: paired): B collapses onto B_ref when the 90% interval "
        "of the mean gap lies within ±margin (TOST) and no point's seed-mean gap exceeds "
        f"{rules.GUARD:g} margins; it breaks when the 95% interval lies beyond the margin or a "
        "seed diverged; else (and where a run stopped before an eval point) undetermined. The "
        "margin is fixed before the "
        f"comparison from B_ref's margin seeds: {MARGIN_SPREADS:g} × the spread of their curve "
        f"averages, at least {MIN_MARGIN:g} nats ({FALLBACK_MARGIN:g} without margin seeds). "
        "Reproduced when √ collapses at every B below its smallest break, at some B above B_ref, "
        "some B breaks, and there √ beats linear and none (mean |gap| per seed, "
        f"{decide.READING}); partly reproduced when √ collapses at some B but not all of that "
        "holds (no break seen, a B below the break left open, or a contrast not beaten); not "
        "reproduced when another scaling beats √ at the break, or √ was decided at every B and "
        "collapses at none; undetermined (not separable) when √ collapses at no B and some B "
        "is left open, or nothing was decided.")


def budget(preset: str) -> tuple[int, int, int, tuple]:
  """(B_ref, examples per run, examples between evals, sizes)."""
  ref = int(scale_value(preset, "data.batch_size"))
  sizes = tuple(sorted(set(SIZES[preset]) | {ref}))
  ex = max(ref * int(scale_value(preset, "train.steps")), MIN_STEPS[preset] * max(sizes))
  multiple = N_EVALS[preset] * max(sizes)  # whole evaluation intervals of the largest B
  ex = math.ceil(ex / multiple) * multiple
  return ref, ex, ex // N_EVALS[preset], sizes


def sweep(preset: str, inputs=None) -> Sweep:
  ref, ex, every, sizes = budget(preset)
  warm = max(ref * int(scale_value(preset, "schedule.warmup_steps")),  # in examples, the same
             guards.MIN_WARMUP * max(sizes) if preset != "ci" else 0)  # for every B

  def block(b, scalings, seeds, examples=ex, **more):
    steps = examples // b
    fixed = {"train.steps": steps, "train.eval_every": every // b,
             "logging.log_every": max(steps // 40, 1), "train.checkpoint_every": max(steps // 4, 1),
             "schedule.warmup_steps": max(warm // b, 1), **more}
    grid = {KEY: [b], REF: [ref], SCALING: list(scalings), SEED: list(seeds)}
    if examples != ex:  # the long arm: train.steps in the grid gives it its own run directories
      grid["train.steps"] = [fixed.pop("train.steps")]
    return Block(grid, fixed=fixed)

  # B_ref's runs track B_simple (stats.gns) for the regime guard
  blocks = [block(ref, ["sqrt"], SEEDS[preset] + MARGIN_SEEDS[preset], **{"stats.gns": True})]
  for b in (b for b in sizes if b != ref):
    blocks.append(block(b, ["sqrt"], SEEDS[preset]))
    if CONTRAST_SEEDS[preset]:  # below B_ref (never where √ breaks, the pair judged): 2 seeds
      blocks.append(block(b, SCALINGS[1:], CONTRAST_SEEDS[preset][:2 if b < ref else None]))
  blocks += [block(b, ["sqrt"], SEEDS[preset][:3], LONG_FACTOR * ex)  # beside, not judged
             for b in LONG_SIZES[preset]]
  # cpu: 57 runs of 12,800 examples + 3 of 25,600 at B = 128
  return Sweep(base_for(NAME, preset, **lr_search.adam_lr(inputs, preset)), tuple(blocks),
               wall_estimate_min={"ci": 1.0, "cpu": 50}.get(preset))


def analyze(runs, out_dir):
  t, fin = runs.table.copy(), with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, Path(out_dir) / "finals.csv")
  t["examples_seen"] = t["step"] * t[KEY]
  t["diverged"] = t["run"].map(dict(zip(fin["run"], fin["diverged"], strict=False))).fillna(False)
  if "train.steps" in t:  # only the long arm has it in its run name
    t.loc[t["train.steps"].notna(), SCALING] = LONG
  t.insert(1, "ref", int(t[REF].dropna().iloc[0]))
  cols = ["run", "ref", KEY, SCALING, SEED, "step", "examples_seen", "diverged", "eval/loss",
          "train/lr", B_SIMPLE]
  write_csv(t[[c for c in cols if c in t]], Path(out_dir) / "curves.csv")


def _seed_curves(g: pd.DataFrame, xs) -> np.ndarray:
  """seeds × len(xs) eval losses (a diverged run +inf everywhere, a point not reached NaN)."""
  out = []
  for _, r in g.groupby(SEED):
    ev = r.dropna(subset=["eval/loss"]).drop_duplicates("examples_seen", keep="last")
    y = ev.set_index("examples_seen")["eval/loss"].reindex(xs).to_numpy(float)
    out.append(np.full(len(xs), np.inf) if bool(r["diverged"].any()) else y)
  return np.array(out).reshape(len(out), len(xs))


def margin(ref_margin: np.ndarray) -> float:
  """MARGIN_SPREADS × the spread of the margin seeds' curve averages (≥ MIN_MARGIN); NaN when
  a margin seed diverged or stopped before a point (its spread is unknown, never the floor)."""
  if len(ref_margin) < 2:
    return FALLBACK_MARGIN
  avg = ref_margin.mean(axis=1)
  if not np.isfinite(avg).all():
    return math.nan
  return max(MIN_MARGIN, MARGIN_SPREADS * float(np.std(avg, ddof=1)))


def spread(y_SxP: np.ndarray) -> float:
  """The std over seeds of their second-half curve averages (NaN: < 2 seeds or a diverged one)."""
  avg = np.nanmean(y_SxP, axis=1) if y_SxP.size else np.array([])
  return float(np.std(avg, ddof=1)) if len(avg) > 1 and np.isfinite(avg).all() else math.nan


def collapse(curves: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, float]:
  """(summary per scaling and B, per-seed mean |gap| to B_ref's seed-mean curve, margin),
  over the second half's eval points (`LONG`, on k× the examples: at k× those, the same
  share of its schedule); B_ref's margin seeds only set the margin (NaN: nothing decided)."""
  ref_b = int(curves["ref"].iloc[0])
  ref = curves[curves[KEY] == ref_b]
  xs = np.array(sorted(x for x in ref.dropna(subset=["eval/loss"])["examples_seen"].unique()
                       if x > ref["examples_seen"].max() / 2))
  split = ref[SEED].isin(MARGIN_SEEDS["cpu"] + MARGIN_SEEDS["paper"])
  m = margin(_seed_curves(ref[split], xs)) if split.any() else FALLBACK_MARGIN
  ref_seeds = sorted(ref[~split][SEED].unique())
  ref_y = _seed_curves(ref[~split], xs)
  m_ref = ref_y.mean(axis=0)
  rows, mis = [], []
  for (sc, b), runs in curves[curves[KEY] != ref_b].groupby([SCALING, KEY], sort=False):
    k = LONG_FACTOR if sc == LONG else 1  # as planned (a run cut short reads its points NaN)
    y = _seed_curves(runs, xs * k)
    seeds = sorted(runs[SEED].unique())
    keep = ~(np.isnan(y).any(axis=0) | np.isnan(ref_y).any(axis=0))
    short = keep.sum() < len(xs) and not np.isinf(y).any()  # a run stopped before a point
    p = decide.compare({float(s): r[keep].mean() for s, r in zip(ref_seeds, ref_y, strict=True)},
                       {float(s): r[keep].mean() for s, r in zip(seeds, y, strict=True)},
                       ("B_ref", f"{sc} at B={int(b)}"), effect=m, margin=m)  # advantage: B − B_ref
    worst = float(np.max(np.abs(y[:, keep].mean(axis=0) - m_ref[keep]))) if keep.any() \
        else math.nan
    diverged = bool(np.isinf(y).any())
    out = (UNDETERMINED if not math.isfinite(m) or short else BREAKS if diverged else
           UNDETERMINED if p.why else COLLAPSES if p.within_margin and worst <= rules.GUARD * m
           else BREAKS if p.lo95 > m or p.hi95 < -m else UNDETERMINED)
    for s, row in zip(seeds, y, strict=False):
      d = np.abs(row - m_ref)
      mis.append({SCALING: sc, KEY: int(b), SEED: int(s),
                  "mean_abs_gap": math.inf if np.isinf(d).any() else float(np.nanmean(d))})
    rows.append({SCALING: sc, KEY: int(b), "n_seeds": p.n, "gap": p.advantage, "lo95": p.lo95,
                 "hi95": p.hi95, "lo": p.lo90, "hi": p.hi90, "sd_paired": p.sd_paired,
                 "max_abs_gap": worst, "outcome": out, "final_eval_loss": float(np.mean(y[:, -1])),
                 "spread": spread(y)})
  rows.append({SCALING: "sqrt", KEY: ref_b, "n_seeds": len(ref_y), "outcome": "reference",
               "spread": spread(ref_y)})
  col = pd.DataFrame(rows)
  col.attrs["margin"] = m
  return col, pd.DataFrame(mis), m


def judge(col: pd.DataFrame, mis: pd.DataFrame) -> tuple[str, dict, list, int | None]:
  """(verdict, {scaling: {outcome: [B]}}, the scalings' pairs at √'s break, that B)."""
  ref_b = int(col.loc[col["outcome"] == "reference", KEY].iloc[0])
  by = {sc: {o: sorted(g.loc[g["outcome"] == o, KEY]) for o in (COLLAPSES, BREAKS, UNDETERMINED)}
        for sc, g in col[col["outcome"] != "reference"].groupby(SCALING, sort=False)}
  sq = by.get("sqrt", {COLLAPSES: [], BREAKS: [], UNDETERMINED: []})
  sizes = sorted(int(b) for b in col[KEY].unique() if int(b) != ref_b)
  at = min(sq[BREAKS]) if sq[BREAKS] else (max(sizes) if sizes else None)
  at_b = mis[mis[KEY] == at]
  vals = lambda s: {float(r[SEED]): float(r["mean_abs_gap"])
                    for r in at_b[at_b[SCALING] == s].to_dict("records")}
  m = float(col.attrs.get("margin", math.nan))
  pairs = [decide.compare(vals("sqrt"), vals(o), (f"sqrt at B={at}", f"{o} at B={at}"),
                          effect=m, margin=m) for o in ("linear", "none") if o in by]
  if not (sq[COLLAPSES] or sq[BREAKS]):
    v = f"{rules.UNDETERMINED}: not separable (no √ arm collapses or breaks)"
  elif (sq[BREAKS] and any(p.outcome == decide.LOSS for p in pairs)) or not (
      sq[COLLAPSES] or sq[UNDETERMINED]):  # a contrast beating √ counts at √'s break only
    v = rules.NOT_REPRODUCED
  elif not sq[COLLAPSES]:  # the collapse half of the claim is open, not partly shown
    v = (f"{rules.UNDETERMINED}: not separable (√ collapses at no B; neither collapse nor "
         f"break shown at B={sq[UNDETERMINED]})")
  elif (sq[BREAKS] and any(ref_b < b < at for b in sq[COLLAPSES])
        and all(b in sq[COLLAPSES] for b in sizes if b < at) and pairs
        and all(p.outcome == decide.WIN for p in pairs)):
    v = rules.REPRODUCED
  else:
    v = rules.PARTLY
  return v, by, pairs, at


def figures(out_dir):
  curves = read_csv(Path(out_dir) / "curves.csv")
  scalings = [s for s in (*SCALINGS, LONG) if s in set(curves[SCALING])]
  fig = plt().figure(figsize=(4.6 * len(scalings), 4.2))
  y = curves["eval/loss"].replace([np.inf, -np.inf], np.nan).dropna()
  for ax, sc in zip(fig.subplots(1, len(scalings), squeeze=False)[0], scalings, strict=False):
    c = curves[(curves[SCALING] == sc) | (curves[KEY] == curves["ref"])].replace(
        [np.inf, -np.inf], np.nan)
    plot_curves(ax, c, [KEY], "eval/loss", labeler=lambda g: f"B={int(g[KEY])}")
    if len(y):
      ax.set_ylim(y.min() - 0.05, np.percentile(y, 85) + 0.1)
    style(ax, title=f"lr_scaling={sc}", legend=7)
  return [savefig(fig, Path(out_dir) / "batch_scaling.png")]


def arm_guards(out_dir) -> tuple:
  """(stable, warm) of the √ arms: no seed diverged at an arm's (√-scaled) lr, and every arm
  (√ and the contrasts) warmed up ≥ `guards.MIN_WARMUP` steps (finals.csv, from the configs)."""
  fin = read_csv(Path(out_dir) / "finals.csv")
  curves = read_csv(Path(out_dir) / "curves.csv")
  name = lambda r: f"{r[SCALING]} at B={int(r[KEY])}"
  lr = curves.groupby("run")["train/lr"].max() if "train/lr" in curves else pd.Series(dtype=float)
  sq = fin[fin[SCALING] == "sqrt"] if SCALING in fin else fin.iloc[:0]
  div = {name(r): (float(lr.get(r["run"], math.nan)), []) for r in sq.to_dict("records")}
  for r in sq[sq["diverged"].astype(bool)].to_dict("records"):
    div[name(r)] = (div[name(r)][0], [div[name(r)][0]])
  warm = {}
  for r in fin.to_dict("records"):
    w = float(r.get(WARMUP, math.nan))
    warm[name(r)] = min(warm.get(name(r), math.inf), w) if math.isfinite(w) else math.nan
  return guards.stable(div, 1.0), guards.warm(warm)


def regime(curves: pd.DataFrame) -> guards.Guard:
  """`guards.in_regime`: the sizes from ≤ BELOW to ≥ ABOVE × B_simple, the median tracked
  B_simple over the second half of B_ref's runs."""
  ref = curves[curves[KEY] == curves["ref"]]
  late = ref[ref["examples_seen"] > ref["examples_seen"].max() / 2]
  b = float(late[B_SIMPLE].median()) if B_SIMPLE in late and late[B_SIMPLE].notna().any() \
      else math.nan
  sizes = sorted(int(x) for x in curves[KEY].unique())
  return guards.in_regime({"min B / B_simple": sizes[0] / b, "max B / B_simple": sizes[-1] / b},
                          [guards.Regime("min B / B_simple", hi=BELOW.value),
                           guards.Regime("max B / B_simple", lo=ABOVE.value)])


def report(out_dir):
  col, mis, m = collapse(read_csv(Path(out_dir) / "curves.csv"))
  verdict, by, pairs, at = judge(col, mis)
  # each √ arm's TOST at its paired sd (the design's power to show equivalence at a true gap
  # of 0: a reading of absence), and each pair at the break (its power for one margin)
  sq = col[(col[SCALING] == "sqrt") & (col["outcome"] != "reference")]
  cals = {f"sqrt at B={int(r[KEY])} vs B_ref": calibrate.Calibration(
      "paired equivalence", float(r["sd_paired"]), int(r["n_seeds"]), m, decide.ALPHA,
      decide.power_equivalence(float(r["sd_paired"]), int(r["n_seeds"]), m))
      for r in sq.to_dict("records")}
  cals |= {key(p): calibration_of(p) for p in pairs}
  decided = list(cals)  # an undetermined one is named in the verdict (partly, undetermined)
  ours = "; ".join(f"{sc}: collapses at B={by[sc][COLLAPSES]}, breaks at B={by[sc][BREAKS]}"
                   for sc in by) + (f" (margin ±{m:.3g})" if math.isfinite(m) else
                                    " (no margin: a margin seed diverged or stopped early)"
                                    ) + f"; at B={at}: {outcomes(pairs)}"
  checked = (*arm_guards(out_dir), regime(read_csv(Path(out_dir) / "curves.csv")),
             same_budget(out_dir))
  return gated(verdict, cals, checked, decided=decided, rule=RULE, paper=PAPER, ours=ours,
               checks=(*(p.sentence() for p in pairs),
                       declared_text(MIN_MARGIN_D, FALLBACK_D, BELOW, ABOVE)),
               numbers_md=md_table(col) + ("\n\n" + pairs_md(pairs) if pairs else ""))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C4. √B lr scaling collapses the curves',
    papers_test=True, rank=5, stream=1, sweep=sweep, analyze=analyze, figures=figures,
    report=report, needs=("preconditioner",)))
