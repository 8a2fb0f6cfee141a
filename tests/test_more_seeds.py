"""More seeds for an under-powered comparison (`pergrad.sweep.more_seeds`): which seeds the
search adds after its pilot, that a resumed search adds the same, and the two-stage design's
false-alarm rate and power, simulated at the noises the clean run measured."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import preconditioner  # noqa: E402
from pergrad.analysis import calibrate, rules  # noqa: E402
from pergrad.sweep import MIN_PILOT, Block, LrSearch, MoreSeeds, Sweep, follow_up_blocks, more_seeds  # noqa: E402
from tests.test_reports import GRID, _row, group_runs  # noqa: E402

PILOT = (1, 2, 3, 4, 5)


def _pairs(best) -> list[tuple[dict, dict]]:
  arm = {r["optimizer.placement"]: {"optimizer.placement": r["optimizer.placement"],
                                    "optimizer.lr": r["optimizer.lr"]} for _, r in best.iterrows()}
  return [(arm["ema"], arm["batch"])] if {"ema", "batch"} <= set(arm) else []


def _sweep(most: int = 24, effect: float = 0.05) -> Sweep:
  more = MoreSeeds(_pairs, effect, most)
  return Sweep({"steps": 3}, tuple(
      Block({"optimizer.placement": [p], "optimizer.lr": list(GRID), "train.seed": [0]})
      for p in ("ema", "batch")), LrSearch(("optimizer.placement",), max_extend=0, seeds=PILOT,
                                             more=more))


def _fin(ema=(3.90, 3.91, 3.92, 3.91, 3.90), batch=(4.00, 4.01, 4.02, 4.01, 4.00)
         ) -> pd.DataFrame:
  return pd.DataFrame(group_runs({"optimizer.placement": "ema"}, ema)
                      + group_runs({"optimizer.placement": "batch"}, batch))


def _added(blocks, sweep) -> dict:
  """{placement: the seeds added past the pilot}."""
  top = max(sweep.lr_search.seeds)
  return {b.grid["optimizer.placement"][0]: b.grid["train.seed"] for b in blocks
          if min(b.grid["train.seed"]) > top}


def test_a_powered_pair_gets_no_more_seeds():
  blocks, kind = follow_up_blocks(_sweep(), _fin())
  assert kind == "seeds" and _added(blocks, _sweep()) == {}


def test_the_pilot_is_awaited_then_the_noisier_arm_alone_gets_seeds():
  sweep = _sweep()
  blocks, kind = follow_up_blocks(sweep, _fin(batch=(4.00,)))  # pilot unfinished
  assert kind == "pilot" and _added(blocks, sweep) == {}
  noisy = (3.96, 4.0, 4.06, 3.98, 4.04)  # std 0.04: power < 0.8 at 5 seeds for effect 0.05
  fin = _fin(ema=(3.90, 3.905, 3.91, 3.905, 3.90), batch=noisy)
  a, b = [3.90, 3.905, 3.91, 3.905, 3.90], list(noisy)
  assert calibrate.of_arms(a, b, 0.05).power < calibrate.MIN_POWER
  blocks, kind = follow_up_blocks(sweep, fin)
  added = _added(blocks, sweep)
  assert kind == "seeds" and list(added) == ["batch"]
  n = len(PILOT) + len(added["batch"])
  assert added["batch"] == list(range(6, 6 + n - len(PILOT)))  # past every seed used
  # the count is the fewest at which the rule reaches the target, the quiet arm at its pilot
  power = lambda k: calibrate.calibrate("pair", np.std(a, ddof=1), 5, 0.05, n_b=k,
                                        noise_b=np.std(b, ddof=1), pilot=5).power
  assert power(n) >= 0.9 > power(n - 1)
  # resumed with any of the added seeds finished, at any loss: the same seeds are asked for
  for k in range(1, len(added["batch"]) + 1):
    done = pd.concat([fin, pd.DataFrame([_row({"optimizer.placement": "batch"}, 3e-3, s, 9.0)
                                         for s in added["batch"][:k]])])
    assert _added(follow_up_blocks(sweep, done)[0], sweep) == added


def test_both_arms_when_one_alone_cannot_and_none_past_the_cap():
  noisy = (3.95, 4.0, 4.05, 3.98, 4.02)  # std 0.04 a side: one side alone cannot reach 0.9
  ls = _sweep().lr_search
  both = more_seeds.needed(list(noisy), [x + 0.1 for x in noisy], ls.more)
  assert set(both) == {0, 1} and both[0] == both[1] <= ls.more.most
  sd = np.std(noisy, ddof=1)
  power = lambda k: calibrate.calibrate("pair", sd, k, 0.05, n_b=k, noise_b=sd, pilot=5).power
  assert power(both[0]) >= 0.9 > power(both[0] - 1)
  blocks, _ = follow_up_blocks(_sweep(most=6), _fin(ema=noisy, batch=noisy))
  assert _added(blocks, _sweep()) == {}  # past the declared cap: left to guards.powered
  diverged = more_seeds.needed([3.9, math.inf, 4.0, 3.9, 3.9], list(noisy), ls.more)
  assert diverged == {}  # decided by the diverged seed (guards.stable), not by noise


def _two_stage(rng, sd_a, sd_b, effect, gap, most, reps, stein=True):
  """The share of `reps` simulated experiments (a pilot of MIN_PILOT a side, then
  `more_seeds.needed`, then the pair rule on every seed, its variances from the pilot's alone
  or, `stein` False, from every seed's) that call a difference (gap 0) or A's win (gap > 0)."""
  more, n0, calls = MoreSeeds(None, effect, most), MIN_PILOT, 0
  for _ in range(reps):
    a, b = sd_a * rng.standard_normal(n0), gap + sd_b * rng.standard_normal(n0)
    add = more_seeds.needed(list(a), list(b), more)
    a = np.r_[a, sd_a * rng.standard_normal(add.get(0, n0) - n0)]
    b = np.r_[b, gap + sd_b * rng.standard_normal(add.get(1, n0) - n0)]
    pair = rules.compare(a, b, pilot=n0 if stein else None)  # A lower: a win
    calls += pair.outcome == rules.WIN or (gap == 0 and pair.outcome == rules.LOSS)
  return calls / reps


def test_the_two_stage_design_keeps_its_false_alarm_rate_and_reaches_its_power(monkeypatch):
  """At preconditioner's measured noises (micro_adam 0.0053 vs adam 0.013 over 5 seeds; effect
  0.02 nats; at most 15 seeds a side, `preconditioner.MOST_SEEDS`), where the pilot alone has
  power 0.70."""
  monkeypatch.setattr(calibrate, "DRAWS", 1000)  # the count's own Monte Carlo, coarser
  sd_a, sd_b, effect, most, reps = 0.0053, 0.013, 0.02, preconditioner.MOST_SEEDS, 1500
  assert calibrate.calibrate("pair", sd_a, MIN_PILOT, effect, noise_b=sd_b).power < 0.8
  rng = np.random.default_rng(1)
  false_alarm = _two_stage(rng, sd_a, sd_b, effect, 0.0, most, reps)
  power = _two_stage(rng, sd_a, sd_b, effect, effect, most, reps)
  se = math.sqrt(0.05 * 0.95 / reps)
  assert false_alarm <= 2 * rules.PAIR_ALPHA + 2 * se, false_alarm  # the rule's own 5 %
  assert power >= calibrate.MIN_POWER, power
  # and the calibration the report shows at the final seeds agrees with the simulated design
  cal = calibrate.calibrate("pair", sd_a, MIN_PILOT, effect, n_b=8, noise_b=sd_b, pilot=5)
  assert abs(cal.false_alarm - 2 * rules.PAIR_ALPHA) < 0.015 and cal.power >= 0.8


def test_a_pilot_too_small_is_refused():
  with pytest.raises(ValueError, match="pilot of 3 seeds"):
    LrSearch(("a",), seeds=(1, 2, 3), more=MoreSeeds(None, 0.05, 10))


def test_the_pilot_variance_interval():
  """Stein's interval: variances from the first `pilot` values, means from all."""
  a, b = np.array([1.0, 2.0, 3.0, 10.0]), np.array([0.0, 1.0, 2.0, 3.0, 4.0])
  d, lo, hi = rules.welch_interval(a, b, 0.025, pilot=3)
  va, vb = np.var(a[:3], ddof=1) / 4, np.var(b[:3], ddof=1) / 5
  df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)

  assert d == pytest.approx(4.0 - 2.0)
  assert hi - d == pytest.approx(stats.t.ppf(0.975, df) * math.sqrt(va + vb))
  assert rules.welch_interval(a, b, 0.025) != (d, lo, hi)
  with pytest.raises(ValueError, match="pilot"):
    rules.welch_interval(a, b, 0.025, pilot=5)


def test_an_arm_run_at_a_fixed_lr_is_read_from_the_finals():
  """msq_eps's case: a pair's arm that no search chose (a fixed block: no selection seed, no
  row in `best`) has its pilot read from the finals, and gets its seeds like any other."""
  fixed = {"optimizer.placement": "fixed", "optimizer.lr": 5e-3}
  noisy = (3.96, 4.0, 4.06, 3.98, 4.04)
  rows = [_row({"optimizer.placement": "fixed"}, 5e-3, s, v)
          for s, v in zip(PILOT, noisy, strict=True)]
  fin = pd.concat([_fin(ema=(3.90, 3.905, 3.91, 3.905, 3.90)), pd.DataFrame(rows)])
  pairs = lambda best: [({"optimizer.placement": "ema", "optimizer.lr": 3e-3}, fixed)]
  sweep = Sweep({"steps": 3}, _sweep().blocks, LrSearch(
      ("optimizer.placement",), max_extend=0, seeds=PILOT, more=MoreSeeds(pairs, 0.05, 24)))
  blocks, kind = follow_up_blocks(sweep, fin)
  assert kind == "seeds" and list(_added(blocks, sweep)) == ["fixed"]
  assert [b.grid["optimizer.lr"] for b in blocks if "fixed" in b.grid["optimizer.placement"]
          ] == [[5e-3]]
  _, kind = follow_up_blocks(sweep, fin[fin["train.seed"] != 5])  # pilot unfinished
  assert kind == "pilot"
