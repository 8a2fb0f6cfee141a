"""Every committed report re-renders byte-identical from the committed results/ alone
(`rerender`: the CSVs, each report's run_info.json with the setup its live sweeps gave, the
neighbouring reports a report reads), the README's claims block and the results index too; the
reports of one results tree carry one analysis commit (`report_commits`)."""

from __future__ import annotations

import json

import pytest
from rerender import REPO, differing


@pytest.mark.extended
def test_every_committed_report_rerenders_byte_identical():
  assert differing() == []


def one_commit(root) -> list[str]:
  """[] when every report.json under `root` (the ladder's rungs included) records the same
  analysis commit, else one line per commit naming its reports."""
  from pergrad.sweep.record import report_commits

  at = report_commits(root)
  return [] if len(at) == 1 else [f"{c}: {v}" for c, v in at.items()]


def _tree(root, commits: dict) -> None:
  for rel, c in commits.items():
    (root / rel).mkdir(parents=True)
    (root / rel / "report.json").write_text(json.dumps({"verdict": "x", "commit": c}))


def test_two_commits_under_one_results_tree_are_named(tmp_path):
  _tree(tmp_path / "one", {"a": "c1", "ladder": "c1", "ladder/s/g": "c1"})
  assert one_commit(tmp_path / "one") == []
  _tree(tmp_path / "two", {"a": "c1", "ladder": "c1", "ladder/s/g": "c0", "b": None})
  bad = one_commit(tmp_path / "two")
  assert set(bad) == {"c1: ['a', 'ladder']", "c0: ['ladder/s/g']", "none: ['b']"}


def test_the_committed_tree_says_where_its_reports_differ():
  """The committed results/ predate the rule; where their reports carry several commits, the
  index says so, naming them (one commit once regenerated at one)."""
  from pergrad.sweep.record import report_commits

  root = REPO / "results" / "cpu"
  text = (root / "README.md").read_text()
  at = report_commits(root)
  assert (len(at) == 1) == ("analysis commits, not one" not in text)
  for c, dirs in at.items():
    if len(dirs) < 4:
      assert all(d in text for d in dirs) and f"`{c[:7]}`" in text


@pytest.mark.extended
def test_a_generated_tree_carries_one_analysis_commit(ci_sweeps):
  """Every report the ci reproduction writes (both streams, at this checkout) records one
  commit."""
  assert len(list(ci_sweeps["root"].rglob("report.json"))) > 5
  assert one_commit(ci_sweeps["root"]) == []
