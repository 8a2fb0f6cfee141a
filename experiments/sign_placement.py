"""Claim 2: where the sign sits in "per-example -> batch mean -> EMA" matters.

Placements (see `pergrad.optim`): `example` u = EMA(mean_i sign g_i), `token` the same
with per-token contributions, `batch` u = EMA(sign ḡ), `ema` u = sign(EMA ḡ) (SignEMA).
Each placement's learning rate is chosen on seed 0 (U-curves over a grid that is extended
automatically past an edge, and downward while every run diverged), then the placement is
re-run at that rate with fresh seeds (1, 2, 3 at the cpu preset), whose final eval losses
alone are reported and compared (`experiments.lr_search`).

Verdict (`RULE`): the claim predicts the two chains ema < batch < example and
ema < batch < token (final eval loss, lower is better); every adjacent pair of both
chains (ema–batch, batch–example, batch–token) is decided by the seed-noise rule of
`experiments.verdict`, and none is dropped (a placement this preset does not run is
named, and its pairs are undetermined).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments import lr_search
from experiments.record import ROWS, Experiment, Report, register
from experiments.sweep import Block, LrSearch, Sweep, base_for
from experiments.verdict import PAIR_WIN, PAIRS_VERDICT, chains, pairs_md

NAME = "sign_placement"
TITLE = "where to put the sign in signSGD"
CLAIM = ("The later the sign in the chain per-example -> batch mean -> EMA, the better: "
         "SignEMA (sign of the EMA) wins, per-example sign is slowest/least stable.")
GROUP = ("optimizer.placement",)
ORDER = ("example", "token", "batch", "ema")  # early -> late
CHAINS = (("ema", "batch", "example"), ("ema", "batch", "token"))  # predicted, best first
SEEDS = (1, 2, 3)  # fresh seeds at each placement's chosen lr (cpu, paper)
RULE = ("Expected ema < batch < example and ema < batch < token in final eval loss on the "
        "fresh seeds (1, 2, 3; seed 0 only picks the lr), each adjacent pair "
        + PAIR_WIN + ": " + PAIRS_VERDICT + ".")


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    blocks = (Block({"optimizer.placement": ["example", "ema"],
                            "optimizer.lr": [1e-2], "train.seed": [0]}),)
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=0, seeds=(1,)),
                        wall_estimate_min=0.5)
  # Per-example signs average to ~sqrt(2/pi)·μ/σ << 1, so early placements need larger lrs.
  if preset == "paper":
    grids = {"example": [1e-4, 3e-4, 1e-3, 3e-3], "token": [1e-4, 3e-4, 1e-3, 3e-3],
             "batch": [3e-5, 1e-4, 3e-4, 1e-3], "ema": [3e-5, 1e-4, 3e-4, 1e-3]}
  else:  # cpu: three lrs (factor ~3) centred on the best of a wider search (ema 3e-3,
    # batch 2.7e-2, example 3e-2, token 1e-2); a best at an edge extends the grid.
    grids = {"example": [1e-2, 3e-2, 1e-1], "token": [3e-3, 1e-2, 3e-2],
             "batch": [1e-2, 3e-2, 1e-1], "ema": [1e-3, 3e-3, 1e-2]}
  blocks = tuple(Block({"optimizer.placement": [k], "optimizer.lr": lrs, "train.seed": [0]})
                 for k, lrs in grids.items())
  return Sweep(base, blocks, LrSearch(GROUP, max_extend=3, seeds=SEEDS),
                      wall_estimate_min=20 if preset == "cpu" else None)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  lr_search.analyze(table, fin, out_dir, GROUP)


def figures(out_dir: Path) -> list[Path]:
  return lr_search.figures(out_dir, GROUP, "sign placement")


def _label(g: dict) -> str:
  return str(g["optimizer.placement"])


def report(out_dir: Path) -> Report:
  best = lr_search.load_best(out_dir)
  groups = lr_search.by_label(best, _label)
  orders = [[p for p in chain if p in groups] for chain in CHAINS]
  orders = [o for o in orders if len(o) > 1]
  absent = [p for p in ORDER if p not in groups]
  if not orders:
    verdict, pairs = "not tested (fewer than two placements in this preset)", []
  else:
    verdict, pairs = chains(groups, orders)
  finding = " ".join(x for x in [
      f"Rule: {RULE}",
      f"Fresh-seed final eval loss per placement ({lr_search.POLICY}): "
      + lr_search.group_lines(best, _label) + ".",
      *(p.sentence() + "." for p in pairs),
      f"Not run in this preset: {absent} (their pairs are not compared)." if absent else "",
      lr_search.search_notes(best, _label)] if x)
  claim_row = ("; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs)
               + " (fresh seeds at each placement's lr; " + lr_search.group_lines(best, _label)
               + ")")
  return Report(
      verdict=verdict,
      rule=RULE,
      finding=finding,
      claim_row=claim_row,
      numbers_md=lr_search.best_md(best, GROUP)
      + ("\n\nPairs of the predicted chains:\n\n" + pairs_md(pairs) if pairs else ""),
  )


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["2"], sweep=sweep, analyze=analyze,
    figures=figures, report=report))
