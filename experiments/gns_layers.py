"""G2 (Gray et al. 2024): the gradient noise scale per layer type over training, and the
normalization layers' GNS as a predictor of the rest of the model's.

Adam at its tuned lr, per-example norms of every layer every step (`stats.gns`), 3 seeds. The
raw per-type terms |G|²_est, S_est are re-smoothed offline (`pergrad.analysis.smooth`) at
several decays α; `RULE` regresses the complement's B_simple on the norm group's
(`gns_terms.part_whole`); both drift as the loss falls, so r reads "tracks", not independence.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import GNS_TOTAL, calibrate, layer_type, leafwise, smooth
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.gns_terms import part_whole
from pergrad.analysis.markdown import fmt_num, listing, sections
from pergrad.analysis.plots import plot_curves, plt, savefig, style
from pergrad.analysis.report import Report, not_measured
from pergrad.analysis.rules import NOT_REPRODUCED, PARTLY, REPRODUCED, UNDETERMINED
from pergrad.analysis.runs import read_csv, write_csv, x_examples
from pergrad.analysis.verdict import gated
from pergrad.sweep import SEEDS, Block, Sweep, base_for, experiment_value, family, with_warmup
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
R_MIN, CLAIMED_R = R_MIN_D.value, CLAIMED_D.value
PAPER = "norm-layer GNS predicts the total GNS (high correlation, linear)"
NORM = "norm"
PART_WHOLE = "gns_part_whole.csv"
RULE = (f"At the tracker's EMA decay α = {ALPHA:g}, the Pearson r between the smoothed "
        f"B_simple of the complement (total minus the normalization layers: (S_tot − S_norm) "
        f"/ (|G|²_tot − |G|²_norm)) and that of the normalization layers over training (past "
        f"t = 1/(1−α)) is high when the seeds' mean r minus their std is ≥ {R_MIN:g} (our "
        f"threshold): reproduced then, not reproduced when the mean plus the std is < "
        f"{R_MIN:g}, partly reproduced otherwise (the rule's power for r = {CLAIMED_R:g} gates "
        "only this reading, reported beside the others), undetermined with < 2 seeds. The total's "
        "own r with the norm group is part-whole (the group is in the total) and is reported, "
        "not used.")


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """Adam at its tuned lr (cpu, paper) with every step's GNS terms logged, seeds."""
  return Sweep(base_for(NAME, preset, **lr_search.adam_lr(inputs, preset)),
               (Block({"train.seed": list(SEEDS[family(preset)])}),),
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


def decide(rs: list[float]) -> str:
  """`RULE` on the seeds' r: mean − std ≥ R_MIN, mean + std < R_MIN, else partly."""
  rs = [r for r in rs if np.isfinite(r)]
  if len(rs) < 2:
    return UNDETERMINED
  m, s = float(np.mean(rs)), float(np.std(rs, ddof=1))
  return REPRODUCED if m - s >= R_MIN else NOT_REPRODUCED if m + s < R_MIN else PARTLY


def settle_text(rs: list[float]) -> str:
  """The seeds that would settle a reading neither side of R_MIN decides: the fewest at which
  the rule's power for r = CLAIMED_R reaches MIN_POWER at the seeds' measured std."""
  sd = float(np.std(rs, ddof=1)) if len(rs) > 1 else float("nan")
  need = calibrate.seeds_for_power("threshold", sd, len(rs) + 1, R_MIN, CLAIMED_R)
  at = f"at the seeds' std {fmt_num(sd)}, the rule's power for r = {CLAIMED_R:g}"
  if not np.isfinite(sd):
    return "seeds that would settle it: not measured (fewer than two seeds)"
  if need:
    return (f"seeds that would settle it: {need} ({at} reaches {calibrate.MIN_POWER:g} there; "
            f"this design runs {len(rs)}, declared in this module, with no sequential seeds)")
  return (f"no number of seeds up to 64 settles it: {at} is "
          f"{fmt_num(calibrate.threshold(sd, 64, R_MIN, CLAIMED_R)[1])} at 64 (the rule compares "
          "mean − std, the seeds' spread, with the threshold: seeds sharpen it little)")


def report(out_dir: Path) -> Report:
  reg = read_csv(Path(out_dir) / PART_WHOLE)
  if reg.empty or "r_complement" not in reg:
    return not_measured(RULE, f"{PART_WHOLE} is missing or empty (no gns/norm and gns/total "
                        "terms, or runs too short for 3 steps past the EMA warm-up)", NAME)
  at = reg[np.isclose(reg["alpha"], ALPHA)]
  rs = at["r_complement"].dropna().tolist()
  cal = calibrate.calibrate("threshold", float(np.std(rs, ddof=1)) if len(rs) > 1 else np.nan,
                            len(rs), R_MIN, CLAIMED_R, effect=CLAIMED_R)
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
  verdict = decide(rs)  # a threshold crossed either way is decided at any power; power gates
  settle = settle_text(rs) if verdict == PARTLY else None
  return gated(verdict, cal, (warm, same_budget(out_dir)), rule=RULE, paper=PAPER,  # the rest
               decided=["rule"] if verdict in (REPRODUCED, NOT_REPRODUCED) else (),
               ours=f"r(complement, norm) = {f('r_complement')} at α = {ALPHA:g}",
               checks=(f"slope {f('slope_complement')}; the norm group holds {f('share_g2')} of "
                       f"Σ|G|² and {f('share_s')} of ΣS, so the part-whole r of the total "
                       f"{f('r_total')} is not evidence", "Share of the parameters per type: "
                       + listing(by_type.items(), lambda v: f"{100 * v:.3g} %"),
                       null, *([settle] if settle else ()), declared_text(R_MIN_D, CLAIMED_D)),
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
    report=report, needs=("preconditioner",), rung=RUNG))
