"""experiments.verdict: the noise-aware rule on constructed data, including the flips."""

from __future__ import annotations

import math

import pytest

from experiments.verdict import (
    LOSS,
    TIE,
    UNDETERMINED,
    WIN,
    chains,
    compare,
    decide,
    ordering,
    pairs_md,
    summarize,
    verdict_of,
)


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
  # example at 3.0, better than batch: the chain is broken whatever `token` does.
  g["example"] = [3.0, 3.01, 3.02]
  assert ordering(g, ["ema", "batch", "example"])[0] == "not reproduced"
  g["example"] = [4.0, 4.6, 4.9]  # noisy: a tie with batch
  assert ordering(g, ["ema", "batch", "example"])[0] == "partly reproduced"
  with pytest.raises(ValueError, match="no values for"):
    ordering(g, ["ema", "token"])


def test_missing_values_and_all_undetermined():
  c = compare([], [4.0, 4.1], ("token", "batch"))
  assert c.outcome == UNDETERMINED and math.isnan(c.mean_a)
  assert "n/a vs 4.05" in c.sentence()
  assert compare([math.inf], []).outcome == UNDETERMINED  # nothing to lose against
  g = {"ema": [4.0], "batch": [4.3]}  # one seed each
  assert ordering(g, ["ema", "batch"])[0] == "undetermined"


def test_decide_and_chains_name_every_pair():
  g = {"ema": [4.0, 4.01, 4.02], "batch": [4.3, 4.31, 4.29], "example": [3.0, 3.01, 3.02],
       "token": [6.0, 6.1, 6.2]}
  verdict, pairs = chains(g, [["ema", "batch", "example"], ["ema", "batch", "token"]])
  assert [(p.a, p.b) for p in pairs] == [("ema", "batch"), ("batch", "example"),
                                         ("batch", "token")]  # the shared pair once
  assert [p.outcome for p in pairs] == [WIN, LOSS, WIN] and verdict == "not reproduced"
  # A group that is absent: its pair is kept, undetermined; the verdict is not "reproduced".
  verdict, pairs = decide({"ema": g["ema"], "batch": g["batch"]},
                          [("ema", "batch"), ("batch", "token")])
  assert [p.outcome for p in pairs] == [WIN, UNDETERMINED] and verdict == "partly reproduced"
  assert verdict_of([compare([1.0, 1.1], [1.05, 1.0])]) == "partly reproduced"  # a tie
  with pytest.raises(ValueError, match="no expected pair"):
    decide(g, [])


def test_summarize_and_pairs_md():
  s = summarize([4.0, 4.2, 4.4])
  assert (s.n, s.n_diverged) == (3, 0) and s.mean == pytest.approx(4.2)
  assert s.std == pytest.approx(0.2) and s.text() == "4.200 ± 0.2 (n=3)"
  assert summarize([4.0]).text() == "4.000 (n=1: no spread)"
  assert summarize([4.0, math.nan]).text() == "diverged (1/2 seeds)"
  assert summarize([]).text() == "no seeds"
  md = pairs_md([compare([4.0, 4.01], [5.0, 5.01], ("a", "b")), compare([math.inf], [4.0])])
  assert "| a | b | win (as expected) | 4.005 | 5.005 |" in md
  assert "| A | B | LOSS (against) | diverged | 4.000 | n/a |" in md


def test_higher_is_better_reports_the_values_themselves():
  c = compare([25.5], [2.05], ("ema", "batch"), lower_is_better=False)
  assert c.outcome == UNDETERMINED and (c.mean_a, c.mean_b) == (25.5, 2.05)
  c = compare([25.0, 26.0], [2.0, 2.1], ("ema", "batch"), lower_is_better=False)
  assert c.outcome == WIN and c.mean_a == 25.5
  assert compare([math.nan, 3.0], [2.0, 2.1], lower_is_better=False).outcome == LOSS
