"""Sign agreement of an update with the expected gradient, from the logged sign counts.

The train loop logs, per leaf and over all leaves ("total"), the raw sums of
`pergrad.stats.sign_agreement.SignCounts` against held-out batches: `sign/<leaf>/<field>`
for FIELDS. Sums pool by adding, so a run's counts are pooled over the second half of
training (and over leaves) first, then turned into (sign_agreement's formulas, in NumPy):

    agree      = agree / selected          P(sign u = sign E g) over the coordinates the
                                           held-out mean resolves (|t| ≥ z)
    resolved   = selected / coords         their share
    agree_raw  = agree_all / coords        over all coordinates (attenuated toward 1/2)
    alignment  = progress / √(coords · mu2)  cosine of the sign step with E g (NaN: mu2 ≤ 0)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments.rules import is_norm_leaf
from experiments.runs import stat_columns

FIELDS = ("coords", "agree_all", "selected", "agree", "progress", "mu2")
SUMMARY = ("agree", "resolved", "agree_raw", "alignment")
CSV = "snr_sign.csv"
TOTAL = "total"
NO_NORM = "no norm"  # the pool of every leaf but the normalization layers'


def long(table: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
  """ids + leaf + FIELDS: one row per run, logged step and leaf (incl. "total"); empty
  when no `sign/` counts were logged."""
  leaves = {c.split("/", 1)[1].rsplit("/", 1)[0] for c in stat_columns(table, "coords", "sign")}
  frames = []
  for leaf in sorted(leaves):
    cols = {f"sign/{leaf}/{f}": f for f in FIELDS}
    if not set(cols) <= set(table.columns):
      continue
    sub = table[ids + list(cols)].dropna(subset=list(cols)).rename(columns=cols)
    frames.append(sub.assign(leaf=leaf))
  cols = ids + ["leaf", *FIELDS]
  return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def summarize(counts: pd.DataFrame) -> pd.DataFrame:
  """counts plus the SUMMARY columns computed from its (pooled) FIELDS."""
  c = {f: counts[f].to_numpy(float) for f in FIELDS}
  with np.errstate(divide="ignore", invalid="ignore"):
    out = {"agree": np.where(c["selected"] > 0, c["agree"] / c["selected"], np.nan),
           "resolved": c["selected"] / c["coords"],
           "agree_raw": c["agree_all"] / c["coords"],
           "alignment": np.where(c["mu2"] > 0, c["progress"] / np.sqrt(
               c["coords"] * np.where(c["mu2"] > 0, c["mu2"], 1.0)), np.nan)}
  return counts.assign(**out)


def pooled(sign_df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
  """Per group of `keys` (e.g. placement, seed): the counts summed over the second half of
  each run's logged steps, for "total" and for the pool without the normalization layers,
  with their SUMMARY."""
  if sign_df.empty:
    return pd.DataFrame(columns=[*keys, "leaf", *FIELDS, *SUMMARY])
  last = sign_df.groupby("run")["step"].transform("max")
  late = sign_df[sign_df["step"] > last / 2]
  total = late[late["leaf"] == TOTAL]
  rest = late[(late["leaf"] != TOTAL) & ~late["leaf"].map(is_norm_leaf)]
  parts = [g.groupby(keys, dropna=False)[list(FIELDS)].sum().reset_index().assign(leaf=name)
           for name, g in ((TOTAL, total), (NO_NORM, rest)) if not g.empty]
  return summarize(pd.concat(parts, ignore_index=True)) if parts else pd.DataFrame(
      columns=[*keys, "leaf", *FIELDS, *SUMMARY])


def read(out_dir: Path) -> pd.DataFrame:
  path = Path(out_dir) / CSV
  return pd.read_csv(path) if path.exists() else pd.DataFrame()
