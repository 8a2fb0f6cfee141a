"""scripts/reanalyse.py (`experiments.reanalysis`): the committed `ours` parsed back to outcomes,
and (extended) the re-analysis of the committed cpu runs: decided wins stay decided whatever
their power, lr_exponent's fit fails same_budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pergrad.analysis import decide as D

REPO = Path(__file__).resolve().parents[1]


def _script():
  spec = importlib.util.spec_from_file_location("reanalyse", REPO / "scripts" / "reanalyse.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_old_outcomes_and_carried_guards():
  from experiments import reanalysis as R

  old = {"ours": "token saving 61%; ramp vs fixed: win; a vs b: tie", "guards": [
      {"name": "powered", "ok": False, "why": "power 0.2"},
      {"name": "bracketed", "ok": False, "why": "lr at the edge"}]}
  assert R.old_outcomes(old) == {"ramp vs fixed": "win", "a vs b": "tie"}
  assert R.carried("reproduced", old) == "undetermined: bracketed"  # powered no longer gates
  old["guards"] = old["guards"][:1]
  assert R.carried("reproduced", old) == "reproduced"


@pytest.mark.extended  # reads every committed cpu report (~20 s)
def test_reanalysis_of_the_committed_cpu_runs():
  if not (REPO / "results" / "cpu" / "reproduction.json").exists():
    pytest.skip("no committed cpu reproduction")
  rows = {r["where"]: r for r in _script().analyse(REPO / "results" / "cpu")}
  sign = rows["results/cpu/sign_placement"]
  assert sign["old_verdict"] == "undetermined: powered" and sign["new_verdict"] == "reproduced"
  token = next(c for c in sign["comparisons"] if c["comparison"] == "batch vs token")
  assert token["new"] == D.WIN and token["power"] < 0.8  # decided whatever its power
  assert "14 of 74 runs" in rows["results/cpu/lr_exponent"]["note"]
  assert "same_budget" in rows["results/cpu/lr_exponent"]["new_verdict"]
  assert rows["results/cpu/ladder/s/gns_ramp"]["new_verdict"] == "not reproduced"
