"""Verdicts after the validity guards: `gated`, and `pairs_report` for the experiments that
compare arms on their shared seeds (`pergrad.analysis.decide`: paired, a detected difference
decided whatever its power, absence by TOST or non-inferiority, else "not separable")."""

from __future__ import annotations

import dataclasses
import math

import pandas as pd

from pergrad.analysis import calibrate, decide, guards, rules, sequential
from pergrad.analysis.markdown import md_table
from pergrad.analysis.report import Report


def gated(verdict: str, cals, checked=(), moot=(), decided=(), **kw) -> Report:
  """The Report of `verdict` after the validity guards (`pergrad.analysis.guards`): those
  `checked` by the experiment (bracketed, stable, warm, in_regime, same_budget) and `powered`
  over `cals` ({comparison: its `Calibration`}, or one), which requires power only of a
  comparison whose rule reads absence from a failure to detect: those `decided` (a detected
  difference, a shown equivalence, or one left open that the verdict names itself: "not
  separable") and those `moot` (unable to change the verdict) show their power beside. A
  failed guard makes the verdict "undetermined: <guard>". The claims table shows the weakest
  comparison's rates."""
  cals = cals if isinstance(cals, dict) else {"rule": cals}
  every = (*checked, guards.powered(cals, moot=moot, decided=decided))
  spared = {*moot, *decided}
  weakest = calibrate.weakest([c for k, c in cals.items() if k not in spared] or cals.values())
  shown = guards.apply(verdict, every)
  overridden = shown != verdict and not verdict.startswith(guards.UNDETERMINED)
  return Report(verdict=shown, rule_verdict=verdict if overridden else "",
                guards=tuple(g.row() for g in every),
                calibration=weakest.row() if weakest else None,
                calibrations={k: c.row() for k, c in cals.items()}, **kw)


def key(p: decide.Paired) -> str:
  return f"{p.a} vs {p.b}"


def calibration_of(p: decide.Paired) -> calibrate.Calibration:
  """A paired comparison's error rates: the paired t's false alarm simulated at its paired sd
  and seeds (`decide.calibrate`), or its sequential design's over all looks
  (`sequential_reading`), and the design's power for the declared effect."""
  if p.why.startswith("a seed diverged"):
    return calibrate.Calibration("paired", math.nan, p.n, p.effect, math.nan, math.nan,
                                 source=calibrate.DIVERGED)
  ok = p.n >= 2 and math.isfinite(p.sd_paired)
  alarm = p.false_alarm if math.isfinite(p.false_alarm) else (
      decide.calibrate(p.sd_paired, p.n, p.effect)["false_alarm"] if ok else math.nan)
  return calibrate.Calibration("paired", p.sd_paired, p.n, p.effect, alarm, p.power)


def pairs_md(pairs) -> str:
  """Comparisons as a table (expected better first; a loss in capitals): the paired advantage,
  its 95% interval, the paired and unpaired noise side by side, the design's power."""
  return md_table(pd.DataFrame([{"expected better": p.a, "expected worse": p.b,
                                 "outcome": p.outcome.upper() if p.outcome in (
                                     decide.LOSS, decide.WORSE) else p.outcome,
                                 "seeds": p.n, "advantage": p.advantage,
                                 "interval (95%, or the design's)": p.interval(),
                                 "paired ±": p.half_paired, "unpaired ±": p.half_unpaired,
                                 "power": p.power} for p in pairs]))


def outcomes(pairs) -> str:
  return "; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs) or "no pair"


def groups(values: dict) -> str:
  return "; ".join(f"{k}: {rules.summarize(list(v.values()))}" for k, v in values.items())


def sequential_reading(p: decide.Paired, a, b, design: sequential.Design,
                       lower_is_better: bool = True, noninferiority: bool = False
                       ) -> decide.Paired:
  """`p` read by the group-sequential `design` its seeds were added under
  (`pergrad.sweep.more_seeds`) at its last look reached (every look, the first included, at
  the design's critical t: its intervals replace the one-look 95%/90% ones); a divergence
  keeps `decide.compare`'s reading; fewer seeds than the first look read not separable.
  `noninferiority`: A non-inferior at the margin or worse beyond it
  (`sequential.read_noninferior`). A difference reading's power (win | the declared effect)
  and false alarm (win or loss | no gap) are the design's over its looks, simulated at the
  paired sd (`sequential.simulate`), not one look's."""
  _, xa, xb, _ = decide.shared(a, b)
  if p.why:
    return p
  d = (xb - xa) if lower_is_better else (xa - xb)
  read = sequential.read_noninferior if noninferiority else sequential.read
  out, _ = read(d, design, p.margin)
  if len(xa) < design.looks[0]:  # fewer than the pilot: its first look is still to come
    return dataclasses.replace(p, outcome=str(out), seeds_to_settle={
        "the design's first look": design.looks[0]}, reading=(
        f"short of the {design.spending} design's first look at {design.looks[0]} seeds"))
  k, m, se = sequential.look(d, design)
  rates = {} if noninferiority or not (math.isfinite(p.sd_paired) and p.sd_paired > 0) else {
      "false_alarm": sum(sequential.simulate(design, 0.0, p.sd_paired)[o]
                         for o in (decide.WIN, decide.LOSS)),
      "power": sequential.simulate(design, p.effect, p.sd_paired)[decide.WIN]}
  return dataclasses.replace(
      p, outcome=str(out), lo95=m - design.crit[k] * se, hi95=m + design.crit[k] * se,
      lo90=m - design.crit_equiv[k] * se, hi90=m + design.crit_equiv[k] * se, **rates,
      reading=f"{design.spending} look {k + 1} of {len(design.looks)} ({design.looks[k]} seeds), "
              f"|t| > {design.crit[k]:.3g}")


def pairs_report(values: dict, expected: list, *, rule: str, paper: str, effect: float,
                 margin: float | None = None, numbers_md: str = "", checks=(), verdict_fn=None,
                 planned=(), lower_is_better: bool = True, checked=(), comparisons=None,
                 design: sequential.Design | None = None) -> Report:
  """`decide.compare` of each `expected` pair (a expected better than b) of `values` ({arm:
  {seed: value}}) on their shared seeds, absence by TOST at ±`margin` (default `effect`), power
  reported for `effect`; read by the sequential `design` where seeds were added under one; or
  the experiment's own `comparisons`. The verdict is `verdict_fn` (default `decide.verdict_of`)
  of them, after the guards `checked` and `powered` (reported: an open pair reads "not
  separable" in the verdict itself). Names `planned` groups not run."""
  margin = effect if margin is None else margin
  pairs = list(comparisons) if comparisons is not None else [
      decide.compare(values.get(a, {}), values.get(b, {}), (a, b), effect=effect, margin=margin,
                     lower_is_better=lower_is_better) for a, b in expected]
  if design is not None and comparisons is None:
    pairs = [sequential_reading(p, values.get(p.a, {}), values.get(p.b, {}), design,
                                lower_is_better) for p in pairs]
  fn = verdict_fn or decide.verdict_of
  verdict = fn(pairs) if pairs else "not tested"
  cals = {key(p): calibration_of(p) for p in pairs}
  used = {x for p in expected for x in p}
  missing = [g for g in planned if g not in values]
  return gated(verdict, cals, checked, decided=[key(p) for p in pairs], rule=rule,
               paper=paper, ours=outcomes(pairs),
               checks=(groups({k: values[k] for k in values if k in used}),
                       *(p.sentence() for p in pairs), *checks,
                       *([f"Not run in this preset: {missing}"] if missing else [])),
               numbers_md=numbers_md + ("\n\n" + pairs_md(pairs) if pairs else ""))


def staged(read, a, b, pilot: int) -> tuple:
  """`read(a, b)` ({seed: value} each; the last item it returns: whether the reading is open)
  as a group-sequential design stops: on the first look's seeds (the first `pilot` seeds both
  arms ran, in seed order: seeds are added past the pilot's) and, only where that reading is
  open and more seeds were added, on every seed both ran (`sequential_reading` then reads its
  last look reached). A reading decided at its first look stays so, whatever seeds another
  comparison added to its arms."""
  common = sorted(set(map(float, a)) & set(map(float, b)))
  first = lambda v: {s: x for s, x in v.items() if float(s) in common[:pilot]}
  r = read(first(a), first(b))
  return read(a, b) if len(common) > pilot and r[-1] else r
