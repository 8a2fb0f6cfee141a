"""experiments.verdict: the noise-aware rule on constructed data, including the flips."""

from __future__ import annotations

import math

import pytest

from experiments.verdict import LOSS, TIE, UNDETERMINED, WIN, compare, ordering


def test_gap_beyond_combined_spread_is_a_win_else_a_tie():
  a, b = [4.00, 4.02, 4.01], [4.20, 4.22, 4.21]  # gap 0.2 >> spread 0.014
  assert compare(a, b).outcome == WIN and compare(b, a).outcome == LOSS
  noisy = [3.9, 4.3, 4.5]  # same means as b, spread ~0.3 > gap
  assert compare(a, noisy).outcome == TIE
  c = compare(a, b, ("adam", "var"))
  assert c.noise == pytest.approx(math.sqrt(2) * 0.01) and c.gap == pytest.approx(0.2)
  assert c.sentence().startswith("adam beats var (4.01 vs 4.21")


def test_one_seed_is_never_a_win_and_higher_is_better_flips():
  assert compare([4.0], [5.0, 5.1]).outcome == UNDETERMINED
  assert compare([1.0, 1.1], [3.0, 3.1], lower_is_better=False).outcome == LOSS


def test_diverged_runs_lose():
  assert compare([4.0, 4.1], [math.nan, 4.0]).outcome == WIN
  assert compare([float("inf")], [4.0]).outcome == LOSS
  assert compare([math.nan], [math.inf]).outcome == TIE


def test_ordering_verdicts():
  g = {"ema": [4.0, 4.01, 4.02], "batch": [4.3, 4.31, 4.29], "example": [5.3, 5.1, 5.5]}
  verdict, pairs = ordering(g, ["ema", "batch", "example"])
  assert verdict == "reproduced" and [p.outcome for p in pairs] == [WIN, WIN]
  # example at 3.0 (the case the old report missed by dropping every pair with `token`):
  g["example"] = [3.0, 3.01, 3.02]
  assert ordering(g, ["ema", "batch", "example"])[0] == "not reproduced"
  g["example"] = [4.0, 4.6, 4.9]  # noisy: a tie with batch
  assert ordering(g, ["ema", "batch", "example"])[0] == "partly reproduced"
  with pytest.raises(ValueError, match="no values for"):
    ordering(g, ["ema", "token"])
