"""Claim 4's sequential seeds (`experiments.batch_scaling.follow_up`, issue 53 item 4): the
pilot's open readings (√ at B vs B_ref; a contrast at √'s break) get seeds on both arms up to
the declared cap, decided ones none, the same whatever seeds were added since; the added runs
on their comparison's budget (same_budget); every reading by the two-look Pocock design, its
false alarm and false collapse ≤ 5 % (simulated, the module's own reading cross-checked)."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pandas as pd
import pytest
from test_batch_scaling import REF, _log2, _run_rule, _table
from test_record import needed_runs

from experiments import batch_scaling as bs
from pergrad.analysis import budget as budget_lib
from pergrad.analysis import decide, rules, sequential, verdict
from pergrad.analysis.runs import fmt, run_dirname

N = bs.MOST_SEEDS
SO = tuple(np.round(np.random.default_rng(0).normal(0.0, 0.01, N), 4))  # a seed's offset
# √ at 64's own per-seed gap to B_ref: open at the 5-seed look (mean 0.008, se 0.011: neither
# within ±0.03 nor beyond it at Pocock's 2.76 / 3.53), within the margin at 15 seeds
E64 = (0.03, -0.02, 0.04, 0.0, -0.01, 0.01, -0.01, 0.005, -0.005, 0.0, 0.01, -0.01, 0.005,
       -0.005, 0.0)
# none at 128, beside its 0.05 below √ (mean |gap| 0.35 vs 0.3): open at the 5-seed look (|t|
# 2.6 < 3.53), a win for √ at 15 seeds
N128 = (0.06, -0.05, -0.02, 0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.02, -0.02, 0.0, 0.01,
        -0.01)


def _offset(b, scaling, x):
  if scaling == "sqrt":
    return 0.3 if b == 128 else 0.0
  return {"linear": 1.0, "none": 0.35}[scaling] if b == 128 else 0.1 * _log2(b)


def _pilot(b, scaling, seed):
  return seed >= 100 or seed < (bs.PILOT if scaling == "sqrt" else bs.CONTRAST_PILOT)


def _added(b, scaling, seed):
  """The pilot and the seeds the follow-up asks for below."""
  return _pilot(b, scaling, seed) or (b, scaling) in {(REF, "sqrt"), (64, "sqrt"),
                                                       (128, "sqrt"), (128, "none")}


def _design_table(keep=_pilot, e64=E64, n128=N128):
  """`_table` on N seeds (margin seeds: margin ±0.03), √ at 64 and none at 128 given their own
  per-seed noise, the runs of `keep(B, scaling, seed)`."""
  t = _table(_offset, seeds=SO, contrast=SO, ref_seeds=SO, margin=(-0.01, 0.0, 0.01))
  for (b, sc), e in (((64, "sqrt"), e64), ((128, "none"), n128)):
    arm = (t[bs.KEY] == b) & (t[bs.SCALING] == sc)
    t.loc[arm, "eval/loss"] += t.loc[arm, bs.SEED].map(dict(enumerate(e)))
  ok = [keep(b, sc, s) for b, sc, s in zip(t[bs.KEY], t[bs.SCALING], t[bs.SEED], strict=True)]
  return t[ok].reset_index(drop=True)


def _follow_up(monkeypatch, table, preset="cpu"):
  monkeypatch.setattr(bs, "aggregate", lambda _: table)
  return bs.follow_up(preset, None)


def _asked(blocks) -> dict:
  return {(b.grid[bs.KEY][0], s): b.grid[bs.SEED] for b in blocks for s in b.grid[bs.SCALING]}


MORE = list(range(bs.PILOT, N))  # 5 ... 14


def test_follow_up_asks_seeds_for_the_open_readings_alone(monkeypatch):
  # √ collapses at 4, 8, 16 and breaks at 128 on the pilot; at 64 it is open: 64's and
  # B_ref's √ get seeds 5-14. At the break √ beats linear (decided: no seeds) and is open
  # against none: both arms to 15 shared seeds (5-14).
  want = {(REF, "sqrt"): MORE, (64, "sqrt"): MORE, (128, "sqrt"): MORE,
          (128, "none"): MORE}
  assert _asked(_follow_up(monkeypatch, _design_table())) == want
  # a function of the pilot: the same whatever added seeds exist (all, or some of them)
  assert _asked(_follow_up(monkeypatch, _design_table(_added))) == want
  some = _design_table(lambda b, sc, s: _pilot(b, sc, s) or (_added(b, sc, s) and s % 3 == 0))
  assert _asked(_follow_up(monkeypatch, some)) == want
  # everything decided on the pilot: no seeds
  decided = _design_table(e64=(0.0,) * N, n128=(0.0,) * N)
  assert _follow_up(monkeypatch, decided) == ()
  # only the open contrast: √ and none at 128, B_ref untouched
  assert _asked(_follow_up(monkeypatch, _design_table(e64=(0.0,) * N))) == {
      (128, "sqrt"): MORE, (128, "none"): MORE}
  assert _follow_up(monkeypatch, _design_table(), preset="ci") == ()


def test_follow_up_waits_for_every_pilot_run_a_reading_needs(monkeypatch):
  t = _design_table()
  for b, sc, s in ((16, "sqrt", 3), (REF, "sqrt", 101), (128, "none", 2)):
    gone = (t[bs.KEY] == b) & (t[bs.SCALING] == sc) & (t[bs.SEED] == s)
    assert _follow_up(monkeypatch, t[~gone]) == (), (b, sc, s)
    running = t.assign(status=np.where(gone, "running", t["status"]))
    assert _follow_up(monkeypatch, running) == (), (b, sc, s)
  gone = (t[bs.KEY] == 16) & (t[bs.SCALING] == "linear")  # not at the break: not needed
  assert _asked(_follow_up(monkeypatch, t[~gone]))[(64, "sqrt")] == MORE


def test_added_seeds_run_on_their_comparisons_budget(tmp_path, monkeypatch):
  """Each added block fixes what its arm's first-stage block fixes (steps, evals, warmup, log
  and checkpoint cadence, B_ref's stats.gns); budget.csv declares an added run's budget from
  the first stage (`budgets.planned`), and the same_budget guard passes on runs that trained
  on the added block's settings."""
  from pergrad.sweep import budgets

  sw = bs.sweep("cpu", needed_runs(tmp_path / "inputs", "cpu"))
  first = {(b.grid[bs.KEY][0], sc): b.fixed for b in sw.blocks if "train.steps" not in b.grid
           for sc in b.grid[bs.SCALING]}
  blocks = _follow_up(monkeypatch, _design_table())
  assert blocks and all(b.fixed == first[(b.grid[bs.KEY][0], b.grid[bs.SCALING][0])]
                        for b in blocks)
  assert next(b for b in blocks if b.grid[bs.KEY] == [REF]).fixed["stats.gns"] is True
  over = tuple(f"{k}={fmt(v)}" for k, v in sw.base.items())
  runs = []
  for bl in blocks:
    pt = bl.points()[-1]  # one added run per arm, recording what its block planned
    steps, warm = bl.fixed["train.steps"], bl.fixed["schedule.warmup_steps"]
    n_params = budgets.declared(budgets.planned(sw, {k: v for k, v in pt.items()
                                                     if k != bs.SEED}, over)).n_params
    d = tmp_path / "sweep" / run_dirname(pt)
    (d / ".hydra").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "status": "completed", "examples_seen": steps * pt[bs.KEY], "last_step": steps,
        "n_params": n_params}))
    (d / ".hydra" / "config.yaml").write_text(f"schedule:\n  warmup_steps: {warm}\n")
    runs.append(d.name)
  fin = pd.DataFrame({"run": runs, "status": "completed"})
  (tmp_path / "out").mkdir()
  budgets.write(sw, tmp_path / "sweep", fin, tmp_path / "out", over)
  g = budget_lib.guard(tmp_path / "out")
  assert g.ok and f"every compared run ({len(blocks)})" in g.why, g.why


# --------------------------------------------------------------------------- error rates

SD, MARGIN, DRAWS = 0.009, 0.03, 20000  # the cpu runs' paired sd; the fallback margin


def _collapse_rule(d_DxN: np.ndarray, des: sequential.Design, m: float) -> np.ndarray:
  """The collapse rule on per-seed gaps (one point a curve), vectorized: at each look, collapses
  when the design's equivalence interval lies within ±m, breaks when its difference interval
  lies beyond ±m; a comparison decided at a look stops there."""
  out = np.full(len(d_DxN), bs.UNDETERMINED, dtype=object)
  open_ = np.ones(len(d_DxN), bool)
  for n, c, e in zip(des.looks, des.crit, des.crit_equiv, strict=True):
    x = d_DxN[:, :n]
    mean, se = x.mean(1), x.std(1, ddof=1) / math.sqrt(n)
    col = open_ & (mean - e * se >= -m) & (mean + e * se <= m)
    brk = open_ & ~col & ((mean - c * se > m) | (mean + c * se < -m))
    out[col], out[brk] = bs.COLLAPSES, bs.BREAKS
    open_ &= ~(col | brk)
  return out


def _module_collapse(d) -> str:
  """The module's reading (`_read` by `verdict.staged`) of the gaps `d` (B_ref at 0)."""
  read = functools.partial(bs._read, m=MARGIN, names=("B_ref", "B"), des=bs.design(bs.PILOT),
                           n=1)
  ref, arm = ({float(s): np.array([v]) for s, v in enumerate(x)} for x in (np.zeros(len(d)), d))
  return verdict.staged(read, ref, arm, bs.PILOT)[1]


def test_a_false_collapse_stays_within_five_percent_over_both_looks():
  des = bs.design(bs.PILOT)
  assert des.looks == (5, 15) and des.spending == "pocock"
  rng = np.random.default_rng(3)
  at_margin = MARGIN + SD * rng.standard_normal((DRAWS, N))
  assert np.mean(_collapse_rule(at_margin, des, MARGIN) == bs.COLLAPSES) <= 0.05
  identical = SD * rng.standard_normal((DRAWS, N))  # and the rule still shows most identical
  assert np.mean(_collapse_rule(identical, des, MARGIN) == bs.COLLAPSES) >= 0.9  # arms equal
  # the module reads as simulated, draw by draw (gaps 0 to 2 margins: every outcome)
  draws = np.concatenate([g + 2 * SD * rng.standard_normal((8, N))
                          for g in (0, 0.015, 0.03, 0.06)])
  assert [_module_collapse(d) for d in draws] == list(_collapse_rule(draws, des, MARGIN))


def test_a_contrast_false_alarm_stays_within_five_percent_over_both_looks():
  des = bs.design(bs.CONTRAST_PILOT)
  assert des.looks == (5, 15)
  sim = sequential.simulate(des, 0.0, SD, MARGIN, draws=DRAWS)
  assert sim[decide.WIN] + sim[decide.LOSS] <= 0.05
  rng = np.random.default_rng(4)  # the module's contrasts read as the design, draw by draw
  for gap in (0.0, 0.02):
    d = gap + 3 * SD * rng.standard_normal(N)
    mis = pd.DataFrame([{bs.SCALING: sc, bs.KEY: 128, bs.SEED: s, "mean_abs_gap": v}
                        for s in range(N) for sc, v in (("sqrt", 0.3), ("none", 0.3 + d[s]))])
    (_, p, _), = bs.contrasts(mis, 128, MARGIN, {"none"})
    first = sequential.read(d[:5], des, MARGIN)
    assert p.outcome == (first[0] if first[1] == 0 else sequential.read(d, des, MARGIN)[0])


# --------------------------------------------------------------------------- end to end


def test_report_reads_each_comparison_at_the_look_its_design_stopped(tmp_path):
  rep, (v, by, pairs, at), col = _run_rule(tmp_path, _design_table(_added))
  cell = lambda sc, b: col[(col[bs.SCALING] == sc) & (col[bs.KEY] == b)].iloc[0]
  assert cell("sqrt", 64)["outcome"] == bs.COLLAPSES and cell("sqrt", 64)["n_seeds"] == N
  assert cell("sqrt", 64)["reading"].startswith("pocock look 2 of 2 (15 seeds)")
  # √ at 128 broke at its first look: it stays read there, though the contrast gave its arm
  # (and 64's reading B_ref's) 15 seeds; √ at 8 has its pilot alone
  assert cell("sqrt", 128)["reading"].startswith("pocock look 1 of 2 (5 seeds)")
  assert cell("sqrt", 128)["outcome"] == bs.BREAKS and cell("sqrt", 8)["n_seeds"] == 5
  assert by["sqrt"] == {bs.COLLAPSES: [4, 8, 16, 64], bs.BREAKS: [128], bs.UNDETERMINED: []}
  assert at == 128 and [(p.outcome, p.n) for p in pairs] == [("win", 5), ("win", N)]
  assert "look 2 of 2" in pairs[1].reading and "look 1 of 2" in pairs[0].reading
  assert v == rep.verdict == rules.REPRODUCED, rep.finding
  assert "pocock look 2 of 2 (15 seeds)" in rep.numbers_md
  assert any("look 2 of 2" in c for c in rep.checks) and str(N) in bs.RULE
  # the pilot alone: 64 and the contrast with none open, the claim partly reproduced
  (tmp_path / "pilot").mkdir()
  rep, (v, by, pairs, _), _ = _run_rule(tmp_path / "pilot", _design_table())
  assert by["sqrt"][bs.UNDETERMINED] == [64] and pairs[1].outcome == decide.NOT_SEPARABLE
  assert v == rules.PARTLY


@pytest.mark.parametrize("n", [1, 3])
def test_an_arm_short_of_the_first_look_stays_undetermined(tmp_path, n):
  rep, (_, by, _, _), col = _run_rule(tmp_path, _design_table(lambda b, sc, s: s < n))
  assert by["sqrt"][bs.UNDETERMINED] == [4, 8, 16, 64, 128]
  assert rep.verdict.startswith("undetermined: not separable")


def test_an_arm_past_the_pilot_without_a_pilot_seed_fails_the_pilot_guard(tmp_path):
  """√ at 64 with added seeds but its pilot seed 3 gone (a failed run): the design's first look
  would read seed 5 among the pilot's; the `pilot` guard names the arm."""
  t = _design_table(_added)
  gone = (t[bs.KEY] == 64) & (t[bs.SCALING] == "sqrt") & (t[bs.SEED] == 3)
  rep, _, _ = _run_rule(tmp_path, t[~gone].reset_index(drop=True))
  assert rep.verdict == "undetermined: pilot", rep.finding
  assert any(g["name"] == "pilot" and "sqrt at B=64" in g["why"] for g in rep.guards)
