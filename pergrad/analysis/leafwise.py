"""Per-leaf views of whole-model ratios and of the logged sign counts.

A ratio of sums Σnum/Σden weighs a leaf by its share of Σnum and Σden, not of the parameters
(the norm layers: a tiny share of the parameters, most of Σμ̂²), so each seed also gets
`leaf_aggregates` of the per-leaf ratios, weighted by the counts in leaf_params.csv.
The sign counts `sign[_lag][_<stage>]/<leaf>/<field>` (`pergrad.stats.sign_agreement.SignCounts`
of the update or a stage's direction against the current or lagged held-out mean,
`pergrad.train.heldout`) are summed over leaves per logged step (`sign_pools`) and over the
second half of training (`sign_pooled`, `sign_summary`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd

from pergrad.analysis.runs import leaf_of, read_csv, stat_columns, write_csv
from pergrad.layer_types import layer_type

SIZES_CSV = "leaf_params.csv"
WHOLE = ("all", "total")  # the whole-model "leaf" of opt/ and stats/, sign/ keys
VIEWS = ("share_params_above_1", "median", "weighted_median")
FIELDS = ("coords", "agree_all", "selected", "agree", "progress", "mu2")
SUMMARY = ("agree", "resolved", "agree_raw", "alignment")
TOTAL, NO_NORM = "total", "no norm"  # the pools: every leaf, every leaf but the norm layers'


def is_norm_leaf(path: str) -> bool:
  """A normalization layer's leaf (`pergrad.layer_types`, the library's one classifier)."""
  return layer_type(path) == "norm"


def weighted_median(values, weights) -> float:
  """The smallest value whose cumulative weight (values sorted) reaches half the total."""
  v, w = np.asarray(values, float), np.asarray(weights, float)
  if not len(v) or w.sum() <= 0:
    return math.nan
  o = np.argsort(v, kind="stable")
  cum = np.cumsum(w[o])
  return float(v[o][np.searchsorted(cum, 0.5 * cum[-1])])


def _aggregate(num, den, size) -> dict:
  """A ratio num/den over leaves: Σnum/Σden, share of parameters with ratio > 1, medians."""
  with np.errstate(divide="ignore", invalid="ignore"):
    r = np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)
  ok = np.isfinite(r)
  tot = float(size[ok].sum())
  return {"ratio_of_sums": float(num.sum() / den.sum()) if den.sum() else math.nan,
          "share_params_above_1": float(size[ok & (r > 1)].sum() / tot) if tot else math.nan,
          "median": float(np.median(r[ok])) if ok.any() else math.nan,
          "weighted_median": weighted_median(r[ok], size[ok]), "n_leaves": len(num),
          "n_params": int(size.sum())}


def leaf_aggregates(num: Mapping[str, float], den: Mapping[str, float], n_params: Mapping[str, int],
                    is_norm: Callable[[str], bool] = is_norm_leaf) -> dict[str, float]:
  """{view: value}: `_aggregate` over all leaves and `_no_norm`, and the norm leaves' shares
  of Σnum, Σden and the parameters (a leaf with den = 0 has no ratio)."""
  leaves = list(num)
  missing = [k for k in leaves if k not in den or k not in n_params]
  if missing or not leaves:
    raise ValueError(f"leaf_aggregates: no den / n_params for leaves {missing[:5]} (or no leaves)")
  n, d, s = (np.array([float(m[k]) for k in leaves]) for m in (num, den, n_params))
  norm = np.array([bool(is_norm(k)) for k in leaves])
  out = {k + suffix: v for suffix, sel in (("", slice(None)), ("_no_norm", ~norm))
         for k, v in _aggregate(n[sel], d[sel], s[sel]).items()}
  share = lambda x: float(x[norm].sum() / x.sum()) if x.sum() else math.nan
  return {**out, "norm_share_num": share(n), "norm_share_den": share(d),
          "norm_share_params": share(s)}


def sizes_from_table(table: pd.DataFrame) -> dict[str, int] | None:
  """leaf -> parameter count: from the model of `table.attrs["overrides"]` (the overrides
  its runs share, when the caller knows them), else the logged `sign/<leaf>/coords`; None
  when neither is there."""
  if table.attrs.get("overrides"):
    from pergrad.analysis import leaf_sizes

    return leaf_sizes(list(table.attrs["overrides"]))
  cols = [c for c in stat_columns(table, "coords", "sign") if leaf_of(c) not in WHOLE]
  sizes = {leaf_of(c): int(table[c].dropna().iloc[0]) for c in cols if table[c].notna().any()}
  return sizes or None


def write_sizes(table: pd.DataFrame, out_dir: Path) -> None:
  if sizes := sizes_from_table(table):
    write_csv(pd.DataFrame({"leaf": list(sizes), "n_params": list(sizes.values())}),
              Path(out_dir) / SIZES_CSV)


def read_sizes(out_dir: Path) -> dict[str, int] | None:
  df = read_csv(Path(out_dir) / SIZES_CSV)
  return dict(zip(df["leaf"], df["n_params"].astype(int), strict=True)) if len(df) else None


def second_half(df: pd.DataFrame) -> pd.DataFrame:
  """The rows past the middle of each run's logged steps."""
  return df if df.empty else df[df["step"] > df.groupby("run")["step"].transform("max") / 2]


def first_half(df: pd.DataFrame) -> pd.DataFrame:
  """The rows up to the middle of each run's logged steps (`second_half`'s complement)."""
  return df if df.empty else df[df["step"] <= df.groupby("run")["step"].transform("max") / 2]


def per_seed_views(by_leaf: pd.DataFrame, sizes: dict[str, int], keys: list[str]) -> pd.DataFrame:
  """by_leaf: keys + [leaf, num, den]; one row per group of `keys`: `rules.leaf_aggregates`."""
  missing = sorted(set(by_leaf["leaf"]) - set(sizes))
  if missing:
    raise ValueError(f"no parameter count for leaves {missing[:3]} in {SIZES_CSV}; re-run the "
                     "analysis with the runs' model (its sizes come from the sweep's config)")
  return pd.DataFrame([{**dict(zip(keys, key, strict=True)), **leaf_aggregates(
      dict(zip(g["leaf"], g["num"], strict=True)), dict(zip(g["leaf"], g["den"], strict=True)),
      sizes)} for key, g in by_leaf.groupby(keys, sort=False)])  # a list of keys: tuples


def long_stats(t: pd.DataFrame, ids: list[str], names: dict, key: str, value: str) -> pd.DataFrame:
  """ids, key, leaf, value: a row per run, logged step and column `<prefix>/<leaf>/<name>` of
  each name (`names`: {name: prefix})."""
  rows = [t[ids + [c]].dropna(subset=[c]).rename(columns={c: value}).assign(**{key: n},
                                                                             leaf=leaf_of(c))
          for n, prefix in names.items() for c in stat_columns(t, n, prefix)]
  cols = [*ids, key, "leaf", value]
  return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def sign_long(table: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
  """ids + direction (update, example, batch, ema) + target (current, lagged) + leaf + FIELDS:
  one row per run, logged step, direction, target and leaf (incl. "total")."""
  frames = []
  for pre, leaf in sorted({(c.split("/")[0], leaf_of(c)) for c in stat_columns(table, "coords")
                           if c.startswith("sign")}):
    cols, lag = {f"{pre}/{leaf}/{f}": f for f in FIELDS}, pre.startswith("sign_lag")
    if set(cols) <= set(table.columns):
      frames.append(table[ids + list(cols)].dropna(subset=list(cols)).rename(columns=cols).assign(
          direction=pre.removeprefix("sign_lag" if lag else "sign").lstrip("_") or "update",
          target="lagged" if lag else "current", leaf=leaf))
  cols = ids + ["direction", "target", "leaf", *FIELDS]
  return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def sign_summary(counts: pd.DataFrame) -> pd.DataFrame:
  """counts plus the SUMMARY of its (pooled) FIELDS: agree = agree / selected, resolved =
  selected / coords, agree_raw = agree_all / coords, alignment = progress / √(coords · mu2)
  (NaN where nothing is selected or mu2 ≤ 0)."""
  c = {f: counts[f].to_numpy(float) for f in FIELDS}
  pos = c["mu2"] > 0
  with np.errstate(divide="ignore", invalid="ignore"):
    return counts.assign(
        agree=np.where(c["selected"] > 0, c["agree"] / c["selected"], np.nan),
        resolved=c["selected"] / c["coords"], agree_raw=c["agree_all"] / c["coords"],
        alignment=np.where(pos, c["progress"] / np.sqrt(c["coords"] * np.where(pos, c["mu2"], 1)),
                           np.nan))


def sign_pools(long: pd.DataFrame) -> pd.DataFrame:
  """`sign_long`'s rows summed over the leaves of each pool (TOTAL: the logged total; NO_NORM:
  every leaf but the norm layers'), one row per run, logged step, direction, target and pool."""
  keys = [c for c in long.columns if c not in ("leaf", *FIELDS)]
  rest = long[(long["leaf"] != TOTAL) & ~long["leaf"].map(is_norm_leaf)]
  no_norm = rest.groupby(keys, dropna=False, sort=False)[list(FIELDS)].sum().reset_index()
  return pd.concat([long[long["leaf"] == TOTAL], no_norm.assign(leaf=NO_NORM)[long.columns]],
                   ignore_index=True)


def sign_pooled(pools: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
  """Per group of `keys` and pool (`sign_pools`' leaf): the counts summed over the second half
  of each run, with their SUMMARY."""
  empty = pd.DataFrame(columns=[*keys, "leaf", *FIELDS, *SUMMARY])
  if pools.empty:
    return empty
  late = second_half(pools)
  parts = [late[late["leaf"] == name].groupby(keys, dropna=False)[list(FIELDS)].sum()
           .reset_index().assign(leaf=name) for name in (TOTAL, NO_NORM)]
  parts = [p for p in parts if len(p)]  # a table without total / no-norm rows: none
  return sign_summary(pd.concat(parts, ignore_index=True)) if parts else empty
