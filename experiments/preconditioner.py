"""Claim 3: Adam's preconditioner works best when dominated by the mean squared μ².

Variants (`pergrad.optim`): `adam` v = EMA ḡ² (μ² + σ²/B), `micro_adam` mean_i g_i² (μ² + σ²),
`micro_adam_var` σ̂², `micro_adam_msq` max(ḡ² − σ̂²/B, 0) (≈ μ², our reading; its v is 0
where the mean is noise-dominated, so its ε is tuned too: 1e-6, 1e-5, 1e-4 first, extended ×10
past an edge until the chosen one is bracketed, `EPS_LIMITS`).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from experiments import lr_search
from pergrad.analysis import guards, sequential
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.decide import READING, VERDICT
from pergrad.analysis.runs import fmt, from_table
from pergrad.analysis.verdict import pairs_report
from pergrad.sweep import Block, LrSearch, MoreSeeds, Sweep, Tuned, base_for
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register

NAME = "preconditioner"
TITLE = "mean- vs variance-dominated Adam preconditioners"
CLAIM = ("Adam's preconditioner is best when dominated by the mean squared μ²: Adam and "
         "MicroAdamMSQ beat the variance-dominated MicroAdam and MicroAdamVar, which are "
         "less stable; clipping stabilises them but they still trail Adam.")
PAPER = "μ²-dominated ≥ Adam > MicroAdam, MicroAdamVar (qualitative; no figure)"
GROUP = ("optimizer.variant", "optimizer.clip_norm", "optimizer.eps")
MEAN_DOMINATED, VAR_DOMINATED = ("adam", "micro_adam_msq"), ("micro_adam", "micro_adam_var")
VARIANTS = MEAN_DOMINATED + VAR_DOMINATED
SELECT, SEEDS = (0, 1), (2, 3, 4, 5, 6)  # an lr and ε chosen on the mean of both
EPS = {"adam": [1e-8], "micro_adam": [1e-8], "micro_adam_var": [1e-8],
       "micro_adam_msq": [1e-6, 1e-5, 1e-4]}  # MSQ's ε is a floor of √v: tuned, bracketed
# MSQ's ε grid extends ×10 past an edge, at most twice a side, within [Adam's own 1e-8, 1e-2]:
# an ε of 1e-2 exceeds √v of nearly every coordinate here, past it the update is plain SGD's.
EPS_LIMITS = (1e-8, 1e-2)
OPTIMUM = {"adam": 3e-2, "micro_adam": 3e-2, "micro_adam_var": 3e-2, "micro_adam_msq": 1e-2}
EFFECT = declared(NAME, "effect")  # configs/experiment/preconditioner.yaml
# The fresh seeds are the first look (`more_seeds`): a pair still open there gets seeds on both
# arms up to the declared cap, read by the two-look sequential design (tests/test_more_seeds.py).
MOST_SEEDS = int(declared(NAME, "seed_cap").value)
RULE = (f"Each variant's lr is the best of a √2 grid on the mean of seeds {SELECT} (the same 3 "
        "lrs around each variant's optimum first, then extended past an edge until bracketed, so "
        "the grids may end unequal; MicroAdamMSQ's ε chosen the same way); within each clipping "
        "setting each μ²-dominated variant must beat each σ²-dominated one on the fresh seeds "
        f"{SEEDS} "
        f"(the first look: a pair still open there gets seeds on both arms up to {MOST_SEEDS}, "
        f"{sequential.READING}): {READING}, at the effect declared before the run; {VERDICT}.")


def more_seeds_design():
  """The sequential design the fresh seeds' comparisons are read by (`sweep.MoreSeeds`)."""
  return MoreSeeds(None, EFFECT.value, most=MOST_SEEDS).design(len(SEEDS))


def grid(lr: float, k: int = 1) -> list[float]:
  """2k + 1 lrs a factor √2 apart centred on `lr`."""
  return [float(f"{lr * math.sqrt(2) ** i:.3g}") for i in range(-k, k + 1)]


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    return Sweep(base, (Block({"optimizer.variant": ["adam"],
                               "optimizer.clip_norm": [None], "optimizer.eps": [1e-8],
                               "optimizer.lr": [3e-3], "train.seed": list(SELECT)}),),
                 LrSearch(GROUP, max_extend=0), wall_estimate_min=0.5)
  clips = [None, 1.0] if preset == "paper" else [None]
  scale = 0.1 if preset == "paper" else 1.0
  blocks = tuple(Block({"optimizer.variant": [v], "optimizer.clip_norm": clips,
                        "optimizer.eps": EPS[v], "optimizer.lr": grid(OPTIMUM[v] * scale),
                        "train.seed": list(SELECT)}) for v in VARIANTS)
  # cpu: 6 (variant, ε) groups × (3 lrs × 2 selection + 5 fresh) = 66 runs (+ extensions)
  eps = Tuned("optimizer.eps", ("optimizer.variant", "optimizer.clip_norm"), factor=10.0,
              low=EPS_LIMITS[0], high=EPS_LIMITS[1])
  more = MoreSeeds(compared, EFFECT.value, most=MOST_SEEDS)
  # Up to 4 extensions (4× past the first grid): the ε choice compares each ε at its own
  # optimum, so every ε group's lr must be bracketed, not the chosen one's only (eps_bracketed).
  return Sweep(base, blocks, LrSearch(GROUP, factor=math.sqrt(2), max_extend=4, seeds=SEEDS,
                                      tuned=eps, more=more),
               wall_estimate_min=36 if preset == "cpu" else None)


def expected_pairs(records) -> list[tuple[str, str]]:
  """(μ²-dominated, σ²-dominated) label pairs within each clipping setting, among the groups
  `records` (one per variant and clipping setting)."""
  labels = {label(r) for r in records}
  suffixes = sorted({label({**r, "optimizer.variant": ""}) for r in records})
  return [(m + s, v + s) for s in suffixes for m in MEAN_DOMINATED for v in VAR_DOMINATED
          if m + s in labels and v + s in labels]


def compared(best) -> list[tuple[dict, dict]]:
  """The pairs of arms that `report` compares (each variant at its chosen ε and lr)."""
  records = chosen(best).to_dict("records")
  arm = {label(r): {k: from_table(r[k]) for k in (*GROUP, "optimizer.lr")} for r in records}
  return [(arm[a], arm[b]) for a, b in expected_pairs(records)]


def label(g: dict) -> str:
  clip = from_table(g.get("optimizer.clip_norm"))
  return f"{g['optimizer.variant']}" + ("" if clip is None else f" + clip {fmt(clip)}")


def chosen(best):
  """Per (variant, clipping): the ε whose selection-seed mean at its chosen lr is lowest."""
  keep = [g.index[int(np.argmin(np.nan_to_num(g["select_loss"].to_numpy(float), nan=np.inf)))]
          for _, g in best.groupby(["optimizer.variant", "optimizer.clip_norm"], sort=False,
                                   dropna=False)]
  return best.loc[keep]


def eps_bracketed(every, best) -> guards.Guard:
  """`guards.bracketed` of each chosen ε among its variant's measured εs (variants searched
  over more than one ε; the others run at their fixed ε, which is not tuned), and each ε it
  was chosen over measured at its own best lr: an ε whose lr search ended at a grid edge, or
  diverged at every lr, holds an upper bound of its loss only, which might beat the chosen."""
  arms, open_ = {}, []
  for r in best.to_dict("records"):
    same = every[(every["optimizer.variant"] == r["optimizer.variant"])
                 & (every["optimizer.clip_norm"].isna() if from_table(r["optimizer.clip_norm"])
                    is None else every["optimizer.clip_norm"] == r["optimizer.clip_norm"])]
    if same["optimizer.eps"].nunique() > 1:
      arms[label(r)] = (same["optimizer.eps"].astype(float), float(r["optimizer.eps"]))
      rivals = same[same["optimizer.eps"].astype(float) != float(r["optimizer.eps"])]
      edge = rivals[rivals["at_edge"].astype(bool) | rivals["all_diverged"].astype(bool)]
      if len(edge):
        open_.append(f"{label(r)}'s ε {fmt(float(r['optimizer.eps']))} was chosen over ε "
                     f"{[fmt(float(x)) for x in sorted(edge['optimizer.eps'])]}, whose lr "
                     "searches ended at a grid edge (their losses are upper bounds)")
  grid = guards.bracketed(arms, "ε")
  return grid if not open_ else guards.Guard(
      "bracketed", False, "; ".join(([grid.why] if not grid.ok else []) + open_))


analyze = functools.partial(lr_search.analyze, group_keys=GROUP)
figures = functools.partial(lr_search.figures, group_keys=GROUP, title="Adam preconditioners")


def report(out_dir):
  every = lr_search.load_best(out_dir)
  best = chosen(every)
  groups = lr_search.by_label(best, label, SEEDS)
  expected = expected_pairs(best.to_dict("records"))
  used = {x for p in expected for x in p}
  seeds = {k: list(v) for k, v in groups.items()}
  return pairs_report(groups, expected, rule=RULE, paper=PAPER, effect=EFFECT.value,
                      planned=VARIANTS, design=more_seeds_design(),
                      numbers_md=lr_search.best_md(every, GROUP),
                      checked=(*lr_search.guards_of(best, label, used),
                               eps_bracketed(every, best), lr_search.selected(every),
                               guards.pilot_first({k: seeds[k] for k in used if k in seeds},
                                                  SEEDS),
                               same_budget(out_dir)),
                      checks=(lr_search.edges_note(every, label), declared_text(EFFECT)))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C3. A μ²-dominated preconditioner is best',
    papers_test=True, rank=3, stream=0, sweep=sweep, analyze=analyze, figures=figures,
    report=report))
