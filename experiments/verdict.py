"""The `Report` every experiment returns and the few templates its sentences are written
with: `finding`, `not_measured`, `gated`, `pairs_report`, and numbers as text and Markdown."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from pergrad.analysis import calibrate, rules


def finding(verdict: str, ours: str, checks=(), cal=None) -> str:
  """The one finding template: the verdict, what we measured, the rule's checks, its error rates."""
  parts = [f"{verdict}: {ours}", *checks]
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

  @property
  def finding(self) -> str:
    return finding(self.verdict, self.ours, self.checks)

  def to_json(self, provenance: dict) -> dict:
    """report.json: the claims table's fields, the checks, the calibration, the provenance."""
    return {"verdict": self.verdict, "rule": self.rule, "paper": self.paper, "ours": self.ours,
            "checks": list(self.checks), "calibration": self.calibration, **provenance}

  @classmethod
  def from_json(cls, doc: dict) -> Report:
    return cls(verdict=doc.get("verdict", ""), rule=doc.get("rule", ""), paper=doc.get("paper", ""),
               ours=doc.get("ours") or doc.get("claim_row") or doc.get("finding", ""),
               checks=tuple(doc.get("checks") or ()), calibration=doc.get("calibration"))


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


def gated(verdict: str, cal: calibrate.Calibration, **kw) -> Report:
  """The Report of `verdict` gated by the rule's error rates `cal` (`calibrate.gate`)."""
  return Report(verdict=calibrate.gate(verdict, cal), calibration=cal.row(), **kw)


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


def pairs_report(values: dict, expected: list, *, rule: str, paper: str, effect: float,
                 numbers_md: str = "", checks=(), verdict_fn=None, planned=(),
                 lower_is_better: bool = True, cal: calibrate.Calibration | None = None) -> Report:
  """`rules.decide` on `expected` (or `verdict_fn` on its pairs), gated by `cal` or the pair
  rule's error rates at the pooled seed noise for `effect`; names `planned` groups not run."""
  verdict, pairs = (rules.decide(values, expected, lower_is_better=lower_is_better)
                    if expected else ("not tested", []))
  if verdict_fn is not None:
    verdict = verdict_fn(pairs)
  used = {x for p in expected for x in p}
  if cal is None:
    vals = [v for k, v in values.items() if k in used and np.isfinite(v).all()]  # diverged out
    cal = calibrate.calibrate("pair", calibrate.pooled_std(vals),
                              min((len(v) for v in vals), default=0), effect)
  missing = [g for g in planned if g not in values]
  return gated(verdict, cal, rule=rule, paper=paper, ours=outcomes(pairs),
               checks=(groups({k: values[k] for k in values if k in used}),
                       *(p.sentence() for p in pairs), *checks,
                       *([f"Not run in this preset: {missing}"] if missing else [])),
               numbers_md=numbers_md + ("\n\n" + pairs_md(pairs) if pairs else ""))
