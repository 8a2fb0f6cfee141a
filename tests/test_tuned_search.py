"""A value tuned beside the lr (`pergrad.sweep.Tuned`: MicroAdamMSQ's ε, gns_schedule's
fixed batch size) extends its grid past an edge until the chosen value is bracketed, within its
declared limits, and the search reaches the same runs however often it is stopped and resumed
(on constructed losses, no training runs)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import gns_schedule, preconditioner  # noqa: E402
from pergrad.sweep import Block, LrSearch, Sweep, Tuned, best_lr, follow_up_blocks, growth  # noqa: E402
from tests.test_reports import GRID, _row  # noqa: E402

EPS_KEYS = ("optimizer.variant", "optimizer.eps")


def _eps_sweep(max_extend: int = 2) -> Sweep:
  return Sweep({"steps": 3}, (
      Block({"optimizer.variant": ["adam"], "optimizer.eps": [1e-8], "optimizer.lr": list(GRID),
             "train.seed": [0]}),
      Block({"optimizer.variant": ["msq"], "optimizer.eps": [1e-6, 1e-5, 1e-4],
             "optimizer.lr": list(GRID), "train.seed": [0]})),
      LrSearch(EPS_KEYS, max_extend=1, seeds=(1, 2), tuned=Tuned(
          "optimizer.eps", ("optimizer.variant",), 10.0, 1e-8, 1e-2, max_extend=max_extend)))


def _searched(sweep: Sweep, loss, stops: tuple = ()) -> list[tuple]:
  """The runner's search on `loss(group, lr, seed)`: the first stage, then up to
  `LrSearch.rounds` follow-up rounds, stopped after the k-th run it trains for each k in
  `stops` (mid-block too) and started again from its first stage (as `reproduce.py`
  resumes); the finished runs as sorted (group values..., lr, seed)."""
  ls, done, trained, stops = sweep.lr_search, {}, [0], set(stops)

  def launch(blocks) -> bool:  # False: stopped here
    for bl in blocks:
      for p in bl.points():
        point = {**bl.fixed, **p}
        group = {k: v for k, v in point.items() if k not in (ls.lr_key, ls.seed_key)}
        row = _row(group, point[ls.lr_key], point[ls.seed_key],
                   loss(group, point[ls.lr_key], point[ls.seed_key]))
        if row["run"] in done:  # a finished run is skipped
          continue
        done[row["run"]] = row
        trained[0] += 1
        if trained[0] in stops:
          stops.discard(trained[0])
          return False
    return True

  def rounds():
    for _ in range(ls.rounds):
      blocks, kind = follow_up_blocks(sweep, pd.DataFrame(list(done.values())))
      yield blocks
      if kind != "extend":
        return

  while True:
    if launch(sweep.blocks) and all(launch(b) for b in rounds()):
      keys = [k for k in ls.group_keys]
      return sorted((*(r.get(k) for k in keys), r[ls.lr_key], r[ls.seed_key])
                    for r in done.values())


def _eps_loss(eps_opt: float):
  return lambda g, lr, seed: (4.0 + 0.2 * abs(math.log(lr / 3e-3)) + 0.01 * seed + (
      0.1 * abs(math.log10(g["optimizer.eps"] / eps_opt)) if g["optimizer.variant"] == "msq"
      else 0.0))


def _eps_values(runs) -> list[float]:
  return sorted({e for v, e, _, s in runs if v == "msq" and s == 0})


def test_an_eps_chosen_at_the_edge_extends_until_bracketed_and_resumes_anywhere():
  sweep = _eps_sweep()
  through = _searched(sweep, _eps_loss(1e-3))
  assert _eps_values(through) == [1e-6, 1e-5, 1e-4, 1e-3, 1e-2]  # 1e-3 chosen, inside
  assert {e for v, e, _, _ in through if v == "adam"} == {1e-8}  # one ε: not tuned
  for eps in (1e-3, 1e-2):  # an added ε: the first-stage lrs, then the fresh seeds
    assert sorted(lr for v, e, lr, s in through if e == eps and s == 0) == list(GRID)
    assert sorted(s for v, e, lr, s in through if e == eps and s > 0) == [1, 2]
  fin = pd.DataFrame([_row({"optimizer.variant": v, "optimizer.eps": e}, lr, s, 0.0)
                      for v, e, lr, s in through])
  fin["final_eval_loss"] = [_eps_loss(1e-3)(r, r["optimizer.lr"], r["train.seed"])
                            for r in fin.to_dict("records")]
  best = preconditioner.chosen(best_lr(fin, preconditioner.GROUP, "optimizer.lr",
                                                 select_seed=0))  # as the experiment chooses
  assert float(best.set_index("optimizer.variant").loc["msq", "optimizer.eps"]) == 1e-3
  for stops in [(k,) for k in range(1, len(through))] + [(8, 16, 24, 32), (21, 22, 23, 29)]:
    assert _searched(sweep, _eps_loss(1e-3), stops) == through, stops


def test_eps_extension_stops_at_its_declared_limit_and_at_max_extend():
  assert _eps_values(_searched(_eps_sweep(max_extend=5), _eps_loss(1.0))) == [
      1e-6, 1e-5, 1e-4, 1e-3, 1e-2]  # 0.1 lies past the declared 1e-2
  assert _eps_values(_searched(_eps_sweep(max_extend=1), _eps_loss(1e-9))) == [
      1e-7, 1e-6, 1e-5, 1e-4]  # one extension a side
  assert _eps_values(_searched(_eps_sweep(), _eps_loss(1e-5))) == [1e-6, 1e-5, 1e-4]


def _b_sweep() -> Sweep:
  steps = lambda b: {"train.steps": 256 // int(b)}
  return Sweep({}, tuple(Block({"batch.kind": ["fixed"], "data.batch_size": [b], **{
      k: [v] for k, v in steps(b).items()}, "optimizer.lr": list(GRID), "train.seed": [0]})
      for b in (8, 16, 32)),
      LrSearch(("batch.kind", "data.batch_size", "train.steps"), max_extend=1, seeds=(1, 2, 3),
               tuned=Tuned("data.batch_size", ("batch.kind",), 2.0, 2, 64, metric="loss_mean",
                           extra=steps)))


def _b_loss(g, lr, seed):
  """Seed 0 (selection) prefers B = 32; the fresh seeds B = 4: the fresh means decide."""
  b = g["data.batch_size"]
  size = abs(math.log2(b / 32)) if seed == 0 else abs(math.log2(b / 4))
  return 4.0 + 0.2 * abs(math.log(lr / 3e-3)) + 0.05 * size + 0.001 * seed


def test_a_batch_size_chosen_on_fresh_seeds_extends_with_its_steps_and_resumes_anywhere():
  sweep = _b_sweep()
  through = _searched(sweep, _b_loss)
  sizes = sorted({b for _, b, _, _, s in through if s == 0})
  assert sizes == [2, 4, 8, 16, 32]  # B = 4 chosen on the fresh seeds, then bracketed by 2
  assert {(b, st) for _, b, st, _, _ in through} == {(b, 256 // b) for b in sizes}
  assert sorted(s for _, b, _, _, s in through if b == 2 and s > 0) == [1, 2, 3]
  for stops in [(k,) for k in range(1, len(through))] + [(10, 20, 30, 40), (27, 28, 29, 33)]:
    assert _searched(sweep, _b_loss, stops) == through, stops


def test_gns_schedule_adds_sizes_as_its_first_stage_makes_them():
  sw = gns_schedule.sweep("cpu")
  t = sw.lr_search.tuned
  for bl in sw.blocks:  # the first-stage arms are the points the extension would make
    b = bl.grid["data.batch_size"][0]
    assert t.point(b) == {k: bl.grid[k][0] for k in gns_schedule.GROUP[1:]}
  four = {"batch.kind": "fixed", **t.point(t.next(8, "low"))}
  assert four["data.batch_size"] == 4 and four["train.steps"] == 2 * t.point(8)["train.steps"]
  assert four["schedule.warmup_steps"] >= 20
  assert growth.first_stage_lrs(sw, four) == gns_schedule.lr_grid("cpu", 8)  # nearest B's
  assert t.next(2, "low") is None and t.next(128, "high") is None  # B_LIMITS: 2 ... 2·B_max
  assert gns_schedule.sweep("ci").lr_search.tuned.point(32)["train.steps"] > 0
