"""Decision rules on seeds shared by the experiments, stated in English beside the code:
divergence (`DIVERGED_RULE`), the Welch interval (the unpaired noise shown beside the paired
rules of `pergrad.analysis.decide`), bounds on ratios (`pergrad.bounds`), the summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from pergrad.bounds import FAILS, HOLDS, UNDETERMINED, bound, quartiles  # noqa: F401

REPRODUCED, NOT_REPRODUCED, PARTLY = "reproduced", "not reproduced", "partly reproduced"
PAIR_ALPHA = 0.025  # per side: identical arms are called different ≤ 5 % of the time


def clean(values: Sequence[float]) -> np.ndarray:
  """Floats with every non-finite value (a diverged seed) as +inf."""
  x = np.asarray([float(v) for v in values], dtype=float)
  return np.where(np.isfinite(x), x, np.inf)


def adjacent(orders) -> list[tuple]:
  """The adjacent pairs (a, b) = "a beats b" of several expected orders (best first), each once."""
  return list(dict.fromkeys(p for o in orders for p in zip(o, o[1:], strict=False)))


def summarize(values: Sequence[float]) -> str:
  """"mean ± std (n=k)", "diverged (d/k seeds)" or "no seeds"."""
  x = clean(values)
  if not len(x):
    return "no seeds"
  if np.isinf(x).any():
    return f"diverged ({int(np.isinf(x).sum())}/{len(x)} seeds)"
  return f"{x.mean():.3f}" + (f" ± {x.std(ddof=1):.2g} (n={len(x)})" if len(x) > 1 else " (n=1)")


ALPHA, GUARD = 0.05, 2.0  # GUARD: no point of a collapse beyond GUARD × margin


def welch_interval(a, b, alpha: float = ALPHA):
  """(mean(a) − mean(b), lo, hi) of the two-sided (1 − 2α) Welch t-interval along the last
  axis (floats for 1-D values, arrays for rows of draws; ≥ 2 values a side)."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  na, nb = a.shape[-1], b.shape[-1]
  if na < 2 or nb < 2:
    raise ValueError(f"welch_interval: {na} and {nb} values; give >= 2 on each side")
  ka, kb = na, nb
  va = a.var(-1, ddof=1) / na
  vb = b.var(-1, ddof=1) / nb
  d, se = a.mean(-1) - b.mean(-1), np.sqrt(va + vb)
  with np.errstate(divide="ignore", invalid="ignore"):
    df = (va + vb) ** 2 / (va**2 / (ka - 1) + vb**2 / (kb - 1))
  half = np.where(se > 0, stats.t.ppf(1 - alpha, df) * se, 0.0)
  out = (d, d - half, d + half)
  return tuple(float(x) for x in out) if np.ndim(d) == 0 else out


DIVERGED_RULE = ("a run diverged when an eval loss is non-finite, its last eval loss exceeds "
                 "ln V (uniform prediction over V tokens), or an eval loss exceeds ln V after "
                 "an earlier one was below it")


def diverged(eval_losses: Sequence[float], vocab_size: int) -> bool:
  """`DIVERGED_RULE` on one run's eval losses in step order (a fresh model starts above ln V)."""
  if vocab_size < 2:
    raise ValueError(f"vocab_size={vocab_size}: give the tokenizer's vocabulary size (>= 2)")
  x = np.asarray(eval_losses, float)
  if not len(x):
    return False
  if (~np.isfinite(x)).any():
    return True
  above = x > math.log(vocab_size)
  below = np.flatnonzero(~above)
  return bool(above[-1] or (len(below) and above[below[0]:].any()))


def diverged_runs(table: pd.DataFrame, vocab_size: int, *, loss="eval/loss", run="run"):
  """run -> whether it diverged, from a long metrics table (rows without an eval skipped)."""
  t = table[table[loss].notna()]
  t = t.sort_values("step", kind="stable") if "step" in t else t
  out = {r: diverged(g[loss].to_numpy(float), vocab_size) for r, g in t.groupby(run, sort=False)}
  return pd.Series({r: out.get(r, False) for r in pd.unique(table[run])}, name="diverged",
                   dtype=bool)


def mark_diverged(finals: pd.DataFrame, vocab_size: int, table: pd.DataFrame | None = None, *,
                  loss="final_eval_loss", run="run") -> pd.DataFrame:
  """`finals` with `diverged` by the rule (on `table`'s evals if given), `loss` +inf if so."""
  fin = finals.copy()
  x = fin[loss].astype(float)
  flag = ~np.isfinite(x) | (x > math.log(vocab_size))
  flag = flag | (fin["diverged"].astype(bool) if "diverged" in fin else False)
  if table is not None:
    flag = flag | fin[run].map(diverged_runs(table, vocab_size, run=run)).fillna(False)
  fin["diverged"] = flag.astype(bool)
  fin.loc[fin["diverged"], loss] = math.inf
  return fin
