"""More seeds for a comparison still open after the pilot (`pergrad.sweep.more_seeds`): which
seeds the search adds, that a resumed search adds the same, and the sequential design's
false-alarm rate and power, simulated at the preconditioner's scale."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import preconditioner  # noqa: E402
from pergrad.analysis import (  # noqa: E402
  decide,
  sequential,
  verdict,
)
from pergrad.sweep import (  # noqa: E402
  MIN_PILOT,
  Block,
  LrSearch,
  MoreSeeds,
  Sweep,
  follow_up_blocks,
  more_seeds,
)
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


def test_the_pilot_is_awaited_then_an_open_pair_gets_seeds_on_both_arms():
  sweep = _sweep()
  blocks, kind = follow_up_blocks(sweep, _fin(batch=(4.00,)))  # pilot unfinished
  assert kind == "pilot" and _added(blocks, sweep) == {}
  noisy = (3.86, 3.95, 4.00, 3.88, 3.96)  # gaps to ema 0.026 ± 0.05: open at the first look
  ema = (3.90, 3.905, 3.91, 3.905, 3.90)
  fin = _fin(ema=ema, batch=noisy)
  out, add = sequential.read(np.subtract(noisy, ema), sweep.lr_search.more.design(5), 0.05)
  assert out == decide.NOT_SEPARABLE and add == 24 - 5
  blocks, kind = follow_up_blocks(sweep, fin)
  added = _added(blocks, sweep)
  assert kind == "seeds" and sorted(added) == ["batch", "ema"]
  assert added["batch"] == added["ema"] == list(range(6, 6 + 24 - len(PILOT)))  # past the used
  # resumed with any of the added seeds finished, at any loss: the same seeds are asked for
  for k in range(1, len(added["batch"]) + 1):
    done = pd.concat([fin, pd.DataFrame([_row({"optimizer.placement": "batch"}, 3e-3, s, 9.0)
                                         for s in added["batch"][:k]])])
    assert _added(follow_up_blocks(sweep, done)[0], sweep) == added


def test_none_for_a_decided_pair_a_divergence_or_a_pilot_at_the_cap():
  ls = _sweep().lr_search
  far = more_seeds.needed([3.9, 3.91, 3.9, 3.92, 3.9], [4.2, 4.21, 4.2, 4.22, 4.2], ls.more)
  assert far == {}  # a win at the first look
  noisy = (3.95, 4.0, 4.05, 3.98, 4.02)
  diverged = more_seeds.needed([3.9, math.inf, 4.0, 3.9, 3.9], list(noisy), ls.more)
  assert diverged == {}  # decided by the diverged seed (guards.stable), not by noise
  at_cap = more_seeds.needed(list(noisy), [x + 0.01 for x in noisy],
                             MoreSeeds(None, 0.05, most=len(noisy)))
  assert at_cap == {}


def _sequential(rng, sd, effect, gap, most, reps):
  """The share of `reps` simulated experiments (a pilot of MIN_PILOT paired gaps, then
  `more_seeds.needed`, then the report's reading, `verdict.sequential_reading`) that call a
  difference (gap 0) or A's win (gap > 0)."""
  more, n0, calls = MoreSeeds(None, effect, most), MIN_PILOT, 0
  for _ in range(reps):
    b = 4.0 + 0.05 * rng.standard_normal(n0)
    a = b - gap + sd * rng.standard_normal(n0)  # paired: a shared seed effect
    n = more_seeds.needed(list(a), list(b), more).get(0, n0)
    extra = 4.0 + 0.05 * rng.standard_normal(n - n0)
    a, b = np.r_[a, extra - gap + sd * rng.standard_normal(n - n0)], np.r_[b, extra]
    va, vb = dict(enumerate(a)), dict(enumerate(b))
    p = verdict.sequential_reading(decide.compare(va, vb, effect=effect, margin=effect), va, vb,
                                   more.design(n0))
    calls += p.outcome == decide.WIN or (gap == 0 and p.outcome == decide.LOSS)
  return calls / reps


def test_the_sequential_design_keeps_its_false_alarm_rate_and_reaches_its_power():
  """At the preconditioner's scale (paired sd 0.015 nats, effect 0.02, 5 seeds then at most 15,
  `preconditioner.MOST_SEEDS`): the pilot alone has power < 0.8 for the effect; the two looks
  keep the false alarm <= 5 % and reach power 0.8."""
  sd, effect, most, reps = 0.015, 0.02, preconditioner.MOST_SEEDS, 2000
  assert decide.power_difference(sd, MIN_PILOT, effect) < 0.8
  rng = np.random.default_rng(1)
  false_alarm = _sequential(rng, sd, effect, 0.0, most, reps)
  power = _sequential(rng, sd, effect, effect, most, reps)
  se = math.sqrt(0.05 * 0.95 / reps)
  assert false_alarm <= decide.ALPHA + 2 * se, false_alarm
  assert power >= 0.8, power


def test_a_pilot_too_small_is_refused():
  with pytest.raises(ValueError, match="pilot of 3 seeds"):
    LrSearch(("a",), seeds=(1, 2, 3), more=MoreSeeds(None, 0.05, 10))


def test_an_arm_run_at_a_fixed_lr_is_read_from_the_finals():
  """msq_eps's case: a pair's arm that no search chose (a fixed block: no selection seed, no
  row in `best`) has its pilot read from the finals, and gets its seeds like any other."""
  fixed = {"optimizer.placement": "fixed", "optimizer.lr": 5e-3}
  noisy = (3.86, 3.95, 4.00, 3.88, 3.96)
  rows = [_row({"optimizer.placement": "fixed"}, 5e-3, s, v)
          for s, v in zip(PILOT, noisy, strict=True)]
  fin = pd.concat([_fin(ema=(3.90, 3.905, 3.91, 3.905, 3.90)), pd.DataFrame(rows)])
  pairs = lambda best: [({"optimizer.placement": "ema", "optimizer.lr": 3e-3}, fixed)]
  sweep = Sweep({"steps": 3}, _sweep().blocks, LrSearch(
      ("optimizer.placement",), max_extend=0, seeds=PILOT, more=MoreSeeds(pairs, 0.05, 24)))
  blocks, kind = follow_up_blocks(sweep, fin)
  assert kind == "seeds" and sorted(_added(blocks, sweep)) == ["ema", "fixed"]
  assert [b.grid["optimizer.lr"] for b in blocks if "fixed" in b.grid["optimizer.placement"]
          ] == [[5e-3]]
  _, kind = follow_up_blocks(sweep, fin[fin["train.seed"] != 5])  # pilot unfinished
  assert kind == "pilot"


def test_sign_placement_declares_its_cap_and_adds_seeds_by_the_same_design():
  """sign_placement's adjacent pairs get more seeds by `MoreSeeds` (cap from its YAML), the
  report reads them by the same two-look design."""
  from experiments import sign_placement as sp

  ls = sp.sweep("cpu").lr_search
  assert ls.more is not None and ls.more.most == sp.MOST_SEEDS == 15 and ls.seeds == sp.SEEDS
  assert sp.design() == ls.more.design(len(sp.SEEDS))
  best = pd.DataFrame([{"optimizer.placement": p, "optimizer.lr": 1e-2}
                       for p in ("ema", "batch", "example", "token")])
  pairs = [(a["optimizer.placement"], b["optimizer.placement"]) for a, b in ls.more.pairs(best)]
  assert pairs == [("ema", "batch"), ("batch", "example"), ("batch", "token")]
  assert preconditioner.MOST_SEEDS == 15  # declared in configs/experiment/preconditioner.yaml


def test_an_open_schedule_gets_seeds_on_both_arms_a_decided_one_none():
  """The best fixed arm's follow-up seeds 4-8 are the first look (`MoreSeeds.first`, cap from
  the YAML): a schedule vs that arm still open there asks for seeds on both arms up to the cap
  (by the same two-look design the report reads), a decided one asks for none."""
  from test_gns_schedule import BEST_LR, _schedule_table

  from experiments import gns_schedule as gs
  from pergrad.analysis import runs
  from pergrad.sweep import follow_up_blocks

  sw = gs.sweep("cpu")
  assert sw.lr_search.pilot_seeds == (4, 5, 6, 7, 8) and sw.lr_search.more.most == gs.MOST_SEEDS
  assert gs.design() == sw.lr_search.more.design(5) and gs.MOST_SEEDS == 15
  fin = runs.finals(_schedule_table({"gns_norm": 1.5, "linear_paper": 1.0}))
  ramp = (fin["batch.kind"] == "linear") & fin["train.seed"].between(4, 8)
  fixed = fin[(fin["run"].str.startswith("fixed_16,")) & (fin["optimizer.lr"] == BEST_LR[16])]
  base = fixed.set_index("train.seed")["final_eval_loss"]
  fin.loc[ramp, "final_eval_loss"] = [base[s] + d for s, d in zip(
      fin.loc[ramp, "train.seed"], (0.05, -0.05, 0.04, -0.045, 0.01), strict=True)]  # open
  blocks, kind = follow_up_blocks(sw, fin)
  added = [b for b in blocks if min(b.grid["train.seed"]) > 8]
  assert kind == "seeds" and sorted(b.grid["batch.kind"][0] for b in added) == ["fixed", "linear"]
  assert all(b.grid["train.seed"] == list(range(9, 9 + gs.MOST_SEEDS - 5)) for b in added)
  assert next(b for b in added if b.grid["batch.kind"] == ["fixed"]).grid["data.batch_size"] == [16]
  fin.loc[ramp, "final_eval_loss"] = base[[4, 5, 6, 7, 8]].to_numpy() - 0.3  # decided: none
  assert not [b for b in follow_up_blocks(sw, fin)[0] if min(b.grid["train.seed"]) > 8]
  waiting = fin[~((fin["batch.kind"] == "gns") & (fin["train.seed"] == 8))]  # first look unrun
  assert follow_up_blocks(sw, waiting)[1] == "pilot"


def _noninferior_calls(rng, sd, gap, margin, most, reps) -> tuple[float, float]:
  """(non-inferior, worse) shares of `reps` simulated msq_eps-like pairs read sequentially for
  non-inferiority (pilot, `needed` with kind NONINFERIORITY, the report's reading); `gap`: A's
  true excess loss over B."""
  more, n0, ni, worse = MoreSeeds(None, margin, most), MIN_PILOT, 0, 0
  for _ in range(reps):
    b = 4.0 + 0.05 * rng.standard_normal(most)
    a = b + gap + sd * rng.standard_normal(most)
    n = more_seeds.needed(list(a[:n0]), list(b[:n0]), more, more_seeds.NONINFERIORITY).get(0, n0)
    out, _ = sequential.read_noninferior(b[:n] - a[:n], more.design(n0), margin)  # the report's
    ni, worse = ni + (out == decide.NONINFERIOR), worse + (out == decide.WORSE)
  return ni / reps, worse / reps


def test_a_noninferiority_pair_gets_seeds_by_its_own_reading_and_keeps_its_rates():
  """msq_eps's MicroAdamMSQ vs Adam: open means neither non-inferior nor worse at the margin.
  A pilot non-inferior but not separable by difference or equivalence gets no seeds as a
  non-inferiority pair (it would as a difference pair); simulated at its 0.02 margin and a
  paired sd of 0.02 (cap 15): a false 'non-inferior' at a true excess of the margin and a
  false 'worse' there stay <= 5 %, and a truly equal pair is shown non-inferior more often
  than by its pilot alone."""
  more = MoreSeeds(None, 0.02, most=15)
  b = np.array([4.0, 4.02, 3.98, 4.01, 3.99])
  a = b - np.array([0.01, -0.005, 0.025, 0.015, 0.005])  # A better by 0.01: ≥ −0.02 shown
  assert more_seeds.needed(list(a), list(b), more) == {0: 15, 1: 15}  # open as a difference
  assert more_seeds.needed(list(a), list(b), more, more_seeds.NONINFERIORITY) == {}
  va, vb = dict(enumerate(a)), dict(enumerate(b))  # the report reads it so (`verdict`)
  p = verdict.sequential_reading(decide.compare(va, vb, effect=0.02, margin=0.02,
                                                noninferiority=True), va, vb, more.design(5),
                                 noninferiority=True)
  assert p.outcome == decide.NONINFERIOR and "pocock look 1 of 2" in p.sentence()
  rng, reps = np.random.default_rng(3), 4000
  se = math.sqrt(0.05 * 0.95 / reps)
  ni, _ = _noninferior_calls(rng, 0.02, 0.02, 0.02, 15, reps)  # on the margin: not non-inferior
  assert ni <= decide.ALPHA + 2 * se, ni
  _, worse = _noninferior_calls(rng, 0.02, 0.02, 0.02, 15, reps)  # ... and not beyond it
  assert worse <= decide.ALPHA + 2 * se, worse
  ni_two_looks, _ = _noninferior_calls(rng, 0.02, 0.0, 0.02, 15, reps)
  ni_pilot, _ = _noninferior_calls(rng, 0.02, 0.0, 0.02, MIN_PILOT, reps)
  assert ni_two_looks > ni_pilot + 0.2, (ni_two_looks, ni_pilot)
