"""The lr policy of `experiments.lr_search` (edge extensions, the all-diverged floor, the
fresh seeds, resumes) on constructed finals tables (no training runs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import sign_placement  # noqa: E402
from pergrad.sweep import Block, LrSearch, Sweep, best_lr, follow_up_blocks, growth  # noqa: E402
from tests.test_reports import GRID, INF, _row, group_runs, write  # noqa: E402


def _sweep(seeds=(1, 2, 3), max_extend=1) -> Sweep:
  return Sweep({"steps": 3}, (
      Block({"optimizer.placement": ["ema"], "optimizer.lr": list(GRID), "train.seed": [0]}),
      Block({"optimizer.placement": ["example"], "optimizer.lr": list(GRID),
             "train.seed": [0]})),
      LrSearch(sign_placement.GROUP, max_extend=max_extend, seeds=seeds))


def test_all_diverged_group_extends_downward_then_stops_at_100x(tmp_path):
  sweep = _sweep()
  fin = pd.DataFrame(group_runs({"optimizer.placement": "ema"}, best=3e-3)
                     + group_runs({"optimizer.placement": "example"}, diverged_all=True))
  lows = []
  for r in range(sweep.lr_search.rounds):  # what the runner does with `LrSearch.rounds`
    blocks, kind = follow_up_blocks(sweep, fin)
    pts = [p for b in blocks for p in b.points()]
    down = [p for p in pts if p["optimizer.placement"] == "example"]
    if r == 0:  # the trained group gets its fresh seeds beside the downward extension
      assert kind == "extend"
      assert sorted(p["train.seed"] for p in pts if p["optimizer.placement"] == "ema") == [1, 2, 3]
      assert all(p["optimizer.lr"] == 3e-3 for p in pts if p["optimizer.placement"] == "ema")
    if kind != "extend":
      break
    assert len(down) == 1 and down[0]["train.seed"] == 0
    lows.append(down[0]["optimizer.lr"])
    fin = pd.concat([fin, pd.DataFrame([_row({"optimizer.placement": "example"},
                                             down[0]["optimizer.lr"], 0, INF)])])
  # by the search factor, until the lowest lr is 100x below the first grid's 1e-3
  assert lows == [0.000333, 0.000111, 3.7e-05, 1.23e-05, 4.1e-06]
  assert kind == "seeds" and not down  # an all-diverged group gets no seeds
  assert len(lows) < sweep.lr_search.rounds
  out = write(tmp_path / "sp", fin.to_dict("records"), sign_placement.GROUP)
  rep = sign_placement.report(out)
  assert "Diverged at every lr: ['example (lr 0.01 down to 4.1e-06)']" in rep.finding


def test_downward_search_stops_when_a_run_trains(tmp_path):
  sweep = _sweep(seeds=(1, 2, 3), max_extend=0)
  fin = pd.DataFrame(group_runs({"optimizer.placement": "ema"}, [4.0, 4.1, 4.2])
                     + group_runs({"optimizer.placement": "example"}, diverged_all=True)
                     + [_row({"optimizer.placement": "example"}, 3.33e-4, 0, INF),
                        _row({"optimizer.placement": "example"}, 1.11e-4, 0, 5.0)])
  blocks, kind = follow_up_blocks(sweep, fin)
  pts = [p for b in blocks for p in b.points()]
  assert kind == "seeds"
  assert [(p["optimizer.lr"], p["train.seed"]) for p in pts
          if p["optimizer.placement"] == "example"] == [(1.11e-4, 1), (1.11e-4, 2), (1.11e-4, 3)]
  best = best_lr(fin, sign_placement.GROUP, "optimizer.lr").set_index(
      "optimizer.placement")
  assert not best.loc["example", "all_diverged"] and best.loc["example", "n_diverged"] == 4


def _searched(sweep: Sweep, loss, stops: tuple = ()) -> list[tuple]:
  """The runner's lr search on `loss(group, lr, seed)` (the first stage, then `rounds` follow-up
  rounds), stopped after the k-th launched block for each k in `stops` and started again from
  its first stage, as `reproduce.py` resumes: the finished runs, sorted."""
  done: dict[str, dict] = {}
  launches, stops = [0], set(stops)

  def launch(blocks) -> bool:  # False: stopped here
    for bl in blocks:
      for p in bl.points():
        point = {**bl.fixed, **p}
        group = {k: v for k, v in point.items() if k not in ("optimizer.lr", "train.seed")}
        row = _row(group, point["optimizer.lr"], point["train.seed"],
                   loss(group, point["optimizer.lr"], point["train.seed"]))
        done.setdefault(row["run"], row)  # a finished run is skipped
      launches[0] += 1
      if launches[0] in stops:
        stops.discard(launches[0])
        return False
    return True

  while True:
    if launch(sweep.blocks) and all(launch(b) for b in _rounds(sweep, done)):
      return sorted((r["optimizer.placement"], r["optimizer.lr"], r["train.seed"])
                    for r in done.values())


def _rounds(sweep: Sweep, done: dict):
  for _ in range(sweep.lr_search.rounds):
    blocks, kind = follow_up_blocks(sweep, pd.DataFrame(list(done.values())))
    yield blocks
    if kind != "extend":
      return


def test_lr_search_resumed_anywhere_reaches_the_uninterrupted_grid():
  # Stopped and restarted (every round counted from 0 again, as each invocation of
  # reproduce.py does), the search extends no group past `max_extend`: the runs are those of
  # one invocation through, wherever it was stopped and however often.
  sweep = _sweep(seeds=(1, 2), max_extend=2)
  opt = {"ema": 1.0, "example": 1e-5}  # both past the grid's edges: extended to the limit
  loss = lambda g, lr, seed: 4.0 + 0.2 * abs(math.log(lr / opt[g["optimizer.placement"]])) + (
      0.01 * seed)
  through = _searched(sweep, loss)
  lrs = {p: sorted({lr for q, lr, s in through if q == p and s == 0}) for p in opt}
  assert lrs == {"ema": [1e-3, 3e-3, 1e-2, 0.03, 0.09],  # two extensions a side, no more
                 "example": [1.11e-4, 3.33e-4, 1e-3, 3e-3, 1e-2]}
  n_launches = 2 * 4  # two blocks in each: the first stage, two extension rounds, the seeds
  for stops in [(k,) for k in range(1, n_launches + 1)] + [(2, 3, 4, 5), (1, 3, 5)]:
    assert _searched(sweep, loss, stops) == through, stops


def test_edge_extension_and_rounds_budget():
  sweep = _sweep(seeds=(1, 2, 3), max_extend=1)
  fin = pd.DataFrame(group_runs({"optimizer.placement": "ema"}, best=1e-1)  # high edge
                     + group_runs({"optimizer.placement": "example"}, best=3e-3))
  blocks, kind = follow_up_blocks(sweep, fin)
  pts = [p for b in blocks for p in b.points()]
  assert kind == "extend"
  assert {"optimizer.placement": "ema", "optimizer.lr": 0.03, "train.seed": 0} in pts
  fin = pd.concat([fin, pd.DataFrame([_row({"optimizer.placement": "ema"}, 0.03, 0, 3.9)])])
  blocks, kind = follow_up_blocks(sweep, fin)  # at the edge again: budget spent
  assert kind == "seeds" and len([p for b in blocks for p in b.points()]) == 6
  assert growth.extensions([1e-3, 3e-3, 1e-2, 0.03], list(GRID), "high") == 1
  assert growth.extensions([3e-4, 1e-3, 3e-3, 1e-2], list(GRID), "high") == 0
  assert LrSearch(("a",)).rounds == 6 and LrSearch(("a",), max_extend=7).rounds == 8
