"""Claim 3: Adam's preconditioner works best when dominated by the mean squared μ².

Variants (see `pergrad.optim`; this project's reading of the paper): v = EMA of
`adam` ḡ² (E = μ² + σ²/B), `micro_adam` mean_i g_i² (μ² + σ²), `micro_adam_var` σ̂²,
`micro_adam_msq` max(ḡ² − σ̂²/B, 0) (≈ μ², our reading). Each runs at its own ε
(`EPS_RULE`) and its own lr, chosen on the selection seeds (0 and 1 at the cpu preset:
the mean final eval loss over them), then re-run there with fresh seeds (2, 3, 4), whose
final eval losses alone are reported (`experiments.lr_search`). A run whose eval loss
exceeds ln V diverged (`lr_search.DIVERGED_RULE`). Clipping (clip_norm = 1) is a second
setting at the paper preset only.
"MicroAdam" here is the paper's per-example Adam, not IST-DASLab's MicroAdam (2024).

The ordering the claim predicts: the μ²-dominated preconditioners, Adam (μ² + σ²/B) and
MicroAdamMSQ (μ²), each reach a lower final eval loss than each σ²-dominated one,
MicroAdam (μ² + σ²) and MicroAdamVar (σ²), within each clipping setting: the pairs
adam < micro_adam, adam < micro_adam_var, micro_adam_msq < micro_adam,
micro_adam_msq < micro_adam_var. It predicts no order inside either family. Each pair is
decided by the seed-noise rule of `experiments.verdict` (`RULE`); whether clipping
improves the σ²-dominated variants is reported beside, by the same rule, outside the
verdict. Whether MicroAdamMSQ's result is its μ² or its ε floor is `msq_eps`'s question.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search
from experiments.record import ROWS, Experiment, Report, register
from experiments.sweep import Block, LrSearch, Sweep, base_for, fmt
from experiments.verdict import PAIR_WIN, PAIRS_VERDICT, compare, decide, pairs_md

NAME = "preconditioner"
TITLE = "mean- vs variance-dominated Adam preconditioners"
CLAIM = ("Adam's preconditioner is best when dominated by the mean squared μ²: Adam and "
         "MicroAdamMSQ beat the variance-dominated MicroAdam and MicroAdamVar, which are "
         "less stable; clipping stabilises them but they still trail Adam.")
GROUP = ("optimizer.variant", "optimizer.clip_norm", "optimizer.eps")
MEAN_DOMINATED = ("adam", "micro_adam_msq")
VAR_DOMINATED = ("micro_adam", "micro_adam_var")
VARIANTS = ("adam", "micro_adam", "micro_adam_var", "micro_adam_msq")
SELECT = (0, 1)  # selection seeds: each lr's value is their mean (cpu, paper)
SEEDS = (2, 3, 4)  # fresh seeds at each variant's chosen lr (cpu, paper)
EPS = {"adam": (1e-8,), "micro_adam": (1e-8,), "micro_adam_var": (1e-8,),
       "micro_adam_msq": (1e-5, 1e-4)}  # the ε values searched per variant (cpu, paper)
EPS_RULE = ("ε is searched where it is the floor of the denominator: MicroAdamMSQ's v is 0 "
            "wherever ḡ² ≤ σ̂²/B, where its step is m̂/ε, so it runs at ε ∈ {1e-5, 1e-4} "
            "(at 1e-8 that step diverges by construction) and keeps the ε whose "
            "selection-seed mean at its chosen lr is lowest; Adam, MicroAdam and "
            "MicroAdamVar keep Adam's ε = 1e-8, below their √v̂ ≥ σ̂/√B on every coordinate "
            "with gradient noise (msq_eps logs the share of coordinates where ε > √v̂).")
RULE = (lr_search.DIVERGED_RULE + " " + EPS_RULE + " Each variant's lr is the one with the "
        "lowest mean final eval loss over the selection seeds (0, 1). Within each clipping "
        "setting, each μ²-dominated variant (adam, micro_adam_msq) must beat each "
        "σ²-dominated one (micro_adam, micro_adam_var) in final eval loss on the fresh "
        "seeds (2, 3, 4), a pair being " + PAIR_WIN + ": " + PAIRS_VERDICT + ".")


def _blocks(grids: dict, clips: list, seeds: list) -> tuple:
  return tuple(Block({"optimizer.variant": [v], "optimizer.clip_norm": clips,
                      "optimizer.eps": list(EPS[v]), "optimizer.lr": lrs,
                      "train.seed": seeds}) for v, lrs in grids.items())


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    blocks = (Block({"optimizer.variant": ["adam", "micro_adam_var"],
                     "optimizer.clip_norm": [None], "optimizer.eps": [1e-8],
                     "optimizer.lr": [3e-3], "train.seed": [0]}),)
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=0), wall_estimate_min=0.5)
  if preset == "paper":
    lrs = [3e-4, 1e-3, 3e-3, 1e-2]
    return Sweep(base, _blocks({v: lrs for v in VARIANTS}, [None, 1.0], list(SELECT)),
                 LrSearch(GROUP, max_extend=2, seeds=SEEDS))
  # cpu: without clipping; three lrs (factor ~3) per variant centred on its best over a
  # wider grid at this preset (adam 3e-2, micro_adam 3e-2, micro_adam_var 1e-1,
  # micro_adam_msq at ε ≥ 1e-5 1e-2); an edge best extends. 5 groups x (3 lrs x 2
  # selection seeds + 3 fresh seeds) = 45 runs.
  grids = {"adam": [1e-2, 3e-2, 1e-1], "micro_adam": [1e-2, 3e-2, 1e-1],
           "micro_adam_var": [3e-2, 1e-1, 3e-1], "micro_adam_msq": [3e-3, 1e-2, 3e-2]}
  return Sweep(base, _blocks(grids, [None], list(SELECT)),
               LrSearch(GROUP, max_extend=2, seeds=SEEDS), wall_estimate_min=45)


def _null(c) -> bool:
  return c is None or (isinstance(c, float) and np.isnan(c))


def _label(g: dict) -> str:
  """A variant and its clipping setting (its ε is the chosen one: `chosen`)."""
  clip = g.get("optimizer.clip_norm")
  return f"{g['optimizer.variant']}" + (f" + clip {fmt(clip)}" if not _null(clip) else "")


def _full_label(g: dict) -> str:
  eps = g.get("optimizer.eps")
  return _label(g) + ("" if _null(eps) else f", eps={fmt(float(eps))}")


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  lr_search.analyze(table, fin, out_dir, GROUP, select_seed=SELECT)


def figures(out_dir: Path) -> list[Path]:
  return lr_search.figures(out_dir, GROUP, "Adam preconditioners", labeler=_full_label)


def chosen(best: pd.DataFrame) -> pd.DataFrame:
  """Per (variant, clipping): the row of `best` whose ε has the lowest selection-seed mean
  at its chosen lr (`EPS_RULE`; ties: the first)."""
  keep = []
  for _, g in best.groupby(["optimizer.variant", "optimizer.clip_norm"], sort=False,
                           dropna=False):
    sel = np.nan_to_num(g["select_loss"].to_numpy(dtype=float), nan=np.inf)
    keep.append(g.index[int(np.argmin(sel))])
  return best.loc[keep]


def _stable_width(fin: pd.DataFrame, tol: float = 0.05) -> pd.Series:
  """Per group: how many lrs of the grid end within `tol` nats of the group's best (mean
  over the selection seeds, the ones run at every lr)."""
  out = {}
  if "train.seed" in fin:
    fin = fin[fin["train.seed"].isin(SELECT)]
  keys = [k for k in GROUP if k in fin]
  for key, g in fin.groupby(keys, dropna=False):
    m = g.groupby("optimizer.lr")["final_eval_loss"].mean()
    out[_full_label(dict(zip(keys, key, strict=True)))] = int((m <= m.min() + tol).sum())
  return pd.Series(out, dtype=int)


def predicted_pairs(clips: list) -> list[tuple[str, str]]:
  """The (better, worse) pairs the claim predicts, by clipping setting present."""
  out = []
  for clip in clips:
    suffix = _label({"optimizer.variant": "", "optimizer.clip_norm": clip})
    out += [(m + suffix, v + suffix) for m in MEAN_DOMINATED for v in VAR_DOMINATED]
  return out


WIDTH = "lrs within 0.05 of best (selection seeds)"


def report(out_dir: Path) -> Report:
  out_dir = Path(out_dir)
  every = lr_search.load_best(out_dir)
  fin = pd.read_csv(out_dir / "finals.csv")
  every[WIDTH] = [_stable_width(fin).get(_full_label(r), 0) for r in every.to_dict("records")]
  best = chosen(every)
  groups = lr_search.by_label(best, _label)
  clips = []
  for c in best["optimizer.clip_norm"]:
    c = None if _null(c) else float(c)
    if c not in clips:
      clips.append(c)
  expected = [(a, b) for a, b in predicted_pairs(clips) if a in groups and b in groups]
  missing = sorted({x for pair in predicted_pairs(clips) for x in pair} - set(groups))
  if not expected:
    verdict, pairs = "not tested (no μ²- and σ²-dominated pair in this preset)", []
  else:
    verdict, pairs = decide(groups, expected)
  lab = lambda v, c: _label({"optimizer.variant": v, "optimizer.clip_norm": c})
  clip_pairs = [compare(groups[lab(v, c)], groups[v], (lab(v, c), v))
                for v in VAR_DOMINATED for c in clips
                if c is not None and v in groups and lab(v, c) in groups]
  others = every.drop(index=best.index)
  finding = " ".join(x for x in [
      f"Rule: {RULE}",
      f"Fresh-seed final eval loss per variant at its chosen ε and lr ({lr_search.POLICY}): "
      + lr_search.group_lines(best, _full_label) + ".",
      ("Not chosen (ε with a higher selection-seed mean): "
       + lr_search.group_lines(others, _full_label) + ".") if len(others) else "",
      *(p.sentence() + "." for p in pairs),
      f"Not run in this preset: {missing} (their pairs are not compared)." if missing else "",
      "Beside the verdict, does clipping help the σ²-dominated variants?" if clip_pairs else "",
      *(p.sentence() + "." for p in clip_pairs),
      lr_search.search_notes(every, _full_label)] if x)
  numbers = lr_search.best_md(every, GROUP, extra=[WIDTH])
  if pairs:
    numbers += ("\n\nPairs the claim predicts (μ²-dominated first, each variant at its chosen "
                "ε):\n\n" + pairs_md(pairs))
  return Report(
      verdict=verdict,
      rule=RULE,
      finding=finding,
      claim_row="; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs)
      + " (fresh seeds at each variant's ε and lr; " + lr_search.group_lines(best, _full_label)
      + ")",
      numbers_md=numbers,
  )


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["3"], sweep=sweep, analyze=analyze,
    figures=figures, report=report))
