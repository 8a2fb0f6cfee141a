"""Verdicts after the validity guards: `gated`, and `pairs_report` for the experiments that
compare pairs of arms with the pair rule."""

from __future__ import annotations

import dataclasses
import itertools

import pandas as pd

from experiments.markdown import md_table
from experiments.report import Report
from pergrad.analysis import calibrate, guards, rules


def gated(verdict: str, cals, checked=(), moot=(), **kw) -> Report:
  """The Report of `verdict` after the validity guards (`pergrad.analysis.guards`): those
  `checked` by the experiment (bracketed, stable, warm, in_regime) and `powered` over `cals`
  ({comparison: its `Calibration`}, or one; `moot`: those that cannot change the verdict); a
  failed one makes the verdict "undetermined: <guard>". The claims table shows the weakest
  comparison's error rates."""
  cals = cals if isinstance(cals, dict) else {"rule": cals}
  every = (*checked, guards.powered(cals, moot=moot))
  weakest = calibrate.weakest([c for k, c in cals.items() if k not in moot] or cals.values())
  shown = guards.apply(verdict, every)
  overridden = shown != verdict and not verdict.startswith(guards.UNDETERMINED)
  return Report(verdict=shown, rule_verdict=verdict if overridden else "",
                guards=tuple(g.row() for g in every),
                calibration=weakest.row() if weakest else None,
                calibrations={k: c.row() for k, c in cals.items()}, **kw)


def pairs_md(pairs) -> str:
  """Comparisons as a table (expected better first; a loss in capitals)."""
  return md_table(pd.DataFrame([{"expected better": p.a, "expected worse": p.b,
                                 "outcome": "LOSS" if p.outcome == rules.LOSS else p.outcome,
                                 "mean (better)": p.mean_a, "mean (worse)": p.mean_b,
                                 "95% half-width": p.noise}
                                for p in pairs]))


def outcomes(pairs) -> str:
  return "; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs) or "no pair"


def groups(values: dict) -> str:
  return "; ".join(f"{k}: {rules.summarize(v)}" for k, v in values.items())


MOOT_MAX = 8  # under-powered comparisons whose outcomes `moot` enumerates (4^8 verdicts)


def moot(verdict: str, pairs, cals: dict, verdict_fn=None) -> tuple[str, ...]:
  """The under-powered comparisons (`cals`' keys "a vs b", power < `calibrate.MIN_POWER`) whose
  outcomes cannot change the verdict: `verdict_fn` (default `rules.verdict_of`) of the pairs
  gives the same verdict for every outcome (win, tie, loss, undetermined) of all of them
  together, so `verdict` rests on the powered ones alone (e.g. a powered loss, where one loss
  decides). Empty when any under-powered key is no pair, past MOOT_MAX of them, or when
  `verdict` is not `verdict_fn`'s of `pairs`."""
  fn = verdict_fn or rules.verdict_of
  at = {f"{p.a} vs {p.b}": i for i, p in enumerate(pairs)}
  weak = [k for k, c in cals.items() if c.source != calibrate.DIVERGED
          and not c.power >= calibrate.MIN_POWER]
  if not weak or len(weak) > MOOT_MAX or any(k not in at for k in weak) or fn(pairs) != verdict:
    return ()
  now, outs = verdict, (rules.WIN, rules.TIE, rules.LOSS, rules.UNDETERMINED)
  for combo in itertools.product(outs, repeat=len(weak)):
    swapped = list(pairs)
    for k, o in zip(weak, combo, strict=True):
      swapped[at[k]] = dataclasses.replace(swapped[at[k]], outcome=o)
    if fn(swapped) != now:
      return ()
  return tuple(weak)


def pairs_report(values: dict, expected: list, *, rule: str, paper: str, effect: float,
                 numbers_md: str = "", checks=(), verdict_fn=None, planned=(),
                 lower_is_better: bool = True, cals: dict | None = None, checked=(),
                 comparisons=None, pilot: int | None = None) -> Report:
  """`rules.decide` on `expected` (or `verdict_fn` on its pairs, or on `comparisons` made by
  the experiment's own rules), after the guards `checked` and `powered`: each pair's rule at
  its own arms' noise and seeds for `effect` (or `cals`, {"a vs b": Calibration}); names
  `planned` groups not run. `pilot`: the seeds that chose how many followed
  (`pergrad.sweep.more_seeds`), `rules.compare`'s."""
  verdict, pairs = (rules.decide(values, expected, lower_is_better=lower_is_better, pilot=pilot)
                    if expected else ("not tested", []))
  if comparisons is not None:
    pairs = list(comparisons)
  if verdict_fn is not None:
    verdict = verdict_fn(pairs)
  used = {x for p in expected for x in p}
  if cals is None:
    cals = {f"{a} vs {b}": calibrate.of_arms(values.get(a, ()), values.get(b, ()), effect,
                                             pilot=pilot) for a, b in expected}
  missing = [g for g in planned if g not in values]
  return gated(verdict, cals, checked, moot=moot(verdict, pairs, cals, verdict_fn), rule=rule,
               paper=paper, ours=outcomes(pairs),
               checks=(groups({k: values[k] for k in values if k in used}),
                       *(p.sentence() for p in pairs), *checks,
                       *([f"Not run in this preset: {missing}"] if missing else [])),
               numbers_md=numbers_md + ("\n\n" + pairs_md(pairs) if pairs else ""))
