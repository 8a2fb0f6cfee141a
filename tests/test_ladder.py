"""The scale ladder's design (`experiments.ladder`): rungs at the same tokens per parameter
(the largest the scale's own model), each claim's quantity read from result CSVs, and one
figure per claim with the paper's value."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import ladder  # noqa: E402
from pergrad.analysis import n_params  # noqa: E402

CPU = REPO / "results" / "cpu"


def test_rungs_share_tokens_per_parameter_and_end_at_tiny():
  p = ladder.plan("cpu")
  assert list(p["rung"]) == ["xs", "s", "tiny"] and p["n_params"].is_monotonic_increasing
  assert p["n_params"].iloc[-1] == n_params(["scale=cpu"])  # the largest: today's tiny
  tpp = ladder.TOKENS_PER_PARAM
  assert p["tokens_per_param"].between(tpp, tpp * 1.01).all()
  assert p["n_params"].iloc[-1] / p["n_params"].iloc[0] > 10  # a ladder, not a step


def test_quantities_read_from_the_committed_csvs():
  assert ladder.quantity("moments", CPU / "moments") == pytest.approx(0.331, abs=0.001)
  assert ladder.quantity("gns_layers", CPU / "gns_layers") == pytest.approx(0.888, abs=0.001)
  assert math.isnan(ladder.quantity("gns_ramp", CPU / "gns_ramp"))  # not run yet
  with pytest.raises(ValueError, match="no quantity"):
    ladder.quantity("snr", CPU / "snr")


def test_one_figure_per_claim(tmp_path):
  points = pd.DataFrame([{"claim": c, "rung": r, "n_params": n, "value": v,
                          "paper": ladder.PAPER[c]}
                         for c in ladder.PAPER for r, n, v in (("xs", 4e4, 0.2), ("s", 1.6e5, 0.3),
                                                               ("tiny", 6.6e5, 0.4))])
  paths = ladder.figures(points, tmp_path)
  assert sorted(p.name for p in paths) == sorted(f"ladder_{c}.png" for c in ladder.PAPER)
  assert all(p.stat().st_size > 0 for p in paths)
  got = ladder.collect({"tiny": CPU}, {"tiny": 664_832})
  assert set(got["claim"]) == set(ladder.PAPER) and len(got) == 4
