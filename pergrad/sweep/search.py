"""The lr search a sweep declares (`LrSearch`, the policy `POLICY`): its groups, how its grid
extends past an edge, a value tuned beside the lr (`Tuned`), more seeds for an under-powered
comparison (`MoreSeeds`). The search runs in `rounds`."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Callable

from pergrad.analysis import sequential

POLICY = ("each group's lr is chosen on its selection seeds alone and its numbers are the "
          "mean ± std of fresh seeds at that lr, never a selection seed")


@dataclasses.dataclass(frozen=True)
class Tuned:
  """A value tuned beside the lr (Adam's ε, the fixed batch size) in each family of groups (the
  groups equal in `within`): the value whose group scores lowest at its chosen lr (`metric`:
  "select_loss", the selection seeds' mean, or "loss_mean", the search's own fresh seeds'). At
  an edge of the measured values the search adds the next value, `factor` past it, with the
  overrides `extra(value)` that go with it and the first-stage lrs of its nearest value's block,
  ≤ `max_extend` past the first-stage values a side, within the declared [`low`, `high`]."""

  key: str
  within: tuple
  factor: float
  low: float
  high: float
  max_extend: int = 2
  metric: str = "select_loss"
  extra: Callable[[float], dict] | None = None

  def point(self, value) -> dict:
    """{key: value, **extra(value)}: the overrides of a group at `value`."""
    return {self.key: value, **(self.extra(value) if self.extra else {})}

  def next(self, value, edge: str):
    """The value past `value` on side `edge` (low|high), as the grids write it; None outside
    [low, high]."""
    x = value / self.factor if edge == "low" else value * self.factor
    x = int(round(x)) if isinstance(value, numbers.Integral) else float(f"{x:.3g}")
    return x if self.low <= x <= self.high else None


@dataclasses.dataclass(frozen=True)
class MoreSeeds:
  """Group-sequential seeds for a comparison still open after the pilot
  (`pergrad.sweep.more_seeds`): `pairs(best)`, the pairs of arms, each {key: value} of its
  group keys and lr (from `best`, `rounds.best_lr`'s table, or an arm run at a fixed lr), that
  the report compares paired at the declared `effect` (a pair `(a, b, "noninferiority")` is
  read for non-inferiority of a at the margin, `more_seeds.needed`); `most`, the cap (seeds a
  side, declared with the experiment); `margin`, the equivalence margin (default `effect`);
  `spending`, the sequential design's (`pergrad.analysis.sequential.SPENDINGS`); `first`, the
  first look's seeds (default: the lr search's fresh seeds), for an experiment that judges its
  pairs on other seeds (gns_schedule: the best arm's follow-up seeds); `reads_finals`:
  `pairs(best, fin)`, the pairs read from the finished runs too (arms run after the search)."""

  pairs: Callable
  effect: float
  most: int
  margin: float | None = None
  spending: str = "pocock"
  first: tuple | None = None
  reads_finals: bool = False

  def __post_init__(self):
    if self.margin is None:
      object.__setattr__(self, "margin", self.effect)

  def design(self, pilot: int) -> sequential.Design:
    """The two-look design: the pilot's seeds, then the cap."""
    return sequential.design((pilot, self.most) if self.most > pilot else (pilot,),
                             self.spending)


# The fewest pilot seeds `MoreSeeds` accepts: the first look's paired t has pilot − 1 degrees
# of freedom (its critical value 4.3 at 3 seeds, 2.8 at 5), so a smaller pilot decides little.
MIN_PILOT = 5


@dataclasses.dataclass(frozen=True)
class LrSearch:
  """`POLICY` per group of `group_keys`: the lowest mean final eval loss over the selection
  seeds (the first block's) picks the lr; a best lr at an edge extends the grid by `factor`
  (≤ `max_extend` times a side, an all-diverged group down to `diverged_floor` below it);
  `each_seed`: also where one selection seed's own best lr is at an edge (an experiment that
  reads each seed's lr*, `lr_exponent`); `tuned`: a value chosen beside the lr, its grid
  extended past an edge likewise (`Tuned`);
  `more`: the fresh seeds are a pilot, more seeds added where a comparison is under-powered
  (`MoreSeeds`)."""

  group_keys: tuple
  lr_key: str = "optimizer.lr"
  factor: float = 3.0
  max_extend: int = 2
  seed_key: str = "train.seed"
  seeds: tuple = ()
  diverged_floor: float = 100.0
  tuned: Tuned | None = None
  more: MoreSeeds | None = None
  each_seed: bool = False

  def __post_init__(self):
    if self.more is not None and len(self.pilot_seeds) < MIN_PILOT:
      raise ValueError(f"LrSearch: more seeds after a pilot of {len(self.pilot_seeds)} seeds; "
                       f"the pilot needs ≥ {MIN_PILOT} (pergrad.sweep.MIN_PILOT): give `seeds` "
                       "(or `MoreSeeds.first`) more.")

  @property
  def pilot_seeds(self) -> tuple:
    """The first look's seeds of `more`: its own `first`, else the fresh seeds."""
    return tuple(self.seeds if self.more is None or self.more.first is None else self.more.first)

  @property
  def rounds(self) -> int:
    """Follow-up rounds that can add runs: extensions (up or down) and the fresh seeds; with
    `tuned`, again for each value it can add (its first lrs, its seeds awaited); with `more`,
    one more (the pilot's seeds awaited)."""
    down = math.ceil(math.log(self.diverged_floor) / math.log(self.factor) - 1e-9)
    one = max(self.max_extend, down) + 1
    tuned = one if self.tuned is None else (one + 2) * (1 + 2 * self.tuned.max_extend)
    return tuned + (self.more is not None)
