"""G3, the paper's own comparison (Gray et al. 2024): a batch-size ramp linear in tokens from
B_max/8 to B_max over the whole budget reaches the fixed B_max run's final loss with fewer
tokens (18 % on a Chinchilla-optimal model).

As the authors' code runs it: both arms at the fixed B_max run's tuned lr (factor-2 grid on
seed 0, extended until bracketed), the lr schedule indexed by tokens, the same tokens; the
model is sized so the budget is ~20 tokens per parameter (configs/experiment/gns_ramp.yaml).
Arms: fixed_<B_max>, ramp (sizes every B_max/8 from B_max/8), short (fixed_<B_max> on 82 % of
the tokens: Δ18, beside). The fresh seeds are the first look: ramp vs fixed still open there
gets seeds on both arms up to the cap declared in the YAML (`pergrad.sweep.more_seeds`, after
the ramp's pilot: `experiments.runner`). The stronger comparison, against the best fixed batch,
is gns_schedule's ("beyond the paper").
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from pergrad.analysis import decide, guards, sequential
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.markdown import listing, sections
from pergrad.analysis.plots import plt, savefig, style
from pergrad.analysis.report import not_measured
from pergrad.analysis.runs import (
  DONE,
  eval_curves,
  read_csv,
  seed_mean,
  seed_mean_to_target,
  to_target,
  write_csv,
)
from pergrad.analysis.verdict import calibration_of, gated, sequential_reading
from pergrad.sweep import (
  Block,
  LrSearch,
  MoreSeeds,
  Sweep,
  base_for,
  best_lr,
  experiment_value,
  family,
  is_rung,
  scale_value,
  with_warmup,
)
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, Rung, register

NAME = "gns_ramp"
TITLE = "the paper's test: a linear batch-size ramp against the fixed B_max run"
CLAIM = ("A batch-size ramp linear in tokens from B_max/7.5 (the paper's 2 to 15 accumulation "
         "steps; B_max/8 here) to B_max, at the fixed B_max run's lr, reaches that run's final "
         "loss with 18% fewer tokens on a Chinchilla-optimal model (Gray et al., arXiv "
         "2411.00999).")
PAPER = "18% fewer tokens to the fixed B_max run's final loss"
EFFECT, TPP = declared(NAME, "effect"), declared(NAME, "tokens_per_param")
SPAN = declared(NAME, "tokens_per_param_span")
MOST_SEEDS = int(declared(NAME, "seed_cap").value)  # ramp vs fixed still open: seeds up to it
SIZE, STEPS, SELECT_SEED, SHORT = "data.batch_size", "train.steps", 0, 0.82
MAX_EXTEND = 4  # the fixed run's lr grid grows ≤ 4 × 2 past an edge (2 stopped at its top)
GROUP = ("batch.kind", STEPS)  # the short arm: a group of its own (its steps in its name)
SEEDS = {"ci": (1,), "cpu": (1, 2, 3, 4, 5, 6), "paper": (1, 2, 3, 4, 5, 6)}
N_EVALS = {"ci": 5, "cpu": 25, "paper": 25}
RULE = (f"The ramp (B_max/8 to B_max linear in tokens over the budget) vs the fixed B_max run, "
        f"both at the fixed run's tuned lr and fresh seeds {SEEDS['cpu']}, in final eval loss at "
        f"equal tokens, paired on their shared seeds (the first look: still open there, seeds "
        f"on both arms up to {MOST_SEEDS}, {sequential.READING}): {decide.READING} (margin and "
        "effect "
        f"declared: {EFFECT.value:g} nats); {decide.VERDICT}. The token saving to the fixed "
        "run's final loss (seed-mean curves) is the paper's figure, reported beside; the regime "
        "guard checks tokens per parameter.")


def max_batch_size(preset: str) -> int:
  return 2 * int(scale_value(preset, "data.batch_size"))


def sweep(preset: str) -> Sweep:
  """The fixed B_max run's lr search (the ramp and the short arm come in `follow_up`)."""
  b, ci = max_batch_size(preset), family(preset) == "ci"
  examples = int(scale_value(preset, "data.batch_size")) * int(scale_value(preset, "train.steps"))
  steps = examples // b
  base = base_for(NAME, preset, **{
      **rung_model(preset),
      SIZE: b, "train.eval_every": max(steps // N_EVALS[family(preset)], 1),
      "schedule.warmup_steps": max(int(scale_value(preset, "schedule.warmup_steps")),
                                   guards.MIN_WARMUP if not ci else 1),
      "batch.start": b // 8,  # ci: powers of two (4 compiled sizes, not 8)
      **({} if ci else {"batch.sizes": list(range(b // 8, b + 1, b // 8))}),
      "logging.log_every": 1 if ci else 5})
  lrs = ([float(experiment_value(NAME, "optimizer.lr"))] if ci else [5e-3, 1e-2, 2e-2, 4e-2])
  block = Block({"batch.kind": ["fixed"], STEPS: [steps], "optimizer.lr": lrs,
                 "train.seed": [SELECT_SEED]})
  more = None if ci else MoreSeeds(functools.partial(compared, preset), EFFECT.value,
                                   most=MOST_SEEDS)
  search = LrSearch(GROUP, factor=2.0, max_extend=0 if ci else MAX_EXTEND,
                    seeds=SEEDS[family(preset)], more=more)
  return Sweep(base, (block,), search, wall_estimate_min={"ci": 0.5, "cpu": 8}.get(preset))


def design():
  """The sequential design ramp vs fixed is read by (`sweep.MoreSeeds`: the cpu and paper
  pilot, then the cap)."""
  return MoreSeeds(None, EFFECT.value, most=MOST_SEEDS).design(len(SEEDS["cpu"]))


def ramp_arm(preset: str, lr: float, steps: int) -> dict:
  """The ramp's settings at the fixed run's chosen lr and steps (the run's own budget)."""
  tokens = steps * max_batch_size(preset) * int(scale_value(preset, "data.seq_len"))
  return {"batch.kind": "linear", "batch.ramp_tokens": tokens, STEPS: steps, "optimizer.lr": lr}


def compared(preset: str, best) -> list[tuple[dict, dict]]:
  """(fixed B_max, ramp) at the fixed run's chosen lr: the pair `MoreSeeds` adds seeds to."""
  row = best[best["batch.kind"] == "fixed"].to_dict("records")
  if not row:
    return []
  lr, steps = float(row[0]["optimizer.lr"]), int(row[0][STEPS])
  return [({"batch.kind": "fixed", STEPS: steps, "optimizer.lr": lr},
           ramp_arm(preset, lr, steps))]


def rung_model(preset: str) -> dict:
  """A ladder rung's model (the model.* its scale file sets: this experiment's config sets its
  own, which the rung's replaces); {} at a base preset."""
  if not is_rung(preset):
    return {}
  keys = ("n_layers", "d_model", "n_heads", "d_ff")
  return {f"model.{k}": int(scale_value(preset, f"model.{k}")) for k in keys}


def follow_up(preset: str, sweep_dir: Path) -> tuple[Block, ...]:
  """The ramp at the fixed run's chosen lr and fresh seeds, the short arm on 3 of them."""
  from pergrad.analysis.runs import aggregate, finals

  table = aggregate(sweep_dir)
  best = fixed_best(finals(table)) if not table.empty else None
  if best is None:
    return ()
  lr, seeds, steps = float(best["optimizer.lr"]), list(SEEDS[family(preset)]), int(best[STEPS])
  ramp = {k: [v] for k, v in ramp_arm(preset, lr, steps).items()}  # its steps in its name
  return (Block({**ramp, "train.seed": seeds}),
          Block({"batch.kind": ["fixed"], STEPS: [int(round(SHORT * steps))], "optimizer.lr": [lr],
                 "train.seed": seeds[:3]}))


def fixed_best(fin: pd.DataFrame) -> dict | None:
  """The fixed B_max run's `best_lr` row (the short arm, without a selection seed,
  has no row), None before it."""
  best = best_lr(fin[fin["batch.kind"] == "fixed"], GROUP, "optimizer.lr",
                           select_seed=SELECT_SEED)
  return None if best.empty else best.iloc[0].to_dict()


def arm(row: dict, steps: float | None = None) -> str:
  """ramp | fixed | short (a fixed run with fewer than `steps` steps)."""
  if row.get("batch.kind") == "linear":
    return "ramp"
  return "short" if steps is not None and float(row.get(STEPS)) < steps else "fixed"


def analyze(runs, out_dir: Path) -> None:
  """finals.csv, best.csv (the fixed run's lr search), curves.csv, to_target.csv (the judged
  runs at the chosen lr, fresh seeds), regime.csv (tokens per parameter)."""
  out_dir, table = Path(out_dir), runs.table
  fin = with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, out_dir / "finals.csv")
  best = best_lr(fin[fin["batch.kind"] == "fixed"], GROUP, "optimizer.lr",
                           select_seed=SELECT_SEED)
  write_csv(best, out_dir / "best.csv")
  if best.empty:
    return
  lr, steps = float(best["optimizer.lr"].iloc[0]), float(best[STEPS].iloc[0])
  judged = table[np.isclose(table["optimizer.lr"].astype(float), lr)  # finished runs only
                 & (table["train.seed"] != SELECT_SEED) & table["status"].isin(DONE)]
  cur = eval_curves(judged, lambda g: arm(g.iloc[0].to_dict(), steps))
  write_csv(cur, out_dir / "curves.csv")
  write_csv(to_target(cur, "fixed", fin), out_dir / "to_target.csv")
  write_regime(table, float(cur.loc[cur["arm"] == "fixed", "tokens"].max()), out_dir, NAME)


def write_regime(table: pd.DataFrame, tokens: float, out_dir: Path, name: str) -> None:
  """regime.csv: the model's parameters (from the sweep's overrides), the tokens of one run,
  tokens per parameter."""
  from pergrad.analysis import n_params

  n = n_params(table.attrs.get("overrides") or [f"experiment={name}"])
  write_csv(pd.DataFrame([{"n_params": n, "tokens": tokens, "tokens_per_param": tokens / n}]),
            Path(out_dir) / "regime.csv")


def regime_guard(out_dir: Path) -> tuple[guards.Guard, float]:
  """(`guards.in_regime` of regime.csv's tokens per parameter against the declared
  Chinchilla-proportioned budget, TPP ÷× SPAN; that value, NaN unmeasured)."""
  regime = read_csv(Path(out_dir) / "regime.csv")
  tpp = float(regime["tokens_per_param"].iloc[0]) if len(regime) else math.nan
  return guards.in_regime({"tokens per parameter": tpp}, [guards.Regime(
      "tokens per parameter", TPP.value / SPAN.value, TPP.value * SPAN.value, TPP.why)]), tpp


def figures(out_dir: Path) -> list[Path]:
  """Seed-mean eval loss and batch size against tokens, the fixed run's final loss marked."""
  cur = read_csv(Path(out_dir) / "curves.csv")
  fig, axes = plt().subplots(1, 2, figsize=(11, 4.2))
  for name, g in cur.groupby("arm", sort=True):
    m = seed_mean(g, ["tokens", "eval_loss", "batch_size"])
    axes[0].plot(m["tokens"], m["eval_loss"], label=name)
    axes[1].step(m["tokens"], m["batch_size"], where="post", label=name)
  tt = read_csv(Path(out_dir) / "to_target.csv")
  if len(tt):
    axes[0].axhline(float(tt["target"].iloc[0]), color="k", lw=0.8, ls="--",
                    label="fixed B_max's final loss")
  for ax, y in zip(axes, ("eval loss", "batch size"), strict=True):
    style(ax, xlabel="tokens seen", ylabel=y, legend=8, grid=True)
  return [savefig(fig, Path(out_dir) / "gns_ramp.png")]


def report(out_dir: Path):
  out_dir = Path(out_dir)
  tt = read_csv(out_dir / "to_target.csv")
  if tt.empty:
    return not_measured(RULE, "the fixed B_max run has no fresh seeds at its chosen lr", NAME,
                        paper=PAPER)
  losses = {k: dict(zip(g["train.seed"].astype(float), g["final_eval_loss"].astype(float),
                        strict=True)) for k, g in tt.groupby("arm")}
  ramp, fixed = losses.get("ramp", {}), losses.get("fixed", {})
  pair = decide.compare(ramp, fixed, ("ramp", "fixed"), effect=EFFECT.value, margin=EFFECT.value)
  pair = sequential_reading(pair, ramp, fixed, design())  # ci's one seed: its own reading
  verdict, cals = decide.verdict_of([pair]), {"ramp vs fixed": calibration_of(pair)}
  best = lr_search.load_best(out_dir)
  bracket, stable, _ = lr_search.guards_of(best, lambda r: "fixed")
  warm = lr_search.warm_of(read_csv(out_dir / "finals.csv"), arm, {"ramp", "fixed"})  # every run
  in_regime, tpp = regime_guard(out_dir)
  regime = read_csv(out_dir / "regime.csv")
  cur = read_csv(out_dir / "curves.csv")
  target = float(tt["target"].iloc[0])
  mean_tt = seed_mean_to_target(cur, "fixed", target).set_index("arm")
  save = listing(((a, mean_tt.loc[a, "token_saving"]) for a in ("ramp",) if a in mean_tt.index),
                 lambda x: f"{100 * x:.1f}%" if math.isfinite(x) else
                 "no reference (the fixed run missed its own target)" if x != x else "not reached")
  short, full = list(losses.get("short", {}).values()), list(losses.get("fixed", {}).values())
  delta = float(np.mean(short) - np.mean(full)) if short and full else math.nan
  pilot = guards.pilot_first({"ramp": sorted(ramp), "fixed": sorted(fixed)}, SEEDS["cpu"])
  checked = (bracket, stable, warm, in_regime, pilot, same_budget(out_dir))
  return gated(verdict, cals, checked, rule=RULE,
               decided=list(cals),
               paper=PAPER, ours=f"token saving to fixed B_max's final loss: {save or 'n/a'}; "
               f"ramp vs fixed: {pair.outcome}",
               checks=(pair.sentence(), f"fixed B_max at lr {best['optimizer.lr'].iloc[0]:g}",
                       f"{tpp:.1f} tokens per parameter", f"Δ18 = {delta:.3g}",
                       declared_text(EFFECT, TPP, SPAN)),
               numbers_md=sections(lr_search.best_md(best, GROUP),
                                   f"To the fixed run's final loss {target:.4f}:",
                                   mean_tt.reset_index(), "Regime:", regime))


def ladder_value(out_dir: Path) -> float:
  """The ramp's token saving to fixed B_max's final loss (NaN without runs)."""
  tt, cur = read_csv(Path(out_dir) / "to_target.csv"), read_csv(Path(out_dir) / "curves.csv")
  if tt.empty or cur.empty:
    return np.nan
  saving = seed_mean_to_target(cur, "fixed", float(tt["target"].iloc[0])).set_index("arm")
  return float(saving.loc["ramp", "token_saving"]) if "ramp" in saving.index else np.nan


def rung_runs(b: int, steps: int, fam: str) -> list[tuple[int, int]]:
  """4 lrs at B_max = 2B, 6 ramps (mean B ≈ 9/16 B_max), 3 short arms at B_max."""
  ex = b * steps
  return ([(2 * b, ex // (2 * b))] * 4 + [(9 * b // 8, ex * 8 // (9 * b))] * 6
          + [(2 * b, int(0.82 * ex) // (2 * b))] * 3)

RUNG = Rung("G3", "G3: token saving of the ramp (paper: 18 %)", 0.18, ladder_value, rung_runs,
            own_model=False)
EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row="G3. A linear batch ramp saves 18 % of tokens",
    papers_test=True, rank=10, stream=1, sweep=sweep, analyze=analyze, figures=figures,
    report=report, follow_up=follow_up, rung=RUNG))
