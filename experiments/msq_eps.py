"""Claim 3, follow-up: is MicroAdamMSQ's result its μ² preconditioner or its ε floor?

MicroAdamMSQ's v = EMA(max(ḡ² − σ̂²/B, 0)) is 0 where the batch mean is noise-dominated, and
there its update is m̂/ε. The controls: Adam at ε = 1 ≫ √v̂ (momentum) and at MicroAdamMSQ's ε.
Logged: eps_share, the share of coordinates where ε > √v̂ (per leaf and over all).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search, preconditioner
from pergrad.analysis import decide, guards, sequential
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.decide import NONINFERIOR, NOT_SEPARABLE, READING, WIN, WORSE
from pergrad.analysis.markdown import sections
from pergrad.analysis.rules import NOT_REPRODUCED, PARTLY, REPRODUCED, UNDETERMINED
from pergrad.analysis.runs import fmt, from_table, read_csv, stat_columns, write_csv
from pergrad.analysis.verdict import pairs_report, sequential_reading
from pergrad.sweep import Block, LrSearch, MoreSeeds, Sweep, base_for
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.more_seeds import NONINFERIORITY
from pergrad.sweep.record import Experiment, register

NAME = "msq_eps"
TITLE = "MicroAdamMSQ: its μ² preconditioner or its ε floor?"
CLAIM = ("A preconditioner dominated by μ² works at least as well as Adam's μ² + σ²/B "
         "(tested on MicroAdamMSQ, whose v is 0 where the mean is noise-dominated, so ε sets "
         "the floor of √v there).")
PAPER = "μ²-dominated ≥ Adam (qualitative)"
GROUP = ("optimizer.variant", "optimizer.eps")
MSQ, ADAM, CONTROL_EPS, CONTROL = "micro_adam_msq", "adam", 1.0, "control (adam, eps=1)"
SELECT, SEEDS = preconditioner.SELECT, preconditioner.SEEDS
LOG_EVERY = {"ci": 10, "cpu": 50, "paper": 500}
MARGIN, EFFECT = declared(NAME, "margin"), declared(NAME, "effect")
MOST_SEEDS = int(declared(NAME, "seed_cap").value)  # a pair still open: seeds up to it
INCONCLUSIVE = f"{UNDETERMINED}: neither within the margin of Adam nor worse beyond it"
RULE = (f"Every pair on the fresh seeds {SEEDS}, paired, the first look (as the "
        "preconditioner's: a pair still open there gets seeds on both arms up to "
        f"{MOST_SEEDS}, {sequential.READING}). MicroAdamMSQ vs Adam: non-inferior when the "
        "one-sided upper end of its excess loss is within the margin "
        f"({MARGIN.value:g} nats, declared), worse when the two-sided interval's lower end "
        "exceeds it, else open. MicroAdamMSQ "
        f"vs the ε-only control (ε = 1) and vs Adam at MicroAdamMSQ's ε: {READING}. "
        "Not reproduced if MicroAdamMSQ is worse "
        "than Adam beyond the margin; "
        "reproduced if it is non-inferior to Adam and beats both controls; partly reproduced "
        "if it does not beat a control (ε can explain it; a control not run is not beaten); "
        "undetermined if the "
        "MicroAdamMSQ-Adam comparison is.")


def sweep(preset: str, inputs=None) -> Sweep:
  base = base_for(NAME, preset, **{"stats.log_every": LOG_EVERY[preset]})
  if preset == "ci":
    return Sweep(base, (Block({"optimizer.variant": [MSQ], "optimizer.eps": [1e-4],
                               "optimizer.lr": [3e-3], "train.seed": list(SELECT)}),),
                 LrSearch(GROUP, max_extend=0), wall_estimate_min=0.5)
  best = preconditioner.chosen(lr_search.tuned_best(inputs, "preconditioner"))
  best = best[best["optimizer.clip_norm"].isna()].set_index("optimizer.variant")
  fixed = tuple(Block({"optimizer.variant": [v], **{k: [float(best.loc[v, k])] for k in (
      "optimizer.eps", "optimizer.lr")}, "train.seed": list(SEEDS)}) for v in (MSQ, ADAM))
  eps_msq, lr_adam = float(best.loc[MSQ, "optimizer.eps"]), float(best.loc[ADAM, "optimizer.lr"])
  ctrl = (Block({"optimizer.variant": [ADAM], "optimizer.eps": [CONTROL_EPS],
                 "optimizer.lr": [x * (3.0 if preset == "cpu" else 0.3) for x in (0.5, 1, 2)],
                 "train.seed": list(SELECT)}),
          Block({"optimizer.variant": [ADAM], "optimizer.eps": [eps_msq],
                 "optimizer.lr": preconditioner.grid(lr_adam), "train.seed": list(SELECT)}))
  msq = {"optimizer.variant": MSQ, "optimizer.eps": eps_msq,
         "optimizer.lr": float(best.loc[MSQ, "optimizer.lr"])}
  adam = {"optimizer.variant": ADAM, "optimizer.eps": float(best.loc[ADAM, "optimizer.eps"]),
          "optimizer.lr": lr_adam}  # the fixed Adam arm, MicroAdamMSQ's non-inferiority pair

  def compared(searched) -> list[tuple]:  # MicroAdamMSQ vs Adam, and vs each control at its lr
    keys = (*GROUP, "optimizer.lr")
    return [(msq, adam, NONINFERIORITY), *((msq, {k: from_table(r[k]) for k in keys})
                                           for r in searched.to_dict("records")
                                           if r["optimizer.variant"] == ADAM)]
  more = MoreSeeds(compared, EFFECT.value, most=MOST_SEEDS)
  # cpu: 2 × 5 fixed + 2 × (3 lrs × 2 selection + 5 fresh) = 32 runs (+ more seeds)
  return Sweep(base, (*ctrl, *fixed), LrSearch(GROUP, factor=2 ** 0.5, max_extend=2, seeds=SEEDS,
                                               more=more),
               wall_estimate_min=26 if preset == "cpu" else None)


def label(g: dict) -> str:
  eps = float(g["optimizer.eps"])
  if g["optimizer.variant"] == ADAM and eps == CONTROL_EPS:
    return CONTROL
  return f"{g['optimizer.variant']}, eps={fmt(eps)}"


def eps_share(table: pd.DataFrame) -> pd.DataFrame:
  """Per run: its group, seed and the mean over its logged steps of each `opt/<leaf>/eps_share*`."""
  cols = [c for n in ("eps_share", "eps_share_weighted") for c in stat_columns(table, n, "opt")]
  keys = [k for k in (*GROUP, "optimizer.lr", "train.seed") if k in table]
  rows = [{**{k: g[k].iloc[0] for k in keys},
           **{c[4:].replace("all/", ""): float(g[c].dropna().mean()) for c in cols}}
          for _, g in table.groupby("run", sort=False)] if cols else []
  return pd.DataFrame(rows, columns=None if rows else [*keys, "eps_share"])


def analyze(runs, out_dir):
  lr_search.analyze(runs, out_dir, GROUP)
  write_csv(eps_share(runs.table), Path(out_dir) / "eps_share.csv")


figures = functools.partial(lr_search.figures, group_keys=GROUP, labeler=label,
                            title="MicroAdamMSQ, Adam and the ε controls")


def arms(out_dir: Path) -> dict[str, tuple[list[float], list[float]]]:
  """{label: (fresh seeds, their final eval losses)}, in seed order: the searched groups' fresh
  seeds, the fixed runs."""
  fin = read_csv(Path(out_dir) / "finals.csv")
  best = lr_search.load_best(out_dir)
  out = {k: (list(v), list(v.values())) for k, v in lr_search.by_label(best, label, SEEDS).items()}
  for v in (MSQ, ADAM):
    eps = fin["optimizer.eps"].astype(float)
    rows = fin[(fin["optimizer.variant"] == v) & ~np.isclose(eps, CONTROL_EPS)
               & ~fin["train.seed"].isin(SELECT)]
    for key, g in rows.groupby("optimizer.eps"):
      name = label({"optimizer.variant": v, "optimizer.eps": key})
      if not out.get(name, ((), ()))[1] and g["optimizer.lr"].nunique() == 1:
        g = g.sort_values("train.seed")
        out[name] = (g["train.seed"].astype(float).tolist(),
                     g["final_eval_loss"].astype(float).tolist())
  return out


def arm_of(r: dict) -> tuple[str, str, str]:
  """A run's or a search row's arm as `inherited` compares them: (variant, ε, lr), `fmt`ed."""
  return (r["optimizer.variant"], fmt(float(r["optimizer.eps"])), fmt(float(r["optimizer.lr"])))


def inherited(out_dir, ran: set[tuple[str, str, str]]) -> tuple[guards.Guard, ...]:
  """The preconditioner's guards on what `sweep` takes from its search (MicroAdamMSQ's ε and
  lr, Adam's lr), read from its best.csv beside this report: each lr bracketed and stable
  there, MicroAdamMSQ's ε bracketed (`preconditioner.eps_bracketed`). Bracketed fails without
  it, or where the arms `ran` (`arm_of`) are not its choice (a
  search re-run since: its guards would vouch for arms this sweep did not run)."""
  src = Path(out_dir).parent / preconditioner.NAME
  if not (src / "best.csv").exists():
    return (guards.Guard("bracketed", False, f"no {preconditioner.NAME}/best.csv beside this "
                         "report: the ε and lrs taken from its search are unchecked; run "
                         f"`scripts/reproduce.py {preconditioner.NAME}` first"),)
  every = lr_search.load_best(src)
  best = preconditioner.chosen(every)
  best = best[best["optimizer.clip_norm"].isna() & best["optimizer.variant"].isin((MSQ, ADAM))]
  choice = {arm_of(r) for r in best.to_dict("records")}
  if not ran <= choice:
    return (guards.Guard("bracketed", False, f"this sweep ran {sorted(ran - choice)}, but "
                         f"{preconditioner.NAME}'s search chose {sorted(choice)}: re-run "
                         f"`scripts/reproduce.py {NAME}`"),)
  bracket, stable, _ = lr_search.guards_of(best, preconditioner.label)
  eps = preconditioner.eps_bracketed(every, best)
  return tuple(guards.Guard(x.name, x.ok, f"{preconditioner.NAME}'s search: {x.why}")
               for x in (bracket, stable, eps, lr_search.selected(every)))


def report(out_dir):
  seeds_values = arms(out_dir)
  g = {k: dict(zip(seeds, values, strict=True)) for k, (seeds, values) in seeds_values.items()}
  msq = next((n for n in g if n.startswith(MSQ)), MSQ)
  eps = msq.split("eps=")[-1]
  adam = next((n for n in g if n.startswith(ADAM + ",") and n.split("eps=")[-1] != eps), ADAM)
  planned = (CONTROL, f"{ADAM}, eps={eps}")  # the ε-only and the ε-matched control
  controls = [c for c in planned if c in g]

  def verdict(pairs):  # "beats both controls": a control not run cannot have been beaten
    head = pairs[0].outcome
    return (NOT_REPRODUCED if head == WORSE else INCONCLUSIVE if head == NOT_SEPARABLE
            else REPRODUCED if head == NONINFERIOR and len(pairs) == 1 + len(planned)
            and all(p.outcome == WIN for p in pairs[1:]) else PARTLY)

  get = lambda k: g.get(k, {})
  design = MoreSeeds(None, EFFECT.value, most=MOST_SEEDS).design(len(SEEDS))
  comparisons = [sequential_reading(decide.compare(get(msq), get(adam), (msq, adam),
                                                 effect=MARGIN.value, margin=MARGIN.value,
                                                 noninferiority=True),
                                  get(msq), get(adam), design, noninferiority=True),
                 *(sequential_reading(decide.compare(get(msq), get(c), (msq, c),
                                                     effect=EFFECT.value, margin=EFFECT.value),
                                      get(msq), get(c), design) for c in controls)]

  shares = read_csv(Path(out_dir) / "eps_share.csv")
  cols = [c for c in (*GROUP, "train.seed", "eps_share", "eps_share_weighted") if c in shares]
  share_md = sections("", "eps_share per run (mean over its logged steps):",
                      shares[cols]) if len(shares) else ""
  expected = [(msq, c) for c in (adam, *controls)]
  used = {x for p in expected for x in p}
  best = lr_search.load_best(out_dir)  # the controls' searches; MicroAdamMSQ's and Adam's lr
  bracket, stable, _ = lr_search.guards_of(best, label, used)  # the controls'; the others'
  # lrs and MicroAdamMSQ's ε were the preconditioner's: its guards on them (`inherited`)
  fin = read_csv(Path(out_dir) / "finals.csv")
  fixed = lr_search.stable_of(fin[fin["train.seed"].isin(SEEDS)], label, {msq, adam})
  ran = {arm_of(r) for r in fin[fin["train.seed"].isin(SEEDS)].to_dict("records")
         if label(r) in (msq, adam)}
  warm = lr_search.warm_of(fin, label, used)
  pilot = guards.pilot_first({k: seeds_values[k][0] for k in used if k in seeds_values},
                             SEEDS)
  return pairs_report(
      g, expected, rule=RULE, paper=PAPER,
      checked=(*inherited(out_dir, ran), bracket, stable, fixed, warm, pilot,
               lr_search.selected(best), same_budget(out_dir)),
      effect=EFFECT.value, verdict_fn=verdict, comparisons=comparisons,
      checks=(declared_text(MARGIN, EFFECT),),
      numbers_md=lr_search.best_md(lr_search.load_best(out_dir), GROUP) + share_md)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C3, ours: MicroAdamMSQ at its tuned ε vs Adam',
    rank=4, stream=0, sweep=sweep, analyze=analyze, figures=figures, report=report,
    needs=("preconditioner",)))
