"""Tests of the experiment machinery (experiments/, scripts/reproduce.py, notebooks/).

Fast part (no JAX): a fake Hydra training entry checks launch / skip / resume / aggregate
logic, including a sweep killed part-way and restarted. Slow part: the `ci` preset of
every experiment through the real scripts/train.py, a kill-and-restart of a real sweep,
and both notebooks executed with nbclient on a ci sweep (one shared sweep root).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import common, runner  # noqa: E402

PY = sys.executable

FAKE_TRAIN = textwrap.dedent('''
    """A stand-in for scripts/train.py: same run-dir contract, no JAX."""
    import dataclasses, json, os, time
    from pathlib import Path
    import hydra
    from hydra.core.config_store import ConfigStore
    from hydra.core.hydra_config import HydraConfig

    @dataclasses.dataclass
    class Opt:
      lr: float = 0.1
      placement: str = "ema"

    @dataclasses.dataclass
    class Cfg:
      optimizer: Opt = dataclasses.field(default_factory=Opt)
      steps: int = 4
      seed: int = 0

    ConfigStore.instance().store(name="cfg", node=Cfg)

    @hydra.main(version_base="1.3", config_path=None, config_name="cfg")
    def main(cfg):
      out = Path(HydraConfig.get().runtime.output_dir)
      summ = out / "summary.json"
      if summ.exists() and json.loads(summ.read_text())["status"] == "completed":
        return
      with open(out / "launches.txt", "a") as f:
        f.write("x\\n")
      sleep = float(os.environ.get("FAKE_SLEEP", "0"))
      lr = cfg.optimizer.lr
      with open(out / "metrics.jsonl", "a") as f:
        for step in range(1, cfg.steps + 1):
          time.sleep(sleep)
          loss = (lr - 0.1) ** 2 + 1.0 / step + 0.01 * cfg.seed
          if cfg.optimizer.placement == "example":
            loss += 0.5
          if lr > 1.0:
            loss = float("nan")
          f.write(json.dumps({"step": step, "split": "train", "loss": loss,
                              "examples_seen": 8 * step}) + "\\n")
          f.write(json.dumps({"step": step, "split": "eval", "loss": loss + 0.1}) + "\\n")
          f.write(json.dumps({"step": step, "split": "stats",
                              "stats/dense/kernel/snr_median": 0.1 * step}) + "\\n")
          f.flush()
      summ.write_text(json.dumps({"status": "completed", "wall_time_s": 0.1}))

    if __name__ == "__main__":
      main()
''')


@pytest.fixture()
def fake_train(tmp_path):
  path = tmp_path / "fake_train.py"
  path.write_text(FAKE_TRAIN)
  return path


def _sweep():
  blocks = (common.Block({"optimizer.placement": ["example", "ema"],
                          "optimizer.lr": [0.03, 0.1, 0.3], "seed": [0]}),)
  return common.Sweep({"steps": 3}, blocks, common.LrSearch(
      ("optimizer.placement",), seed_key="seed", max_extend=1, seeds=(1,)))


def test_run_dirname_matches_hydra_and_aggregate(tmp_path, fake_train):
  sweep = _sweep()
  log = common.launch_blocks(tmp_path / "s", sweep.base, sweep.blocks, train_script=fake_train,
                             echo=lambda *_: None)
  assert len(log.launched) == 6 and not log.failed and not log.skipped
  names = sorted(p.name for p in (tmp_path / "s").iterdir() if p.is_dir())
  expect = sorted(common.run_dirname(p) for p in sweep.blocks[0].points())
  assert [n for n in names if not n.startswith(".")] == expect  # same names as Hydra's
  table = common.aggregate(tmp_path / "s")
  assert len(table) == 6 * 3  # one row per run and step
  assert {"train/loss", "eval/loss", "stats/dense/kernel/snr_median", "optimizer.lr",
          "optimizer.placement", "seed"} <= set(table.columns)
  fin = common.finals(table)
  best = common.best_lr(fin, ["optimizer.placement"], "optimizer.lr", seed_key="seed")
  assert set(best["optimizer.lr"]) == {0.1} and not best["at_edge"].any()
  # Second launch: everything is skipped, nothing is re-run.
  log2 = common.launch_blocks(tmp_path / "s", sweep.base, sweep.blocks,
                              train_script=fake_train, echo=lambda *_: None)
  assert sorted(log2.skipped) == expect and not log2.launched
  # Follow-up stage: best lr not at an edge -> seeds at the best lr.
  blocks, kind = common.follow_up_blocks(sweep, fin, 0)
  assert kind == "seeds"
  assert sorted(common.run_dirname(p) for b in blocks for p in b.points()) == sorted(
      f"optimizer.lr=0.1,optimizer.placement={p},seed=1" for p in ("ema", "example"))


def test_follow_up_extends_grid_past_edge_and_flags_divergence(tmp_path, fake_train):
  blocks = (common.Block({"optimizer.placement": ["ema"], "optimizer.lr": [0.01, 0.03],
                          "seed": [0]}),
            common.Block({"optimizer.placement": ["example"], "optimizer.lr": [0.3, 3.0],
                          "seed": [0]}))
  sweep = common.Sweep({"steps": 2}, blocks, common.LrSearch(
      ("optimizer.placement",), seed_key="seed", max_extend=1))
  d = tmp_path / "s"
  common.launch_blocks(d, sweep.base, sweep.blocks, train_script=fake_train,
                       echo=lambda *_: None)
  fin = common.finals(common.aggregate(d))
  assert fin.loc[fin["optimizer.lr"] == 3.0, "diverged"].all()
  new, kind = common.follow_up_blocks(sweep, fin, 0)
  assert kind == "extend"
  pts = [p for b in new for p in b.points()]
  assert pts == [{"optimizer.placement": "ema", "optimizer.lr": 0.09, "seed": 0},
                 {"optimizer.placement": "example", "optimizer.lr": 0.1, "seed": 0}]


def _kill_and_restart(cmd, sweep_dir: Path, env=None, timeout=600):
  """Starts `cmd`, kills it once a first run has finished, restarts it; returns both logs."""
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  t0 = time.time()
  while not list(sweep_dir.glob(f"*/{common.SUMMARY}")):
    assert proc.poll() is None, "the sweep ended before any run finished"
    assert time.time() - t0 < timeout
    time.sleep(0.2)
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  first = {p.parent.name: p.stat().st_mtime_ns for p in sweep_dir.glob(f"*/{common.SUMMARY}")}
  out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return first, out.stdout


def test_killed_sweep_restarts_only_missing_runs_fake(tmp_path, fake_train):
  d = tmp_path / "s"
  sweep = _sweep()
  code = textwrap.dedent(f"""
      import sys; sys.path.insert(0, {str(REPO)!r})
      from pathlib import Path
      from experiments import common
      blocks = (common.Block({{"optimizer.placement": ["example", "ema"],
                               "optimizer.lr": [0.03, 0.1, 0.3], "seed": [0]}}),)
      log = common.launch_blocks(Path({str(d)!r}), {{"steps": 3}}, blocks,
                                 train_script=Path({str(fake_train)!r}))
      print("SKIPPED", sorted(log.skipped))
  """)
  env = {**os.environ, "FAKE_SLEEP": "0.3"}
  first, stdout = _kill_and_restart([PY, "-c", code], d, env=env)
  all_names = sorted(common.run_dirname(p) for p in sweep.blocks[0].points())
  assert f"SKIPPED {sorted(first)}" in stdout
  for name in all_names:
    assert common.run_status(d / name) == "completed"
  for name, mtime in first.items():  # finished runs were not run again
    assert (d / name / common.SUMMARY).stat().st_mtime_ns == mtime
    assert (d / name / "launches.txt").read_text().count("x") == 1


def test_presets_are_well_formed():
  for name in runner.EXPERIMENTS:
    mod = runner.load(name)
    assert (REPO / "configs" / "experiment" / f"{name}.yaml").exists()
    for attr in ("NAME", "TITLE", "CLAIM", "analyze", "figures", "report"):
      assert hasattr(mod, attr), (name, attr)
    if hasattr(mod, "launch"):
      continue
    for preset in common.PRESETS:
      sweep = mod.sweep(preset)
      pts = [common.run_dirname(p) for b in sweep.blocks for p in b.points()]
      assert len(pts) == len(set(pts)), (name, preset)  # distinct run dirs
      if preset == "ci":
        assert 1 <= len(pts) <= 4, (name, len(pts))


def test_unknown_experiment_or_preset_is_one_clear_error():
  with pytest.raises(ValueError, match="unknown experiment"):
    runner.load("nope")
  with pytest.raises(ValueError, match="unknown preset"):
    runner.run_experiment("snr", "huge")


# --------------------------------------------------------------------------- real sweeps

TRAIN = REPO / "scripts" / "train.py"
needs_train = pytest.mark.skipif(not TRAIN.exists(), reason="scripts/train.py not written yet")
TRAINING = [n for n in runner.EXPERIMENTS if not hasattr(runner.load(n), "launch")]


def _reproduce(*args, timeout=900):
  env = {**os.environ, "WANDB_MODE": "disabled"}
  return subprocess.run([PY, str(REPO / "scripts" / "reproduce.py"), *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ci_root(tmp_path_factory):
  """One shared root with the ci sweep of every training experiment.

  sign_placement is first killed after its first run finished and restarted; the restart
  must skip exactly the finished run(s) (checked in test_killed_real_sweep_*).
  """
  if not TRAIN.exists():
    pytest.skip("scripts/train.py not written yet")
  root = tmp_path_factory.mktemp("sweeps")
  sweep_dir = root / "sign_placement" / "ci"
  cmd = [PY, str(REPO / "scripts" / "reproduce.py"), "sign_placement", "--preset", "ci",
         "--sweeps-root", str(root)]
  first, stdout = _kill_and_restart(cmd, sweep_dir, env={**os.environ, "WANDB_MODE": "disabled"})
  for name in TRAINING:
    if name == "sign_placement":
      continue
    out = _reproduce(name, "--preset", "ci", "--sweeps-root", str(root))
    assert out.returncode == 0, f"{name}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
  return {"root": root, "killed_first": first, "restart_stdout": stdout}


@needs_train
@pytest.mark.slow
def test_killed_real_sweep_restarts_only_missing_runs(ci_root):
  sweep_dir = ci_root["root"] / "sign_placement" / "ci"
  first = ci_root["killed_first"]
  assert first, "no run had finished before the kill"
  for name in first:
    assert f"[skip] {name} (completed)" in ci_root["restart_stdout"]
    assert (sweep_dir / name / common.SUMMARY).stat().st_mtime_ns == first[name]
  runs = [p.parent.name for p in sweep_dir.glob(f"*/{common.METRICS}")]
  assert runs and all(common.run_status(sweep_dir / r) == "completed" for r in runs)


@needs_train
@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINING)
def test_ci_preset_writes_results(ci_root, name):
  sweep_dir = ci_root["root"] / name / "ci"
  table = pd.read_csv(sweep_dir / "table.csv")
  sweep = runner.load(name).sweep("ci")
  expected = {common.run_dirname(p) for b in sweep.blocks for p in b.points()}
  assert expected <= set(table["run"])  # every first-stage point ran and is in the table
  assert not table.duplicated(["run", "step"]).any()  # one row per run and step
  assert table["train/loss"].notna().any() and table["eval/loss"].notna().any()
  report = sweep_dir / "report"
  assert list(report.glob("*.png")) and list(report.glob("*.csv"))
  readme = (report / "README.md").read_text()
  verdict = json.loads((report / "report.json").read_text())["verdict"]
  assert verdict in readme and f"scripts/reproduce.py {name} --preset ci" in readme


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / "scripts" / "bench_stats.py").exists(),
                    reason="scripts/bench_stats.py not written yet")
def test_overhead_ci(tmp_path):
  out = _reproduce("overhead", "--preset", "ci", "--sweeps-root", str(tmp_path))
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  report = tmp_path / "overhead" / "ci" / "report"
  df = pd.read_csv(report / "overhead.csv")
  assert len(df) and (report / "overhead.png").exists()


@needs_train
@pytest.mark.slow
def test_notebooks_execute_on_ci_sweep(ci_root, tmp_path):
  import nbformat
  from nbclient import NotebookClient
  results = tmp_path / "results"
  results.mkdir()
  for name in TRAINING:
    (results / name).symlink_to(ci_root["root"] / name / "ci" / "report")
  for nb_name, env in (("inspect_runs", {"PERGRAD_SWEEP_DIR": str(
      ci_root["root"] / "sign_placement" / "ci")}), ("figures", {
          "PERGRAD_RESULTS_ROOT": str(results)})):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
      nb = nbformat.read(REPO / "notebooks" / f"{nb_name}.ipynb", as_version=4)
      NotebookClient(nb, timeout=300, kernel_name="python3",
                     resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    finally:
      for k, v in old.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    images = [o for c in nb.cells for o in c.get("outputs", [])
              if o.get("output_type") == "display_data" and "image/png" in o.get("data", {})]
    assert images, nb_name
