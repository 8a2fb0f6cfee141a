"""The rows of the claims table (README.md, results/<preset>/README.md): one per claim of the
papers, decided by the paper's own test, then one per comparison of ours beside it, each the
`row` its experiment declares."""

from __future__ import annotations

from pergrad.sweep.record import experiments

LEGEND = ("Rows C1-G3: the paper's own test, which decides the claim's verdict; rows marked "
          "\"ours\": our comparisons beside it, not counted toward the claim. A failed validity "
          "guard reads \"undetermined: <guard>\". The rule, numbers and guards of each row are "
          "in its experiment's README.")


def claim_rows() -> dict[str, tuple]:
  """{row of the claims table: the experiments in it}: the paper's tests, then the other rows,
  each in the order of their claims' ids (the rows' text)."""
  rows: dict[str, tuple] = {}
  for exp in sorted(experiments().values(), key=lambda e: (not e.papers_test, e.row)):
    rows[exp.row] = (*rows.get(exp.row, ()), exp.name)
  return rows
