"""Noise-aware comparisons over seeds: the rules every experiment's `report()` uses.

One rule, stated once: with the final values of A and B over seeds (lower is better
unless said otherwise), their gap d = mean_B − mean_A is a WIN for A when d exceeds the
combined seed spread √(s_A² + s_B²) (s: sample standard deviation over seeds), a WIN for
B when −d does, and a TIE otherwise. With fewer than two seeds on either side the noise
is unknown and the comparison is UNDETERMINED (never a win). A diverged run (NaN / inf)
counts as +inf: a group with any diverged seed loses to a group without, and two such
groups tie. A side with no values at all (a group this preset did not run, or one with no
fresh seed) is UNDETERMINED too.

`ordering` applies the rule to each adjacent pair of an expected order, `chains` to the
adjacent pairs of several expected orders, `decide` to any list of expected pairs, and
each says "reproduced" (every pair a significant win in the expected direction), "not
reproduced" (at least one significant win against it), "undetermined" (every pair
undetermined: too few seeds) or else "partly reproduced" (no significant win against it,
some ties or undetermined pairs).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

WIN, LOSS, TIE, UNDETERMINED = "win", "loss", "tie", "undetermined"
# The pieces of the rule that every experiment's one-sentence RULE quotes.
PAIR_WIN = ("a win when its gap of seed means exceeds √(s_A² + s_B²) (diverged runs lose, "
            "< 2 seeds: undetermined)")
PAIRS_VERDICT = ("reproduced if every pair is a win, not reproduced if any pair is a "
                 "significant win the other way, undetermined if every pair is, partly "
                 "reproduced otherwise")
RULE = ("A beats B when the gap of their seed means exceeds the combined seed spread "
        "√(s_A² + s_B²) (s = std over seeds, ≥ 2 seeds each); otherwise a tie.")


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Outcome of A vs B (lower is better): `outcome` is from A's side."""

  a: str
  b: str
  outcome: str  # win | loss | tie | undetermined
  mean_a: float
  mean_b: float
  noise: float  # √(s_A² + s_B²)

  @property
  def gap(self) -> float:
    return self.mean_b - self.mean_a

  def sentence(self) -> str:
    fmt = lambda x: "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.3g}"
    rel = {WIN: "beats", LOSS: "loses to", TIE: "ties with", UNDETERMINED: "is not separable from"}
    return (f"{self.a} {rel[self.outcome]} {self.b} ({fmt(self.mean_a)} vs {fmt(self.mean_b)},"
            f" noise {fmt(self.noise)})")


def _clean(values: Sequence[float]) -> np.ndarray:
  x = np.asarray([float(v) for v in values], dtype=float)
  return np.where(np.isfinite(x), x, np.inf)


def compare(a: Sequence[float], b: Sequence[float], names: tuple[str, str] = ("A", "B"),
            *, lower_is_better: bool = True) -> Comparison:
  """A vs B over seeds by the module's rule."""
  xa, xb = _clean(a), _clean(b)  # diverged -> +inf (the worst, whichever way is better)

  def mean(x):  # as reported: the values' own mean (inf when a seed diverged)
    return math.nan if len(x) == 0 else math.inf if np.isinf(x).any() else float(np.mean(x))

  ma, mb = mean(xa), mean(xb)
  if len(xa) == 0 or len(xb) == 0:  # not measured: never a win, never a loss
    return Comparison(*names, UNDETERMINED, ma, mb, math.nan)
  inf_a, inf_b = bool(np.isinf(xa).any()), bool(np.isinf(xb).any())
  if inf_a or inf_b:
    outcome = TIE if inf_a and inf_b else (LOSS if inf_a else WIN)
    return Comparison(*names, outcome, ma, mb, math.nan)
  if len(xa) < 2 or len(xb) < 2:
    return Comparison(*names, UNDETERMINED, ma, mb, math.nan)
  noise = math.sqrt(float(np.var(xa, ddof=1)) + float(np.var(xb, ddof=1)))
  gap = (mb - ma) if lower_is_better else (ma - mb)  # > 0: A is better
  outcome = WIN if gap > noise else LOSS if -gap > noise else TIE
  return Comparison(*names, outcome, ma, mb, noise)


def ordering(groups: Mapping[str, Sequence[float]], best_first: Sequence[str], *,
             lower_is_better: bool = True) -> tuple[str, list[Comparison]]:
  """Verdict on the expected order `best_first` (best group first), by adjacent pairs."""
  missing = [g for g in best_first if g not in groups]
  if missing:
    raise ValueError(f"ordering: no values for {missing}")
  return decide(groups, list(zip(best_first, best_first[1:], strict=False)),
                lower_is_better=lower_is_better)


def decide(groups: Mapping[str, Sequence[float]], expected: Sequence[tuple[str, str]], *,
           lower_is_better: bool = True) -> tuple[str, list[Comparison]]:
  """Verdict on expected pairs (a, b) = "a beats b"; a group absent from `groups` has no
  values (its pairs are undetermined, and listed, never dropped)."""
  if not expected:
    raise ValueError("decide: no expected pair")
  pairs = [compare(groups.get(a, ()), groups.get(b, ()), (a, b),
                   lower_is_better=lower_is_better) for a, b in expected]
  return verdict_of(pairs), pairs


def verdict_of(pairs: Sequence[Comparison]) -> str:
  """The module's verdict on comparisons each expected to be a WIN."""
  if any(p.outcome == LOSS for p in pairs):
    return "not reproduced"
  if all(p.outcome == WIN for p in pairs):
    return "reproduced"
  if all(p.outcome == UNDETERMINED for p in pairs):
    return "undetermined"
  return "partly reproduced"


def chains(groups: Mapping[str, Sequence[float]], orders: Sequence[Sequence[str]], *,
           lower_is_better: bool = True) -> tuple[str, list[Comparison]]:
  """Verdict on several expected orders (each best first): every adjacent pair of every
  order, each pair once (orders sharing a prefix share its pairs)."""
  expected: list[tuple[str, str]] = []
  for order in orders:
    for pair in zip(order, order[1:], strict=False):
      if pair not in expected:
        expected.append(pair)
  return decide(groups, expected, lower_is_better=lower_is_better)


# --------------------------------------------------------------------------- reporting


@dataclasses.dataclass(frozen=True)
class Summary:
  """One group's values over seeds: mean ± sample std, n seeds, how many diverged."""

  mean: float
  std: float
  n: int
  n_diverged: int

  def text(self) -> str:
    if self.n == 0:
      return "no seeds"
    if self.n_diverged:
      return f"diverged ({self.n_diverged}/{self.n} seeds)"
    if self.n == 1:
      return f"{self.mean:.3f} (n=1: no spread)"
    return f"{self.mean:.3f} ± {self.std:.2g} (n={self.n})"


def summarize(values: Sequence[float]) -> Summary:
  x = _clean(values)
  n_div = int(np.isinf(x).sum())
  if len(x) == 0:
    return Summary(math.nan, math.nan, 0, 0)
  if n_div:
    return Summary(math.inf, math.nan, len(x), n_div)
  return Summary(float(np.mean(x)), float(np.std(x, ddof=1)) if len(x) > 1 else math.nan,
                 len(x), 0)


def pairs_md(pairs: Sequence[Comparison]) -> str:
  """The comparisons as a Markdown table (expected winner first)."""
  fmt = lambda x: ("n/a" if math.isnan(x) else "diverged" if math.isinf(x) else f"{x:.3f}")
  lines = ["| expected better | expected worse | outcome | mean (better) | mean (worse) "
           "| noise √(s_A²+s_B²) |", "|---|---|---|---|---|---|"]
  for p in pairs:
    outcome = {WIN: "win (as expected)", LOSS: "LOSS (against)", TIE: "tie (within noise)",
               UNDETERMINED: "undetermined"}[p.outcome]
    lines.append(f"| {p.a} | {p.b} | {outcome} | {fmt(p.mean_a)} | {fmt(p.mean_b)} | "
                 f"{fmt(p.noise)} |")
  return "\n".join(lines)
