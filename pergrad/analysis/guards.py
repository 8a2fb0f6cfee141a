"""Validity guards, checked before any verdict: could the experiment decide its claim at all?
Each returns a `Guard`; `apply(verdict, guards)` makes a decided verdict "undetermined:
<guard>[, <guard>]" when one fails, so a verdict the setup cannot support never reads as a
finding.

  bracketed   every tuned quantity (lr per arm, the best batch size, ε) lies strictly inside
              its grid, both neighbours measured
  stable      a chosen lr is at least one grid step below the smallest lr at which any of its
              arm's seeds diverged (so no compared arm runs at an lr that diverged elsewhere)
  warm        every arm gets ≥ MIN_WARMUP optimizer steps of warmup
  in_regime   the measured regime (B / B_simple, tokens per parameter, ...) lies in the range
              the claim declares it speaks of
  powered     each comparison read as absence has power ≥ `calibrate.MIN_POWER` for its
              declared effect; a detected difference, a shown equivalence or an open pair the
              verdict names ("not separable") reports its power beside, never gated
  pilot       where seeds followed a first look (a sequential design), each arm's values
              begin with exactly the first look's seeds, which the design reads first
  selected    every searched group's lr was chosen on all its selection seeds (a group none
              of whose lrs every selection seed finished chose nothing, and is not compared)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from pergrad.analysis.calibrate import DIVERGED, MIN_POWER, Calibration

NAMES = ("bracketed", "stable", "warm", "in_regime", "powered", "pilot", "selected")
MIN_WARMUP = 20  # optimizer steps
UNDETERMINED = "undetermined"
NOT_DECIDED = ("not measured", "not tested")  # verdicts no guard can change
RTOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Guard:
  """One guard's outcome: `name` (one of NAMES), whether it passed, why (the measured values)."""

  name: str
  ok: bool
  why: str

  def text(self) -> str:
    return f"{self.name}: {'passes' if self.ok else 'FAILS'} ({self.why})"

  def row(self) -> dict:
    return dataclasses.asdict(self)


def _guard(name: str, bad: Sequence[str], passed: str) -> Guard:
  return Guard(name, not bad, "; ".join(bad) if bad else passed)


def _g(x: float) -> str:
  return "diverged" if math.isinf(x) else f"{x:.3g}"


def bracketed(arms: Mapping[str, tuple[Sequence[float], float]], what: str = "lr") -> Guard:
  """Each arm's chosen `what` (arm -> (the grid values measured, the chosen one)) has a
  measured value on each side in its grid."""
  bad = []
  for arm, (grid, chosen) in arms.items():
    g = sorted({float(x) for x in grid})
    below = [x for x in g if x < float(chosen) * (1 - RTOL)]
    above = [x for x in g if x > float(chosen) * (1 + RTOL)]
    if not below or not above:
      side = "lowest" if not below else "highest"
      bad.append(f"{arm}'s {what} {_g(float(chosen))} is the {side} of {[_g(x) for x in g]}")
  return _guard("bracketed", bad, f"every {what} inside its grid ({len(arms)} arms)")


def stable(arms: Mapping[str, tuple[float, Sequence[float]]], factor: float) -> Guard:
  """Each arm's lr (arm -> (lr, the lrs at which any of its seeds diverged)) is ≤ the smallest
  diverged lr / `factor` (one grid step; `factor` 1: strictly below it)."""
  bad = []
  for arm, (lr, div) in arms.items():
    div = [float(x) for x in div]
    if not div:
      continue
    lo = min(div)
    if not (float(lr) < lo * (1 - RTOL) and float(lr) * factor <= lo * (1 + RTOL)):
      bad.append(f"{arm} at lr {_g(float(lr))}, a seed diverged at lr {_g(lo)}")
  return _guard("stable", bad, f"every arm ≥ one step (×{factor:.3g}) below its divergences")


def warm(arms: Mapping[str, float], least: int = MIN_WARMUP) -> Guard:
  """Each arm (arm -> its warmup in optimizer steps) warms up for ≥ `least` steps."""
  bad = [f"{arm} warms up {_g(float(w))} steps" for arm, w in arms.items()
         if not float(w) >= least]
  if not arms:
    bad = ["no arm's warmup is known"]
  return _guard("warm", bad, f"every arm ≥ {least} warmup steps (fewest "
                f"{_g(min(map(float, arms.values())))})" if arms else "")


@dataclasses.dataclass(frozen=True)
class Regime:
  """A quantity's range the claim speaks of, declared before the run: lo ≤ value ≤ hi."""

  quantity: str  # e.g. "B / B_simple", "tokens per parameter"
  lo: float = -math.inf
  hi: float = math.inf
  why: str = ""  # the paper's regime, in a few words

  def holds(self, value: float) -> bool:
    return math.isfinite(value) and self.lo <= value <= self.hi

  def span(self) -> str:
    return (f"≥ {_g(self.lo)}" if math.isinf(self.hi) else f"≤ {_g(self.hi)}"
            if math.isinf(self.lo) else f"in [{_g(self.lo)}, {_g(self.hi)}]")


def in_regime(measured: Mapping[str, float], declared: Sequence[Regime]) -> Guard:
  """Every declared quantity was measured (`measured`: quantity -> value) and lies in its range."""
  bad, good = [], []
  for r in declared:
    v = float(measured.get(r.quantity, math.nan))
    (good if r.holds(v) else bad).append(
        f"{r.quantity} {'not measured' if math.isnan(v) else _g(v)}, declared {r.span()}")
  return _guard("in_regime", bad, "; ".join(good) or "no regime declared")


def powered(cals: Mapping[str, Calibration], least: float = MIN_POWER, moot=(),
            decided=()) -> Guard:
  """Each comparison read as absence (name -> its `Calibration`) has power ≥ `least`. Power
  qualifies a reading of absence only: those `decided` (a difference detected, an equivalence
  shown, each at its calibrated false-alarm rate) stand at any power, and those `moot` cannot
  change the verdict whatever their outcomes (both shown, not required); one decided by a
  diverged seed (source DIVERGED) has no noise to calibrate and is left to `stable`."""
  noisy = {k: c for k, c in cals.items() if c.source != DIVERGED}
  weak = [k for k, c in noisy.items() if not c.power >= least]
  bad = [f"{k}: power {_g(noisy[k].power) if math.isfinite(noisy[k].power) else 'unknown'} "
         f"for effect {_g(noisy[k].effect)}" for k in weak
         if k not in moot and k not in decided]
  if not cals:
    bad = ["no comparison calibrated"]
  div = len(cals) - len(noisy)
  spared = [k for k in weak if k in moot and k not in decided]
  low = [k for k in weak if k in decided]
  return _guard("powered", bad, f"every comparison read as absence has power ≥ {least:g} "
                f"({len(noisy) - len(spared) - len(low)}"
                + (f"; {div} decided by a diverged seed" if div else "")
                + (f"; decided whatever their power: {', '.join(low)}" if low else "")
                + (f"; under-powered but unable to change the verdict whatever their outcomes: "
                   f"{', '.join(spared)}" if spared else "") + ")")


def pilot_first(arms: Mapping[str, Sequence[float]], pilot: Sequence[float]) -> Guard:
  """Seeds added after a `pilot` (numbered past it) are read by a sequential design whose first
  look is each side's first len(pilot) values (arm -> its seeds, in the order of its values).
  So an arm with an added seed, or with any seed outside the pilot once seeds were added,
  starts with every pilot seed, in order: a pilot seed missing, or another seed before it,
  would read the first look on the wrong runs."""
  want = [float(s) for s in pilot]
  text = lambda seeds: "[" + ", ".join(f"{float(s):g}" for s in seeds) + "]"
  arms = {arm: [float(s) for s in seeds] for arm, seeds in arms.items()}
  two_stage = any(len(seeds) > len(want) for seeds in arms.values())
  past = {arm: seeds for arm, seeds in arms.items()
          if any(s > max(want) or (two_stage and s not in want) for s in seeds)}
  bad = [f"{arm}'s first seeds are {text(seeds[:len(want)])}, not the pilot {text(want)}"
         for arm, seeds in past.items() if seeds[:len(want)] != want]
  return _guard("pilot", bad, f"every arm past the pilot starts with its {len(want)} seeds "
                f"({len(past)} of {len(arms)} arms past it)")


def selected(unscored: Sequence[str]) -> Guard:
  """Fails when a searched group chose no lr (`rounds.best_lr`'s `unscored` lines): its arm
  is missing from every comparison, which a verdict on the others would hide."""
  return Guard("selected", not unscored, "; ".join(unscored) if unscored else
               "every group's lr chosen on all its selection seeds")


def apply(verdict: str, guards: Sequence[Guard]) -> str:
  """`verdict`, or "undetermined: <failed guards>" when a guard failed (a verdict in
  NOT_DECIDED stays as it is)."""
  failed = list(dict.fromkeys(g.name for g in guards if not g.ok))
  if verdict in NOT_DECIDED or not failed:
    return verdict
  return f"{UNDETERMINED}: {', '.join(failed)}"
