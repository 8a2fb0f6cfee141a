"""G2 (Gray et al. 2024): the gradient noise scale per layer type over training, and the
normalization layers' GNS as a predictor of the rest of the model's.

Adam at its tuned lr, per-example norms of every layer every step (`stats.gns`), 5 seeds (the
first look), more up to the cap declared in configs/experiment/gns_layers.yaml where the
reading is still open there (`follow_up`). The raw per-type terms |G|²_est, S_est are
re-smoothed offline (`pergrad.analysis.smooth`) at several decays α; `RULE` regresses the
complement's B_simple on the norm group's (`gns_terms.part_whole`) and reads the location of
the seeds' Fisher-z r against the threshold; both drift as the loss falls, so r reads
"tracks", not independence.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import (
  GNS_TOTAL,
  calibrate,
  guards,
  layer_type,
  leafwise,
  sequential,
  smooth,
)
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.decide import LOSS, WIN, seeds_to_settle
from pergrad.analysis.gns_terms import part_whole
from pergrad.analysis.markdown import fmt_num, listing, sections
from pergrad.analysis.plots import plot_curves, plt, savefig, style
from pergrad.analysis.report import Report, not_measured
from pergrad.analysis.rules import NOT_REPRODUCED, REPRODUCED, UNDETERMINED
from pergrad.analysis.runs import aggregate, finals, finished, read_csv, write_csv, x_examples
from pergrad.analysis.verdict import gated
from pergrad.sweep import Block, Sweep, base_for, experiment_value, family, is_rung, with_warmup
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, Inputs, Rung, register

NAME = "gns_layers"
TITLE = "gradient noise scale per layer type; the normalization layers as predictor"
CLAIM = ("The gradient noise scale of the normalization layers alone predicts the total GNS "
         "of a transformer (a linear relation with high correlation once both are smoothed; "
         "Gray et al., arXiv 2411.00999).")
ALPHA = float(experiment_value(NAME, "stats.gns_alpha"))
ALPHAS = (0.9, ALPHA, 0.98, 0.99)
R_MIN_D, CLAIMED_D = declared(NAME, "r_min"), declared(NAME, "claimed_r")  # configs/experiment
SEED_CAP = declared(NAME, "seed_cap")
R_MIN, CLAIMED_R, MOST_SEEDS = R_MIN_D.value, CLAIMED_D.value, int(SEED_CAP.value)
SEEDS = {"ci": (0,), "cpu": (0, 1, 2, 3, 4), "paper": (0, 1, 2, 3, 4)}  # the first look
RUNG_SEEDS = (0, 1, 2)  # a ladder rung reads the mean r only (`ladder_value`), no verdict
CLAIMED_GAP = math.atanh(CLAIMED_R) - math.atanh(R_MIN)  # the power's effect, in Fisher z
PAPER = "norm-layer GNS predicts the total GNS (high correlation, linear)"
NORM = "norm"
PART_WHOLE = "gns_part_whole.csv"
RULE = (f"At the tracker's EMA decay α = {ALPHA:g}, the Pearson r between the smoothed "
        f"B_simple of the complement (total minus the normalization layers: (S_tot − S_norm) "
        f"/ (|G|²_tot − |G|²_norm)) and that of the normalization layers over training (past "
        f"t = 1/(1−α)), per seed, as Fisher z − atanh({R_MIN:g}) (our threshold; z is near "
        f"normal where r is not); the seeds' mean of it read by a two-look Pocock design (the "
        f"first {len(SEEDS['cpu'])} seeds, then up to {MOST_SEEDS} where the first look leaves "
        "it open; overall false alarm ≤ 5%, each look at the design's critical t): reproduced "
        f"when the mean lies above atanh({R_MIN:g}), not reproduced when below, else "
        "undetermined: not separable (naming the seeds that would settle it); the design's "
        f"power for r = {CLAIMED_R:g} is reported beside. The total's own r with the norm group "
        "is part-whole (the group is in the total) and is reported, not used.")


def design() -> sequential.Design:
  """The two-look design the seeds' r is read by: the first look's seeds, then the cap."""
  return sequential.design((len(SEEDS["cpu"]), MOST_SEEDS))


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Adam at its tuned lr (cpu, paper) with every step's GNS terms logged, seeds."""
  return Sweep(base_for(NAME, preset, **lr_search.adam_lr(inputs, preset)),
               (Block({"train.seed": list(RUNG_SEEDS if is_rung(preset)
                                          else SEEDS[family(preset)])}),),
               wall_estimate_min={"ci": 0.3, "cpu": 4}.get(preset))


def terms(table: pd.DataFrame) -> pd.DataFrame:
  """Long table: run, train.seed, step, examples_seen, group, G2, S (every logged step)."""
  t = table.assign(examples_seen=x_examples(table))
  ids = ["run", "train.seed", "step", "examples_seen"]
  groups = sorted({c.split("/")[1] for c in t if c.startswith("gns/") and c.endswith("/G2")})
  rows = [t[[*ids, f"gns/{g}/G2", f"gns/{g}/S"]].dropna().set_axis([*ids, "G2", "S"], axis=1)
          .assign(group=g) for g in groups]
  cols = [*ids, "group", "G2", "S"]
  return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def smoothed(terms_df: pd.DataFrame, alpha: float) -> pd.DataFrame:
  """terms_df plus G2_ema, S_ema, b_simple by the tracker's recurrence at `alpha`."""
  out = []
  for _, g in terms_df.sort_values("step").groupby(["run", "group"], sort=False):
    sm = smooth(g["G2"].to_numpy(), g["S"].to_numpy(), alpha)
    out.append(g.assign(**{k: v.astype(float) for k, v in sm.items()}, alpha=alpha))
  return pd.concat(out, ignore_index=True) if out else terms_df.assign(alpha=alpha)


def regression(sm: pd.DataFrame, alpha: float) -> pd.DataFrame:
  """Per run: `gns_terms.part_whole` of the smoothed total and normalization-layer terms over
  steps t ≥ 1/(1−α): the complement's and the total's regression on the norm group's
  B_simple, and the group's shares of |G|² and S."""
  rows = []
  for run, g in sm.groupby("run", sort=False):
    late = g[g["step"] >= 1.0 / (1.0 - alpha)]
    wide = late.pivot_table(index="step", columns="group", values=["G2_ema", "S_ema"])
    if (("G2_ema", NORM) not in wide) or (("G2_ema", GNS_TOTAL) not in wide):
      continue
    wide = wide.dropna(subset=[(k, c) for k in ("G2_ema", "S_ema") for c in (NORM, GNS_TOTAL)])
    pw = part_whole(wide[("G2_ema", GNS_TOTAL)], wide[("S_ema", GNS_TOTAL)],
                    wide[("G2_ema", NORM)], wide[("S_ema", NORM)])
    if pw.n_steps < 3:
      continue
    rows.append({"run": run, "train.seed": g["train.seed"].iloc[0], "alpha": alpha,
                 **dataclasses.asdict(pw)})
  return pd.DataFrame(rows)


def analyze(runs, out_dir: Path) -> None:
  """gns_terms.csv (raw terms; smoothed at α = ALPHA on reading), gns_part_whole.csv (every α),
  leaf_params.csv."""
  out_dir, table, fin = Path(out_dir), runs.table, runs.finals
  t = terms(table)
  write_csv(t, out_dir / "gns_terms.csv")
  write_csv(pd.concat([regression(smoothed(t, a), a) for a in ALPHAS], ignore_index=True),
            out_dir / PART_WHOLE)
  leafwise.write_sizes(table, out_dir)
  write_csv(with_warmup(fin, runs.sweep_dir), out_dir / "finals.csv")


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  sm = smoothed(read_csv(out_dir / "gns_terms.csv"), ALPHA)
  fig, axes = plt().subplots(1, 2, figsize=(12, 4.2))
  if len(sm):
    late = sm[sm["step"] >= 1.0 / (1.0 - ALPHA)]
    plot_curves(axes[0], late, ["group"], "b_simple", labeler=lambda g: g["group"])
    style(axes[0], yscale="log", ylabel="B_simple = EMA(S) / EMA(|G|²)",
          title=f"GNS per layer type (α = {ALPHA:g}; mean over seeds, band = min-max)",
          legend=8)
    pairs = b_simple_pairs(sm, ALPHA)
    for run, (b_norm, b_rest) in pairs.items():
      axes[1].plot(b_norm, b_rest, ".", ms=2, label=str(run)[-12:])
    if pairs:
      style(axes[1], xlabel="normalization layers' B_simple", legend=6, grid=True,
            ylabel="B_simple of the rest (total minus norm)",
            title="rest of the model vs normalization-layer GNS (each step)")
  return [savefig(fig, out_dir / "gns_layers.png")]


def b_simple_pairs(sm: pd.DataFrame, alpha: float) -> dict:
  """{run: (the norm group's B_simple, the complement's) by step, past t = 1/(1−α)}."""
  late = sm[sm["step"] >= 1.0 / (1.0 - alpha)]
  wide = late.pivot_table(index=["run", "step"], columns="group", values=["G2_ema", "S_ema"])
  if ("G2_ema", NORM) not in wide or ("G2_ema", GNS_TOTAL) not in wide:
    return {}
  b_norm = wide[("S_ema", NORM)] / wide[("G2_ema", NORM)]
  b_rest = ((wide[("S_ema", GNS_TOTAL)] - wide[("S_ema", NORM)])
            / (wide[("G2_ema", GNS_TOTAL)] - wide[("G2_ema", NORM)]))
  runs = wide.index.get_level_values(0).unique()
  return {run: (b_norm.loc[run], b_rest.loc[run]) for run in runs}


def cross_seed_r(pairs: dict) -> float:
  """Ours, beside the paper's r: the mean Pearson r between one run's norm-group B_simple and
  ANOTHER run's complement over their shared steps: what a shared drift over training alone
  gives (the within-run r must exceed it for the norm layers to track more than the trend)."""
  rs = []
  for i, (b_norm, _) in pairs.items():
    for j, (_, b_rest) in pairs.items():
      both = pd.concat([b_norm, b_rest], axis=1, join="inner").replace([np.inf, -np.inf], np.nan)
      both = both.dropna()
      if i != j and len(both) >= 3:
        rs.append(float(np.corrcoef(both.iloc[:, 0], both.iloc[:, 1])[0, 1]))
  return float(np.mean(rs)) if rs else float("nan")


def gaps(rs) -> np.ndarray:
  """Each seed's Fisher z of r minus the threshold's: atanh(r) − atanh(R_MIN) (r clipped inside
  ±1); the seeds' mean of it above 0 is a mean r above R_MIN."""
  r = np.clip(np.asarray(rs, float), -1 + 1e-9, 1 - 1e-9)
  return np.arctanh(r) - math.atanh(R_MIN)


def read(rs) -> tuple[str, int]:
  """(outcome, seeds to add) of the seeds' r (in seed order) by `design`: win (above R_MIN),
  loss (below) or not separable, at the design's last look ≤ len(rs) (`sequential.read`)."""
  return sequential.read(gaps(rs), design())


def decide(rs: list[float]) -> str:
  """`RULE` on the seeds' r (in seed order; non-finite dropped)."""
  rs = [r for r in rs if np.isfinite(r)]
  out, _ = read(rs)
  if len(rs) < design().looks[0]:
    return f"{UNDETERMINED}: not separable (fewer seeds than the first look's {design().looks[0]})"
  return {WIN: REPRODUCED, LOSS: NOT_REPRODUCED}.get(out, f"{UNDETERMINED}: not separable")


def calibration(rs) -> calibrate.Calibration:
  """The design's error rates at the seeds' Fisher-z spread (`sequential.simulate`): false
  alarm (win or loss at a mean r of R_MIN: no spread enters), power (win at r = CLAIMED_R)."""
  z = gaps([r for r in rs if np.isfinite(r)])
  sd = float(np.std(z, ddof=1)) if len(z) > 1 else math.nan
  if not (math.isfinite(sd) and sd > 0):
    return calibrate.Calibration("sequential location (Fisher z)", sd, len(z), CLAIMED_GAP,
                                 math.nan, math.nan)
  null = sequential.simulate(design(), 0.0, sd)
  return calibrate.Calibration(
      "sequential location (Fisher z)", sd, len(z), CLAIMED_GAP, null[WIN] + null[LOSS],
      sequential.simulate(design(), CLAIMED_GAP, sd)[WIN])


def location_text(rs) -> str:
  """The seeds' mean r (back from the mean Fisher z) and the design's interval at its look."""
  z = gaps([r for r in rs if np.isfinite(r)])
  if (at := sequential.look(z, design())) is None:
    return f"{len(z)} seeds, short of the design's first look at {design().looks[0]}"
  k, m, se = at
  c, back = design().crit[k], lambda x: math.tanh(x + math.atanh(R_MIN))
  return (f"mean r (Fisher z) {fmt_num(back(m))} [{fmt_num(back(m - c * se))}, "
          f"{fmt_num(back(m + c * se))}] at look {k + 1} of {len(design().looks)} "
          f"({design().looks[k]} seeds, |t| > {c:.3g}) against {R_MIN:g}")


def settle_text(rs) -> str:
  """What would settle a reading the design left open: before the cap, its own added seeds;
  at it, the fewest seeds at which a one-look t on the seeds' Fisher-z gaps detects their
  observed mean with power 0.8 (`decide.seeds_to_settle`), or none up to 64."""
  z = gaps([r for r in rs if np.isfinite(r)])
  if len(z) < design().cap:
    return (f"seeds that would settle it: the design's own, up to {design().cap} (its "
            "follow-up stage adds them where the first look leaves the reading open)")
  sd = float(np.std(z, ddof=1))
  need = seeds_to_settle(sd, float(np.mean(z)))["difference"]
  at = (f"a one-look t at the seeds' Fisher-z spread {fmt_num(sd)} and mean gap "
        f"{fmt_num(float(np.mean(z)))} from atanh({R_MIN:g})")
  return (f"seeds that would settle it: {need} ({at} detects it with power 0.8 there; the "
          f"declared cap is {design().cap})" if need else
          f"no number of seeds up to 64 settles it: {at} (a mean r this near {R_MIN:g})")


def follow_up(preset: str, sweep_dir: Path) -> tuple[Block, ...]:
  """Seeds up to MOST_SEEDS when the first look's seeds (all finished) leave the reading open;
  a function of those seeds alone, so a sweep stopped and resumed asks for the same."""
  pilot = SEEDS.get(family(preset), ())
  if family(preset) == "ci" or is_rung(preset):
    return ()
  table = aggregate(sweep_dir)
  done = finished(finals(table)) if not table.empty else pd.DataFrame()
  if done.empty or not set(pilot) <= {int(s) for s in done["train.seed"]}:
    return ()
  first = table[table["run"].isin(done["run"]) & table["train.seed"].isin(pilot)]
  reg = regression(smoothed(terms(first), ALPHA), ALPHA).sort_values("train.seed")
  rs = reg["r_complement"].tolist() if len(reg) else []
  if len(rs) < len(pilot) or not np.isfinite(rs).all():
    return ()
  _, add = read(rs)
  start = max(pilot) + 1
  return (Block({"train.seed": list(range(start, start + add))}),) if add else ()


def report(out_dir: Path) -> Report:
  reg = read_csv(Path(out_dir) / PART_WHOLE)
  if reg.empty or "r_complement" not in reg:
    return not_measured(RULE, f"{PART_WHOLE} is missing or empty (no gns/norm and gns/total "
                        "terms, or runs too short for 3 steps past the EMA warm-up)", NAME)
  at = reg[np.isclose(reg["alpha"], ALPHA)].sort_values("train.seed")
  rs = at["r_complement"].dropna().tolist()
  cal = calibration(rs)
  f = lambda c: ", ".join(fmt_num(float(x)) for x in at[c])
  sizes = leafwise.read_sizes(out_dir) or {}
  by_type = pd.Series(sizes, dtype=float).groupby(layer_type).sum() / max(sum(sizes.values()), 1)
  by_alpha = reg.groupby("alpha")[["r_complement", "slope_complement", "r_total", "share_g2",
                                   "share_s"]].agg(["mean", "std"]).reset_index()
  by_alpha.columns = ["_".join(c).rstrip("_") for c in by_alpha.columns]
  warm = lr_search.warm_of(read_csv(Path(out_dir) / "finals.csv"), lambda r: "adam", {"adam"})
  sm = smoothed(read_csv(Path(out_dir) / "gns_terms.csv"), ALPHA)
  cross = cross_seed_r(b_simple_pairs(sm, ALPHA)) if len(sm) else float("nan")
  null = (f"ours, beside: the same r between one seed's norm layers and another seed's rest "
          f"(a shared drift alone) is {fmt_num(cross)}; the within-seed r exceeds it in "
          f"{sum(r > cross for r in rs)} of {len(rs)} seeds" if np.isfinite(cross) else
          "ours, beside: the r a shared drift alone gives, not measured (fewer than two seeds)")
  verdict = decide(rs)  # decided at any power; an open reading names itself (not separable)
  settle = settle_text(rs) if verdict.startswith(UNDETERMINED) else None
  pilot = guards.pilot_first({"seeds": at["train.seed"].tolist()}, SEEDS["cpu"])
  return gated(verdict, cal, (warm, same_budget(out_dir), pilot), rule=RULE, paper=PAPER,
               decided=["rule"],  # the design's power for r = CLAIMED_R: reported beside
               ours=(f"r(complement, norm) = {f('r_complement')} at α = {ALPHA:g}; "
                     f"{location_text(rs)}"),
               checks=(f"slope {f('slope_complement')}; the norm group holds {f('share_g2')} of "
                       f"Σ|G|² and {f('share_s')} of ΣS, so the part-whole r of the total "
                       f"{f('r_total')} is not evidence", "Share of the parameters per type: "
                       + listing(by_type.items(), lambda v: f"{100 * v:.3g} %"),
                       null, *([settle] if settle else ()),
                       declared_text(R_MIN_D, CLAIMED_D, SEED_CAP)),
               numbers_md=sections("Regressions on the norm layers' B_simple (per seed, by α):",
                                   reg, "By α:", by_alpha))


def ladder_value(out_dir: Path) -> float:
  """r(complement, norm layers) at the tracker's α (NaN without runs)."""
  reg = read_csv(Path(out_dir) / PART_WHOLE)
  at = reg[np.isclose(reg["alpha"], ALPHA)] if len(reg) else reg
  return float(at["r_complement"].mean()) if len(at) else np.nan


def rung_runs(b: int, steps: int, fam: str) -> list[tuple[int, int]]:
  """3 seeds at the scale's B."""
  return [(b, steps)] * 3

RUNG = Rung("G2", "G2: r(complement, norm layers)", 0.95, ladder_value, rung_runs,
            one_sided=True)
EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row="G2. The norm layers' GNS predicts the total",
    papers_test=True, rank=9, stream=1, sweep=sweep, analyze=analyze, figures=figures,
    report=report, needs=("preconditioner",), rung=RUNG, follow_up=follow_up))
