"""scripts/reanalyse.py: the claim-level readings over the new rules' comparisons, and (extended)
the re-analysis of the committed cpu runs: decided wins stay decided whatever their power,
lr_exponent's fit fails same_budget."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from pergrad.analysis import decide as D
from pergrad.analysis import timing as T

REPO = Path(__file__).resolve().parents[1]


def _script():
  spec = importlib.util.spec_from_file_location("reanalyse", REPO / "scripts" / "reanalyse.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _p(outcome, a="a", b="b"):
  p = D.compare({0: 0.0, 1: 0.1}, {0: 1.0, 1: 1.2}, (a, b), effect=0.1)
  return dataclasses.replace(p, outcome=outcome)


def test_pairs_verdict_and_median_verdict():
  r = _script()
  assert r.pairs_verdict([_p(D.WIN), _p(D.WIN)]) == r.REPRODUCED
  assert r.pairs_verdict([_p(D.WIN), _p(D.NOT_SEPARABLE)]) == r.PARTLY
  assert r.pairs_verdict([_p(D.WIN), _p(D.LOSS)]) == r.NOT_REPRODUCED
  assert r.pairs_verdict([_p(D.EQUIVALENT), _p(D.EQUIVALENT)]) == r.NOT_REPRODUCED
  assert r.pairs_verdict([_p(D.EQUIVALENT), _p(D.NOT_SEPARABLE, "x", "y")]) == (
      "undetermined: not separable (x vs y)")
  assert r.median_verdict([T.HOLDS, T.HOLDS, T.FAILS]) == T.HOLDS
  assert r.median_verdict([T.HOLDS, T.FAILS]) == T.UNDETERMINED
  assert r.median_verdict([]) == T.UNDETERMINED


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
