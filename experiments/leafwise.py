"""Per-leaf views of whole-model ratios for the snr and moments experiments.

A whole-model ratio of sums Σnum/Σden weighs a leaf by its share of Σnum and Σden, not of
the parameters: in the cpu runs the normalization layers hold 0.19 % of the parameters but
most of Σμ̂². Each report therefore gives, per seed, `rules.leaf_aggregates` of the
per-leaf ratios (share of parameters in leaves with ratio > 1, median over leaves,
parameter-weighted median), over all leaves and without the normalization layers
(`rules.is_norm_leaf`), with the leaves' parameter counts from `leaf_params.csv`.

`leaf_params.csv` (leaf, n_params) is written by `analyze` from the model of the sweep's
base overrides (the runner puts them in `table.attrs["overrides"]`; shapes only,
`pergrad.analysis.leaf_sizes`), else from the runs' logged sign counts (`sign/<leaf>/coords`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.rules import is_norm_leaf, leaf_aggregates
from experiments.runs import leaf_of, stat_columns

SIZES_CSV = "leaf_params.csv"
WHOLE = ("all", "total")  # the whole-model "leaf" of opt/ and stats/, sign/ keys
VIEWS = ("share_params_above_1", "median", "weighted_median")  # the per-leaf views


def sizes_from_table(table: pd.DataFrame) -> dict[str, int] | None:
  """leaf -> parameter count: from the model of `table.attrs["overrides"]` (the runner's),
  else the logged `sign/<leaf>/coords`; None when neither is there."""
  overrides = table.attrs.get("overrides")
  if overrides:
    from pergrad.analysis import leaf_sizes

    return leaf_sizes(list(overrides))
  cols = [c for c in stat_columns(table, "coords", "sign") if leaf_of(c) not in WHOLE]
  sizes = {leaf_of(c): int(table[c].dropna().iloc[0]) for c in cols if table[c].notna().any()}
  return sizes or None


def write_sizes(table: pd.DataFrame, out_dir: Path) -> None:
  """leaf_params.csv of the table's runs (nothing when the counts are unknown)."""
  sizes = sizes_from_table(table)
  if sizes:
    pd.DataFrame({"leaf": list(sizes), "n_params": list(sizes.values())}).to_csv(
        Path(out_dir) / SIZES_CSV, index=False)


def read_sizes(out_dir: Path) -> dict[str, int] | None:
  path = Path(out_dir) / SIZES_CSV
  if not path.exists():
    return None
  df = pd.read_csv(path)
  return dict(zip(df["leaf"], df["n_params"].astype(int), strict=True))


def second_half(df: pd.DataFrame) -> pd.DataFrame:
  """The rows past the middle of each run's logged steps."""
  if df.empty:
    return df
  last = df.groupby("run")["step"].transform("max")
  return df[df["step"] > last / 2]


def aggregates(num: pd.Series, den: pd.Series, sizes: dict[str, int]) -> dict:
  """`rules.leaf_aggregates` of leaf-indexed sums; a leaf without a count is an error."""
  missing = sorted(set(num.index) - set(sizes))
  if missing:
    raise ValueError(f"no parameter count for leaves {missing[:3]} in {SIZES_CSV}; re-run the "
                     "analysis with the runs' model (its sizes come from the sweep's config)")
  return leaf_aggregates(num.to_dict(), den.to_dict(), sizes, is_norm=is_norm_leaf)


def per_seed_views(by_leaf: pd.DataFrame, sizes: dict[str, int], keys: list[str]
                   ) -> pd.DataFrame:
  """by_leaf: rows keys + [leaf, num, den] (one per leaf and group of `keys`); out: one row
  per group, `rules.leaf_aggregates` of its leaves."""
  rows = []
  for key, g in by_leaf.groupby(keys, sort=False):
    key = key if isinstance(key, tuple) else (key,)
    agg = aggregates(g.set_index("leaf")["num"], g.set_index("leaf")["den"], sizes)
    rows.append({**dict(zip(keys, key, strict=True)), **agg})
  return pd.DataFrame(rows)


def view_text(row: pd.Series | dict, name: str = "") -> str:
  """"share of parameters with r > 1: 0.12 (all leaves) / 0.10 (no norm), ..." of one
  (mean) row of `per_seed_views`."""
  f = lambda x: "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"
  parts = [f"{label} {f(row.get(k))} (all leaves) / {f(row.get(k + '_no_norm'))} (no norm)"
           for k, label in (("share_params_above_1", f"share of parameters with {name} > 1"),
                            ("median", "median over leaves"),
                            ("weighted_median", "parameter-weighted median"))]
  return ", ".join(parts)


def norm_shares_text(row: pd.Series | dict, num: str, den: str) -> str:
  f = lambda x: "n/a" if x is None or not np.isfinite(x) else f"{100 * x:.3g} %"
  return (f"the normalization layers hold {f(row.get('norm_share_params'))} of the "
          f"parameters, {f(row.get('norm_share_num'))} of {num} and "
          f"{f(row.get('norm_share_den'))} of {den}")
