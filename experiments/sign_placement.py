"""Claim 2: the later the sign in per-example -> batch mean -> EMA, the better (SignEMA wins).

Placements (`pergrad.optim`): `example` EMA(mean_i sign g_i), `token` the same per token,
`batch` EMA(sign ḡ), `ema` sign(EMA ḡ), each at the lr its search chose on seed 0 (`lr_search`).
The fresh seeds are the first look: an adjacent pair still open there gets seeds on both arms up
to the cap declared in configs/experiment/sign_placement.yaml (`pergrad.sweep.more_seeds`).
"""

from __future__ import annotations

import functools

from experiments import lr_search
from pergrad.analysis import guards, sequential
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.decide import READING, VERDICT
from pergrad.analysis.rules import adjacent
from pergrad.analysis.runs import from_table
from pergrad.analysis.verdict import pairs_report
from pergrad.sweep import Block, LrSearch, MoreSeeds, Sweep, base_for
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register

NAME = "sign_placement"
TITLE = "where to put the sign in signSGD"
CLAIM = ("The later the sign in the chain per-example -> batch mean -> EMA, the better: "
         "SignEMA wins, per-example sign is slowest/least stable.")
PAPER = "SignEMA best, per-example sign worst (qualitative; no figure)"
GROUP = ("optimizer.placement",)
CHAINS = (("ema", "batch", "example"), ("ema", "batch", "token"))
SEEDS = (1, 2, 3, 4, 5)  # the first look (`pergrad.sweep.MIN_PILOT` seeds)
EFFECT = declared(NAME, "effect")  # configs/experiment/sign_placement.yaml
MOST_SEEDS = int(declared(NAME, "seed_cap").value)
RULE = (f"Expected ema < batch < example and ema < batch < token in final eval loss on the "
        f"fresh seeds (the first look: a pair still open there gets seeds on both arms up to "
        f"{MOST_SEEDS}, {sequential.READING}); each adjacent pair: {READING}; {VERDICT}.")


def design():
  """The sequential design the fresh seeds' comparisons are read by (`sweep.MoreSeeds`)."""
  return MoreSeeds(None, EFFECT.value, most=MOST_SEEDS).design(len(SEEDS))


def compared(best) -> list[tuple[dict, dict]]:
  """The adjacent pairs `report` compares, each placement at its chosen lr."""
  arm = {str(r["optimizer.placement"]): {k: from_table(r[k]) for k in (*GROUP, "optimizer.lr")}
         for r in best.to_dict("records")}
  return [(arm[a], arm[b]) for a, b in adjacent([p for p in c if p in arm] for c in CHAINS)]


def sweep(preset: str) -> Sweep:
  base = base_for(NAME, preset)
  if preset == "ci":
    return Sweep(base, (Block({"optimizer.placement": ["example", "ema"], "optimizer.lr": [1e-2],
                               "train.seed": [0]}),), LrSearch(GROUP, max_extend=0),
                 wall_estimate_min=0.5)
  grids = ({"example": [1e-4, 3e-4, 1e-3, 3e-3], "token": [1e-4, 3e-4, 1e-3, 3e-3],
            "batch": [3e-5, 1e-4, 3e-4, 1e-3], "ema": [3e-5, 1e-4, 3e-4, 1e-3]}
           if preset == "paper" else  # cpu: factor 3 around each placement's best
           {"example": [3e-3, 1e-2, 3e-2], "token": [3e-3, 1e-2, 3e-2],
            "batch": [1e-2, 3e-2, 1e-1], "ema": [1e-3, 3e-3, 1e-2]})
  blocks = tuple(Block({"optimizer.placement": [k], "optimizer.lr": v, "train.seed": [0]})
                 for k, v in grids.items())
  more = MoreSeeds(compared, EFFECT.value, most=MOST_SEEDS)
  return Sweep(base, blocks, LrSearch(GROUP, max_extend=3, seeds=SEEDS, more=more),
               wall_estimate_min=24 if preset == "cpu" else None)  # 32 runs (+ seeds)


analyze = functools.partial(lr_search.analyze, group_keys=GROUP)
figures = functools.partial(lr_search.figures, group_keys=GROUP, title="sign placement")


def report(out_dir):
  best, label = lr_search.load_best(out_dir), lambda g: str(g["optimizer.placement"])
  groups = lr_search.by_label(best, label, SEEDS)
  expected = adjacent([p for p in c if p in groups] for c in CHAINS)
  used = {x for p in expected for x in p}
  pilot = guards.pilot_first({k: list(groups[k]) for k in used if k in groups}, SEEDS)
  return pairs_report(groups, expected, rule=RULE, design=design(),
                      paper=PAPER, effect=EFFECT.value, numbers_md=lr_search.best_md(best, GROUP),
                      checks=(lr_search.edges_note(best, label), declared_text(EFFECT)),
                      checked=(*lr_search.guards_of(best, label, used), pilot,
                               lr_search.selected(best), same_budget(out_dir)),
                      planned=tuple(dict.fromkeys(sum(CHAINS, ()))))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C2. The later the sign, the better', papers_test=True,
    rank=2, stream=0, sweep=sweep, analyze=analyze, figures=figures, report=report))
