"""More seeds where a comparison is under-powered: sample-size re-estimation after a pilot
(an "internal pilot", Wittes & Brittain 1990; our design, not the papers').

The fresh seeds of an lr search (`LrSearch.seeds`) are the pilot. A comparison of two groups
(`sweep.MoreSeeds.pairs`) whose rule has power below `calibrate.MIN_POWER` at the two arms' pilot
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

from experiments.sweep import Block, MoreSeeds, Sweep
from pergrad.analysis import calibrate
from pergrad.analysis.runs import from_table


def pilot(row: pd.Series, seeds) -> list[float] | None:
  """A group's final losses on the pilot seeds at its chosen lr (inf: diverged); None until
  every pilot seed has finished."""
  have = dict(zip((float(s) for s in str(row["fresh_seeds"]).split()),
                  (float(v) for v in str(row["fresh_losses"]).split()), strict=True))
  vals = [have.get(float(s)) for s in seeds]
  return None if any(v is None for v in vals) else vals


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


def blocks(sweep: Sweep, best: pd.DataFrame, seed0) -> tuple[list[Block], bool]:
  """(the blocks of the added seeds, waiting): waiting while a compared group's pilot is
  unfinished. A group's added seeds continue past every seed the search uses."""
  ls = sweep.lr_search
  more = ls.more
  pilots = {i: pilot(best.loc[i], ls.seeds) for i in {i for p in more.pairs(best) for i in p}}
  if any(v is None for v in pilots.values()):
    return [], True
  want: dict = {}
  for pair in more.pairs(best):
    for side, n in needed(*(pilots[k] for k in pair), more).items():
      want[pair[side]] = max(want.get(pair[side], 0), n)
  first = max(int(s) for s in (*seed0, *ls.seeds)) + 1
  out = []
  for i, n in sorted(want.items(), key=lambda kv: str(kv[0])):
    row = best.loc[i]
    out.append(Block({**{k: [from_table(row[k])] for k in ls.group_keys},
                      ls.lr_key: [float(row[ls.lr_key])],
                      ls.seed_key: list(range(first, first + n - len(ls.seeds)))}))
  return out, False
