"""Claim 4 as an exponent: lr*(B) ∝ B^α with the lr tuned at each B, α with its interval
against √ scaling (α = 0.5), over batch sizes from well below to above the measured B_simple.

Per B: Adam at a √2 grid of absolute lrs centred on Adam's tuned lr × √(B / B_ref), two
selection seeds, extended until each seed's best lr is bracketed (`LrSearch.each_seed`); every
run at the same examples (warmup ≥ 20 steps at the largest B). Each seed's lr* is the vertex
of a parabola in log lr through its three lowest-loss neighbours (the grid point when the
vertex leaves them), from its finished runs;
the guards check each seed's lr* (the quantity fitted), not only the seeds' mean. α is the
least-squares slope on log B of log lr* averaged over the seeds at each B, its interval
Student's t on those B-level residuals (n = the number of B): the seeds at one B share its
grid, so their lr* are not independent and a fit over every
(B, seed) would read a too-narrow interval (a shared per-B deviation of 0.1 in ln lr beside
0.03 per seed: 71 % coverage for a nominal 90 %; tests/test_lr_exponent.py simulates it).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from experiments import lr_search
from pergrad.analysis import calibrate, guards, rules
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.markdown import md_table
from pergrad.analysis.plots import plt, savefig, style
from pergrad.analysis.report import not_measured
from pergrad.analysis.runs import finished, read_csv, write_csv
from pergrad.analysis.verdict import gated
from pergrad.sweep import (
  Block,
  LrSearch,
  Sweep,
  base_for,
  factor_of,
  family,
  is_rung,
  scale_value,
  with_warmup,
)
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, Inputs, Rung, register

NAME = "lr_exponent"
TITLE = "the exponent of the tuned learning rate in the batch size"
CLAIM = ("With the learning rate tuned at each batch size, lr* grows as √B (α = 0.5) for "
         "small to medium B: the premise of square-root scaling.")
PAPER = "lr* ∝ √B for small/medium B (α = 0.5; qualitative)"
KEY, SEED, LR = "data.batch_size", "train.seed", "optimizer.lr"
SIZES = {"ci": [8, 16], "cpu": [4, 8, 16, 32, 64, 128], "paper": [32, 64, 128, 256, 512, 1024]}
SELECT = (0, 1)
ALPHA, MARGIN = declared(NAME, "alpha"), declared(NAME, "margin")
BELOW, ABOVE = declared(NAME, "below"), declared(NAME, "above")
B_SIMPLE = "gns/total/b_simple"
RULE = (f"α is the least-squares slope of log lr* (the seeds' mean at each B) on log B; "
        "reproduced "
        f"when its 90% interval lies within {ALPHA.value:g} ± {MARGIN.value:g} (declared), not "
        "reproduced when its 95% interval lies wholly outside that band, else undetermined. "
        "Guards: every lr* inside its grid, no diverged seed at it, ≥ 20 warmup steps, the B "
        f"range from ≤ {BELOW.value:g} to ≥ {ABOVE.value:g} × the measured B_simple (B_ref's "
        "runs at each seed's lowest-loss grid lr, second half). Reported beside, not a guard: "
        "the rule's power for an α of exactly 0.5.")


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  ref = int(scale_value(preset, "data.batch_size"))
  ci, sizes = family(preset) == "ci", SIZES[family(preset)]
  examples = ref * int(scale_value(preset, "train.steps"))
  warm = max(ref * int(scale_value(preset, "schedule.warmup_steps")),
             guards.MIN_WARMUP * max(sizes) if not ci else 0)
  # a ladder rung has no preconditioner search: its grid is centred on the config's lr (and
  # extended until bracketed); moments and gns_layers there take Adam's lr from this search
  lr_ref = float(({} if is_rung(preset) else lr_search.adam_lr(inputs, preset)).get(LR, 1e-2))
  blocks = tuple(Block(
      {KEY: [b], LR: [float(f"{lr_ref * math.sqrt(b / ref) * 2 ** (i / 2):.3g}")
                      for i in (range(-2, 3) if not ci else (0,))],  # √2 apart
       SEED: list(SELECT)},
      fixed={"train.steps": examples // b, "train.eval_every": max(examples // b // 8, 1),
             "schedule.warmup_steps": max(warm // b, 1),
             "logging.log_every": max(examples // b // 50, 1)}) for b in sizes)
  # Up to 4 extensions (4× past the first grid): a ladder rung's grid is centred on the
  # config's lr, not a tuned one, and its small models' lr* lie past 2 extensions at large B.
  search = LrSearch((KEY,), factor=math.sqrt(2), max_extend=0 if ci else 4, each_seed=True)
  # cpu: 6 sizes × 5 lrs × 2 seeds = 60 runs of 12,800 examples (with the GNS)
  return Sweep(base_for(NAME, preset), blocks, search,
               wall_estimate_min={"ci": 0.5, "cpu": 40}.get(preset))


def vertex(lrs, losses) -> float:
  """The lr at the vertex of the parabola in log lr through the lowest finite loss and its two
  neighbours (the lowest point itself at an edge, or when the parabola opens down)."""
  x, y = np.log(np.asarray(lrs, float)), np.asarray(losses, float)
  o = np.argsort(x)
  x, y = x[o], y[o]
  if not np.isfinite(y).any():
    return math.nan
  i = int(np.nanargmin(np.where(np.isfinite(y), y, np.nan)))
  if i == 0 or i == len(x) - 1 or not np.isfinite(y[i - 1:i + 2]).all():
    return float(np.exp(x[i]))
  a, b, _ = np.polyfit(x[i - 1:i + 2], y[i - 1:i + 2], 2)
  return float(np.exp(np.clip(-b / (2 * a), x[i - 1], x[i + 1]))) if a > 0 else float(np.exp(x[i]))


def lr_star(fin: pd.DataFrame) -> pd.DataFrame:
  """Per (B, seed), from its finished runs (an interrupted run's last eval is no final loss):
  lr* (`vertex`), the grid's lowest-loss lr, the seed's grid ("lrs", space-separated), the
  number of lrs."""
  fin = finished(fin)
  rows = []
  for (b, s), g in fin.groupby([KEY, SEED]):
    loss = g["final_eval_loss"].astype(float).where(~g["diverged"].astype(bool), np.inf)
    rows.append({KEY: int(b), SEED: int(s), "lr_star": vertex(g[LR], loss),
                 "lr_grid_best": float(g[LR].iloc[int(np.argmin(loss.to_numpy()))]),
                 "lrs": " ".join(f"{x:.6g}" for x in sorted(g[LR].astype(float))),
                 "n_lrs": len(g)})
  return pd.DataFrame(rows)


def star_guards(star: pd.DataFrame, fin: pd.DataFrame) -> tuple[guards.Guard, guards.Guard]:
  """(bracketed, stable) of each (B, seed)'s lr*, the quantities `fit` reads: its grid's
  lowest-loss lr strictly inside that seed's grid, and lr* at least one grid step below the
  smallest lr at which any seed at that B diverged."""
  fin = finished(fin)
  grid, div, steps = {}, {}, []
  for r in star.to_dict("records"):
    arm = f"B={int(r[KEY])} seed {int(r[SEED])}"
    lrs = [float(x) for x in str(r["lrs"]).split()]
    grid[arm] = (lrs, float(r["lr_grid_best"]))
    at_b = fin[fin[KEY] == r[KEY]]
    bad = at_b["diverged"].astype(bool) | ~np.isfinite(at_b["final_eval_loss"].astype(float))
    div[arm] = (float(r["lr_star"]), sorted(set(at_b.loc[bad, LR].astype(float))))
    if len(lrs) > 1:
      steps.append(factor_of(lrs))
  return guards.bracketed(grid), guards.stable(div, min(steps, default=1.0))


def fit(star: pd.DataFrame) -> dict:
  """α (slope on log B of log lr* averaged over the seeds at each B), its 90% and 95%
  t-intervals on the B-level residuals, se, n (the number of B), n_seeds_points."""
  ok = star[np.isfinite(star["lr_star"])]
  by_b = ok.assign(y=np.log(ok["lr_star"].astype(float))).groupby(KEY)["y"].mean()
  x, y = np.log(by_b.index.to_numpy(float)), by_b.to_numpy(float)
  n, nan = len(x), math.nan
  if n < 3 or np.ptp(x) == 0:
    return {"alpha": nan, "se": nan, "lo90": nan, "hi90": nan, "lo95": nan, "hi95": nan, "n": n,
            "n_points": len(ok)}
  slope, icpt = np.polyfit(x, y, 1)
  resid = y - (slope * x + icpt)
  se = float(np.sqrt(resid @ resid / (n - 2) / ((x - x.mean()) @ (x - x.mean()))))
  t90, t95 = sps.t.ppf(0.95, n - 2), sps.t.ppf(0.975, n - 2)
  return {"alpha": float(slope), "se": se, "lo90": slope - t90 * se, "hi90": slope + t90 * se,
          "lo95": slope - t95 * se, "hi95": slope + t95 * se, "n": n, "n_points": len(ok)}


def judge(f: dict) -> str:
  lo, hi = ALPHA.value - MARGIN.value, ALPHA.value + MARGIN.value
  if not math.isfinite(f["alpha"]):
    return f"{rules.UNDETERMINED}: not separable (α not measured)"
  if lo <= f["lo90"] and f["hi90"] <= hi:
    return rules.REPRODUCED
  return (rules.NOT_REPRODUCED if f["lo95"] > hi or f["hi95"] < lo else
          f"{rules.UNDETERMINED}: not separable (α vs {ALPHA.value:g}: neither within "
          f"±{MARGIN.value:g} nor beyond)")


def analyze(runs, out_dir: Path) -> None:
  """finals.csv (warmup from the configs), best.csv (`best_lr` per B), lr_star.csv,
  b_simple.csv (each run's median tracked B_simple over its second half; `at_ref`: a run at
  the preset's B_ref at its seed's lowest-loss lr, those the regime reads)."""
  out_dir = Path(out_dir)
  fin = with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, out_dir / "finals.csv")
  lr_search.write_best(fin, runs.sweep, out_dir, (KEY,), LR)
  star = lr_star(fin)
  write_csv(star, out_dir / "lr_star.csv")
  t, ref = runs.table, reference_batch_size(runs.table.attrs.get("overrides") or [])
  at_ref = {(int(r[SEED]), float(r["lr_grid_best"])) for r in star.to_dict("records")
            if ref is not None and int(r[KEY]) == ref}
  rows = [{"run": r, KEY: g[KEY].iloc[0], LR: g[LR].iloc[0], SEED: g[SEED].iloc[0],
           "b_simple": float(g.loc[g["step"] > g["step"].max() / 2, B_SIMPLE].median()),
           "at_ref": int(g[KEY].iloc[0]) == ref and any(  # B_ref's own runs only
               int(g[SEED].iloc[0]) == s and np.isclose(float(g[LR].iloc[0]), lr)
               for s, lr in at_ref)}
          for r, g in t.groupby("run")] if B_SIMPLE in t else []
  write_csv(pd.DataFrame(rows, columns=["run", KEY, LR, SEED, "b_simple", "at_ref"]),
            out_dir / "b_simple.csv")


def reference_batch_size(overrides) -> int | None:
  """B_ref: the batch size the run's scale preset sets (`scale=` among the sweep's shared
  overrides); None without one."""
  preset = next((o.split("=", 1)[1] for o in overrides if o.startswith("scale=")), None)
  return int(scale_value(preset, "data.batch_size")) if preset else None


def figures(out_dir: Path) -> list[Path]:
  star = read_csv(Path(out_dir) / "lr_star.csv")
  fig, ax = plt().subplots(figsize=(5.5, 4.2))
  if len(star):
    ax.loglog(star[KEY], star["lr_star"], "o", label="lr* per seed")
    f = fit(star)
    if math.isfinite(f["alpha"]):
      b = np.array(sorted(star[KEY].unique()), float)
      ly, lx = np.mean(np.log(star["lr_star"])), np.mean(np.log(star[KEY]))
      for a, ls, name in ((f["alpha"], "-", f"fit α = {f['alpha']:.2f}"),
                          (ALPHA.value, ":", f"√ scaling (α = {ALPHA.value:g})")):
        ax.loglog(b, np.exp(ly + a * (np.log(b) - lx)), ls, label=name)
  style(ax, xlabel="batch size B", ylabel="tuned lr*", legend=8, grid=True)
  return [savefig(fig, Path(out_dir) / "lr_exponent.png")]


def regime(out_dir: Path) -> guards.Guard:
  """`guards.in_regime`: min(B) / B_simple ≤ BELOW and max(B) / B_simple ≥ ABOVE, B_simple the
  median over the runs at the reference batch size at their seed's lowest-loss lr (`at_ref`;
  none: not measured)."""
  bs, star = read_csv(Path(out_dir) / "b_simple.csv"), read_csv(Path(out_dir) / "lr_star.csv")
  sizes = sorted(star[KEY].unique()) if len(star) else []
  ref = bs[bs["at_ref"].astype(bool)] if "at_ref" in bs else pd.DataFrame()
  b_simple = (float(ref["b_simple"].median()) if "b_simple" in ref and ref["b_simple"].notna().any()
              else math.nan)
  measured = ({"min B / B_simple": sizes[0] / b_simple, "max B / B_simple": sizes[-1] / b_simple}
              if sizes else {})
  return guards.in_regime(measured, [guards.Regime("min B / B_simple", hi=BELOW.value),
                                     guards.Regime("max B / B_simple", lo=ABOVE.value)])


def report(out_dir: Path):
  out_dir = Path(out_dir)
  star = read_csv(out_dir / "lr_star.csv")
  if star.empty:
    return not_measured(RULE, "no run finished", NAME)
  f = fit(star)
  best = lr_search.load_best(out_dir)
  _, _, warm = lr_search.guards_of(best, lambda r: f"B={int(r[KEY])}")
  bracket, stable = star_guards(star, read_csv(out_dir / "finals.csv"))
  # the band test's error rates at the slope's own standard error and points
  cal = calibrate.calibrate("band", f["se"], f["n"], MARGIN.value) if f["n"] >= 3 else \
      calibrate.calibrate("band", math.nan, f["n"], MARGIN.value)
  ours = (f"α = {f['alpha']:.2f} [{f['lo95']:.2f}, {f['hi95']:.2f}] (95%) over B = "
          f"{sorted(int(b) for b in star[KEY].unique())}; √ scaling: α = {ALPHA.value:g}")
  checked = (bracket, stable, warm, lr_search.selected(best), regime(out_dir),
             same_budget(out_dir))
  return gated(judge(f), {"α vs 0.5": cal}, checked,
               decided=["α vs 0.5"],  # an open α names itself in the verdict
               rule=RULE, paper=PAPER, ours=ours,
               checks=(f"90% interval [{f['lo90']:.2f}, {f['hi90']:.2f}] against "
                       f"[{ALPHA.value - MARGIN.value:g}, {ALPHA.value + MARGIN.value:g}]",
                       declared_text(ALPHA, MARGIN, BELOW, ABOVE)),
               numbers_md=md_table(star) + "\n\n" + md_table(pd.DataFrame([f])))


def ladder_value(out_dir: Path) -> float:
  """α of lr*(B) ∝ B^α (NaN without runs)."""
  star = read_csv(Path(out_dir) / "lr_star.csv")
  return fit(star)["alpha"] if len(star) else np.nan


def rung_runs(b: int, steps: int, fam: str) -> list[tuple[int, int]]:
  """5 lrs × 2 seeds per batch size, at the rung's examples."""
  return [(s, b * steps // s) for s in SIZES[fam] for _ in range(10)]

RUNG = Rung("C4", "C4: α of lr* ∝ B^α (√ scaling: 0.5)", 0.5, ladder_value, rung_runs)
EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row="C4, ours: the exponent α of lr*(B)", rank=12,
    stream=0, sweep=sweep, analyze=analyze, figures=figures, report=report,
    needs=("preconditioner",), rung=RUNG))
