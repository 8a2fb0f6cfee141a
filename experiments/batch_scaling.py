"""Claim 4: with lr tuned at B_ref and scaled by √(B / B_ref), Adam's loss-vs-examples curves
collapse for small to medium B and separate at large B (the paper's test, which decides the
verdict). Ours, beside it: √ against linear and none at √'s break.

Every run sees the same examples (≥ MIN_STEPS steps at the largest B), warmup and evals in
examples (the warmup long enough for `guards.MIN_WARMUP` steps at the largest B); B_ref runs
at Adam's tuned lr. The `sqrt_2x` arm (the largest B at twice the examples, where the curves
separate) tells "large B has too few steps in this budget" (its gap closes with more examples)
from "√ scaling breaks at large B" (it does not). lr_exponent fits lr*(B) ∝ B^α beside.

The first seeds are the first look of a two-look Pocock design (`design`): a reading open
there (√ at B vs B_ref, a contrast at √'s break) gets seeds on both arms up to the YAML's cap
(`follow_up`, from the pilot's runs alone), read at the look it stopped (`verdict.staged`).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import calibrate, decide, guards, rules, sequential, verdict
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.markdown import md_table
from pergrad.analysis.plots import plot_curves, plt, savefig, style
from pergrad.analysis.runs import aggregate, finished, read_csv, write_csv
from pergrad.analysis.verdict import calibration_of, gated, key, outcomes, pairs_md
from pergrad.sweep import WARMUP, Block, MoreSeeds, Sweep, base_for, scale_value, with_warmup
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register
from pergrad.sweep.rounds import marked_finals

NAME = "batch_scaling"
TITLE = "square-root learning-rate scaling with batch size"
CLAIM = ("With lr tuned at a reference batch size and scaled by sqrt(B / B_ref), Adam's "
         "loss-vs-examples curves nearly coincide for small to medium batch sizes and separate "
         "at large ones.")
PAPER = "curves coincide for small/medium B under √ scaling, separate at large B (qualitative)"
KEY, SCALING, SEED = "data.batch_size", "optimizer.lr_scaling", "train.seed"
REF = "optimizer.ref_batch_size"
SCALINGS = ("sqrt", "linear", "none")
LONG, LONG_FACTOR = "sqrt_2x", 2  # √ scaling at twice the examples (the largest B only)
SIZES = {"ci": [8, 32], "cpu": [4, 8, 16, 64, 128],  # cpu: spans B_simple (its report's guard)
         "paper": [32, 64, 128, 256, 512, 1024, 2048]}
LONG_SIZES = {"ci": [], "cpu": [128], "paper": [2048]}
SEEDS = {"ci": [0], "cpu": [0, 1, 2, 3, 4], "paper": [0, 1, 2, 3, 4]}  # the pilot (√ arms)
MARGIN_SEEDS = {"ci": [], "cpu": [100, 101, 102], "paper": [100, 101, 102]}  # B_ref only
CONTRAST_SEEDS = {"ci": [], "cpu": [0, 1, 2, 3, 4], "paper": [0, 1, 2, 3, 4]}  # ⊂ SEEDS
PILOT, CONTRAST_PILOT = len(SEEDS["cpu"]), len(CONTRAST_SEEDS["cpu"])  # first looks (= paper)
MOST_SEEDS = int(declared(NAME, "seed_cap").value)  # a reading open at its first look: up to it
MIN_STEPS, N_EVALS = {"ci": 4, "cpu": 100, "paper": 200}, {"ci": 4, "cpu": 25, "paper": 40}
MIN_MARGIN_D, FALLBACK_D = declared(NAME, "min_margin"), declared(NAME, "fallback_margin")
MIN_MARGIN, MARGIN_SPREADS, FALLBACK_MARGIN = MIN_MARGIN_D.value, 3.0, FALLBACK_D.value
BELOW, ABOVE = declared(NAME, "below"), declared(NAME, "above")  # the regime, vs B_simple
B_SIMPLE = "gns/total/b_simple"  # tracked in B_ref's runs (stats.gns)
COLLAPSES, BREAKS, UNDETERMINED = "collapses", "breaks", "undetermined"
RULE = ("Over the second half of training's eval points, per seed, the average of B's curve "
        "minus B_ref's (the same seeds: paired): B collapses onto B_ref when the design's "
        "equivalence interval of the mean gap lies within ±margin (TOST) and no point's seed-mean "
        f"gap exceeds {rules.GUARD:g} margins; it breaks when its difference interval lies beyond "
        "the margin or a seed diverged; else (and where a run stopped before an eval point) "
        f"undetermined. Each reading and contrast below: {sequential.READING}; the first look is "
        f"the pilot's {PILOT} seeds, one open there gets the same seeds on B's and B_ref's arms "
        f"up to {MOST_SEEDS} (open at the cap: undetermined). The margin is fixed before the "
        f"comparison from B_ref's margin seeds: {MARGIN_SPREADS:g} × the spread of their curve "
        f"averages, at least {MIN_MARGIN:g} nats ({FALLBACK_MARGIN:g} without margin seeds). "
        "Reproduced when √ collapses at every B below its smallest break, at some B above B_ref, "
        "and some B breaks; partly reproduced when √ collapses at some B but not all of that "
        "holds (no break seen, or a B below the break left open); not reproduced when √ was "
        "decided at every B and collapses at none; undetermined (not separable) when √ collapses "
        "at no B and some B is left open, or nothing was decided. Ours, beside it and not counted "
        "toward the verdict: at √'s break (else the largest B), √ against linear and none "
        f"(mean |gap| per seed to B_ref's pilot mean curve, {decide.READING}; by the same design "
        f"from {CONTRAST_PILOT} seeds, both arms of a contrast open there to {MOST_SEEDS} seeds).")


def budget(preset: str) -> tuple[int, int, int, tuple]:
  """(B_ref, examples per run, examples between evals, sizes)."""
  ref = int(scale_value(preset, "data.batch_size"))
  sizes = tuple(sorted(set(SIZES[preset]) | {ref}))
  ex = max(ref * int(scale_value(preset, "train.steps")), MIN_STEPS[preset] * max(sizes))
  multiple = N_EVALS[preset] * max(sizes)  # whole evaluation intervals of the largest B
  ex = math.ceil(ex / multiple) * multiple
  return ref, ex, ex // N_EVALS[preset], sizes


def block(preset: str, b: int, scalings, seeds, factor: int = 1) -> Block:
  """`scalings` at batch size `b` on `seeds`, every run of an arm (first stage, `follow_up`) on
  its budget: factor × `budget`'s examples (factor ≠ 1, the long arm: train.steps in the grid),
  the same eval points and warmup in examples (≥ `guards.MIN_WARMUP` steps at the largest B,
  but at ci); B_ref's runs track B_simple (stats.gns, the regime guard)."""
  ref, ex, every, sizes = budget(preset)
  warm = max(ref * int(scale_value(preset, "schedule.warmup_steps")),
             guards.MIN_WARMUP * max(sizes) if preset != "ci" else 0)
  steps = factor * ex // b
  fixed = {"train.steps": steps, "train.eval_every": every // b,
           "logging.log_every": max(steps // 40, 1), "train.checkpoint_every": max(steps // 4, 1),
           "schedule.warmup_steps": max(warm // b, 1), **({"stats.gns": True} if b == ref else {})}
  grid = {KEY: [b], REF: [ref], SCALING: list(scalings), SEED: list(seeds)}
  if factor != 1:
    grid["train.steps"] = [fixed.pop("train.steps")]
  return Block(grid, fixed=fixed)


def contrast_seeds(preset: str, b: int, ref: int) -> list:
  """The contrasts' first seeds at `b`: 2 below B_ref (never judged), the pilot's above."""
  return CONTRAST_SEEDS[preset][:2 if b < ref else None]


def sweep(preset: str, inputs=None) -> Sweep:
  ref, _, _, sizes = budget(preset)
  blocks = [block(preset, ref, ["sqrt"], SEEDS[preset] + MARGIN_SEEDS[preset])]
  for b in (b for b in sizes if b != ref):
    blocks.append(block(preset, b, ["sqrt"], SEEDS[preset]))
    if CONTRAST_SEEDS[preset]:
      blocks.append(block(preset, b, SCALINGS[1:], contrast_seeds(preset, b, ref)))
  blocks += [block(preset, b, ["sqrt"], SEEDS[preset][:3], LONG_FACTOR)  # beside, not judged
             for b in LONG_SIZES[preset]]
  # cpu: 65 runs of 12,800 examples + 3 of 25,600 at B = 128 (then `follow_up`'s seeds)
  return Sweep(base_for(NAME, preset, **lr_search.adam_lr(inputs, preset)), tuple(blocks),
               wall_estimate_min={"ci": 1.0, "cpu": 50}.get(preset))


def curves_of(table: pd.DataFrame, fin: pd.DataFrame) -> pd.DataFrame:
  """curves.csv: eval points, examples seen, divergence (`fin`), B_ref; the long arm as LONG."""
  t = table.copy()
  t["examples_seen"] = t["step"] * t[KEY]
  t["diverged"] = t["run"].map(dict(zip(fin["run"], fin["diverged"], strict=False))).fillna(False)
  if "train.steps" in t:  # only the long arm has it in its run name
    t.loc[t["train.steps"].notna(), SCALING] = LONG
  t.insert(1, "ref", int(t[REF].dropna().iloc[0]))
  cols = ["run", "ref", KEY, SCALING, SEED, "step", "examples_seen", "diverged", "eval/loss",
          "train/lr", B_SIMPLE]
  return t[[c for c in cols if c in t]]


def analyze(runs, out_dir):
  fin = with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, Path(out_dir) / "finals.csv")
  write_csv(curves_of(runs.table, fin), Path(out_dir) / "curves.csv")


def follow_up(preset: str, sweep_dir) -> tuple[Block, ...]:
  """Seeds (past every seed run, margin seeds aside) up to MOST_SEEDS a side on both arms of
  each reading open at its first look: √ at B and B_ref's √ for a collapse reading, √ and the
  contrast at √'s break (`judge`) for a contrast. Read from the pilot's seeds alone, so a sweep
  stopped and resumed anywhere asks for the same; () at ci, and until every pilot run a reading
  needs has finished."""
  table = aggregate(sweep_dir) if preset != "ci" else pd.DataFrame()
  if table.empty:
    return ()
  fin = marked_finals(table, base_for(NAME, preset))
  curves = curves_of(table, fin)
  ref, _, _, sizes = budget(preset)
  done = finished(fin)
  done = done[done["train.steps"].isna()] if "train.steps" in done else done  # not the long arm
  done = set(zip(done[KEY].astype(int), done[SCALING], done[SEED].astype(int), strict=True))
  need = {(b, "sqrt", s) for b in sizes for s in SEEDS[preset]}
  if not need | {(ref, "sqrt", s) for s in MARGIN_SEEDS[preset]} <= done:
    return ()
  col, mis, m = collapse(curves[curves[SEED].isin(SEEDS[preset] + MARGIN_SEEDS[preset])])
  at = judge(col, mis)[3]
  if not {(at, sc, s) for sc in SCALINGS[1:] for s in contrast_seeds(preset, at, ref)} <= done:
    return ()
  first = max(SEEDS[preset]) + 1  # past every seed run (the contrasts' ⊂ SEEDS)
  more = list(range(first, first + MOST_SEEDS - len(SEEDS[preset])))
  want = {(b, "sqrt"): more for b in col.attrs["open"]}
  want |= {(ref, "sqrt"): more} if want else {}
  for o, _, open_ in contrasts(mis, at, m, set(col[SCALING])):
    if open_:
      want |= {(at, "sqrt"): more, (at, o): [
          s for s in SEEDS[preset] if s not in contrast_seeds(preset, at, ref)] + more}
  return tuple(block(preset, b, [sc], seeds) for (b, sc), seeds in sorted(want.items()))


def _seed_curves(g: pd.DataFrame, xs) -> dict:
  """{seed: its eval losses at xs} (a diverged run +inf everywhere, a point not reached NaN)."""
  out = {}
  for s, r in g.groupby(SEED):
    ev = r.dropna(subset=["eval/loss"]).drop_duplicates("examples_seen", keep="last")
    y = ev.set_index("examples_seen")["eval/loss"].reindex(xs).to_numpy(float)
    out[float(s)] = np.full(len(xs), np.inf) if bool(r["diverged"].any()) else y
  return out


def _rows(by_seed: dict, n: int) -> np.ndarray:  # seeds × n, in seed order
  return np.array([by_seed[s] for s in sorted(by_seed)]).reshape(len(by_seed), n)


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


def design(pilot: int) -> sequential.Design:
  """The two-look Pocock design of `pilot` seeds, then MOST_SEEDS (`sweep.MoreSeeds`)."""
  return MoreSeeds(None, math.nan, most=MOST_SEEDS).design(pilot)


def _read(ref: dict, arm: dict, m: float, names: tuple, des, n: int) -> tuple:
  """(Paired, outcome, worst, open) of B's curves ({seed: n points}) vs B_ref's on the seeds both
  ran: d_s = mean over the points all reached of B − B_ref, `decide.compare`d (by `des`; None:
  one look); worst = max over points |mean_s gap|; open: undetermined by the intervals alone."""
  seeds = sorted(set(ref) & set(arm))
  r, y = (_rows({s: x[s] for s in seeds}, n) for x in (ref, arm))
  keep = ~(np.isnan(y).any(axis=0) | np.isnan(r).any(axis=0))
  short = keep.sum() < len(keep) and not np.isinf(y).any()  # a run stopped before a point
  a_, b_ = ({s: row[keep].mean() for s, row in zip(seeds, x, strict=True)} for x in (r, y))
  p = decide.compare(a_, b_, names, effect=m, margin=m)
  if des is not None:
    p = verdict.sequential_reading(p, a_, b_, des)
  with np.errstate(invalid="ignore"):
    worst = float(np.max(np.abs((y - r)[:, keep].mean(axis=0)))) if keep.any() and len(seeds) \
        else math.nan
  read = math.isfinite(m) and not short and not np.isinf(y).any() and not p.why and (
      des is None or p.n >= des.looks[0])
  out = (UNDETERMINED if not math.isfinite(m) or short else BREAKS if np.isinf(y).any() else
         UNDETERMINED if not read else
         COLLAPSES if p.lo90 >= -m and p.hi90 <= m and worst <= rules.GUARD * m
         else BREAKS if p.lo95 > m or p.hi95 < -m else UNDETERMINED)
  return p, out, worst, read and out == UNDETERMINED


def collapse(curves: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, float]:
  """(summary per scaling and B, per-seed mean |gap| to B_ref's pilot mean curve, margin),
  over the second half's eval points (`LONG`, on k× the examples: at k× those, the same share
  of its schedule); B_ref's margin seeds only set the margin (NaN: nothing decided). √ at B is
  read by `design(PILOT)` (`verdict.staged`; attrs["open"]: the B open at its first look); the
  contrasts' and LONG's rows, beside the verdict, once on their first seeds."""
  ref_b = int(curves["ref"].iloc[0])
  ref = curves[curves[KEY] == ref_b]
  xs = np.array(sorted(x for x in ref.dropna(subset=["eval/loss"])["examples_seen"].unique()
                       if x > ref["examples_seen"].max() / 2))
  split = ref[SEED].isin(MARGIN_SEEDS["cpu"] + MARGIN_SEEDS["paper"])
  m = margin(_rows(_seed_curves(ref[split], xs), len(xs))) if split.any() else FALLBACK_MARGIN
  ref_c = _seed_curves(ref[~split], xs)
  ref_y = _rows(ref_c, len(xs))
  m_ref = ref_y[:PILOT].mean(axis=0)  # the pilot's: the same whatever seeds are added
  rows, mis, opened = [], [], []
  for (sc, b), runs in curves[curves[KEY] != ref_b].groupby([SCALING, KEY], sort=False):
    k = LONG_FACTOR if sc == LONG else 1  # as planned (a run cut short reads its points NaN)
    arm = _seed_curves(runs, xs * k)
    read = functools.partial(_read, m=m, names=("B_ref", f"{sc} at B={int(b)}"),
                             des=design(PILOT) if sc == "sqrt" else None, n=len(xs))
    if sc == "sqrt":
      p, out, worst, open_ = verdict.staged(read, ref_c, arm, PILOT)
      opened += [int(b)] if open_ else []
    else:  # one look on its first seeds (2 below B_ref, 3 above)
      first = sorted(arm)[:len(contrast_seeds("cpu", b, ref_b))]
      p, out, worst, _ = read(ref_c, {s: arm[s] for s in first})
    y = _rows(arm, len(xs))
    for s, row in arm.items():
      d = np.abs(row - m_ref)
      mis.append({SCALING: sc, KEY: int(b), SEED: int(s),
                  "mean_abs_gap": math.inf if np.isinf(d).any() else float(np.nanmean(d))})
    rows.append({SCALING: sc, KEY: int(b), "n_seeds": p.n, "gap": p.advantage, "lo95": p.lo95,
                 "hi95": p.hi95, "lo": p.lo90, "hi": p.hi90, "sd_paired": p.sd_paired,
                 "max_abs_gap": worst, "outcome": out, "reading": p.reading or "one look",
                 "final_eval_loss": float(np.mean(y[:, -1])), "spread": spread(y)})
  rows.append({SCALING: "sqrt", KEY: ref_b, "n_seeds": len(ref_y), "outcome": "reference",
               "spread": spread(ref_y)})
  col = pd.DataFrame(rows)
  col.attrs["margin"], col.attrs["open"] = m, opened
  return col, pd.DataFrame(mis), m


def contrasts(mis: pd.DataFrame, at, m: float, scalings) -> list[tuple]:
  """[(scaling, √ vs it at B=`at` on per-seed mean |gap|, open: not separable by its intervals,
  no seed diverged)] for linear and none where `scalings` has them, by `design(CONTRAST_PILOT)`
  (`verdict.staged`)."""
  def read(a, b, o):
    p = verdict.sequential_reading(decide.compare(a, b, (f"sqrt at B={at}", f"{o} at B={at}"),
                                                  effect=m, margin=m), a, b, design(CONTRAST_PILOT))
    return p, p.outcome == decide.NOT_SEPARABLE and not p.why
  vals = lambda s: {float(r[SEED]): float(r["mean_abs_gap"])
                    for r in mis[(mis[KEY] == at) & (mis[SCALING] == s)].to_dict("records")}
  return [(o, *verdict.staged(functools.partial(read, o=o), vals("sqrt"), vals(o), CONTRAST_PILOT))
          for o in ("linear", "none") if o in scalings]


def judge(col: pd.DataFrame, mis: pd.DataFrame) -> tuple[str, dict, list, int | None]:
  """(verdict, {scaling: {outcome: [B]}}, the scalings' pairs at √'s break, that B)."""
  ref_b = int(col.loc[col["outcome"] == "reference", KEY].iloc[0])
  by = {sc: {o: sorted(g.loc[g["outcome"] == o, KEY]) for o in (COLLAPSES, BREAKS, UNDETERMINED)}
        for sc, g in col[col["outcome"] != "reference"].groupby(SCALING, sort=False)}
  sq = by.get("sqrt", {COLLAPSES: [], BREAKS: [], UNDETERMINED: []})
  sizes = sorted(int(b) for b in col[KEY].unique() if int(b) != ref_b)
  at = min(sq[BREAKS]) if sq[BREAKS] else (max(sizes) if sizes else None)
  pairs = [p for _, p, _ in contrasts(mis, at, float(col.attrs.get("margin", math.nan)), by)]
  if not (sq[COLLAPSES] or sq[BREAKS]):
    v = f"{rules.UNDETERMINED}: not separable (no √ arm collapses or breaks)"
  elif not (sq[COLLAPSES] or sq[UNDETERMINED]):  # the contrasts (ours) never decide it
    v = rules.NOT_REPRODUCED
  elif not sq[COLLAPSES]:  # the collapse half of the claim is open, not partly shown
    v = (f"{rules.UNDETERMINED}: not separable (√ collapses at no B; neither collapse nor "
         f"break shown at B={sq[UNDETERMINED]})")
  elif (sq[BREAKS] and any(ref_b < b < at for b in sq[COLLAPSES])
        and all(b in sq[COLLAPSES] for b in sizes if b < at)):
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
  curves = read_csv(Path(out_dir) / "curves.csv")
  col, mis, m = collapse(curves)
  v, by, pairs, at = judge(col, mis)
  # each √ arm's collapse, a reading of absence: false collapse, power at a gap of 0 (by its
  # design over its looks; one look's short of the first); each pair at the break
  rates = lambda sd, n: (sequential.equivalence_rates(design(PILOT), sd, m) if n >= PILOT and
                         sd > 0 and math.isfinite(m) else (decide.ALPHA, decide.power_equivalence(
                             sd, n, m)))
  sq = col[(col[SCALING] == "sqrt") & (col["outcome"] != "reference")].to_dict("records")
  cals = {f"sqrt at B={int(r[KEY])} vs B_ref": calibrate.Calibration(
      "paired equivalence", r["sd_paired"], int(r["n_seeds"]), m,
      *rates(r["sd_paired"], int(r["n_seeds"]))) for r in sq}
  cals |= {key(p): calibration_of(p) for p in pairs}
  moot = [key(p) for p in pairs]  # ours: beside the verdict, never deciding it
  decided = [k for k in cals if k not in moot]  # one left open is named in the verdict
  ours = "; ".join(f"{sc}: collapses at B={by[sc][COLLAPSES]}, breaks at B={by[sc][BREAKS]}"
                   for sc in sorted(by, key=lambda sc: sc != "sqrt")) + (
      f" (margin ±{m:.3g})" if math.isfinite(m) else " (no margin: a margin seed diverged or "
      "stopped early)") + f"; at B={at} (ours, not counted): {outcomes(pairs)}"
  arms = {f"{sc} at B={b}": sorted(g[SEED].unique()) for (sc, b), g in curves.groupby(
      [SCALING, KEY]) if sc != LONG}  # B_ref's margin seeds (100, ...) sort last
  checked = (*arm_guards(out_dir), regime(curves), same_budget(out_dir),
             guards.pilot_first(arms, SEEDS["cpu"]))
  return gated(v, cals, checked, moot=moot, decided=decided, rule=RULE, paper=PAPER, ours=ours,
               checks=(*(p.sentence() for p in pairs),
                       declared_text(MIN_MARGIN_D, FALLBACK_D, BELOW, ABOVE)),
               numbers_md=md_table(col) + ("\n\n" + pairs_md(pairs) if pairs else ""))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C4. √B lr scaling collapses the curves',
    papers_test=True, rank=5, stream=1, sweep=sweep, analyze=analyze, figures=figures,
    report=report, needs=("preconditioner",), follow_up=follow_up))
