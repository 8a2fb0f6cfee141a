"""`experiments.runner.launch_sweep` runs the lr search's follow-up rounds while each one runs
something: a round is a function of the finished runs, so one that ran none would return the
same blocks again. A sweep resumed mid follow-up stage waits ("pilot") on an arm that only
that stage runs: its rounds stop at the first that runs nothing, not after `LrSearch.rounds`
identical ones (the clean run spun 38 such rounds in gns_schedule)."""

from __future__ import annotations

import types

from experiments import runner
from pergrad.sweep import Block, How


def _launch(monkeypatch, tmp_path, next_round):
  """launch_sweep on a fake experiment whose rounds are `next_round(k)` -> (blocks, kind) and
  whose runs finish when launched (each new point once); returns the calls and points run."""
  calls, done = [], set()

  def launch_blocks(sdir, base, blocks, *, log, **kw):
    for bl in blocks:
      for p in bl.points():
        key = tuple(sorted(p.items()))
        (log.skipped if key in done else log.launched).append(key)
        done.add(key)
    return log

  def follow_up(sweep, fin):
    calls.append(len(calls))
    return next_round(len(calls) - 1)

  for name, fn in dict(launch_blocks=launch_blocks, follow_up_blocks=follow_up,
                       aggregate=lambda sdir: None, marked_finals=lambda *a: None,
                       record_sweep=lambda *a, **k: None, write_csv=lambda *a: None,
                       diverged_runs=lambda sdir: []).items():
    monkeypatch.setattr(runner, name, fn)
  first = Block({"optimizer.lr": [0.01], "train.seed": [0]})
  sweep = types.SimpleNamespace(base={}, blocks=(first,),
                                lr_search=types.SimpleNamespace(rounds=40, more=None))
  exp = types.SimpleNamespace(name="fake", follow_up=None, sweep_at=lambda preset, inputs: sweep)
  how = How(echo=lambda line: None, sweeps_root=tmp_path)
  _, log, _ = runner.launch_sweep(exp, "cpu", tmp_path / "sweep", None, how, None)
  return calls, log


def test_a_round_that_runs_nothing_ends_the_rounds(monkeypatch, tmp_path):
  waiting = Block({"optimizer.lr": [0.01], "train.seed": [1, 2]})
  calls, log = _launch(monkeypatch, tmp_path, lambda k: ([waiting], "pilot"))
  assert len(calls) == 2  # the first ran seeds 1, 2; the second ran nothing: stop
  assert len(log.launched) == 3 and len(log.skipped) == 2


def test_rounds_that_run_something_go_on_to_the_cap(monkeypatch, tmp_path):
  grow = lambda k: ([Block({"optimizer.lr": [0.01 * 2 ** (k + 1)], "train.seed": [0]})],
                    "extend")
  calls, log = _launch(monkeypatch, tmp_path, grow)
  assert len(calls) == 40 and len(log.launched) == 41
  calls, _ = _launch(monkeypatch, tmp_path, lambda k: ([], "extend"))
  assert len(calls) == 1  # nothing to run: one round
