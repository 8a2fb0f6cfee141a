"""The `Report` every experiment returns and the few templates its sentences are written
with: `finding`, `not_measured`, `gated` (the validity guards, then the verdict),
`pairs_report`, and numbers as text and Markdown."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pandas as pd

from pergrad.analysis import calibrate, guards, rules


def finding(verdict: str, ours: str, checks=(), cal=None) -> str:
  """The one finding template: the verdict, what we measured, the rule's checks, its error rates."""
  parts = [f"{verdict}: {ours}" if verdict else ours, *checks]
  if cal is not None:
    parts.append(f"Rule's error rates ({cal.text()})")
  return ". ".join(p.rstrip(".") for p in parts if p) + "."


@dataclasses.dataclass(frozen=True)
class Report:
  """What `Experiment.report(out_dir)` returns: the verdict, the rule stated before the data,
  the claims table's cells, the checks, the rule's error rates, the README's Markdown."""

  verdict: str
  rule: str = ""
  paper: str = ""
  ours: str = ""
  checks: tuple = ()
  calibration: dict | None = None
  numbers_md: str = ""
  setup_md: str = ""
  guards: tuple = ()  # `guards.Guard.row()`s, checked before the verdict
  calibrations: dict | None = None  # {comparison: its `Calibration.row()`}
  rule_verdict: str = ""  # the rule's verdict before the guards, where a guard changed it

  @property
  def finding(self) -> str:
    return finding(self.headline, self.ours, self.checks)

  @property
  def headline(self) -> str:
    """The verdict, with the rule's own where a guard overrode it."""
    return (f"{self.verdict} (the rule alone: {self.rule_verdict})" if self.rule_verdict
            else self.verdict)

  def guards_text(self) -> str:
    """"Guards: bracketed: passes (...); ..." ('' when none was checked)."""
    return "; ".join(guards.Guard(**g).text() for g in self.guards)

  def to_json(self, provenance: dict) -> dict:
    """report.json: the claims table's fields, the checks, the guards, the calibrations, the
    provenance."""
    return {"verdict": self.verdict, "rule": self.rule, "paper": self.paper, "ours": self.ours,
            "checks": list(self.checks), "guards": list(self.guards),
            "calibration": self.calibration, "calibrations": self.calibrations,
            **({"rule_verdict": self.rule_verdict} if self.rule_verdict else {}), **provenance}

  @classmethod
  def from_json(cls, doc: dict) -> Report:
    return cls(verdict=doc.get("verdict", ""), rule=doc.get("rule", ""), paper=doc.get("paper", ""),
               ours=doc.get("ours") or doc.get("claim_row") or doc.get("finding", ""),
               checks=tuple(doc.get("checks") or ()), calibration=doc.get("calibration"),
               guards=tuple(doc.get("guards") or ()), calibrations=doc.get("calibrations"),
               rule_verdict=doc.get("rule_verdict", ""))


@dataclasses.dataclass(frozen=True)
class Declared:
  """A value stated before the runs in `configs/experiment/<name>.yaml` (`declared.<key>`),
  with its one-line justification."""

  key: str
  value: float
  why: str

  def text(self) -> str:
    return f"{self.key} {self.value:g} ({self.why})"


def declared(name: str, key: str) -> Declared:
  """`declared.<key>` of experiment `name`'s config: {value, why} (KeyError if not stated)."""
  from experiments.sweep import experiment_value

  d = experiment_value(name, f"declared.{key}")
  if not isinstance(d, dict) or "value" not in d or not str(d.get("why", "")).strip():
    raise KeyError(f"configs/experiment/{name}.yaml: declared.{key} needs a value and a why")
  return Declared(key, float(d["value"]), " ".join(str(d["why"]).split()))


def declared_text(*items: Declared) -> str:
  """"Declared before the run: margin 0.02 (why); ..."."""
  return "Declared before the run: " + "; ".join(d.text() for d in items)


def not_measured(rule: str, what: str, name: str = "", **kw) -> Report:
  """"not measured: <what>; re-run ..." (the experiment's inputs are missing)."""
  rerun = f": re-run `python scripts/reproduce.py {name} --preset <preset>`" if name else ""
  return Report(verdict="not measured", rule=rule, ours=what + rerun, **kw)


def fmt_num(x, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "n/a"
  if isinstance(x, float) and math.isinf(x):
    return "diverged"
  return f"{x:.{digits}g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits}f}"


def md_table(df: pd.DataFrame) -> str:
  """A small DataFrame as a Markdown table."""
  cell = lambda v: fmt_num(v) if isinstance(v, float) else str(v)
  return "\n".join(["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns),
                    *("| " + " | ".join(map(cell, r)) + " |" for _, r in df.iterrows())])


def listing(items, fmt=fmt_num) -> str:
  """"k v, k v" of (key, value) pairs, each value by `fmt`."""
  return ", ".join(f"{k} {fmt(v)}" for k, v in items)


def sections(*parts) -> str:
  """Markdown of the numbers: text and tables (DataFrames, by `md_table`), a blank line apart."""
  return "\n\n".join(md_table(p) if isinstance(p, pd.DataFrame) else p for p in parts)


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
  (`experiments.more_seeds`), `rules.compare`'s."""
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
