"""The `Report` every experiment returns, and its one-sentence finding."""

from __future__ import annotations

import dataclasses

from pergrad.analysis import guards


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


def not_measured(rule: str, what: str, name: str = "", **kw) -> Report:
  """"not measured: <what>; re-run ..." (the experiment's inputs are missing)."""
  rerun = f": re-run `python scripts/reproduce.py {name} --preset <preset>`" if name else ""
  return Report(verdict="not measured", rule=rule, ours=what + rerun, **kw)
