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
