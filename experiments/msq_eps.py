"""Claim 3, follow-up: MicroAdamMSQ needs a floor under its preconditioner.

Our reading of MicroAdamMSQ, v = EMA_β2(max(ḡ² − σ̂²/B, 0)), puts v = 0 on every
coordinate whose batch mean is noise-dominated (ḡ² ≤ σ̂²/B), so its update
m̂/(√v̂ + ε) is ḡ/ε there. With Adam's ε = 1e-8 that diverges within a few steps at any
learning rate (see results/preconditioner). Here ε, the floor of √v̂, is swept for
MicroAdamMSQ beside Adam at the same ε values, each at its own best learning rate: does a
μ²-dominated preconditioner with a floor match or beat Adam (μ² + σ²/B)?
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments import lr_search
from experiments.report_md import fmt_num
from experiments.sweep import Block, LrSearch, Sweep, base_for, fmt

NAME = "msq_eps"
TITLE = "MicroAdamMSQ with a floor ε under its preconditioner"
CLAIM = ("A preconditioner dominated by μ² works at least as well as Adam's μ² + σ²/B "
         "(tested on MicroAdamMSQ, whose v is 0 where the mean is noise-dominated, so ε "
         "sets the floor of √v).")
GROUP = ("optimizer.variant", "optimizer.eps")


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    blocks = (Block({"optimizer.variant": ["micro_adam_msq"], "optimizer.eps": [1e-4],
                            "optimizer.lr": [3e-3], "train.seed": [0]}),)
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=0),
                        wall_estimate_min=0.3)
  lrs = [1e-3, 3e-3, 1e-2] if preset == "cpu" else [3e-4, 1e-3, 3e-3]
  blocks = (
      Block({"optimizer.variant": ["adam"], "optimizer.eps": [1e-8, 1e-4],
                    "optimizer.lr": lrs, "train.seed": [0]}),
      Block({"optimizer.variant": ["micro_adam_msq"], "optimizer.eps": [1e-8, 1e-5, 1e-4],
                    "optimizer.lr": lrs, "train.seed": [0]}),
  )
  return Sweep(base, blocks, LrSearch(GROUP, max_extend=1),
                      wall_estimate_min=20 if preset == "cpu" else None)


def _label(g: dict) -> str:
  return f"{g['optimizer.variant']}, eps={fmt(float(g['optimizer.eps']))}"


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  lr_search.analyze(table, fin, out_dir, GROUP)


def figures(out_dir: Path) -> list[Path]:
  return lr_search.figures(out_dir, GROUP, "MicroAdamMSQ vs Adam by ε", labeler=_label)


def report(out_dir: Path) -> dict:
  best = pd.read_csv(Path(out_dir) / "best.csv")
  best["label"] = [_label(r) for r in best.to_dict("records")]
  loss = dict(zip(best["label"], best["loss_mean"], strict=True))
  ranking = sorted(loss, key=loss.get)
  msq = best[best["optimizer.variant"] == "micro_adam_msq"]
  adam = best[best["optimizer.variant"] == "adam"]
  msq_best = float(msq["loss_mean"].min()) if len(msq) else float("inf")
  adam_best = float(adam["loss_mean"].min()) if len(adam) else float("inf")
  diverged = list(msq.loc[~msq["loss_mean"].apply(lambda x: x < float("inf")), "label"])
  if len(msq) < 2 or len(adam) < 1:
    verdict = "not tested (too few variants in this preset)"
  elif msq_best <= adam_best:
    verdict = "reproduced"
  elif msq_best < float("inf") and msq_best - adam_best <= 0.02:
    verdict = "partly reproduced"
  else:
    verdict = "not reproduced"
  finding = ("Final eval loss at each (variant, ε)'s best lr ranks "
             + " < ".join(f"{k} ({fmt_num(loss[k])})" for k in ranking)
             + f". Best MicroAdamMSQ {fmt_num(msq_best)} vs best Adam "
             f"{fmt_num(adam_best)}.")
  if diverged:
    finding += f" Diverged at every lr: {diverged}."
  edges = list(best.loc[best["at_edge"], "label"])
  if edges:
    finding += f" Caution: best lr at a grid edge for {edges}."
  return {"verdict": verdict, "finding": finding,
          "claim_row": " < ".join(f"{k} {fmt_num(loss[k])}" for k in ranking),
          "numbers_md": lr_search.best_md(best.drop(columns="label"), GROUP)}
