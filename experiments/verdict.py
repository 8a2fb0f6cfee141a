"""The few sentence templates and Markdown tables every report is written with.

  finding(verdict, ours, checks, cal)   "<verdict>: <ours>. <checks>. <rule's error rates>."
  outcomes(pairs)                       "a vs b: win; c vs d: tie"
  groups(values)                        "a: 4.012 ± 0.003 (n=5); b: ..."
"""

from __future__ import annotations

import math

import pandas as pd

from experiments.rules import LOSS, TIE, UNDETERMINED, WIN, Comparison, summarize


def fmt_num(x, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "n/a"
  if isinstance(x, float) and math.isinf(x):
    return "diverged"
  return f"{x:.{digits}g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits}f}"


def md_table(df: pd.DataFrame) -> str:
  """A small DataFrame as a Markdown table."""
  cols = list(df.columns)
  lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
  for _, r in df.iterrows():
    lines.append("| " + " | ".join(fmt_num(v) if isinstance(v, float) else str(v) for v in r) + " |")
  return "\n".join(lines)


def pairs_md(pairs) -> str:
  """Comparisons as a table (expected better first)."""
  word = {WIN: "win", LOSS: "LOSS", TIE: "tie", UNDETERMINED: "undetermined"}
  return md_table(pd.DataFrame([{"expected better": p.a, "expected worse": p.b,
                                 "outcome": word[p.outcome], "mean (better)": p.mean_a,
                                 "mean (worse)": p.mean_b, "95% half-width": p.noise}
                                for p in pairs]))


def outcomes(pairs: list[Comparison]) -> str:
  return "; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs) or "no pair"


def groups(values: dict) -> str:
  return "; ".join(f"{k}: {summarize(v)}" for k, v in values.items())


def finding(verdict: str, ours: str, checks=(), cal=None) -> str:
  """The one finding template: the verdict, what we measured, the rule's checks, its error rates."""
  parts = [f"{verdict}: {ours}", *checks]
  if cal is not None:
    parts.append(f"Rule's error rates ({cal.text()})")
  return ". ".join(p.rstrip(".") for p in parts if p) + "."
