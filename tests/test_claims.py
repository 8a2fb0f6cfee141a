"""The claims are generated, and the experiment configs say everything.

- README.md's claims block and results/cpu/README.md are what the committed
  results/cpu/*/report.json render (`pergrad.sweep.report_md`), so numbers cannot drift from data;
  the same functions render constructed reports as expected.
- Experiment configs set only what differs from the defaults (a default is repeated only
  where its comment says an experiment sweeps or reads it).
No JAX training here; the README render computes the parameter count with jax.eval_shape.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import pytest
from conftest import compose
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pergrad.sweep import record, report_md  # noqa: E402
from pergrad.sweep.record import Experiment, Report  # noqa: E402

# --------------------------------------------------------------------------- claims


def test_readme_claims_block_is_rendered_from_committed_reports(tmp_path):
  """README.md is what `python scripts/reproduce.py --render-readme` leaves: rendering its
  claims block again from results/cpu/*/report.json changes nothing."""
  copy = tmp_path / "README.md"
  copy.write_text((REPO / "README.md").read_text())
  changed = report_md.render_readme(copy, REPO / "results" / "cpu", "results/cpu/")
  assert not changed, ("README.md's claims block differs from what results/cpu/*/report.json "
                       "render; run `python scripts/reproduce.py --render-readme`.")


def test_results_index_is_rendered_from_committed_reports():
  got = (REPO / "results" / "cpu" / "README.md").read_text()
  assert got == report_md.index_text(REPO / "results" / "cpu", "cpu"), (
      "results/cpu/README.md differs from what results/cpu/*/report.json render; run "
      "`python scripts/reproduce.py --render-readme` after `write_index`, or any "
      "`reproduce.py EXPERIMENT --analyze-only`.")


def _report(root: Path, name: str, **doc) -> None:
  (root / name).mkdir(parents=True, exist_ok=True)
  (root / name / "report.json").write_text(json.dumps(doc))


def test_one_row_per_claim_then_ours_each_cell_one_line():
  """The committed table: C1-G3 once each, in order, decided by the paper's own test, then our
  comparisons (labelled "ours"); the claim, paper and ours cells fit one line."""
  rows = report_md.claims_table(REPO / "results" / "cpu").splitlines()[2:]
  claims = [r.split(" | ")[0].lstrip("| ") for r in rows]
  assert [c.split(".")[0] for c in claims[:7]] == ["C1", "C2", "C3", "C4", "G1", "G2", "G3"]
  assert all("ours" in c.lower() for c in claims[7:]) and len(claims) == len(set(claims))
  assert sorted(n for names in report_md.claim_rows().values() for n in names) == sorted(
      record.builtin())
  for r in rows:
    cells = r.split(" | ")
    assert all(len(c) <= report_md.CELL + 2 for c in (cells[0], cells[2], cells[3])), cells


def test_claims_table_renders_constructed_reports(tmp_path):
  root = tmp_path / "results"
  cal = {"kind": "pair", "noise": 0.01, "n": 3, "effect": 0.05, "false_alarm": 0.034,
         "power": 0.991, "source": "measured"}
  from experiments import overhead, sign_placement
  _report(root, "overhead", verdict="reproduced", ours="ratio 1.234", paper="≈ 1.17",
          checks=["long text"], calibration=cal, commit="abc", rule=overhead.RULE, guards=[])
  _report(root, "sign_placement", verdict="partly reproduced", ours="ema 4.5 < batch 4.6",
          commit="abc", rule=sign_placement.RULE, guards=[])
  (root / "sign_placement" / "curves.png").write_bytes(b"")
  (root / "sign_placement" / "best.csv").write_text("optimizer.placement,n_seeds\nema,3\n"
                                                    "batch,2\n")
  table = report_md.claims_table(root, "results/")
  rows = table.splitlines()
  assert rows[0] == ("| Claim | Experiment | Paper | Ours | Verdict | False alarm | Power "
                     "| Figures |")
  assert len(rows) == 2 + sum(len(v) for v in report_md.claim_rows().values())
  row = next(r for r in rows if "`overhead`" in r)
  assert "| ≈ 1.17 | ratio 1.234 | **reproduced** | 0.03 | 0.99 |" in row
  assert "long text" not in row and "(results/overhead/README.md)" in row  # reasoning: its README
  row = next(r for r in rows if "`sign_placement`" in r)
  assert "| — | ema 4.5 < batch 4.6 | **partly reproduced** | — | — |" in row  # no calibration
  assert "[curves.png](results/sign_placement/curves.png)" in row
  assert "| `snr` | | not yet run | not yet run |" in table
  _report(tmp_path / "old", "snr", verdict="reproduced", ours="x", commit="abc", rule="older")
  assert report_md.OLD_RULE in report_md.claims_table(tmp_path / "old")  # marked, not hidden
  _report(tmp_path / "unguarded", "overhead", verdict="reproduced", ours="x", commit="abc",
          rule=overhead.RULE)  # written before the validity guards
  assert report_md.NO_GUARDS in report_md.claims_table(tmp_path / "unguarded")
  long = "; ".join(f"arm_{i} vs fixed_8: tie" for i in range(12))  # ~280 characters
  _report(tmp_path / "long", "snr", verdict="x", ours=long, commit="abc", guards=[])
  cell = report_md.claims_table(tmp_path / "long").split("`snr`")[1].split(" | ")[2]
  assert len(cell) <= report_md.CELL + 2 and cell.endswith("tie …")
  # Every number of the table is one of the reports' (or a claim's own numbering).
  nums = set(re.findall(r"\d+\.\d+", table))
  assert nums == {"1.234", "1.17", "4.5", "4.6", "0.03", "0.99"}
  # The README's block: setup paragraph (from configs and the CSVs) + the table.
  readme = tmp_path / "README.md"
  readme.write_text(f"# x\n\nbefore\n\n{report_md.README_BEGIN}\nold, hand-typed 9.99\n"
                    f"{report_md.README_END}\n\nafter\n")
  assert report_md.render_readme(readme, root, "results/")
  text = readme.read_text()
  assert "9.99" not in text and text.startswith("# x\n\nbefore\n\n") and text.endswith(
      "\n\nafter\n")
  block = report_md.readme_block(readme)
  assert block.endswith(table) and "sign_placement 2-3" in block
  cfg = compose(["scale=cpu"])
  assert (f"B = {cfg.data.batch_size} sequences of T = {cfg.data.seq_len} tokens, "
          f"{cfg.train.steps} steps") in block
  assert not report_md.render_readme(readme, root, "results/")  # idempotent
  readme.write_text("no markers\n")
  with pytest.raises(ValueError, match="claims:begin"):
    report_md.render_readme(readme, root)


def test_readme_shows_the_rule(tmp_path):
  exp = Experiment("x", "t", "c", "row", analyze=print, figures=print, report=print,
                   launch=print, describe_setup=lambda preset: "setup")
  info = {"launch_wall_s": 60.0, "preset": "ci", "command": "cmd", "launcher": "basic",
          "sweep_dir": "s", "n_runs_completed": 1, "runs_compute_s": 1.0, "wall_s": 1.0,
          "launched": 1, "skipped": 0, "commit": "abc", "clean": True}
  rep = Report(verdict="reproduced", ours="r", rule="A beats B.", numbers_md="n")
  report_md.write_readme(exp, tmp_path, rep, info)
  assert "**Rule.** A beats B." in (tmp_path / "README.md").read_text()
  assert json.loads((tmp_path / "report.json").read_text())["rule"] == "A beats B."
  report_md.write_readme(exp, tmp_path, dataclasses.replace(rep, rule=""), info)
  assert "**Rule.**" not in (tmp_path / "README.md").read_text()


# --------------------------------------------------------------------------- configs

TRAINING = [n for n in record.builtin() if record.get(n).sweep is not None]
CONFIGS = [*TRAINING, "overhead", "quickstart"]


def _plain(v):
  return getattr(v, "value", v)


@pytest.mark.parametrize("name", CONFIGS)
def test_experiment_config_sets_only_what_differs(name):
  """An experiment config chooses its optimizer and sets only the optimizer and schedule
  values that differ from that optimizer's defaults (a swept value, or one an experiment
  module reads from the file, may repeat a default: its comment says "swept" or "reads
  it"); what the file says is what Hydra composes (nothing later overrides it)."""
  path = REPO / "configs" / "experiment" / f"{name}.yaml"
  text = path.read_text()
  doc = OmegaConf.to_container(OmegaConf.load(path))
  overrides = [d for d in doc.get("defaults", []) if isinstance(d, dict)]
  opt = next((d["override /optimizer"] for d in overrides if "override /optimizer" in d), None)
  assert opt, f"{path.name}: choose the optimizer (`- override /optimizer: NAME`)"
  cfg = compose([f"experiment={name}", "scale=cpu"])
  base = compose([f"optimizer={opt}", "scale=cpu"])
  assert _plain(cfg.optimizer.name) == opt
  for part in ("optimizer", "schedule"):
    for k, v in (doc.get(part) or {}).items():
      got = _plain(cfg[part][k])
      assert got == v or (isinstance(v, float) and math.isclose(got, v)), (name, part, k, got, v)
      line = next(ln for ln in text.splitlines() if ln.strip().startswith(f"{k}:"))
      assert _plain(base[part][k]) != got or "reads it" in line or "swept" in line, \
          f"{path.name} repeats the default {part}.{k}={got}; remove it"


def test_seeds_of_a_search_without_fresh_seeds_are_its_selection_seeds(tmp_path):
  """The README's "Seeds behind the reported numbers": lr_exponent's numbers are its selection
  seeds' (best.csv: 0 fresh seeds), which read "0" before."""
  import pandas as pd

  d = tmp_path / "lr_exponent"
  d.mkdir()
  pd.DataFrame({"n_seeds": [0, 0]}).to_csv(d / "best.csv", index=False)
  pd.DataFrame({"train.seed": [0, 1, 0, 1]}).to_csv(d / "finals.csv", index=False)
  assert report_md._seeds(d) == "2"
  pd.DataFrame({"n_seeds": [5, 10]}).to_csv(d / "best.csv", index=False)
  assert report_md._seeds(d) == "5-10"
