"""pergrad.analysis.budget.same_budget reads each run's own record and fails the runs whose
budget differs from the comparison's (lr_search's extension blocks ran 4× the examples)."""

from __future__ import annotations

import json

from pergrad.analysis import budget as B


def run_dir(tmp_path, name, examples, steps, warmup, n_params=1000):
  d = tmp_path / name
  (d / ".hydra").mkdir(parents=True)
  (d / "summary.json").write_text(json.dumps({"status": "completed", "examples_seen": examples,
                                              "last_step": steps, "n_params": n_params}))
  (d / ".hydra" / "config.yaml").write_text(f"schedule:\n  warmup_steps: {warmup}\n")
  return d


def test_same_budget_passes_equal_and_names_each_difference(tmp_path):
  good = run_dir(tmp_path, "a", 12800, 100, 80)
  wrong = run_dir(tmp_path, "b", 51200, 400, 20)
  declared = B.Budget(examples=12800, steps=100, warmup_steps=80, n_params=1000)
  ok = B.same_budget({"a": B.record(good)}, declared)
  assert ok.ok and ok.name == "same_budget"
  bad = B.same_budget({"a": B.record(good), "b": B.record(wrong)}, declared)
  assert not bad.ok
  assert "b: examples 51200, declared 12800" in bad.why and "b: warmup_steps 20" in bad.why
  assert "a:" not in bad.why


def test_a_declared_field_not_recorded_fails_and_undeclared_ones_are_free(tmp_path):
  d = tmp_path / "c"
  d.mkdir()
  rec = B.record(d)
  assert rec == {"examples": None, "steps": None, "warmup_steps": None, "n_params": None}
  g = B.same_budget({"c": rec}, B.Budget(examples=10))
  assert not g.ok and "not recorded" in g.why
  assert B.same_budget({"c": rec}, B.Budget()).ok
  assert not B.same_budget({}, B.Budget()).ok


def test_per_run_budgets_and_finals_rows():
  rows = {"B=4": {"final_step": 3200, "warmup_steps": 640.0},
          "B=128": {"final_step": 400, "warmup_steps": 20.0}}
  recs = {"B=4": B.of_finals(rows["B=4"], 4), "B=128": B.of_finals(rows["B=128"], 128)}
  declared = {"B=4": B.Budget(examples=12800, steps=3200, warmup_steps=640),
              "B=128": B.Budget(examples=12800, steps=100, warmup_steps=20)}
  g = B.same_budget(recs, declared)
  assert not g.ok and "B=128: examples 51200" in g.why and "B=4" not in g.why


def test_a_run_of_an_extension_block_declares_its_first_stage_budget(tmp_path):
  """`budgets.planned`: a run that an lr search's extension block ran (an lr the first-stage
  grid lacks) declares the first-stage block's fixed budget, whatever its own block fixed; the
  table reads each run's record beside it, and the guard names the run that missed it."""
  import pandas as pd

  from pergrad.sweep import Block, LrSearch, Sweep, budgets

  base = {"experiment": "sign_placement", "scale": "cpu"}
  fixed = {"train.steps": 50, "schedule.warmup_steps": 20}
  sw = Sweep(base, tuple(Block({"optimizer.placement": [p], "optimizer.lr": [1e-2, 3e-2],
                                "train.seed": [0]}, fixed=fixed) for p in ("ema", "batch")),
             LrSearch(("optimizer.placement",)))
  point = {"optimizer.placement": "ema", "optimizer.lr": 0.09}  # an extension's lr
  over = budgets.planned(sw, point, ("experiment=sign_placement", "scale=cpu"))
  assert "train.steps=50" in over and "schedule.warmup_steps=20" in over
  want = budgets.declared(over)
  assert (want.steps, want.warmup_steps, want.examples) == (50, 20, 50 * 32) and want.n_params
  names = {"ok": "optimizer.lr=0.01,optimizer.placement=ema,train.seed=0",
           "ext": "optimizer.lr=0.09,optimizer.placement=ema,train.seed=0"}
  run_dir(tmp_path, names["ok"], 50 * 32, 50, 20, want.n_params)
  run_dir(tmp_path, names["ext"], 400 * 32, 400, 20, want.n_params)  # the preset's steps
  fin = pd.DataFrame({"run": list(names.values()), "status": "completed"})
  df = budgets.table(sw, tmp_path, fin, ("experiment=sign_placement", "scale=cpu"))
  assert list(df["declared_steps"]) == [50, 50] and list(df["steps"]) == [50, 400]
  (tmp_path / "out").mkdir()
  budgets.write(sw, tmp_path, fin, tmp_path / "out", ("experiment=sign_placement", "scale=cpu"))
  g = B.guard(tmp_path / "out")
  assert not g.ok and f"{names['ext']}: examples 12800, declared 1600" in g.why
  assert names["ok"] + ":" not in g.why
  assert B.guard(tmp_path / "out", runs=[names["ok"]]).ok


def test_a_report_with_one_run_at_another_budget_reads_undetermined_naming_it(tmp_path):
  """Every report that compares trained runs reads budget.csv through its same_budget guard:
  sign_placement's clear win, one fresh run at 4× the steps -> "undetermined: same_budget",
  naming that run; without budget.csv the budgets are unchecked: undetermined as well."""
  import pandas as pd
  from conftest import as_planned

  from experiments import sign_placement
  from tests.test_reports import group_runs, pad, write

  rows = []
  for p, vals in dict(ema=[4.00, 4.01, 4.02], batch=[4.30, 4.31, 4.29],
                      example=[5.30, 5.31, 5.29], token=[6.10, 6.12, 6.11]).items():
    rows += group_runs({"optimizer.placement": p}, pad(vals), seed0=min(vals))
  for r in rows:
    r["final_step"] = 400
  out = write(tmp_path / "sp", rows, sign_placement.GROUP)
  assert sign_placement.report(out).verdict == "undetermined: same_budget"  # no budget.csv
  as_planned(out)
  assert sign_placement.report(out).verdict == "reproduced"
  df = pd.read_csv(out / "budget.csv")
  wrong = df["run"][df["run"].str.contains("placement=batch,train.seed=2")].iloc[0]
  df.loc[df["run"] == wrong, "steps"] = 1600
  df.to_csv(out / "budget.csv", index=False)
  rep = sign_placement.report(out)
  assert rep.verdict == "undetermined: same_budget" and rep.rule_verdict == "reproduced"
  assert f"{wrong}: steps 1600, declared 400" in rep.guards_text()


def test_a_variable_batch_run_may_end_past_its_budget_by_less_than_a_batch():
  """A ramp ends at the first update that reaches E (`pergrad.train.batch_schedule`): its
  comparison declares E + up to B_max − 1 examples, and the guard names the overshoot it
  admitted; a shortfall, a larger overshoot, or any overshoot of a fixed-B run fails."""
  from pergrad.sweep import budgets

  over = ("experiment=gns_ramp", "scale=cpu")
  fixed = budgets.declared((*over, "batch.kind=fixed"))
  ramp = budgets.declared((*over, "batch.kind=linear", "batch.ramp_tokens=819200"))
  assert fixed.examples_over == 0 and fixed.steps is not None
  assert ramp.examples == fixed.examples and ramp.steps is None
  b_max = ramp.examples_over + 1
  assert ramp.examples == b_max * fixed.steps
  rec = lambda e: {"examples": e, "steps": 7, "warmup_steps": ramp.warmup_steps,
                   "n_params": ramp.n_params}
  E = ramp.examples
  g = B.same_budget({"r1": rec(E + b_max // 2), "r2": rec(E)}, ramp)
  assert g.ok and "1 variable-batch run(s)" in g.why and f"≤ {b_max // 2} examples" in g.why
  assert B.same_budget({"r": rec(E + b_max - 1)}, ramp).ok
  for e in (E + b_max, E - 1):
    g = B.same_budget({"r": rec(e)}, ramp)
    assert not g.ok and f"r: examples {e}, declared {E} (+ at most {b_max - 1})" in g.why
  g = B.same_budget({"f": {**rec(E + 1), "steps": fixed.steps}}, fixed)
  assert not g.ok and f"f: examples {E + 1}, declared {E}" in g.why
