"""One experiment record (`pergrad.sweep.record`): the README's recipe "An experiment" followed
from outside the package (a plugin module run by `scripts/reproduce.py`), dependencies
re-derived from the needed experiment's runs, provenance and per-invocation costs, and
the import surface of `experiments` (`pergrad.analysis`)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import runner  # noqa: E402
from pergrad.analysis.runs import run_dirname  # noqa: E402
from pergrad.registry import Registry  # noqa: E402
from pergrad.sweep import (  # noqa: E402
  LaunchLog,
  record,
  report_md,
  sweep_dir,
)
from pergrad.sweep.record import Experiment, Inputs, Report  # noqa: E402

PLUGIN = textwrap.dedent('''\
    """A toy experiment: one ci-sized run, its final eval loss."""
    from pathlib import Path

    import pandas as pd

    from pergrad.sweep.record import Experiment, Report, register
    from pergrad.sweep import Block, Sweep


    def sweep(preset):
      base = {"scale": preset, "train.steps": 4, "train.eval_every": 2,
              "train.checkpoint_every": 4, "logging.log_every": 2}
      return Sweep(base, (Block({"train.seed": [0]}),))


    def analyze(runs, out_dir):
      runs.finals.to_csv(Path(out_dir) / "finals.csv", index=False)


    def figures(out_dir):
      return []


    def report(out_dir):
      loss = float(pd.read_csv(Path(out_dir) / "finals.csv")["final_eval_loss"].iloc[0])
      return Report(verdict="measured", ours=f"final eval loss {loss:.3f}",
                    rule="none: a toy")


    EXPERIMENT = register(Experiment(
        name="toy", title="a toy", claim="a run trains", row="T. A toy row", sweep=sweep,
        analyze=analyze, figures=figures, report=report))
''')


@pytest.fixture()
def registry(monkeypatch):
  """The registry as a copy for one test: what it registers is gone afterwards."""
  record.experiments()
  copy = Registry("experiment", hint=record._REGISTRY.hint)
  for name, exp in record._REGISTRY.items():
    copy.register(name, exp)
  monkeypatch.setattr(record, "_REGISTRY", copy)


def _reproduce():
  spec = importlib.util.spec_from_file_location("reproduce", REPO / "scripts" / "reproduce.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_plugin_experiment_runs_through_reproduce(tmp_path, registry, compilation_cache,
                                                  monkeypatch):
  for k, v in compilation_cache.items():
    monkeypatch.setenv(k, v)
  plugin = tmp_path / "toy_experiment.py"
  plugin.write_text(PLUGIN)
  root = tmp_path / "sweeps"
  rc = _reproduce().main(["toy", "--preset", "ci", "--plugin", str(plugin),
                          "--sweeps-root", str(root)])
  assert rc == 0
  out = root / "toy" / "ci" / "report"
  doc = json.loads((out / "report.json").read_text())
  assert doc["verdict"] == "measured" and doc["ours"].startswith("final eval loss")
  assert set(doc) >= {"commit", "clean"}
  assert "# toy: a toy" in (out / "README.md").read_text()
  assert "toy" in record.experiments() and "T. A toy row" in report_md.claim_rows()


def test_unknown_experiment_names_the_plugin_option(registry):
  with pytest.raises(ValueError, match="--plugin"):
    record.get("nope")
  with pytest.raises(ValueError, match="exactly one of sweep"):
    Experiment("x", "t", "c", "r", analyze=print, figures=print, report=print)
  with pytest.raises(ValueError, match="another name"):
    record.register(Experiment("snr", "t", "c", "r", analyze=print, figures=print,
                               report=print, sweep=print))


def test_needed_experiments_run_first():
  assert record.in_order(("snr", "sign_placement", "overhead")) == (
      "sign_placement", "snr", "overhead")
  assert record.in_order(("moments",)) == ("moments",)  # not named: not added
  names = record.in_order(record.builtin())
  for n in names:
    assert all(names.index(d) < names.index(n) for d in record.get(n).needs)


# --------------------------------------------------------------------------- dependencies


def fake_runs(root: Path, name: str, preset: str, losses: dict) -> Path:
  """Completed runs of `name` at `preset` under `root`: {point (dict items): final loss}."""
  d = sweep_dir(root, name, preset)
  for point, loss in losses.items():
    rd = d / run_dirname(dict(point))
    rd.mkdir(parents=True)
    recs = [{"step": 1, "split": s, "loss": loss} for s in ("train", "eval")]
    (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (rd / "summary.json").write_text(json.dumps({"status": "completed"}))
  return d


def needed_runs(root: Path, preset: str) -> Inputs:
  """Runs of the searches the experiments that need them read (preconditioner's Adam: best
  lr 0.03, its MicroAdamMSQ: ε 1e-4 at lr 0.01; sign_placement: ema 0.003, batch and
  example 0.01), as `Inputs`."""
  adam = {"optimizer.variant": "adam", "optimizer.clip_norm": None, "optimizer.eps": 1e-8}
  msq = {"optimizer.variant": "micro_adam_msq", "optimizer.clip_norm": None,
         "optimizer.eps": 1e-4}
  fake_runs(root, "preconditioner", preset, {
      tuple({**g, "optimizer.lr": lr, "train.seed": s}.items()): loss
      for g, lr, s, loss in ((adam, 0.01, 0, 4.2), (adam, 0.03, 0, 4.0), (adam, 0.1, 0, 4.5),
                             (adam, 0.03, 1, 4.01), (msq, 0.003, 0, 4.2), (msq, 0.01, 0, 4.0),
                             (msq, 0.01, 1, 4.05))})
  fake_runs(root, "sign_placement", preset, {
      (("optimizer.placement", p), ("optimizer.lr", lr), ("train.seed", 0)):
      4.0 + (lr != best) for p, best in (("ema", 3e-3), ("batch", 1e-2), ("example", 1e-2))
      for lr in (3e-3, 1e-2)})
  return Inputs(root, preset)


def test_tuned_lr_is_rederived_from_the_needed_runs(tmp_path):
  inputs = needed_runs(tmp_path, "cpu")
  for name in ("moments", "batch_scaling", "gns_layers"):
    assert record.get(name).needs == ("preconditioner",)
    lr = record.get(name).sweep_at("cpu", inputs).base["optimizer.lr"]
    assert lr == 0.03, name  # Adam's tuned lr (batch_scaling's B_ref too)
  snr = record.get("snr").sweep_at("cpu", inputs)
  lrs = {b.grid["optimizer.placement"][0]: b.grid["optimizer.lr"][0] for b in snr.blocks}
  assert lrs == {"ema": 3e-3, "batch": 1e-2, "example": 1e-2}
  with pytest.raises(FileNotFoundError, match="reproduce.py preconditioner --preset cpu"):
    record.get("moments").sweep_at("cpu", Inputs(tmp_path / "empty", "cpu"))


# --------------------------------------------------------------------------- provenance


def _git(cwd, *args):
  subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd,
                 check=True, capture_output=True)


def test_provenance_records_commit_and_clean_tree(tmp_path):
  _git(tmp_path, "init", "-q")
  (tmp_path / "a.txt").write_text("a")
  _git(tmp_path, "add", "a.txt")
  _git(tmp_path, "commit", "-qm", "a")
  head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                        text=True).stdout.strip()
  assert record.provenance(tmp_path) == {"commit": head, "clean": True}
  (tmp_path / "results" / "cpu").mkdir(parents=True)  # the reproduction's own outputs
  (tmp_path / "results" / "cpu" / "report.json").write_text("{}")
  assert record.provenance(tmp_path) == {"commit": head, "clean": True}
  (tmp_path / "b.txt").write_text("untracked")
  assert record.provenance(tmp_path) == {"commit": head, "clean": False}
  assert record.provenance(tmp_path / "nowhere") == {"commit": "unknown", "clean": False}


def test_run_info_and_report_count_this_invocation_only(tmp_path):
  out, sdir = tmp_path / "out", tmp_path / "sweep"
  out.mkdir()
  (out / "run_info.json").write_text(json.dumps({"launch_wall_s_total": 5000.0}))
  (sdir / "r0").mkdir(parents=True)
  (sdir / "r0" / "summary.json").write_text(json.dumps({"status": "completed",
                                                        "wall_time_s": 7.0}))
  log = LaunchLog(skipped=["r0"], launched=["r1"], wall_s=12.34)
  prov = {"commit": "abc", "clean": False}
  info = runner.run_info(out, "toy", "ci", sdir, log, 20.0, None, "basic", prov)
  assert json.loads((out / "run_info.json").read_text()) == info
  assert "launch_wall_s_total" not in info
  assert (info["launch_wall_s"], info["wall_s"], info["launched"], info["skipped"]) == (
      12.3, 20.0, 1, 1)
  assert (info["commit"], info["clean"], info["runs_compute_s"]) == ("abc", False, 7.0)
  exp = Experiment("toy", "a toy", "c", "r", analyze=print, figures=print, report=print,
                   launch=print, describe_setup=lambda preset: "setup")
  cal = {"kind": "pair", "noise": 0.01, "n": 3, "effect": 0.05, "false_alarm": 0.03,
         "power": 0.9, "source": "measured"}
  rep = Report(verdict="measured", rule="R", paper="p", ours="o", checks=("c",),
               calibration=cal, numbers_md="n")
  report_md.write_readme(exp, out, rep, info)
  doc = json.loads((out / "report.json").read_text())
  assert doc == {"verdict": "measured", "rule": "R", "paper": "p", "ours": "o", "checks": ["c"],
                 "guards": [], "calibration": cal, "calibrations": None, "commit": "abc",
                 "clean": False}
  assert Report.from_json(doc) == Report("measured", "R", "p", "o", ("c",), cal)
  text = (out / "README.md").read_text()
  assert "commit `abc` with uncommitted changes" in text and "launching 1 run(s)" in text
  results = tmp_path / "results"  # costs: run_info.json's, or the record's at its commit
  for n, wall in (("overhead", 60.0), ("snr", 120.0)):
    (results / n).mkdir(parents=True)
    (results / n / "run_info.json").write_text(json.dumps({**info, "launch_wall_s": 0.0 if
                                                            n == "snr" else wall}))
  assert report_md.launch_costs(results) == {"overhead": 60.0, "snr": 0.0}
  (results / report_md.REPRODUCTION).write_text(json.dumps(
      {"commit": "abc", "experiments": {"snr": {"launch_wall_s": 120.0}}}))
  assert report_md.launch_costs(results) == {"overhead": 60.0, "snr": 120.0}
  (results / report_md.REPRODUCTION).write_text(json.dumps(
      {"commit": "zzz", "experiments": {"snr": {"launch_wall_s": 120.0}}}))
  assert report_md.launch_costs(results)["snr"] == 0.0  # another commit's record
  # A resumed run_info (2 invocations) sums its launches already; a record written before
  # `Record.experiment` stopped adding them again reads twice as much (msq_eps: 42.0 vs
  # 21.1 min): run_info.json's counts
  (results / "snr" / "run_info.json").write_text(json.dumps(
      {**info, "launch_wall_s": 60.0, "invocations": 2}))
  (results / report_md.REPRODUCTION).write_text(json.dumps(
      {"commit": "abc", "experiments": {"snr": {"launch_wall_s": 120.0}}}))
  assert report_md.launch_costs(results)["snr"] == 60.0
  # A finished end-to-end record's wall time on each experiment (every invocation's, at any
  # of its commits) is the cost; run_info.json counts the launches at its own commit only
  # (the clean run: batch_scaling 10.9 min of them against the record's 68.5), so the
  # table's total is the record's.
  (results / report_md.REPRODUCTION).write_text(json.dumps(
      {"command": "python scripts/reproduce.py all", "commit": "abc", "started": "t0",
       "finished": "t1", "wall_s": 300.0, "invocations": [], "experiments": {
          n: {"wall_s": w, "launch_wall_s": 1.0, "status": "completed"}
          for n, w in (("overhead", 100.0), ("snr", 200.0))}}))
  assert report_md.experiment_costs(results) == {"overhead": 100.0, "snr": 200.0}
  (results / "overhead" / "README.md").write_text("x")
  index = report_md.index_text(results, "cpu")
  assert "| total | | 5.0 | the end-to-end record's wall time, experiment by experiment |" in index
  assert "took 5 min on 2 cores" in index
  record = json.loads((results / report_md.REPRODUCTION).read_text())
  record["experiments"]["snr"]["status"] = "error: boom"  # not completed: run_info's launches
  (results / report_md.REPRODUCTION).write_text(json.dumps(record))
  assert report_md.experiment_costs(results) == {"overhead": 100.0, "snr": 60.0}
  assert "| total | | 2.7 | of the end-to-end record's 5.0 min |" in report_md.index_text(
      results, "cpu")


def test_results_name_no_machine_path(tmp_path):
  """run_info.json, reproduction.json and the experiments' READMEs say `<sweeps-root>` for an
  absolute sweeps directory (`report_md.portable_results`, run by `write_index`)."""
  results, root = tmp_path / "results", "/some/machine/sweeps5"
  (results / "snr").mkdir(parents=True)
  info = {"sweep_dir": f"{root}/snr/cpu", "command": "python scripts/reproduce.py snr",
          "commit": "abc", "launch_wall_s": 1.0, "n_runs_completed": 1}
  (results / "snr" / "run_info.json").write_text(json.dumps(info))
  (results / "snr" / "README.md").write_text(f"Sweep directory `{root}/snr/cpu` (not committed)")
  (results / report_md.REPRODUCTION).write_text(json.dumps(
      {"command": f"python scripts/reproduce.py all --sweeps-root {root}", "commit": "abc",
       "experiments": {}, "wall_s": 60.0, "started": "t0", "finished": "t1"}))
  report_md.write_index(results, "cpu")
  text = "".join(p.read_text() for p in results.rglob("*") if p.is_file())
  assert root not in text and text.count("<sweeps-root>") >= 4
  assert json.loads((results / "snr" / "run_info.json").read_text())["sweep_dir"] == \
      "<sweeps-root>/snr/cpu"
  assert report_md.portable_command("x --sweeps-root /a/b --n-jobs 2") == \
      "x --sweeps-root <sweeps-root> --n-jobs 2"
  assert report_md.portable_sweep_dir(report_md.REPO / "runs" / "s" / "snr" / "ci") == \
      "runs/s/snr/ci"  # inside the checkout: relative
  assert "| total | | 0.0 | of the end-to-end record's 1.0 min" in text


def test_a_new_report_removes_the_files_of_the_old_one(tmp_path):
  out = tmp_path / "out"
  out.mkdir()
  for f in ("old.csv", "old.png", "notes.txt"):
    (out / f).write_text("x")
  assert runner.clear_outputs(out) == []  # not a report's directory: nothing removed
  (out / "report.json").write_text("{}")
  assert [p.name for p in runner.clear_outputs(out)] == ["old.csv", "old.png"]
  assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "report.json"]


# --------------------------------------------------------------------------- size


def test_every_python_file_is_at_most_400_lines():
  """Library, experiments, scripts and tests alike (which modules `experiments` may import:
  tests/test_layers.py)."""
  files = [p for d in ("pergrad", "experiments", "scripts", "tests")
           for p in (REPO / d).rglob("*.py")]
  lines = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in files}
  over = {name: n for name, n in lines.items() if n > 400}
  assert len(files) > 50 and not over, over


# --------------------------------------------------------------------------- reproduction.json


def _reproduce_module():
  spec = importlib.util.spec_from_file_location("reproduce_script",
                                                REPO / "scripts" / "reproduce.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_reproduction_record_survives_a_stop_and_is_continued(tmp_path, monkeypatch):
  """A stopped `all` leaves its record (written on each experiment and each beat); the same
  command at the same commit continues it: invocations listed, costs summed, the stopped
  experiment's earlier runs counted as launched."""
  mod = _reproduce_module()
  monkeypatch.setattr(mod.rec, "provenance", lambda: {"commit": "abc", "clean": True})
  path = tmp_path / "reproduction.json"
  first = mod.Record(path, "python scripts/reproduce.py all --preset cpu", fresh=True)
  first.begin("a")
  first.experiment("a", {"wall_s": 10.0, "launch_wall_s": 9.0, "launched": 3, "skipped": 0,
                         "status": "completed"})
  first.begin("b")
  first._running = ("b", first._running[1] - 30.0)  # 30 s into b when stopped
  first._write()
  first._stop.set()
  stopped = json.loads(path.read_text())
  assert stopped["running"]["name"] == "b" and "finished" not in stopped
  assert "NOT finished (stopped during `b`)" in "\n".join(
      report_md.reproduction_lines(tmp_path))

  second = mod.Record(path, "python scripts/reproduce.py all --preset cpu", fresh=False)
  second.begin("b")
  second.experiment("b", {"wall_s": 5.0, "launch_wall_s": 4.0, "launched": 1, "skipped": 2,
                          "status": "completed"})
  assert second.finished_before("a") and not second.finished_before("b")
  d = second.finish()
  assert d["fresh"] is True and len(d["invocations"]) == 2 and "running" not in d
  assert d["experiments"]["a"]["launched"] == 3
  b = d["experiments"]["b"]
  assert (b["launched"], b["skipped"]) == (3, 0) and b["wall_s"] >= 35.0
  assert d["wall_s"] == pytest.approx(sum(i["wall_s"] for i in d["invocations"]))
  text = "\n".join(report_md.reproduction_lines(tmp_path))
  assert "in 2 invocations" in text and "finished " in text
  # stopped twice in one experiment: both stops' wall times kept (batch_scaling's record at
  # bae3e8a had lost the first two of its three stops, 962 s and ~1960 s)
  twice = path.with_name("r3.json")
  for spent in (30.0, 20.0):
    r = mod.Record(twice, "python scripts/reproduce.py all --preset cpu", fresh=True)
    r.begin("b")
    r._running = ("b", r._running[1] - spent)
    r._write()
    r._stop.set()
  r = mod.Record(twice, "python scripts/reproduce.py all --preset cpu", fresh=True)
  r.begin("b")
  r.experiment("b", {"wall_s": 5.0, "launch_wall_s": 4.0, "launched": 1, "skipped": 2,
                     "status": "completed"})
  r._stop.set()
  assert r.d["experiments"]["b"]["wall_s"] == pytest.approx(55.0, abs=0.5)

  # an experiment re-run after failed runs: its run_info.json (same commit and sweep) already
  # sums both invocations' launches, and the record adds only the wall time (it added both,
  # so msq_eps read 42.0 min of launches against run_info's 21.1)
  third = mod.Record(path.with_name("r2.json"), "python scripts/reproduce.py all", fresh=True)
  third.experiment("c", {"wall_s": 8.0, "launch_wall_s": 6.0, "launched": 2, "skipped": 0,
                         "status": "1 run(s) failed"})
  third._stop.set()  # stopped after c, before the next experiment
  fourth = mod.Record(path.with_name("r2.json"), "python scripts/reproduce.py all", fresh=True)
  assert not fourth.finished_before("c")  # its runs failed: c runs again
  fourth.experiment("c", {"wall_s": 3.0, "launch_wall_s": 6.0 + 2.0, "launched": 2 + 1,
                          "skipped": 0, "status": "completed"})
  fourth._stop.set()
  c = fourth.d["experiments"]["c"]
  assert (c["wall_s"], c["launch_wall_s"], c["launched"]) == (11.0, 8.0, 3)
  # diverged runs are a finished outcome: not re-run on resume (the clean run at bf717d4
  # re-ran preconditioner and msq_eps and its record read "5 run(s) failed" before, then not)
  fourth.experiment("d", {"wall_s": 5.0, "launch_wall_s": 4.0, "launched": 3, "skipped": 0,
                          "status": "completed (2 diverged), verdict: reproduced"})
  fourth._stop.set()
  resumed = mod.Record(path.with_name("r2.json"), "python scripts/reproduce.py all", fresh=True)
  resumed._stop.set()
  assert resumed.finished_before("d")

  monkeypatch.setattr(mod.rec, "provenance", lambda: {"commit": "def", "clean": True})
  fifth = mod.Record(path, "python scripts/reproduce.py all --preset cpu", fresh=True)
  fifth._stop.set()
  assert len(fifth.d["invocations"]) == 1 and fifth.d["commit"] == "def"  # a new commit

