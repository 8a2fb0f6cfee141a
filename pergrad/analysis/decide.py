"""Two arms compared on their shared seeds, read by what the data decide.

A seed gives every arm the same init and data order, so the per-seed gap d_s = y_B(s) − y_A(s)
(A's advantage; lower is better) carries no seed-to-seed variance. Over n shared seeds, with
mean d̄ and sd s_d, the paired t-interval d̄ ± t_{n−1}(1 − a) s_d/√n reads:

  win / loss      the 95% interval (a = 0.025 a side) excludes 0: a detected difference, decided
                  whatever the power (identical arms called different ≤ 5 % at any paired sd)
  equivalent      else, with a declared margin m, the 90% interval lies within ±m (TOST:
                  called ≤ 5 % of the time when the true gap is ±m)
  not separable   else; `seeds_to_settle` names the seeds at which, at the observed s_d and
                  gap, the difference or the equivalence would be shown with power 0.8

Non-inferiority of A (at most m worse): the one-sided 95% upper end of −d̄ ≤ m; worse: the 95%
lower end of −d̄ > m. The exact sign-flip p (all 2^n sign patterns of d) is the
distribution-free check beside the t; it cannot reject at 5 % two-sided below 6 seeds. Power is
the design's (n, s_d, the declared effect), reported beside, never a gate on a detected
difference. A seed diverged (non-finite) on one side only loses that side the comparison.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import numpy as np
from scipy import stats

from pergrad.analysis import rules

WIN, LOSS, EQUIVALENT, NOT_SEPARABLE = "win", "loss", "equivalent", "not separable"
NONINFERIOR, WORSE = "non-inferior", "worse"
DECIDED = (WIN, LOSS)
ALPHA = 0.05  # each reading's wrong-call rate
TARGET_POWER = 0.8
DRAWS = 20000
MOST_SEEDS = 64
VERDICT = ("each comparison expected a win: reproduced if every one wins, not reproduced if one "
           "loses or every one is shown equivalent, partly reproduced if some win, else "
           "undetermined: not separable (naming those)")
READING = ("per-seed gaps on the shared seeds, paired t: win/loss when the 95% interval excludes "
           "0 (decided whatever the power), equivalent when the 90% interval lies within "
           "±margin (TOST), else not separable (with the seeds that would settle it); power "
           "for the declared effect reported beside")


@dataclasses.dataclass(frozen=True)
class Paired:
  """A vs B on shared seeds; `advantage` = mean(B − A) (> 0: A better), intervals on it."""

  a: str
  b: str
  outcome: str
  n: int
  advantage: float
  lo95: float
  hi95: float
  lo90: float
  hi90: float
  sd_paired: float  # sd of the per-seed gaps
  half_paired: float  # 95% half-width, paired t
  half_unpaired: float  # 95% half-width, Welch on the same values (the noise unpaired)
  sign_flip_p: float
  effect: float
  margin: float
  power: float  # the design's: P(decided | true advantage = effect) at sd_paired, n
  power_equivalence: float  # P(TOST passes | true gap 0) at sd_paired, n (NaN without margin)
  within_margin: bool = False  # TOST passes, whatever the difference reading (a claim of
  # equivalence reads this: a gap detected but within ±margin is still within it)
  seeds_to_settle: dict = dataclasses.field(default_factory=dict)
  dropped: tuple = ()  # seeds not shared by both arms
  why: str = ""
  reading: str = ""  # how lo95/hi95 (lo90/hi90) were read: "" one look's 95% (90%) t; else
  # the sequential design's look and critical t (`verdict.sequential_reading`)
  false_alarm: float = math.nan  # a design's simulated rate (`verdict.sequential_reading`);
  # NaN: one look's, `calibrate`

  def interval(self) -> str:
    """'[lo, hi]' of the difference reading, its design named where one read it."""
    f = lambda x: "n/a" if not math.isfinite(x) else f"{x:.3g}"
    return f"[{f(self.lo95)}, {f(self.hi95)}]" + (f" ({self.reading})" if self.reading else "")

  def row(self) -> dict:
    return dataclasses.asdict(self)

  def sentence(self) -> str:
    f = lambda x: "n/a" if not math.isfinite(x) else f"{x:.3g}"
    rel = {WIN: "beats", LOSS: "loses to", EQUIVALENT: "is equivalent to",
           NOT_SEPARABLE: "is not separable from", NONINFERIOR: "is non-inferior to",
           WORSE: "is worse beyond the margin than"}[self.outcome]
    need = "; ".join(f"{k}: {v if v else f'> {MOST_SEEDS}'} seeds"
                     for k, v in self.seeds_to_settle.items())
    head = (self.why.rstrip("; ") if self.why else
            f"advantage {f(self.advantage)} {self.interval()}, n={self.n}")
    return (f"{self.a} {rel} {self.b} ({head}; noise "
            f"paired ±{f(self.half_paired)} vs unpaired ±{f(self.half_unpaired)}; power "
            f"{f(self.power)} for {f(self.effect)}" + (f"; would settle at {need}" if need else "")
            + ")")


def shared(a: Mapping, b: Mapping) -> tuple[list, np.ndarray, np.ndarray, tuple]:
  """(seeds both arms ran, sorted; A's values; B's values; the seeds only one ran)."""
  key = lambda s: float(s)
  common = sorted(set(map(key, a)) & set(map(key, b)))
  va = {key(s): float(v) for s, v in a.items()}
  vb = {key(s): float(v) for s, v in b.items()}
  dropped = tuple(sorted(set(va) ^ set(vb)))
  return common, np.array([va[s] for s in common]), np.array([vb[s] for s in common]), dropped


def interval(d_xN, a: float):
  """(mean, lo, hi) of the paired t-interval at level 1 − 2a along the last axis (n ≥ 2)."""
  d = np.asarray(d_xN, float)
  n = d.shape[-1]
  m, se = d.mean(-1), d.std(-1, ddof=1) / math.sqrt(n)
  half = stats.t.ppf(1 - a, n - 1) * se
  return m, m - half, m + half


def tost(d_xN, margin: float):
  """Whether the 90% paired interval lies within ±margin (False without a finite margin)."""
  _, lo90, hi90 = interval(d_xN, ALPHA)
  return (lo90 >= -margin) & (hi90 <= margin) & math.isfinite(margin)


def read_gaps(d_xN, margin: float = math.nan) -> np.ndarray:
  """The reading (`READING`) of rows of per-seed gaps (A's advantage), as strings."""
  _, lo95, hi95 = interval(d_xN, ALPHA / 2)
  out = np.where(tost(d_xN, margin), EQUIVALENT, NOT_SEPARABLE)
  return np.where(lo95 > 0, WIN, np.where(hi95 < 0, LOSS, out))


def read_noninferior(d_xN, margin: float) -> np.ndarray:
  """Non-inferiority of A (the gaps: A's advantage): non-inferior when the one-sided 95% upper
  end of −d̄ is ≤ margin, worse when the 95% lower end of −d̄ exceeds it, else not separable."""
  _, lo90, _ = interval(d_xN, ALPHA)
  _, _, hi95 = interval(d_xN, ALPHA / 2)
  return np.where(-lo90 <= margin, NONINFERIOR, np.where(-hi95 > margin, WORSE, NOT_SEPARABLE))


def sign_flip_p(d) -> float:
  """Two-sided exact p of the sign-flip test on mean(d) (every sign pattern up to 16 seeds,
  65,536 random ones past)."""
  d = np.asarray(d, float)
  if len(d) == 0:
    return math.nan
  null = np.abs(_signs(len(d)) @ d)
  return float(np.mean(null >= abs(d.sum()) * (1 - 1e-12)))


@functools.lru_cache(maxsize=None)
def _signs(n: int) -> np.ndarray:
  """The sign patterns of `sign_flip_p`: all 2^n up to n = 16, 65,536 random ones past."""
  if n <= 16:
    signs = 1.0 - 2.0 * ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1)
  else:
    signs = np.random.default_rng(0).choice((1.0, -1.0), size=(65536, n))
  signs.setflags(write=False)
  return signs


def power_difference(sd: float, n: int, effect: float) -> float:
  """P(the 95% paired interval excludes 0 | true advantage `effect`), exact (noncentral t)."""
  if not (n >= 2 and sd > 0 and math.isfinite(sd)):
    return math.nan
  return float(_powers_difference(sd, np.asarray([n]), effect)[0])


def _powers_difference(sd: float, n_N: np.ndarray, effect: float) -> np.ndarray:
  """`power_difference` at each n of n_N (all ≥ 2, sd > 0), in one scipy call."""
  df, nc = n_N - 1, effect / (sd / np.sqrt(n_N))
  crit = stats.t.ppf(1 - ALPHA / 2, df)
  p = stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc)
  return np.where(np.isfinite(p), p, np.abs(nc) > crit)  # (nct fails far in the tail)


def power_equivalence(sd: float, n: int, margin: float, gap: float = 0.0) -> float:
  """P(the 90% paired interval lies within ±margin | true gap), simulated (DRAWS, fixed seed)."""
  if not (n >= 2 and sd > 0 and math.isfinite(sd) and math.isfinite(margin)):
    return math.nan
  rng = np.random.default_rng(0)
  mean = gap + sd / math.sqrt(n) * rng.standard_normal(DRAWS)
  se = sd * np.sqrt(rng.chisquare(n - 1, DRAWS) / (n - 1)) / math.sqrt(n)
  half = stats.t.ppf(1 - ALPHA, n - 1) * se
  return float(np.mean((mean - half >= -margin) & (mean + half <= margin)))


def seeds_to_settle(sd: float, gap: float, margin: float = math.nan,
                    target: float = TARGET_POWER, most: int = MOST_SEEDS) -> dict:
  """What would settle a comparison at the observed paired sd and gap: {"difference": fewest
  seeds at which `power_difference` for |gap| reaches `target`, "equivalence": fewest at which
  the TOST at `margin` passes with probability `target` at that gap} (None past `most`; no
  "equivalence" without a margin or with |gap| ≥ margin, where no seeds show it)."""
  def fewest(ok):
    return next((n for n in range(2, most + 1) if ok(n)), None)
  n_N = np.arange(2, most + 1)
  ok_N = (_powers_difference(sd, n_N, abs(gap)) >= target if sd > 0 and math.isfinite(sd)
          else np.zeros(len(n_N), bool))
  out = {"difference": int(n_N[ok_N][0]) if ok_N.any() else None}
  if math.isfinite(margin) and abs(gap) < margin:
    out["equivalence"] = fewest(lambda n: power_equivalence(sd, n, margin, gap) >= target)
  return out


def welch_half(xa, xb) -> float:
  """95% half-width of the Welch interval of mean(B) − mean(A) (the noise unpaired)."""
  gap, lo, _ = rules.welch_interval(xb, xa, rules.PAIR_ALPHA)
  return float(gap - lo)


def _diverged(xa, xb) -> str | None:
  ia, ib = ~np.isfinite(xa), ~np.isfinite(xb)
  if not (ia.any() or ib.any()):
    return None
  return LOSS if ia.any() and not ib.any() else WIN if ib.any() and not ia.any() else NOT_SEPARABLE


def compare(a: Mapping, b: Mapping, names=("A", "B"), *, effect: float,
            margin: float = math.nan, lower_is_better: bool = True,
            noninferiority: bool = False) -> Paired:
  """A vs B ({seed: value} each) by `READING` (or `read_noninferior` with `noninferiority`) on
  their shared seeds; `effect` the declared effect the power is reported for."""
  seeds, xa, xb, dropped = shared(a, b)
  nan = math.nan
  stub = dict(sign_flip_p=nan, effect=float(effect), margin=float(margin), power=nan,
              power_equivalence=nan, dropped=dropped)
  if (div := _diverged(xa, xb)) is not None:
    out = ({WIN: NONINFERIOR, LOSS: WORSE} if noninferiority else {}).get(div, div)
    return Paired(*names, out, len(seeds), *[nan] * 8, **stub, why="a seed diverged; ")
  if len(seeds) < 2:
    return Paired(*names, NOT_SEPARABLE, len(seeds), *[nan] * 8, **stub,
                  why=f"{len(seeds)} shared seeds; ")
  d = (xb - xa) if lower_is_better else (xa - xb)
  m, lo95, hi95 = (float(x) for x in interval(d, ALPHA / 2))
  _, lo90, hi90 = (float(x) for x in interval(d, ALPHA))
  out = str((read_noninferior(d, margin) if noninferiority else read_gaps(d, margin))[()])
  sd = float(np.std(d, ddof=1))
  settle = {}
  if out == NOT_SEPARABLE and sd > 0:  # non-inferiority: A's excess over the margin decides
    settle = ({"against the margin": seeds_to_settle(sd, -m - margin)["difference"]}
              if noninferiority else seeds_to_settle(sd, m, margin))
  return Paired(*names, out, len(seeds), m, lo95, hi95, lo90, hi90, sd, hi95 - m,
                welch_half(xa, xb), sign_flip_p(d), float(effect), float(margin),
                power_difference(sd, len(seeds), effect),
                power_equivalence(sd, len(seeds), margin), bool(tost(d, margin)), settle,
                dropped)


def calibrate(sd: float, n: int, effect: float, margin: float = math.nan,
              draws: int = DRAWS, seed: int = 0) -> dict:
  """`read_gaps`'s error rates simulated at paired sd `sd` and n seeds: false_alarm (win or loss
  | gap 0), power (win | advantage `effect`); and the `tost`'s: false_equivalence (within the
  margin | gap = margin), power_equivalence (within | gap 0)."""
  z = np.random.default_rng(seed).standard_normal((draws, n)) * sd
  rate = lambda x, what: float(np.mean(np.isin(read_gaps(x), what)))
  out = {"false_alarm": rate(z, DECIDED), "power": rate(z + effect, [WIN])}
  if math.isfinite(margin):
    out |= {"false_equivalence": float(np.mean(tost(z + margin, margin))),
            "power_equivalence": float(np.mean(tost(z, margin)))}
  return out


def verdict_of(pairs) -> str:
  """`VERDICT` over `Paired` comparisons, each expected a win."""
  out = [p.outcome for p in pairs]
  if LOSS in out or (out and all(o == EQUIVALENT for o in out)):
    return "not reproduced"
  if out and all(o == WIN for o in out):
    return "reproduced"
  if WIN in out:
    return "partly reproduced"
  open_ = [f"{p.a} vs {p.b}" for p in pairs if p.outcome == NOT_SEPARABLE]
  return "undetermined" + (f": not separable ({'; '.join(open_)})" if open_ else "")
