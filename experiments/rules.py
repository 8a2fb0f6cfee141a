"""Decision rules and aggregates that hold up against seed noise and part-whole artefacts.

Pure NumPy / pandas / SciPy (SciPy comes with JAX), no JAX: every function takes arrays
or tables and returns numbers, so a report can recompute any verdict from its CSVs.

  equivalence    are two families of learning curves (seeds × matched points) the same
                 curve within ±margin? A two one-sided test (TOST) on the curve-averaged
                 gap (`RULE`).
  diverged       a run whose eval loss is non-finite or, once trained below it, above
                 ln V, uniform prediction (`DIVERGED_RULE`); `diverged_runs` /
                 `mark_diverged` apply it to tables.
  leaf_aggregates  parameter-weighted per-leaf views of a ratio of sums (μ̂² over σ̂²/B,
                 SNR², ...) with and without the normalization layers (`LEAF_RULE`).
  part_whole     the GNS of "everything but a group" regressed on the group's GNS, and the
                 group's share of |G|² and S (`PART_WHOLE_RULE`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from pergrad.layer_types import layer_type

# --------------------------------------------------------------------------- equivalence

MARGIN = 0.02  # nats: curves closer than this are "the same curve"
ALPHA = 0.05  # each one-sided test's level: a (1 − 2α) = 90 % interval
GUARD = 2.0  # no single point's gap of seed means may exceed GUARD × margin
RULE = (f"Two families of loss curves (seeds × the same eval points) are equivalent when the "
        f"{100 * (1 - 2 * ALPHA):g}% Welch t-interval of the gap of their seed means, "
        f"averaged over the compared points (each seed's curve averaged first, so the "
        f"interval has one value per seed and needs no model of the noise along the "
        f"curve), lies within ±{MARGIN:g} nats (two one-sided tests at α = {ALPHA:g}) and "
        f"no compared point's gap of seed means exceeds {GUARD:g} × {MARGIN:g} nats (curves "
        f"that cross); a diverged seed (non-finite value) makes them not equivalent; fewer "
        f"than 2 seeds on a side: undetermined.")


@dataclasses.dataclass(frozen=True)
class Equivalence:
  """Outcome of `equivalence` (gaps are A − B, in the curves' units)."""

  equivalent: bool | None  # None: undetermined (< 2 seeds on a side, or no common point)
  gap: float  # mean over the compared points of (mean_A − mean_B)
  lo: float  # the (1 − 2α) Welch t-interval of `gap`
  hi: float
  max_abs_gap: float  # largest |mean_A − mean_B| at one compared point
  margin: float
  n_a: int
  n_b: int
  n_points: int

  def sentence(self) -> str:
    if self.equivalent is None:
      return f"undetermined ({self.n_a} vs {self.n_b} seeds, {self.n_points} points)"
    word = "equivalent" if self.equivalent else "not equivalent"
    return (f"{word} within ±{self.margin:g}: mean gap {self.gap:+.4f} "
            f"[{self.lo:+.4f}, {self.hi:+.4f}], max point gap {self.max_abs_gap:.4f} "
            f"({self.n_a} vs {self.n_b} seeds, {self.n_points} points)")


def welch_interval(a: Sequence[float], b: Sequence[float],
                   alpha: float = ALPHA) -> tuple[float, float, float]:
  """(mean(a) − mean(b), lo, hi): the two-sided (1 − 2α) Welch t-interval, i.e. the
  interval whose ends are the two one-sided level-α bounds. Needs ≥ 2 values on each side."""
  a, b = np.asarray(a, float), np.asarray(b, float)
  if len(a) < 2 or len(b) < 2:
    raise ValueError(f"welch_interval: {len(a)} and {len(b)} values; give >= 2 on each side")
  va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
  d = float(np.mean(a) - np.mean(b))
  se = math.sqrt(va + vb)
  if se == 0.0:
    return d, d, d
  df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
  half = float(stats.t.ppf(1 - alpha, df)) * se
  return d, d - half, d + half


def equivalence(curves_a_SxP, curves_b_SxP, margin: float = MARGIN, *, alpha: float = ALPHA,
                guard: float = GUARD) -> Equivalence:
  """Whether two families of curves are the same curve within ±margin (module `RULE`).

  curves_*_SxP: seeds × points, the same P points (e.g. eval loss at the same examples
  seen) in both; seed counts may differ. A NaN (a point a seed has not reached) drops
  that point from both families; ±inf (a diverged seed) makes the outcome False.

  Each seed's curve is averaged over the points, ā_s = (1/P) Σ_p a_sp, and the Welch
  interval of mean(ā) − mean(b̄) must lie in [−margin, margin]: two one-sided tests, so
  when the true average gap is ±margin the rule passes with probability ≤ α. The noise
  along a curve (correlated from point to point) enters only through the spread of ā_s
  over seeds. Averaging hides curves that cross, hence the guard on every point's gap.

  Power is set by the seed spread s̄ of the curve averages ā_s. With 3 seeds a side,
  identical curves pass ≥ 95 % for s̄ ≲ 0.005 (per-point std 0.01, AR(1) ρ = 0.5 over 20
  points), but about 22 % at s̄ = 0.0115, B_ref's in the cpu batch_scaling runs (mostly
  one offset per seed): there, 8 seeds (90 %) or 5 seeds at margin 0.03 (97 %) are needed.
  Check a measured noise with `simulate_curves` before trusting "not equivalent".
  """
  a = np.atleast_2d(np.asarray(curves_a_SxP, float))
  b = np.atleast_2d(np.asarray(curves_b_SxP, float))
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"equivalence: {a.shape[1]} vs {b.shape[1]} points; align both families "
                     "on the same points (e.g. the same examples seen) first")
  keep = ~(np.isnan(a).any(axis=0) | np.isnan(b).any(axis=0))
  a, b = a[:, keep], b[:, keep]
  n_a, n_b, n_p = a.shape[0], b.shape[0], int(keep.sum())
  nan = math.nan
  if n_p and (np.isinf(a).any() or np.isinf(b).any()):
    return Equivalence(False, nan, nan, nan, math.inf, margin, n_a, n_b, n_p)
  if n_a < 2 or n_b < 2 or n_p == 0:
    return Equivalence(None, nan, nan, nan, nan, margin, n_a, n_b, n_p)
  gap, lo, hi = welch_interval(a.mean(axis=1), b.mean(axis=1), alpha)
  max_gap = float(np.max(np.abs(a.mean(axis=0) - b.mean(axis=0))))
  ok = bool(lo >= -margin and hi <= margin and max_gap <= guard * margin)
  return Equivalence(ok, gap, lo, hi, max_gap, margin, n_a, n_b, n_p)


def simulate_curves(rng: np.random.Generator, n_seeds: int, n_points: int, sigma: float,
                    rho: float = 0.5, offset: float = 0.0, shared: float = 0.0) -> np.ndarray:
  """Seed noise around a flat curve at `offset`, seeds × points: each seed's deviation is
  σ (√shared · c + √(1 − shared) · e_p) with c ~ N(0, 1) one offset per seed and e an AR(1)
  along the points (coefficient ρ, unit variance). For power checks of `equivalence`."""
  c = rng.standard_normal((n_seeds, 1))
  e = np.empty((n_seeds, n_points))
  e[:, 0] = rng.standard_normal(n_seeds)
  for p in range(1, n_points):
    e[:, p] = rho * e[:, p - 1] + math.sqrt(1 - rho**2) * rng.standard_normal(n_seeds)
  return offset + sigma * (math.sqrt(shared) * c + math.sqrt(1 - shared) * e)


# --------------------------------------------------------------------------- divergence

DIVERGED_RULE = ("A run diverged when an eval loss is non-finite, when its last eval loss "
                 "exceeds ln V (the loss of a uniform prediction over the vocabulary of V "
                 "tokens), or when an eval loss exceeds ln V after an earlier one was below "
                 "it; evals above ln V before the first one below it (a random model starts "
                 "above ln V) count only through the last eval.")


def divergence_threshold(vocab_size: int) -> float:
  """ln V: the cross-entropy of predicting every token with probability 1/V."""
  if vocab_size < 2:
    raise ValueError(f"vocab_size={vocab_size}: give the tokenizer's vocabulary size (>= 2)")
  return math.log(vocab_size)


def diverged(eval_losses: Sequence[float], vocab_size: int) -> bool:
  """`DIVERGED_RULE` on one run's eval losses in step order.

  A model at initialization predicts worse than uniform (the cpu runs' step-0 eval is
  7.3-7.5 against ln 1024 = 6.93, and a large batch's first eval, 4 steps into the
  warmup, 6.94-7.02), so an eval above ln V is divergence only once the run has been
  below ln V, or when the run ends above it."""
  x = np.asarray(eval_losses, float)
  if len(x) == 0:
    return False
  if (~np.isfinite(x)).any():
    return True
  above = x > divergence_threshold(vocab_size)
  below = np.flatnonzero(~above)
  return bool(above[-1] or (len(below) and above[below[0]:].any()))


def diverged_runs(table: pd.DataFrame, vocab_size: int, *, loss: str = "eval/loss",
                  run: str = "run", step: str = "step") -> pd.Series:
  """run -> whether it diverged, from a long metrics table (a row per logged step, sorted
  by `step` here; rows without an eval are skipped)."""
  t = table[table[loss].notna()]  # NaN: no eval at this row (a NaN loss shows in `status`)
  if step in t:
    t = t.sort_values(step, kind="stable")
  out = {r: diverged(g[loss].to_numpy(float), vocab_size) for r, g in t.groupby(run, sort=False)}
  runs = pd.unique(table[run])
  return pd.Series({r: out.get(r, False) for r in runs}, name="diverged", dtype=bool)


def mark_diverged(finals: pd.DataFrame, vocab_size: int, table: pd.DataFrame | None = None, *,
                  loss: str = "final_eval_loss", run: str = "run") -> pd.DataFrame:
  """A copy of a finals table (one row per run) whose `diverged` column also holds the
  rule's verdict (from the whole eval history in `table` when given, else from the final
  `loss`), and whose `loss` is +inf for every diverged run (so it ranks last)."""
  fin = finals.copy()
  by_final = ~np.isfinite(fin[loss].astype(float)) | (
      fin[loss].astype(float) > divergence_threshold(vocab_size))
  flag = by_final | (fin["diverged"].astype(bool) if "diverged" in fin else False)
  if table is not None:
    flag = flag | fin[run].map(diverged_runs(table, vocab_size, run=run)).fillna(False)
  fin["diverged"] = flag.astype(bool)
  fin.loc[fin["diverged"], loss] = math.inf
  return fin


# --------------------------------------------------------------------------- per leaf

LEAF_RULE = ("Per-leaf aggregates: the whole-model ratio of sums Σnum/Σden, the share of "
             "parameters in leaves whose own ratio exceeds 1, and the median leaf ratio "
             "(plain, and weighted by the leaves' parameter counts), each over all leaves "
             "and without the normalization layers.")


def is_norm_leaf(path: str) -> bool:
  """Whether a leaf path ("block_0/norm_attn/scale") is a normalization layer's
  (`pergrad.layer_types`, the library's one classifier)."""
  return layer_type(path) == "norm"


@dataclasses.dataclass(frozen=True)
class Aggregate:
  """A ratio num/den over a set of leaves, aggregated four ways."""

  ratio_of_sums: float  # Σ num / Σ den
  share_params_above_1: float  # Σ params of leaves with num/den > 1, over Σ params
  median: float  # median over leaves of num/den
  weighted_median: float  # the same, each leaf weighted by its parameter count
  n_leaves: int
  n_params: int


@dataclasses.dataclass(frozen=True)
class LeafAggregates:
  """`Aggregate`s over all leaves and without the normalization layers, and the norm
  leaves' shares of Σ num, Σ den and of the parameters."""

  all: Aggregate
  no_norm: Aggregate
  norm_share_num: float
  norm_share_den: float
  norm_share_params: float

  def row(self) -> dict[str, float]:
    """Flat {name: value} for a CSV row ("ratio_of_sums", "ratio_of_sums_no_norm", ...)."""
    out = {}
    for suffix, agg in (("", self.all), ("_no_norm", self.no_norm)):
      out.update({f"{k}{suffix}": v for k, v in dataclasses.asdict(agg).items()})
    return {**out, "norm_share_num": self.norm_share_num,
            "norm_share_den": self.norm_share_den, "norm_share_params": self.norm_share_params}


def weighted_median(values: Sequence[float], weights: Sequence[float]) -> float:
  """The smallest value whose cumulative weight (values sorted) reaches half the total."""
  v, w = np.asarray(values, float), np.asarray(weights, float)
  if len(v) == 0 or w.sum() <= 0:
    return math.nan
  order = np.argsort(v, kind="stable")
  cum = np.cumsum(w[order])
  return float(v[order][np.searchsorted(cum, 0.5 * cum[-1])])


def _aggregate(num: np.ndarray, den: np.ndarray, size: np.ndarray) -> Aggregate:
  ok = den != 0
  ratio = np.where(ok, num / np.where(ok, den, 1.0), np.nan)
  fin = np.isfinite(ratio)
  total = float(size[fin].sum())
  return Aggregate(
      ratio_of_sums=float(num.sum() / den.sum()) if den.sum() != 0 else math.nan,
      share_params_above_1=float(size[fin & (ratio > 1)].sum() / total) if total else math.nan,
      median=float(np.median(ratio[fin])) if fin.any() else math.nan,
      weighted_median=weighted_median(ratio[fin], size[fin]),
      n_leaves=int(len(num)), n_params=int(size.sum()))


def leaf_aggregates(num: Mapping[str, float], den: Mapping[str, float],
                    n_params: Mapping[str, int],
                    is_norm: Callable[[str], bool] = is_norm_leaf) -> LeafAggregates:
  """Parameter-weighted views of the ratio Σnum/Σden from its per-leaf sums (`LEAF_RULE`).

  num, den: leaf path -> the leaf's sum over its coordinates (e.g. Σμ̂² and Σσ̂²/B; from
  logged per-leaf means, mean × n_params); n_params: leaf path -> coordinates. A leaf with
  den = 0 has no ratio (left out of the medians and shares, kept in the sums).
  """
  leaves = list(num)
  missing = [k for k in leaves if k not in den or k not in n_params]
  if missing or not leaves:
    raise ValueError(f"leaf_aggregates: no den / n_params for leaves {missing[:5]} (or no "
                     "leaves); give all three mappings for the same leaf paths")
  n = np.array([float(num[k]) for k in leaves])
  d = np.array([float(den[k]) for k in leaves])
  s = np.array([float(n_params[k]) for k in leaves])
  norm = np.array([bool(is_norm(k)) for k in leaves])
  share = lambda x: float(x[norm].sum() / x.sum()) if x.sum() != 0 else math.nan
  return LeafAggregates(all=_aggregate(n, d, s), no_norm=_aggregate(n[~norm], d[~norm], s[~norm]),
                        norm_share_num=share(n), norm_share_den=share(d),
                        norm_share_params=share(s))


# --------------------------------------------------------------------------- part-whole

PART_WHOLE_RULE = ("The group's GNS predicts the rest of the model when the smoothed "
                   "B_simple of the complement (total minus the group: (S_tot − S_grp) / "
                   "(|G|²_tot − |G|²_grp)) correlates with the group's own B_simple; the "
                   "total's correlation with the group is part-whole when the group holds "
                   "most of |G|² or S (its shares are reported beside r).")


@dataclasses.dataclass(frozen=True)
class PartWhole:
  """Regressions of B_simple series on the group's, and the group's shares."""

  r_complement: float  # Pearson r of complement vs group B_simple
  slope_complement: float  # least squares complement = slope · group + intercept
  intercept_complement: float
  r_total: float  # the same for total vs group (the part-whole regression)
  slope_total: float
  share_g2: float  # Σ_t |G|²_grp / Σ_t |G|²_tot over the steps used
  share_s: float  # Σ_t S_grp / Σ_t S_tot
  median_share_g2: float  # median over the steps of |G|²_grp / |G|²_tot
  median_share_s: float  # median over the steps of S_grp / S_tot
  n_steps: int  # steps used (complement |G|² > 0 and every series finite)


def _fit(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
  if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
    return math.nan, math.nan, math.nan
  slope, intercept = np.polyfit(x, y, 1)
  return float(np.corrcoef(x, y)[0, 1]), float(slope), float(intercept)


def part_whole(g2_total, s_total, g2_group, s_group) -> PartWhole:
  """`PART_WHOLE_RULE` on series over steps (same steps in all four): the smoothed |G|²
  and S of the whole model and of one group (e.g. `pergrad.stats.noise.smooth` output past the
  EMA warm-up). B_simple = S/|G|² for the group, the total and the complement. Steps where
  the group's or the complement's |G|² is ≤ 0, or any value is non-finite, are dropped."""
  gt, st, gg, sg = (np.asarray(x, float) for x in (g2_total, s_total, g2_group, s_group))
  if not gt.shape == st.shape == gg.shape == sg.shape:
    raise ValueError("part_whole: the four series differ in length; give them on the same steps")
  gc, sc = gt - gg, st - sg
  ok = np.isfinite(gt) & np.isfinite(st) & np.isfinite(gg) & np.isfinite(sg) & (gg > 0) & (gc > 0)
  b_grp, b_tot, b_cmp = sg[ok] / gg[ok], st[ok] / gt[ok], sc[ok] / gc[ok]
  r_c, slope_c, icpt_c = _fit(b_grp, b_cmp)
  r_t, slope_t, _ = _fit(b_grp, b_tot)
  share = lambda part, whole: float(part.sum() / whole.sum()) if whole.sum() != 0 else math.nan
  med = lambda part, whole: float(np.median(part / whole)) if len(part) else math.nan
  return PartWhole(r_c, slope_c, icpt_c, r_t, slope_t, share(gg[ok], gt[ok]),
                   share(sg[ok], st[ok]), med(gg[ok], gt[ok]), med(sg[ok], st[ok]),
                   int(ok.sum()))
