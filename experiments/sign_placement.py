"""Claim 2: where the sign sits in "per-example -> batch mean -> EMA" matters.

Placements (see `pergrad.optim`): `example` u = EMA(mean_i sign g_i), `token` the same
with per-token contributions, `batch` u = EMA(sign ḡ), `ema` u = sign(EMA ḡ) (SignEMA).
Each placement is compared at its own best learning rate (U-curves over a grid that is
extended automatically past an edge), then re-run with a second seed at that rate.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments import lr_search
from experiments.report_md import fmt_num
from experiments.sweep import Block, LrSearch, Sweep, base_for

NAME = "sign_placement"
TITLE = "where to put the sign in signSGD"
CLAIM = ("The later the sign in the chain per-example -> batch mean -> EMA, the better: "
         "SignEMA (sign of the EMA) wins, per-example sign is slowest/least stable.")
GROUP = ("optimizer.placement",)
ORDER = ("example", "token", "batch", "ema")  # early -> late


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    blocks = (Block({"optimizer.placement": ["example", "ema"],
                            "optimizer.lr": [1e-2], "train.seed": [0]}),)
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=0, seeds=(1,)),
                        wall_estimate_min=0.5)
  # Per-example signs average to ~sqrt(2/pi)·μ/σ << 1, so early placements need larger lrs.
  early = [3e-4, 1e-3, 3e-3, 1e-2]
  late = [1e-4, 3e-4, 1e-3, 3e-3]
  if preset == "paper":
    early, late = [1e-4, 3e-4, 1e-3, 3e-3], [3e-5, 1e-4, 3e-4, 1e-3]
  blocks = (
      Block({"optimizer.placement": ["example", "token"], "optimizer.lr": early,
                    "train.seed": [0]}),
      Block({"optimizer.placement": ["batch", "ema"], "optimizer.lr": late,
                    "train.seed": [0]}),
  )
  return Sweep(base, blocks, LrSearch(GROUP, max_extend=3, seeds=(1,)),
                      wall_estimate_min=25 if preset == "cpu" else None)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  lr_search.analyze(table, fin, out_dir, GROUP)


def figures(out_dir: Path) -> list[Path]:
  return lr_search.figures(out_dir, GROUP, "sign placement")


def report(out_dir: Path) -> dict:
  best = pd.read_csv(Path(out_dir) / "best.csv")
  best = best.set_index("optimizer.placement")
  present = [p for p in ORDER if p in best.index]
  losses = {p: float(best.loc[p, "loss_mean"]) for p in present}
  stds = {p: float(best.loc[p, "loss_std"]) for p in present}
  ranking = sorted(present, key=lambda p: losses[p])
  later_better = all(losses[a] >= losses[b] for a, b in zip(present, present[1:], strict=False)
                     if a != "token" and b != "token")
  winner = ranking[0]
  if winner == "ema" and later_better:
    verdict = "reproduced"
  elif winner == "ema" or (later_better and "ema" in present):
    verdict = "partly reproduced"
  else:
    verdict = "not reproduced"
  edges = [p for p in present if bool(best.loc[p, "at_edge"])]
  finding = (
      "At each placement's best lr, final eval loss ranks "
      + " < ".join(f"{p} ({fmt_num(losses[p])}±{fmt_num(stds[p], 2)})"
                   for p in ranking)
      + f". Winner: `{winner}`; monotone in placement (example→batch→ema): {later_better}.")
  if edges:
    finding += (f" Caution: best lr at the edge of the grid for {edges} (grid extended "
                "as far as allowed; see best.csv).")
  return {
      "verdict": verdict,
      "finding": finding,
      "claim_row": " < ".join(f"{p} {fmt_num(losses[p])}" for p in ranking)
      + " (final eval loss at each placement's best lr, mean over seeds)",
      "numbers_md": lr_search.best_md(best.reset_index(), GROUP),
  }
