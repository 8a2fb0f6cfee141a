"""Claim 3, follow-up: MicroAdamMSQ needs a floor under its preconditioner.

Our reading of MicroAdamMSQ, v = EMA_β2(max(ḡ² − σ̂²/B, 0)), puts v = 0 on every
coordinate whose batch mean is noise-dominated (ḡ² ≤ σ̂²/B), so its update
m̂/(√v̂ + ε) is ḡ/ε there. With Adam's ε = 1e-8 that diverges within a few steps at any
learning rate (see the preconditioner experiment). Here ε, the floor of √v̂, is swept for
MicroAdamMSQ beside Adam at the same ε values: does a μ²-dominated preconditioner with a
floor match or beat Adam (μ² + σ²/B)? Each (variant, ε)'s lr is chosen on seed 0 (a group
that diverges at every lr is searched downward, to 100x below its first grid), then it is
re-run there with fresh seeds (1, 2, 3 at the cpu preset), whose final eval losses alone
are reported and compared.

Verdict (`RULE`): "at least as well" is read as "not significantly worse". The ε of each
variant is the one whose seed-0 run at its chosen lr is lowest (selection on seed 0 only,
as the lr); the fresh seeds of that MicroAdamMSQ and that Adam are then compared by the
seed-noise rule of `experiments.verdict`: a win or a tie reproduces the claim; a loss is
partly reproduced if MicroAdamMSQ wins or ties against Adam at some same ε, else not
reproduced; fewer than two fresh seeds on a side is undetermined.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from experiments.record import ROWS, Experiment, Report, register
from experiments.sweep import Block, LrSearch, Sweep, base_for, fmt
from experiments.verdict import TIE, UNDETERMINED, WIN, compare, pairs_md

NAME = "msq_eps"
TITLE = "MicroAdamMSQ with a floor ε under its preconditioner"
CLAIM = ("A preconditioner dominated by μ² works at least as well as Adam's μ² + σ²/B "
         "(tested on MicroAdamMSQ, whose v is 0 where the mean is noise-dominated, so ε "
         "sets the floor of √v).")
GROUP = ("optimizer.variant", "optimizer.eps")
SEEDS = (1, 2, 3)  # fresh seeds at each (variant, ε)'s chosen lr (cpu, paper)
RULE = ("The best MicroAdamMSQ and the best Adam over ε (each picked, like its lr, on seed "
        "0 alone) are compared on their fresh seeds (1, 2, 3), MicroAdamMSQ losing when its "
        "seed mean exceeds Adam's by more than √(s_A² + s_B²) (diverged runs lose, < 2 seeds: "
        "undetermined): reproduced ('at least as well') on a win or a tie, partly reproduced "
        "on a loss if MicroAdamMSQ wins or ties against Adam at some same ε, else not "
        "reproduced.")


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    blocks = (Block({"optimizer.variant": ["micro_adam_msq"], "optimizer.eps": [1e-4],
                            "optimizer.lr": [3e-3], "train.seed": [0]}),)
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=0),
                        wall_estimate_min=0.3)
  if preset == "paper":
    lrs = [3e-4, 1e-3, 3e-3]
    blocks = (
        Block({"optimizer.variant": ["adam"], "optimizer.eps": [1e-8, 1e-4],
               "optimizer.lr": lrs, "train.seed": [0]}),
        Block({"optimizer.variant": ["micro_adam_msq"], "optimizer.eps": [1e-8, 1e-5, 1e-4],
               "optimizer.lr": lrs, "train.seed": [0]}),
    )
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=1, seeds=SEEDS))
  # cpu: three lrs (factor ~3) per variant centred on the best of a wider search run before
  # issue 11 (adam 3e-2 at both ε, at the grid's edge then; micro_adam_msq 1e-2); ε = 1e-8
  # of micro_adam_msq is left to the preconditioner experiment, where it diverges at every lr.
  blocks = (
      Block({"optimizer.variant": ["adam"], "optimizer.eps": [1e-8, 1e-4],
             "optimizer.lr": [1e-2, 3e-2, 1e-1], "train.seed": [0]}),
      Block({"optimizer.variant": ["micro_adam_msq"], "optimizer.eps": [1e-5, 1e-4],
             "optimizer.lr": [3e-3, 1e-2, 3e-2], "train.seed": [0]}),
  )
  return Sweep(base, blocks, LrSearch(GROUP, max_extend=2, seeds=SEEDS),
                      wall_estimate_min=20)


def _label(g: dict) -> str:
  return f"{g['optimizer.variant']}, eps={fmt(float(g['optimizer.eps']))}"


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  lr_search.analyze(table, fin, out_dir, GROUP)


def figures(out_dir: Path) -> list[Path]:
  return lr_search.figures(out_dir, GROUP, "MicroAdamMSQ vs Adam by ε", labeler=_label)


def _pick(best: pd.DataFrame, variant: str):
  """The group of `variant` whose seed-0 run at its chosen lr is lowest (None if none)."""
  rows = best[best["optimizer.variant"] == variant]
  if rows.empty:
    return None
  return rows.to_dict("records")[int(np.argmin(rows["select_loss"].to_numpy(dtype=float)))]


def report(out_dir: Path) -> Report:
  best = lr_search.load_best(out_dir, GROUP)
  groups = lr_search.by_label(best, _label)
  msq, adam = _pick(best, "micro_adam_msq"), _pick(best, "adam")
  same_eps = []
  if msq is None or adam is None:
    verdict, pairs = "not tested (no MicroAdamMSQ or no Adam group in this preset)", []
  else:
    head = compare(msq["values"], adam["values"], (_label(msq), _label(adam)))
    for r in best[best["optimizer.variant"] == "micro_adam_msq"].to_dict("records"):
      twin = _label({"optimizer.variant": "adam", "optimizer.eps": r["optimizer.eps"]})
      if twin in groups:
        same_eps.append(compare(r["values"], groups[twin], (_label(r), twin)))
    pairs = [head] + [p for p in same_eps if (p.a, p.b) != (head.a, head.b)]
    if head.outcome in (WIN, TIE):
      verdict = "reproduced"
    elif head.outcome == UNDETERMINED:
      verdict = "undetermined"
    else:  # LOSS
      verdict = ("partly reproduced" if any(p.outcome in (WIN, TIE) for p in same_eps)
                 else "not reproduced")
  finding = " ".join(x for x in [
      f"Rule: {RULE}",
      f"Fresh-seed final eval loss per (variant, ε) ({lr_search.POLICY}): "
      + lr_search.group_lines(best, _label) + ".",
      *(p.sentence() + "." for p in pairs),
      lr_search.search_notes(best, _label)] if x)
  numbers = lr_search.best_md(best, GROUP)
  if pairs:
    numbers += ("\n\nBest MicroAdamMSQ vs best Adam (first row), then MicroAdamMSQ vs Adam "
                "at the same ε:\n\n" + pairs_md(pairs))
  return Report(verdict=verdict, rule=RULE, finding=finding,
                claim_row="; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs)
                + " (fresh seeds at each group's lr; " + lr_search.group_lines(best, _label) + ")",
                numbers_md=numbers)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["3"], sweep=sweep, analyze=analyze,
    figures=figures, report=report))
