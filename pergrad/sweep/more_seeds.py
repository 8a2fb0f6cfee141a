"""More seeds where a comparison is still open: group-sequential seeds on the paired gaps
(issue 53; our design, not the papers').

The fresh seeds of an lr search (`LrSearch.seeds`), or those the experiment names
(`MoreSeeds.first`), are the first look. A compared pair of arms
(`MoreSeeds.pairs`) is read on its per-seed gaps by `MoreSeeds.design`
(`pergrad.analysis.sequential`: two looks, the pilot and the cap `MoreSeeds.most`, Pocock
spending); one decided there (a difference, or equivalence within the margin) gets no more
seeds; one still open gets seeds on both arms (the gaps are paired) up to the cap, where the
report reads it with the same design (`pergrad.analysis.verdict.pairs_report`'s `design`). The
overall false-alarm rate stays ≤ 5 % (simulated in tests/test_more_seeds.py and
tests/test_sequential.py). The count reads the pilot's seeds alone, so a search stopped and
resumed anywhere asks for the same seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pergrad.analysis import sequential
from pergrad.analysis.runs import finished
from pergrad.sweep.grid import Block, Sweep
from pergrad.sweep.growth import first_stage_fixed, same
from pergrad.sweep.search import MoreSeeds

DIFFERENCE, NONINFERIORITY = "difference", "noninferiority"  # how a pair is read (`needed`)


def pilot(fin: pd.DataFrame, arm: dict, seeds) -> list[float] | None:
  """An arm's ({key: value} of its group and lr) final losses on the pilot seeds, in seed
  order (inf: diverged); None until every pilot seed has finished."""
  rows = finished(fin)
  for k, v in arm.items():
    rows = rows[[same(x, v) for x in rows[k]]] if k in rows else rows.iloc[:0]
  have = {float(s): float(v) for s, v in zip(rows["train.seed"], rows["final_eval_loss"],
                                               strict=True)} if len(rows) else {}
  vals = [have.get(float(s)) for s in seeds]
  return None if any(v is None for v in vals) else [v if np.isfinite(v) else np.inf
                                                   for v in vals]


def needed(a, b, more: MoreSeeds, kind: str = DIFFERENCE) -> dict[int, int]:
  """{side (0: `a`, 1: `b`): its seeds}: both arms at `more.most` when the pair's pilot gaps
  (b − a, seed by seed) read "not separable" at the design's first look; {} when decided there
  (a difference, or equivalence within `more.margin`; for a pair of `kind` NONINFERIORITY,
  non-inferior or worse beyond the margin, `sequential.read_noninferior`), decided by a
  diverged seed, or when the pilot is already at the cap."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  if len(a) != len(b) or not (np.isfinite(a).all() and np.isfinite(b).all()):
    return {}
  if len(a) >= more.most:
    return {}
  read = sequential.read_noninferior if kind == NONINFERIORITY else sequential.read
  _, add = read(b - a, more.design(len(a)), more.margin)
  return {0: len(a) + add, 1: len(a) + add} if add else {}


def blocks(sweep: Sweep, fin: pd.DataFrame, best: pd.DataFrame, seed0
           ) -> tuple[list[Block], bool]:
  """(the blocks of the added seeds, waiting): waiting while a compared arm's pilot is
  unfinished. An arm's added seeds continue past every seed the search uses."""
  ls, first_look = sweep.lr_search, sweep.lr_search.pilot_seeds
  found = ls.more.pairs(best, fin) if ls.more.reads_finals else ls.more.pairs(best)
  pairs = [(tuple(tuple(sorted(arm.items())) for arm in p[:2]),
            p[2] if len(p) > 2 else DIFFERENCE) for p in found]  # (a, b) or (a, b, kind)
  pilots = {arm: pilot(fin, dict(arm), first_look) for p, _ in pairs for arm in p}
  if any(v is None for v in pilots.values()):
    return [], True
  want: dict = {}
  for pair, kind in pairs:
    for side, n in needed(*(pilots[arm] for arm in pair), ls.more, kind).items():
      want[pair[side]] = max(want.get(pair[side], 0), n)
  first = max(int(s) for s in (*seed0, *ls.seeds, *first_look)) + 1
  return [Block({**{k: [v] for k, v in arm}, ls.seed_key: list(range(
      first, first + n - len(first_look)))}, fixed=first_stage_fixed(sweep, dict(arm)))
          for arm, n in sorted(want.items(), key=str)], False
