"""More seeds where a comparison is under-powered: sample-size re-estimation after a pilot
(an "internal pilot", Wittes & Brittain 1990; our design, not the papers').

The fresh seeds of an lr search (`LrSearch.seeds`) are the pilot. A comparison of two groups
(`MoreSeeds.pairs`) whose rule has power below `calibrate.MIN_POWER` at the two arms' pilot
noises and the declared effect gets seeds up to the count at which the rule reaches
`MoreSeeds.target`: the noisier arm's alone where that suffices, else both arms' alike, at
most `MoreSeeds.most` a side; past that it is left as it is, and `guards.powered` says how many
seeds it would need. The count reads the pilot's noises alone, never the arms' difference, and
the pair rule then takes each arm's variance from its pilot alone (Stein's two-stage test,
`rules.compare`'s `pilot`), so the false-alarm rate stays the rule's 5 % (tests/
test_more_seeds.py simulates the two-stage design at the measured noises: with the variances of
every seed it rises above). The count reads the pilot alone, so a search stopped and resumed
anywhere asks for the same seeds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from pergrad.analysis import calibrate
from pergrad.analysis.runs import finished
from pergrad.sweep.grid import Block, Sweep
from pergrad.sweep.growth import first_stage_fixed, same
from pergrad.sweep.search import MoreSeeds


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


def needed(a, b, more: MoreSeeds) -> dict[int, int]:
  """{side (0: `a`, 1: `b`): its seeds} at which the pair rule on pilots `a` and `b` (as many a
  side), then tested with the pilot's variances (`rules.compare`'s `pilot`), reaches
  `more.target` at the pilot's noises: the noisier side's alone where that suffices within
  `more.most`, else both alike; {} when it is powered already, decided by a diverged seed, or
  needs more than `more.most` a side."""
  cal = calibrate.of_arms(a, b, more.effect)
  if cal.source == calibrate.DIVERGED or not np.isfinite(cal.power) or (
      cal.power >= calibrate.MIN_POWER):
    return {}
  n0 = len(a)
  ok = lambda na, nb: calibrate.calibrate("pair", cal.noise, na, more.effect, n_b=nb,
                                          noise_b=cal.noise_b, pilot=n0).power >= more.target

  def fewest(at) -> int | None:  # the fewest n in (n0, most] with ok(*at(n)): power grows with n
    lo, hi = n0, more.most
    if hi <= lo or not ok(*at(hi)):
      return None
    while hi - lo > 1:
      mid = (lo + hi) // 2
      lo, hi = (lo, mid) if ok(*at(mid)) else (mid, hi)
    return hi

  noisy = int(cal.noise_b > cal.noise)
  alone = fewest(lambda n: (n, n0) if noisy == 0 else (n0, n))
  if alone:
    return {noisy: alone}
  both = fewest(lambda n: (n, n))
  return {0: both, 1: both} if both else {}


def blocks(sweep: Sweep, fin: pd.DataFrame, best: pd.DataFrame, seed0
           ) -> tuple[list[Block], bool]:
  """(the blocks of the added seeds, waiting): waiting while a compared arm's pilot is
  unfinished. An arm's added seeds continue past every seed the search uses."""
  ls = sweep.lr_search
  pairs = [tuple(tuple(sorted(arm.items())) for arm in p) for p in ls.more.pairs(best)]
  pilots = {arm: pilot(fin, dict(arm), ls.seeds) for p in pairs for arm in p}
  if any(v is None for v in pilots.values()):
    return [], True
  want: dict = {}
  for pair in pairs:
    for side, n in needed(*(pilots[arm] for arm in pair), ls.more).items():
      want[pair[side]] = max(want.get(pair[side], 0), n)
  first = max(int(s) for s in (*seed0, *ls.seeds)) + 1
  return [Block({**{k: [v] for k, v in arm}, ls.seed_key: list(range(
      first, first + n - len(ls.seeds)))}, fixed=first_stage_fixed(sweep, dict(arm)))
          for arm, n in sorted(want.items(), key=str)], False
