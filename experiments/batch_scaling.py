"""Claim 4: with lr tuned at a reference batch size and scaled by sqrt(B / B_ref), Adam's
loss-vs-examples curves collapse for small to medium B and separate at large B.

Design. Adam's lr is tuned at B_ref (the scale's batch size; at the cpu scale B_ref = 32
and lr = 3e-2, Adam's best lr in the preconditioner search) and scaled by
(B / B_ref)^κ with κ = 1/2 (`optimizer.lr_scaling=sqrt`), beside the same sweep with
κ = 1 (`linear`) and κ = 0 (`none`), over a ladder of batch sizes and several seeds.
Every run sees the same number of examples, large enough that the largest B takes at
least `MIN_STEPS` steps (steps = examples / B); the warmup is fixed in examples; every
run is evaluated at the same examples counts. At B = B_ref the three scalings are the
same run, so it is run once (labelled `sqrt`) and is the reference of all three.

The rule (`RULE`): whole curves, not one final point, over the second half of training.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from experiments import verdict as V
from experiments.figures import plot_curves, plt, savefig, style
from experiments.record import ROWS, Experiment, Inputs, Report, register
from experiments.report_md import md_table
from experiments.sweep import Block, Sweep, base_for, scale_value

NAME = "batch_scaling"
TITLE = "square-root learning-rate scaling with batch size"
CLAIM = ("With lr tuned at a reference batch size and scaled by sqrt(B / B_ref), Adam's "
         "loss-vs-examples curves nearly coincide for small to medium batch sizes and "
         "separate at large batch sizes; sqrt scaling does this better than linear or no "
         "scaling.")
KEY = "data.batch_size"
SCALING = "optimizer.lr_scaling"
REF = "optimizer.ref_batch_size"
SEED = "train.seed"
SCALINGS = ("sqrt", "linear", "none")  # sqrt first: the claim's; B_ref runs once, as sqrt

# The ladder per preset. cpu: B = 16 is left out to keep the sweep under an hour
# (`wall_estimate_min`); the paper preset keeps every power of two.
SIZES = {"ci": [8, 32], "cpu": [8, 32, 64, 128, 256],
         "paper": [32, 64, 128, 256, 512, 1024, 2048]}
SEEDS = {"ci": [0], "cpu": [0, 1, 2], "paper": [0, 1, 2]}
SCALINGS_AT = {"ci": ("sqrt", "linear"), "cpu": SCALINGS, "paper": SCALINGS}
MIN_STEPS = {"ci": 4, "cpu": 100, "paper": 200}  # steps of the largest B, at least
N_EVALS = {"ci": 4, "cpu": 25, "paper": 40}  # evaluations per run, at the same examples
# Wall-time model of the cpu preset (2 cores): a step takes STEP_S at B = 32, roughly
# proportional to B, plus RUN_OVERHEAD_S per run (start-up, compilation, evaluations,
# checkpoints).
STEP_S_B32 = 0.085  # measured on this machine (Adam, scale=cpu, 2026-11-23)
RUN_OVERHEAD_S = 10.0
FRACTION = 0.9  # share of second-half eval points within noise for a collapse
RULE = ("A batch size B collapses onto B_ref when, at ≥ 90% of the eval points of the "
        "second half of training (same examples seen), the gap between the two seed-mean "
        "eval-loss curves is at most their combined seed spread √(s_B² + s_ref²) (s = std "
        "over seeds, ≥ 2 seeds each); collapse breaks at the smallest B that does not "
        "collapse, and there √ scaling beats another scaling when its seeds' mean |gap| to "
        "the reference curve is lower by more than the combined seed spread of that "
        "statistic (experiments.verdict).")


@dataclasses.dataclass(frozen=True)
class Plan:
  """What every run of the sweep sees at one preset."""

  sizes: tuple
  ref: int  # B_ref: the scale's batch size, at which the lr was tuned
  examples: int  # examples per run (every B)
  warmup_examples: int
  eval_examples: int  # examples between two evaluations (every B)
  seeds: tuple
  scalings: tuple

  def steps(self, b: int) -> int:
    return self.examples // b

  def runs(self, b: int) -> int:
    return len(self.seeds) * (1 if b == self.ref else len(self.scalings))


def plan(preset: str) -> Plan:
  """The examples budget is the reference run's (the scale's steps times B_ref), raised so
  that the largest B takes at least MIN_STEPS steps, and rounded up to a multiple of
  N_EVALS times the largest B, so that every B evaluates at the same examples counts."""
  ref = int(scale_value(preset, "data.batch_size"))
  sizes = tuple(sorted(set(SIZES[preset]) | {ref}))
  top = max(sizes)
  examples = max(ref * int(scale_value(preset, "train.steps")), MIN_STEPS[preset] * top)
  unit = N_EVALS[preset] * top
  examples = math.ceil(examples / unit) * unit
  every = examples // N_EVALS[preset]
  assert all(every % b == 0 for b in sizes), (sizes, every)
  warm = ref * int(scale_value(preset, "schedule.warmup_steps"))
  return Plan(sizes, ref, examples, warm, every, tuple(SEEDS[preset]), SCALINGS_AT[preset])


def wall_estimate_min(p: Plan) -> float:
  """Minutes on 2 cores: runs × (steps × STEP_S_B32 · B/32 + RUN_OVERHEAD_S)."""
  s = sum(p.runs(b) * (p.steps(b) * STEP_S_B32 * b / 32 + RUN_OVERHEAD_S) for b in p.sizes)
  return s / 60


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """At cpu and paper, lr (at B_ref) is the one Adam's own search chose (no clipping),
  re-derived from the preconditioner runs (`inputs`); at ci, the config's."""
  p = plan(preset)
  tuned = {} if preset == "ci" else {"optimizer.lr": lr_search.tuned_lr(
      inputs, "preconditioner", {"optimizer.variant": "adam", "optimizer.clip_norm": None})}
  base = base_for(NAME, preset, **tuned)
  blocks = []
  for b in p.sizes:
    steps = p.steps(b)
    blocks.append(Block(
        {KEY: [b], REF: [p.ref], SCALING: list(p.scalings[:1] if b == p.ref else p.scalings),
         SEED: list(p.seeds)},
        fixed={"train.steps": steps, "train.eval_every": p.eval_examples // b,
               "train.checkpoint_every": max(steps // 4, 1),
               "logging.log_every": max(steps // 40, 1),
               "schedule.warmup_steps": max(p.warmup_examples // b, 1)}))
  # cpu: 3 seeds × (4 batch sizes × 3 scalings + B_ref once) = 39 runs of 25,600 examples
  # each (B = 8: 3,200 steps ... B = 256: 100 steps): about 50 min by the model above.
  est = {"ci": 1.0}.get(preset, round(wall_estimate_min(p)) if preset == "cpu" else None)
  return Sweep(base, tuple(blocks), wall_estimate_min=est)


# --------------------------------------------------------------------------- analysis


def _reference(table: pd.DataFrame) -> int:
  if REF in table and table[REF].notna().any():
    return int(table[REF].dropna().iloc[0])
  sizes = sorted(table[KEY].unique())  # older sweeps: the middle of the ladder
  return int(sizes[len(sizes) // 2 - 1]) if len(sizes) > 2 else int(sizes[0])


def eval_curves(table: pd.DataFrame, fin: pd.DataFrame) -> pd.DataFrame:
  """Eval rows: batch size, scaling, seed, examples seen (= step × B), eval loss, and
  whether the run diverged."""
  t = table.copy()
  if SCALING not in t:
    t[SCALING] = "sqrt"
  t["examples_seen"] = t["step"] * t[KEY]
  div = dict(zip(fin["run"], fin["diverged"], strict=False)) if "diverged" in fin else {}
  t["diverged"] = t["run"].map(div).fillna(False).astype(bool)
  cols = ["run", KEY, SCALING, SEED, "step", "examples_seen", "diverged",
          *[c for c in ("eval/loss", "train/loss", "train/lr") if c in t]]
  return t[cols]


def _seed_values(g: pd.DataFrame, xs) -> dict:
  """{seed: values at xs}; a diverged run is +inf from its first missing point on, a run
  that has not reached a point (unfinished) has NaN there."""
  out = {}
  for seed, r in g.groupby(SEED):
    ev = r.dropna(subset=["eval/loss"]).set_index("examples_seen")["eval/loss"]
    ev = ev[~ev.index.duplicated(keep="last")]
    y = ev.reindex(xs).to_numpy(dtype=float)
    y = np.where(np.isfinite(y) | np.isnan(y), y, np.inf)
    if bool(r["diverged"].any()):
      y = np.where(np.isnan(y), np.inf, y)
    out[int(seed)] = y
  return out


def _mean_std(vals: list[float]) -> tuple[float, float, int]:
  x = np.asarray([v for v in vals if not np.isnan(v)], dtype=float)
  if len(x) == 0:
    return math.nan, math.nan, 0
  if np.isinf(x).any():
    return math.inf, math.nan, len(x)
  return float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else math.nan, len(x)


def collapse_tables(curves: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
  """(points, per-seed mismatch, summary) of every (scaling, B) against B_ref's curve.

  points: one row per (scaling, B, second-half eval point): both seed means and stds, the
    gap, the noise √(s_B² + s_ref²) and whether the gap is within it (NaN: < 2 seeds).
  mismatch: one row per (scaling, B, seed): the mean |gap| of that seed's curve to the
    reference seed-mean curve over those points (inf for a diverged run).
  summary: one row per (scaling, B): share of points within noise, collapsed (True /
    False / NaN when undetermined), the mean |gap|, steps and examples, final eval loss.
  """
  ref_b = int(curves["ref"].iloc[0])
  ev = curves.dropna(subset=["eval/loss"])
  ref = ev[ev[KEY] == ref_b]
  budget = float(curves.loc[curves[KEY] == ref_b, "examples_seen"].max())
  xs = np.array(sorted(x for x in ref["examples_seen"].unique() if x > budget / 2))
  # B_ref's runs are the same under every scaling: one value per seed.
  ref_vals = _seed_values(ref.drop_duplicates(["examples_seen", SEED], keep="first"), xs)
  ref_stats = [_mean_std([v[i] for v in ref_vals.values()]) for i in range(len(xs))]
  m_ref = np.array([s[0] for s in ref_stats])
  points, mismatch, summary = [], [], []
  scalings = [s for s in SCALINGS if s in set(curves[SCALING])] + sorted(
      set(curves[SCALING]) - set(SCALINGS))
  for scaling in scalings:
    for b in sorted(curves[KEY].unique()):
      b = int(b)
      g = ref if b == ref_b else ev[(ev[KEY] == b) & (ev[SCALING] == scaling)]
      runs = curves[(curves[KEY] == b) & ((curves[SCALING] == scaling) | (b == ref_b))]
      if runs.empty:
        continue
      vals = _seed_values(g.drop_duplicates(["examples_seen", SEED], keep="first"), xs) \
          if not g.empty else {int(s): np.full(len(xs), np.inf if d else np.nan)
                               for s, d in runs.groupby(SEED)["diverged"].any().items()}
      within = []
      for i, x in enumerate(xs):
        mb, sb, nb = _mean_std([v[i] for v in vals.values()])
        mr, sr, nr = ref_stats[i]
        gap = mb - mr if math.isfinite(mb) and math.isfinite(mr) else math.inf
        noise = math.sqrt(sb ** 2 + sr ** 2) if nb > 1 and nr > 1 else math.nan
        if b == ref_b:
          ok = 1.0
        elif not math.isfinite(gap):
          ok = 0.0
        else:
          ok = float(abs(gap) <= noise) if math.isfinite(noise) else math.nan
        within.append(ok)
        points.append({SCALING: scaling, KEY: b, "examples_seen": int(x), "mean": mb,
                       "std": sb, "n_seeds": nb, "mean_ref": mr, "std_ref": sr,
                       "gap": gap, "noise": noise, "within": ok})
      for seed, y in vals.items():
        d = np.abs(y - m_ref)
        mis = math.inf if np.isinf(d).any() else float(np.nanmean(d)) if len(d) else math.nan
        mismatch.append({SCALING: scaling, KEY: b, SEED: seed, "mean_abs_gap": mis})
      w = np.array(within, dtype=float)
      frac = float(np.mean(w)) if len(w) and not np.isnan(w).any() else math.nan
      gaps = [abs(p["gap"]) for p in points[-len(xs):]] if len(xs) else []
      fin = [v[-1] for v in vals.values()] if len(xs) else []
      fm, fs, n = _mean_std(fin)
      steps = runs.groupby("run")["step"].max()
      summary.append({
          SCALING: scaling, KEY: b, "reference": b == ref_b, "n_seeds": n,
          "n_diverged": int(runs.groupby("run")["diverged"].any().sum()),
          "steps": int(steps.max()) if len(steps) else 0,
          "examples": int(runs["examples_seen"].max()),
          "peak_lr": float(runs["train/lr"].max()) if "train/lr" in runs else math.nan,
          "n_points": len(xs), "frac_within": frac,
          "collapsed": (True if b == ref_b else math.nan if math.isnan(frac)
                        else bool(frac >= FRACTION)),
          "mean_abs_gap": float(np.mean(gaps)) if gaps else math.nan,
          "final_eval_loss": fm, "final_eval_loss_std": fs})
  return pd.DataFrame(points), pd.DataFrame(mismatch), pd.DataFrame(summary)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  out_dir = Path(out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)
  curves = eval_curves(table, fin)
  curves.insert(1, "ref", _reference(table))
  curves.to_csv(out_dir / "curves.csv", index=False)
  points, mismatch, summary = collapse_tables(curves)
  points.to_csv(out_dir / "collapse_points.csv", index=False)
  mismatch.to_csv(out_dir / "mismatch.csv", index=False)
  summary.to_csv(out_dir / "collapse.csv", index=False)


# --------------------------------------------------------------------------- figures


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  curves = pd.read_csv(out_dir / "curves.csv")
  col = pd.read_csv(out_dir / "collapse.csv")
  ref_b = int(curves["ref"].iloc[0]) if "ref" in curves else None
  scalings = [s for s in SCALINGS if s in set(curves[SCALING])]
  pyplot = plt()
  n = len(scalings) + ("frac_within" in col)
  fig, axes = pyplot.subplots(1, n, figsize=(4.6 * n, 4.2), squeeze=False)
  axes = axes[0]
  y = curves["eval/loss"].replace([np.inf, -np.inf], np.nan).dropna()
  half = curves.groupby(KEY)["examples_seen"].max().max() / 2
  for ax, scaling in zip(axes, scalings, strict=False):
    sel = (curves[SCALING] == scaling) | (curves[KEY] == ref_b)
    c = curves[sel].replace([np.inf, -np.inf], np.nan)
    plot_curves(ax, c, [KEY], "eval/loss", labeler=lambda g: f"B={int(g[KEY])}")
    ax.axvline(half, color="grey", ls=":", lw=1)
    if not y.empty:
      ax.set_ylim(y.min() - 0.05, np.percentile(y, 85) + 0.1)
    style(ax, title=f"lr_scaling={scaling}: eval loss vs examples", legend=7)
  if "frac_within" in col:
    ax = axes[-1]
    shown = 0
    for scaling in scalings:
      g = col[(col[SCALING] == scaling) & ~col["reference"].astype(bool)].sort_values(KEY)
      g = g.dropna(subset=["frac_within"])
      shown += len(g)
      ax.plot(g[KEY], g["frac_within"], "o-", label=scaling)
    ax.axhline(FRACTION, color="grey", ls="--", lw=1)
    if shown:
      ax.set_xscale("log", base=2)
    else:
      ax.text(0.5, 0.5, "undetermined: < 2 seeds", ha="center", transform=ax.transAxes)
    style(ax, xlabel="batch size B", ylabel="share of 2nd-half eval points within noise",
          title=f"collapse onto B_ref = {ref_b}", legend=8, grid=True)
  return [savefig(fig, out_dir / "batch_scaling.png")]


# --------------------------------------------------------------------------- report


def _at(sizes) -> str:
  """"at B = 8, 64" or "at no B"."""
  return "at B = " + ", ".join(str(int(b)) for b in sizes) if len(sizes) else "at no B"


def judge(col: pd.DataFrame, mismatch: pd.DataFrame) -> dict:
  """The rule's outcome from collapse.csv and mismatch.csv (see RULE)."""
  ref_b = int(col.loc[col["reference"].astype(bool), KEY].iloc[0])
  out = {"ref": ref_b, "scalings": {}}
  for scaling, g in col[~col["reference"].astype(bool)].groupby(SCALING, sort=False):
    g = g.sort_values(KEY)
    c = g["collapsed"]
    undetermined = c.isna() | (c.astype(str).str.lower() == "nan")
    flag = c.astype(str).str.lower() == "true"
    ok = list(g.loc[flag & ~undetermined, KEY].astype(int))
    bad = list(g.loc[~flag & ~undetermined, KEY].astype(int))
    und = list(g.loc[undetermined, KEY].astype(int))
    out["scalings"][scaling] = {"collapsed": ok, "not_collapsed": bad, "undetermined": und,
                                "break": min(bad) if bad else None}
  sq = out["scalings"].get("sqrt")
  sizes = sorted(int(b) for b in col[KEY].unique() if int(b) != ref_b)
  at = (sq["break"] if sq and sq["break"] is not None else (max(sizes) if sizes else None))
  out["at"] = at
  pairs = []
  if at is not None:
    for other in ("linear", "none"):
      vals = lambda s: list(mismatch[(mismatch[SCALING] == s) & (mismatch[KEY] == at)]
                            ["mean_abs_gap"])
      if other in out["scalings"]:
        pairs.append(V.compare(vals("sqrt"), vals(other), (f"sqrt at B={at}",
                                                           f"{other} at B={at}")))
  out["pairs"] = pairs
  if not sq or len(sizes) < 2 or (sq["undetermined"] and not sq["collapsed"]
                                  and not sq["not_collapsed"]):
    v = "undetermined"
  elif not sq["collapsed"] or any(p.outcome == V.LOSS for p in pairs):
    v = "not reproduced"
  elif (sq["break"] is not None and any(b > ref_b and b < sq["break"] for b in sq["collapsed"])
        and all(b in sq["collapsed"] for b in sizes if b < sq["break"])
        and pairs and all(p.outcome == V.WIN for p in pairs)):
    v = "reproduced"
  else:
    v = "partly reproduced"
  out["verdict"] = v
  return out


def report(out_dir: Path) -> Report:
  out_dir = Path(out_dir)
  col = pd.read_csv(out_dir / "collapse.csv")
  mismatch = pd.read_csv(out_dir / "mismatch.csv")
  j = judge(col, mismatch)
  ref_b = j["ref"]
  ref_row = col[col["reference"].astype(bool)].iloc[0]
  seeds = int(ref_row["n_seeds"])
  steps = col.drop_duplicates(KEY).sort_values(KEY)
  steps_text = ", ".join(f"B={int(r[KEY])}: {int(r['steps'])}" for _, r in steps.iterrows())
  per = []
  for s, d in j["scalings"].items():
    brk = (f"breaks at B = {d['break']}" if d["break"] is not None
           else "break undetermined" if d["undetermined"] else "never breaks")
    und = f" (undetermined {_at(d['undetermined'])})" if d["undetermined"] else ""
    per.append(f"{s}: collapses {_at(d['collapsed'])}, {brk}{und}")
  cmp_text = "; ".join(p.sentence() for p in j["pairs"]) or "no other scaling to compare"
  finding = (f"Eval-loss curves against B_ref = {ref_b} over the second half of training "
             f"({int(ref_row['n_points'])} eval points; {int(ref_row['examples']):,} examples "
             f"per run, steps {steps_text}; {seeds} seed(s)). " + "; ".join(per)
             + f". At B = {j['at']} (mean |gap| to the reference curve per seed): "
             + cmp_text + ".")
  sq = j["scalings"].get("sqrt", {})
  row = ("√B: collapses " + _at(sq.get("collapsed", []))
         + (f", breaks at B = {sq['break']}" if sq.get("break") is not None else
            ", no break")
         + "".join(f"; {s}: breaks at B = {d['break']}" if d["break"] is not None
                   else f"; {s}: no break" for s, d in j["scalings"].items() if s != "sqrt")
         + f" (B_ref = {ref_b}, {seeds} seed(s), {int(ref_row['examples']):,} examples). At B = "
         + f"{j['at']}: " + ", ".join(f"√ {p.outcome} vs {p.b.split(' ')[0]}"
                                      for p in j["pairs"]) + ".")
  show = col.rename(columns={KEY: "B", SCALING: "lr_scaling"})[
      ["lr_scaling", "B", "n_seeds", "n_diverged", "steps", "examples", "peak_lr",
       "frac_within", "collapsed", "mean_abs_gap", "final_eval_loss", "final_eval_loss_std"]]
  numbers = (md_table(show) + "\n\n`frac_within`: share of the second-half eval points at "
             "which the gap to B_ref's seed-mean curve is within √(s_B² + s_ref²); "
             f"collapsed when ≥ {FRACTION:g}. The scalings compared at B = {j['at']}:\n\n"
             + (V.pairs_md(j["pairs"]) if j["pairs"] else "(none)"))
  return Report(verdict=j["verdict"], finding=finding, claim_row=row, rule=RULE,
                numbers_md=numbers)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["4"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("preconditioner",)))
