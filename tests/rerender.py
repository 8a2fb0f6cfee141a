"""Re-renders every committed report under results/ from its committed CSVs (each experiment's
`report` and README template with its committed run_info.json; the claims block and index) and
names the files whose bytes differ. `python tests/rerender.py` prints them; the test asserts
none."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def report_dirs(root: Path = REPO / "results") -> list[Path]:
  return sorted(p.parent for p in root.rglob("report.json"))


def rerender(d: Path, tmp: Path) -> list[str]:
  """The files of `d` (README.md, report.json) whose re-render differs."""
  from pergrad.sweep import record, report_md

  info = json.loads((d / "run_info.json").read_text())
  exp = record.get(info["experiment"])
  out = tmp / d.relative_to(REPO)  # the whole results/ tree is there (`differing`)
  rep = exp.report(out)
  runs = record.Inputs(REPO / "runs" / "sweeps", info["preset"], ())
  needs = bool(exp.needs) and not all(runs.sweep_dir(n).is_dir() for n in exp.needs)
  inputs = record.Inputs(runs.root, runs.preset, (), dry_run=needs)  # no runs: placeholder lrs
  report_md.write_readme(exp, out, rep, info, inputs)
  return [str((d / f).relative_to(REPO)) for f in ("README.md", "report.json")
          if (d / f).read_bytes() != (out / f).read_bytes()]


def differing(keep: Path | None = None) -> list[str]:
  """The committed files that re-render otherwise; `keep`: a folder to hold the renders."""
  from pergrad.sweep import report_md

  bad = []
  with tempfile.TemporaryDirectory() as t:
    shutil.copytree(REPO / "results", Path(t) / "results")  # a report reads its neighbours
    for d in report_dirs():
      bad += rerender(d, Path(t))
    if keep is not None:
      shutil.copytree(Path(t) / "results", keep, dirs_exist_ok=True)
    copy = Path(t) / "README.md"
    copy.write_text((REPO / "README.md").read_text())
    if report_md.render_readme(copy, REPO / "results" / "cpu", "results/cpu/"):
      bad.append("README.md")
  if (REPO / "results/cpu/README.md").read_text() != report_md.index_text(
      REPO / "results" / "cpu", "cpu"):
    bad.append("results/cpu/README.md")
  return bad


if __name__ == "__main__":
  print("\n".join(differing(Path(sys.argv[1]) if sys.argv[1:] else None))
        or "all byte-identical")
