"""Decision rules on seeds, stated in English beside the code (`PAIR_WIN`, `EQUIV`, `BOUND`,
`DIVERGED_RULE`): pair comparisons, equivalence and non-inferiority of curves, bounds on
ratios, divergence."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from pergrad.bounds import BOUND, FAILS, HOLDS, UNDETERMINED, WITHIN, bound, quartiles  # noqa: F401

WIN, LOSS, TIE = "win", "loss", "tie"
REPRODUCED, NOT_REPRODUCED, PARTLY = "reproduced", "not reproduced", "partly reproduced"
PAIR_ALPHA = 0.025  # per side: identical arms are called different ≤ 5 % of the time
PAIR_WIN = ("A beats B when the 95% Welch interval of mean_B − mean_A lies above 0 (diverged "
            "seeds lose; < 2 seeds: undetermined)")
PAIRS_VERDICT = ("reproduced if every expected pair is a win, not reproduced if one is a loss "
                 "or every one ties (at power ≥ 0.8, the powered guard's), partly reproduced if "
                 "some but not all win, undetermined otherwise")


@dataclasses.dataclass(frozen=True)
class Comparison:
  """A vs B over seeds (lower is better unless stated): `outcome` from A's side."""

  a: str
  b: str
  outcome: str
  mean_a: float
  mean_b: float
  noise: float  # half-width of the 95% Welch interval of the gap

  def sentence(self) -> str:
    f = lambda x: "n/a" if math.isnan(x) else "diverged" if math.isinf(x) else f"{x:.4g}"
    rel = {WIN: "beats", LOSS: "loses to", TIE: "ties with", UNDETERMINED: "is not separable from",
           NONINFERIOR: "is non-inferior to"}
    return (f"{self.a} {rel[self.outcome]} {self.b} ({f(self.mean_a)} vs {f(self.mean_b)}, "
            f"noise {f(self.noise)})")


def clean(values: Sequence[float]) -> np.ndarray:
  """Floats with every non-finite value (a diverged seed) as +inf."""
  x = np.asarray([float(v) for v in values], dtype=float)
  return np.where(np.isfinite(x), x, np.inf)


def _sides(a, b, names, both_diverged: str):
  """(A's and B's values, their means, the Comparison the seeds decide without noise or None):
  a side with no values or < 2 seeds is undetermined; a side with a diverged seed loses (both:
  `both_diverged`)."""
  xa, xb = clean(a), clean(b)
  mean = lambda x: math.nan if not len(x) else math.inf if np.isinf(x).any() else float(x.mean())
  ma, mb = mean(xa), mean(xb)
  ia, ib = bool(np.isinf(xa).any()), bool(np.isinf(xb).any())
  out = (UNDETERMINED if not len(xa) or not len(xb) else
         (both_diverged if ia and ib else LOSS if ia else WIN) if ia or ib else
         UNDETERMINED if len(xa) < 2 or len(xb) < 2 else None)
  return xa, xb, ma, mb, None if out is None else Comparison(*names, out, ma, mb, math.nan)


SHORT_OF_PILOT = -1  # `pilot_of`: a side holds fewer values than the pilot another side is past


def pilot_of(pilot: int | None, na: int, nb: int) -> int | None:
  """The pilot `welch_interval` reads for sides of na and nb values: None (every value's
  variances) unless a side is past `pilot`; SHORT_OF_PILOT when one is past it and the other
  short of it (no two-stage reading: the comparison is undetermined)."""
  if not pilot or max(na, nb) <= pilot:
    return None
  return SHORT_OF_PILOT if min(na, nb) < pilot else pilot


def compare(a, b, names=("A", "B"), *, lower_is_better: bool = True,
            pilot: int | None = None) -> Comparison:
  """A vs B by `PAIR_WIN`; a side with no values is undetermined, with a diverged seed loses.
  `pilot`: values in seed order, the first `pilot` a side chose how many followed: their
  variances alone (`welch_interval`), where a side has more."""
  xa, xb, ma, mb, decided = _sides(a, b, names, TIE)
  if decided is not None:
    return decided
  pilot = pilot_of(pilot, len(xa), len(xb))
  if pilot == SHORT_OF_PILOT:
    return Comparison(*names, UNDETERMINED, ma, mb, math.nan)
  gap, lo, hi = welch_interval(*((xb, xa) if lower_is_better else (xa, xb)), PAIR_ALPHA, pilot)
  return Comparison(*names, WIN if lo > 0 else LOSS if hi < 0 else TIE, ma, mb, gap - lo)


def verdict_of(pairs: Sequence[Comparison]) -> str:
  """`PAIRS_VERDICT` on comparisons each expected to be a win."""
  out = [p.outcome for p in pairs]
  if LOSS in out or (out and all(o == TIE for o in out)):  # no expected win shows anywhere
    return NOT_REPRODUCED
  if all(o == WIN for o in out):
    return REPRODUCED
  return PARTLY if WIN in out else UNDETERMINED  # ties beside undetermined pairs: no win


def decide(groups: Mapping[str, Sequence[float]], expected, *, lower_is_better=True,
           pilot: int | None = None):
  """(verdict, comparisons) of expected pairs (a, b) = "a beats b" (a missing group: no values;
  `pilot`: `compare`'s)."""
  if not expected:
    raise ValueError("decide: no expected pair")
  pairs = [compare(groups.get(a, ()), groups.get(b, ()), (a, b), lower_is_better=lower_is_better,
                   pilot=pilot) for a, b in expected]
  return verdict_of(pairs), pairs


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


MARGIN, ALPHA, GUARD = 0.02, 0.05, 2.0
EQUIV = ("equivalent when the 90% Welch interval of the gap of the seeds' curve averages lies "
         "within ±margin and no point's gap of seed means exceeds 2 × margin")


@dataclasses.dataclass(frozen=True)
class Equivalence:
  """Outcome of `equivalence` (gaps A − B); equivalent None: < 2 seeds a side or no point."""

  equivalent: bool | None
  gap: float
  lo: float
  hi: float
  max_abs_gap: float
  margin: float
  n_a: int
  n_b: int
  n_points: int

  lo95: float = math.nan  # the 95% interval: "beyond the margin" is judged on it
  hi95: float = math.nan

  @property
  def beyond(self) -> bool:
    """The whole 95% interval lies outside ±margin, or a seed diverged."""
    return bool(self.lo95 > self.margin or self.hi95 < -self.margin or math.isinf(self.max_abs_gap))


def welch_interval(a, b, alpha: float = ALPHA, pilot: int | None = None):
  """(mean(a) − mean(b), lo, hi) of the two-sided (1 − 2α) Welch t-interval along the last
  axis (floats for 1-D values, arrays for rows of draws; ≥ 2 values a side). `pilot`: each
  side's variance from its first `pilot` values alone (its df pilot − 1), the means from all:
  Stein's (1945) two-stage test, exact where those values chose how many followed."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  na, nb = a.shape[-1], b.shape[-1]
  if na < 2 or nb < 2 or (pilot is not None and not 2 <= pilot <= min(na, nb)):
    raise ValueError(f"welch_interval: {na} and {nb} values, pilot {pilot}; give >= 2 on each "
                     "side and a pilot of 2 up to the fewer")
  ka, kb = (na, nb) if pilot is None else (pilot, pilot)
  va = a[..., :ka].var(-1, ddof=1) / na
  vb = b[..., :kb].var(-1, ddof=1) / nb
  d, se = a.mean(-1) - b.mean(-1), np.sqrt(va + vb)
  with np.errstate(divide="ignore", invalid="ignore"):
    df = (va + vb) ** 2 / (va**2 / (ka - 1) + vb**2 / (kb - 1))
  half = np.where(se > 0, stats.t.ppf(1 - alpha, df) * se, 0.0)
  out = (d, d - half, d + half)
  return tuple(float(x) for x in out) if np.ndim(d) == 0 else out


def equivalence(a_SxP, b_SxP, margin: float = MARGIN, *, alpha=ALPHA, guard=GUARD) -> Equivalence:
  """`EQUIV` on seeds × points (same points; NaN drops a point, ±inf: not equivalent); the
  guard catches curves that cross."""
  a, b = np.atleast_2d(np.asarray(a_SxP, float)), np.atleast_2d(np.asarray(b_SxP, float))
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"equivalence: {a.shape[1]} vs {b.shape[1]} points; align both families first")
  keep = ~(np.isnan(a).any(axis=0) | np.isnan(b).any(axis=0))
  a, b = a[:, keep], b[:, keep]
  n_a, n_b, n_p, nan = a.shape[0], b.shape[0], int(keep.sum()), math.nan
  if n_p and (np.isinf(a).any() or np.isinf(b).any()):
    return Equivalence(False, nan, nan, nan, math.inf, margin, n_a, n_b, n_p)
  if n_a < 2 or n_b < 2 or n_p == 0:
    return Equivalence(None, nan, nan, nan, nan, margin, n_a, n_b, n_p)
  gap, lo, hi = welch_interval(a.mean(axis=1), b.mean(axis=1), alpha)
  _, lo95, hi95 = welch_interval(a.mean(axis=1), b.mean(axis=1), PAIR_ALPHA)
  mx = float(np.max(np.abs(a.mean(axis=0) - b.mean(axis=0))))
  return Equivalence(bool(lo >= -margin and hi <= margin and mx <= guard * margin), gap, lo, hi,
                     mx, margin, n_a, n_b, n_p, lo95, hi95)


NONINFERIOR = "non-inferior"
NONINF = ("A is non-inferior to B (lower is better) when the upper end of the 90% Welch "
          "interval of mean_A − mean_B (one-sided 95%) lies at or below +margin; A loses when "
          "the 95% interval lies wholly above +margin, worse beyond it (or A diverged); else "
          "undetermined")


def noninferior(a, b, margin: float, names=("A", "B"), pilot: int | None = None) -> Comparison:
  """`NONINF` (lower is better; the margin declared before the run): outcome NONINFERIOR,
  LOSS, WIN (B diverged) or UNDETERMINED (< 2 seeds a side or neither shown). A gap above 0
  but not beyond the margin is no loss: the claim is "at most the margin worse". `pilot`:
  `compare`'s."""
  xa, xb, ma, mb, decided = _sides(a, b, names, UNDETERMINED)
  if decided is not None:
    return decided
  pilot = pilot_of(pilot, len(xa), len(xb))
  if pilot == SHORT_OF_PILOT:
    return Comparison(*names, UNDETERMINED, ma, mb, math.nan)
  gap, _, hi = welch_interval(xa, xb, ALPHA, pilot)
  _, lo95, _ = welch_interval(xa, xb, PAIR_ALPHA, pilot)
  out = NONINFERIOR if hi <= margin else LOSS if lo95 > margin else UNDETERMINED
  return Comparison(*names, out, ma, mb, hi - gap)


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
