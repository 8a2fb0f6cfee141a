"""Numbers as text and Markdown, for the experiments' reports."""

from __future__ import annotations

import math

import pandas as pd


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
