"""The claims are generated, the experiment configs say everything, claim 4's rule.

- README.md's claims block and results/cpu/README.md are what the committed
  results/cpu/*/report.json render (`experiments.report_md`), so numbers cannot drift from data;
  the same functions render constructed reports as expected.
- Experiment configs set only what differs from the defaults (a default is repeated only
  where its comment says an experiment sweeps or reads it).
- `experiments.batch_scaling`: its plan (examples and steps per B, wall estimate) and its
  rule on constructed curves (collapse, break, √ against linear and none).
No JAX training here; the README render computes the parameter count with jax.eval_shape.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import compose
from omegaconf import OmegaConf
from test_record import needed_runs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import batch_scaling as bs  # noqa: E402
from experiments import lr_search, report_md, runner, runs  # noqa: E402
from experiments.record import Experiment, Report  # noqa: E402
from experiments.sweep import run_dirname  # noqa: E402

# --------------------------------------------------------------------------- claims


def test_readme_claims_block_is_rendered_from_committed_reports():
  got = report_md.readme_block(REPO / "README.md")
  want = report_md.claims_block(REPO / "results" / "cpu", "results/cpu/")
  assert got == want, ("README.md's claims block differs from what results/cpu/*/report.json "
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


def test_claims_table_renders_constructed_reports(tmp_path):
  root = tmp_path / "results"
  _report(root, "overhead", verdict="reproduced", finding="long text", claim_row="ratio 1.234")
  _report(root, "sign_placement", verdict="partly reproduced", finding="ema 4.5 < batch 4.6")
  (root / "sign_placement" / "curves.png").write_bytes(b"")
  (root / "sign_placement" / "best.csv").write_text("optimizer.placement,n_seeds\nema,3\n"
                                                    "batch,2\n")
  table = report_md.claims_table(root, "results/")
  rows = table.splitlines()
  assert rows[0] == "| Claim | What we measured | Figures | Verdict |"
  assert len(rows) == 2 + len(report_md.claim_rows())
  assert "`overhead`: ratio 1.234" in rows[2] and "long text" not in rows[2]  # claim_row first
  assert "overhead: **reproduced**" in rows[2]
  assert "`sign_placement`: ema 4.5 < batch 4.6" in rows[3]  # no claim_row: the finding
  assert "[curves.png](results/sign_placement/curves.png)" in rows[3]
  assert "`snr`: not yet run" in rows[3] and "snr: not yet run" in rows[3]
  assert "batch_scaling: not yet run" in rows[5]
  # Every number of the table is one of the reports' (or a claim's own numbering).
  nums = set(re.findall(r"\d+\.\d+", table))
  assert nums == {"1.234", "4.5", "4.6"}
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
  rep = Report(verdict="reproduced", finding="f", claim_row="r", rule="A beats B.",
               numbers_md="n")
  report_md.write_readme(exp, tmp_path, rep, info)
  assert "**Rule.** A beats B." in (tmp_path / "README.md").read_text()
  assert json.loads((tmp_path / "report.json").read_text())["rule"] == "A beats B."
  report_md.write_readme(exp, tmp_path, dataclasses.replace(rep, rule=""), info)
  assert "**Rule.**" not in (tmp_path / "README.md").read_text()


# --------------------------------------------------------------------------- configs

TRAINING = [n for n in runner.EXPERIMENTS if runner.load(n).sweep is not None]
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


# --------------------------------------------------------------------------- claim 4: plan


def test_batch_scaling_plan_gives_large_batches_enough_steps(tmp_path):
  p = bs.plan("cpu")
  assert p.ref == 32 and min(p.sizes) == 8 and max(p.sizes) == 256 and len(p.seeds) >= 3
  assert p.scalings == ("sqrt", "linear", "none")
  assert p.examples == 25_600 and p.steps(256) >= 100 and p.steps(8) == 3_200
  assert all(p.eval_examples % b == 0 for b in p.sizes)  # same eval points for every B
  inputs = needed_runs(tmp_path, "cpu")
  sw = bs.sweep("cpu", inputs)
  assert sw.wall_estimate_min == round(bs.wall_estimate_min(p)) <= 60
  pts = [pt for b in sw.blocks for pt in b.points()]
  assert len(pts) == sum(p.runs(b) for b in p.sizes) == 39
  assert [pt[bs.SCALING] for pt in pts if pt[bs.KEY] == p.ref] == ["sqrt"] * len(p.seeds)
  for b in sw.blocks:
    size = b.grid[bs.KEY][0]
    assert b.fixed["train.steps"] * size == p.examples
    assert b.fixed["train.eval_every"] * size == p.eval_examples
  cfg = compose(["experiment=batch_scaling", "scale=cpu"])
  assert cfg.optimizer.lr == 3e-2 and cfg.optimizer.weight_decay == 0.0
  # At cpu the sweep runs at the lr Adam's own search chose, from the preconditioner runs.
  assert sw.base["optimizer.lr"] == lr_search.tuned_lr(
      inputs, "preconditioner", {"optimizer.variant": "adam", "optimizer.clip_norm": None})
  ci = bs.sweep("ci")
  assert len({run_dirname(pt) for b in ci.blocks for pt in b.points()}) <= 4


# --------------------------------------------------------------------------- claim 4: rule

SEED_OFFSETS = (-0.01, 0.0, 0.01)  # std 0.01 per group; combined noise 0.0141


def _table(offset, seeds=SEED_OFFSETS, diverge=()):
  """An `aggregate`-like table of eval curves: loss(x) = 4 + 3 exp(-x / 5000) +
  offset(b, scaling, x) + a seed offset; runs in `diverge` stop at 10,000 examples."""
  p = bs.plan("cpu")
  rows = []
  for b in p.sizes:
    for scaling in (("sqrt",) if b == p.ref else p.scalings):
      for seed, so in enumerate(seeds):
        name = run_dirname({bs.KEY: b, bs.REF: p.ref, bs.SCALING: scaling, bs.SEED: seed})
        bad = (b, scaling) in diverge
        for k in range(0, p.steps(b) + 1, p.eval_examples // b):
          x = k * b
          if bad and x > 10_000:
            break
          loss = 4 + 3 * math.exp(-x / 5000) + offset(b, scaling, x) + so
          rows.append({"run": name, "status": "diverged" if bad else "completed",
                       bs.KEY: b, bs.REF: p.ref, bs.SCALING: scaling, bs.SEED: seed,
                       "step": k, "eval/loss": loss, "train/loss": loss, "train/lr": 3e-2})
        if bad:
          rows.append({**rows[-1], "eval/loss": np.nan, "train/loss": math.inf})
  return pd.DataFrame(rows)


def _run_rule(tmp_path, table):
  bs.analyze(table, runs.finals(table), tmp_path)
  col = pd.read_csv(tmp_path / "collapse.csv")
  return bs.report(tmp_path), bs.judge(col, pd.read_csv(tmp_path / "mismatch.csv")), col


def _log2(b):
  return abs(math.log2(b / 32))


def test_rule_collapse_then_break_and_sqrt_wins(tmp_path):
  def offset(b, scaling, x):
    if scaling == "sqrt":
      return {128: 0.1, 256: 0.3}.get(b, 0.0)
    return (0.1 if scaling == "linear" else 0.08) * _log2(b)

  rep, j, col = _run_rule(tmp_path, _table(offset, diverge={(256, "linear")}))
  assert j["scalings"]["sqrt"] == {"collapsed": [8, 64], "not_collapsed": [128, 256],
                                   "undetermined": [], "break": 128}
  assert j["scalings"]["linear"]["break"] == 8 and j["scalings"]["none"]["break"] == 8
  assert j["at"] == 128 and [p.outcome for p in j["pairs"]] == ["win", "win"]
  assert rep.verdict == "reproduced" and rep.rule == bs.RULE
  assert "breaks at B = 128" in rep.claim_row and "25,600 examples" in rep.finding
  assert "B=8: 3200" in rep.finding and "B=256: 100" in rep.finding
  lin256 = col[(col[bs.SCALING] == "linear") & (col[bs.KEY] == 256)].iloc[0]
  assert lin256["n_diverged"] == 3 and not lin256["collapsed"]
  assert bs.figures(tmp_path)[0].exists()


def test_rule_counts_ninety_percent_of_second_half_points(tmp_path):
  # sqrt at B = 64 leaves the noise at the last n of the 13 second-half eval points.
  def offset_for(n):
    def offset(b, scaling, x):
      if b == 64 and scaling == "sqrt" and x > 25_600 - n * 1_024:
        return 0.05
      return 0.0 if scaling == "sqrt" and b < 128 else 0.2
    return offset

  for n, collapsed in ((1, True), (2, False)):
    _, j, col = _run_rule(tmp_path, _table(offset_for(n)))
    frac = col[(col[bs.SCALING] == "sqrt") & (col[bs.KEY] == 64)]["frac_within"].iloc[0]
    assert frac == pytest.approx(1 - n / 13)
    assert (64 in j["scalings"]["sqrt"]["collapsed"]) is collapsed


def test_rule_linear_beating_sqrt_at_the_break_is_not_reproduced(tmp_path):
  def offset(b, scaling, x):
    if scaling == "sqrt":
      return 0.3 if b >= 128 else 0.0
    return 0.0 if scaling == "linear" and b == 128 else 0.5

  rep, j, _ = _run_rule(tmp_path, _table(offset))
  assert j["scalings"]["sqrt"]["break"] == 128 and j["scalings"]["linear"]["collapsed"] == [128]
  assert [p.outcome for p in j["pairs"]] == ["loss", "win"]
  assert rep.verdict == "not reproduced"


def test_rule_without_break_or_seeds(tmp_path):
  def same(b, scaling, x):
    return 0.0 if scaling == "sqrt" else 0.1 * _log2(b)

  rep, j, _ = _run_rule(tmp_path, _table(same))
  assert j["scalings"]["sqrt"]["break"] is None and j["at"] == 256
  assert rep.verdict == "partly reproduced"  # collapses everywhere: no break seen
  rep, j, _ = _run_rule(tmp_path, _table(same, seeds=(0.0,)))
  assert rep.verdict == "undetermined"  # one seed: the noise is unknown
  assert j["scalings"]["sqrt"]["undetermined"] == [8, 64, 128, 256]
