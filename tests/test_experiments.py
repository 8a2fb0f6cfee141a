"""Tests of the experiment machinery (experiments/, scripts/reproduce.py, notebooks/).

Fast part (no JAX): a fake Hydra training entry checks launch / skip / resume / aggregate
logic, including a sweep killed part-way and restarted; a sweep's directory follows its
config-changing extra overrides (the scale presets: tests/test_scales.py).
Slow part: one end-to-end test per experiment on the `ci` preset (the session-wide
`ci_sweeps`, tests/conftest.py); extended: a real sweep killed and restarted, the notebooks.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ALONE, kill_and_restart
from omegaconf import OmegaConf
from test_record import needed_runs

from pergrad.analysis.runs import read_csv

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import runner  # noqa: E402
from pergrad.analysis import runs  # noqa: E402
from pergrad.analysis.runs import run_dirname  # noqa: E402, read_csv
from pergrad.sweep import (  # noqa: E402
  PRESETS,
  SWEEP_JSON,
  Block,
  LrSearch,
  Sweep,
  best_lr,
  follow_up_blocks,
  launch,
  record,
  record_sweep,
)

PY = sys.executable

FAKE_TRAIN = textwrap.dedent('''
    """A stand-in for `python -m pergrad.train`: same run-dir contract, no JAX."""
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
      done = [] if lr > 1.0 else [cfg.steps]  # a "checkpoint" of the last step (no Orbax)
      for step in done:
        (out / "checkpoints" / str(step)).mkdir(parents=True, exist_ok=True)
      summ.write_text(json.dumps({"status": "diverged" if lr > 1.0 else "completed",
                                  "wall_time_s": 0.1, "last_step": cfg.steps,
                                  "checkpoint_steps": done}))

    if __name__ == "__main__":
      main()
''')


@pytest.fixture()
def fake_train(tmp_path):
  path = tmp_path / "fake_train.py"
  path.write_text(FAKE_TRAIN)
  return path


def _fake_cmd(fake_train: Path) -> tuple:
  return (PY, str(fake_train))


def _sweep():
  blocks = (Block({"optimizer.placement": ["example", "ema"],
                   "optimizer.lr": [0.03, 0.1, 0.3], "seed": [0]}),)
  return Sweep({"steps": 3}, blocks, LrSearch(
      ("optimizer.placement",), seed_key="seed", max_extend=1, seeds=(1,)))


def test_run_dirname_matches_hydra_and_aggregate(tmp_path, fake_train):
  sweep = _sweep()
  log = launch.launch_blocks(tmp_path / "s", sweep.base, sweep.blocks,
                             train_cmd=_fake_cmd(fake_train), echo=lambda *_: None)
  assert len(log.launched) == 6 and not log.failed and not log.skipped
  names = sorted(p.name for p in (tmp_path / "s").iterdir() if p.is_dir())
  expect = sorted(run_dirname(p) for p in sweep.blocks[0].points())
  assert [n for n in names if not n.startswith(".")] == expect  # same names as Hydra's
  table = runs.aggregate(tmp_path / "s")
  assert len(table) == 6 * 3  # one row per run and step
  assert {"train/loss", "eval/loss", "stats/dense/kernel/snr_median", "optimizer.lr",
          "optimizer.placement", "seed"} <= set(table.columns)
  fin = runs.finals(table)
  best = best_lr(fin, ["optimizer.placement"], "optimizer.lr", seed_key="seed")
  assert set(best["optimizer.lr"]) == {0.1} and not best["at_edge"].any()
  # Second launch: everything is skipped, nothing is re-run.
  log2 = launch.launch_blocks(tmp_path / "s", sweep.base, sweep.blocks,
                              train_cmd=_fake_cmd(fake_train), echo=lambda *_: None)
  assert sorted(log2.skipped) == expect and not log2.launched
  # Follow-up stage: best lr not at an edge -> seeds at the best lr.
  blocks, kind = follow_up_blocks(sweep, fin)
  assert kind == "seeds"
  assert sorted(run_dirname(p) for b in blocks for p in b.points()) == sorted(
      f"optimizer.lr=0.1,optimizer.placement={p},seed=1" for p in ("ema", "example"))


def test_follow_up_extends_grid_past_edge_and_flags_divergence(tmp_path, fake_train):
  blocks = (Block({"optimizer.placement": ["ema"], "optimizer.lr": [0.01, 0.03], "seed": [0]}),
            Block({"optimizer.placement": ["example"], "optimizer.lr": [0.3, 3.0], "seed": [0]}))
  sweep = Sweep({"steps": 2}, blocks, LrSearch(
      ("optimizer.placement",), seed_key="seed", max_extend=1))
  d = tmp_path / "s"
  log = launch.launch_blocks(d, sweep.base, sweep.blocks, train_cmd=_fake_cmd(fake_train),
                             echo=lambda *_: None)
  fin = runs.finals(runs.aggregate(d))
  assert fin.loc[fin["optimizer.lr"] == 3.0, "diverged"].all()
  gone = ["optimizer.lr=3,optimizer.placement=example,seed=0"]
  assert log.failed == [] and runner.diverged_runs(d) == gone  # finished, not a failure
  again = launch.launch_blocks(d, sweep.base, sweep.blocks, train_cmd=_fake_cmd(fake_train),
                               echo=lambda *_: None)  # resumed: nothing run again
  assert (again.failed, again.launched) == ([], [])
  new, kind = follow_up_blocks(sweep, fin)
  assert kind == "extend"
  pts = [p for b in new for p in b.points()]
  assert pts == [{"optimizer.placement": "ema", "optimizer.lr": 0.09, "seed": 0},
                 {"optimizer.placement": "example", "optimizer.lr": 0.1, "seed": 0}]


def test_killed_sweep_restarts_only_missing_runs_fake(tmp_path, fake_train):
  d = tmp_path / "s"
  sweep = _sweep()
  code = textwrap.dedent(f"""
      import sys; sys.path.insert(0, {str(REPO)!r})
      from pathlib import Path
      from pergrad.sweep import Block, launch_blocks
      blocks = (Block({{"optimizer.placement": ["example", "ema"],
                        "optimizer.lr": [0.03, 0.1, 0.3], "seed": [0]}}),)
      log = launch_blocks(Path({str(d)!r}), {{"steps": 3}}, blocks,
                          train_cmd=({PY!r}, {str(fake_train)!r}))
      print("SKIPPED", sorted(log.skipped))
  """)
  env = {**os.environ, "FAKE_SLEEP": "0.3"}
  first, stdout = kill_and_restart([PY, "-c", code], d, env=env)
  all_names = sorted(run_dirname(p) for p in sweep.blocks[0].points())
  assert f"SKIPPED {sorted(first)}" in stdout
  for name in all_names:
    assert runs.run_status(d / name) == "completed"
  for name, mtime in first.items():  # finished runs were not run again
    assert (d / name / runs.SUMMARY).stat().st_mtime_ns == mtime
    assert (d / name / "launches.txt").read_text().count("x") == 1


def test_presets_are_well_formed(tmp_path):
  needed = {p: needed_runs(tmp_path / p, p) for p in PRESETS}
  for name in record.builtin():
    exp = record.get(name)
    assert (REPO / "configs" / "experiment" / f"{name}.yaml").exists()
    assert exp.name == name and exp.title and exp.claim and exp.row
    if exp.launch is not None:
      continue
    for preset in PRESETS:
      sweep = exp.sweep_at(preset, needed[preset])
      assert sweep.base["scale"] == preset and sweep.base["experiment"] == name
      pts = [run_dirname(p) for b in sweep.blocks for p in b.points()]
      assert len(pts) == len(set(pts)), (name, preset)  # distinct run dirs
      if preset == "ci":
        assert 1 <= len(pts) <= 4, (name, len(pts))


def test_unknown_experiment_or_preset_is_one_clear_error():
  with pytest.raises(ValueError, match="unknown experiment"):
    record.get("nope")
  with pytest.raises(ValueError, match="unknown preset"):
    runner.run_experiment("snr", "huge")


# --------------------------------------------------------------------------- sweep dirs


def test_dry_run_of_an_experiment_whose_needs_have_not_run(tmp_path):
  """It says what it would launch (placeholder lrs), not the needed search's missing runs."""
  lines = []
  out = runner.run_experiment("snr", "cpu", dry_run=True, sweeps_root=tmp_path, echo=lines.append)
  assert len(out.log.launched) == 9 and "sign_placement not run yet" in lines[-1]


def _dry(name, root, *extra):
  out = runner.run_experiment(name, "ci", dry_run=True, sweeps_root=root, extra=extra,
                              echo=lambda *_: None)
  return out.sweep_dir


def test_sweep_dir_depends_on_config_changing_extras(tmp_path):
  base = _dry("snr", tmp_path)
  assert base == tmp_path / "snr" / "ci"
  # Launcher-only, logging and data-cache overrides do not change what the runs compute.
  assert _dry("snr", tmp_path, "hydra.launcher.n_jobs=3", "hydra/launcher=joblib",
              "logging.wandb.mode=offline", "logging=quiet", "data.tfds_dir=/x") == base
  assert _dry("snr", tmp_path, "data.tfds=/x") != base  # a prefix of a key is not the key
  txt = ("data=txt_folder", "data.path=/corpus")
  other = _dry("snr", tmp_path, *txt)
  assert other.parent == base.parent and other.name.startswith("ci-") and other != base
  # Stable: independent of the order and of neutral extras; another value, another dir.
  assert _dry("snr", tmp_path, *reversed(txt), "logging.log_every=3") == other
  assert _dry("snr", tmp_path, "data=txt_folder", "data.path=/other") not in (base, other)
  # The dry-run command carries the extras to every run.
  log = runner.run_experiment("snr", "ci", dry_run=True, sweeps_root=tmp_path, extra=txt,
                              echo=lambda *_: None).log
  assert all(set(txt) <= set(c) for c in log.commands) and log.commands
  # Only the training sweeps depend on extras (the benchmark does not take them).
  assert _dry("overhead", tmp_path, *txt) == tmp_path / "overhead" / "ci"


def test_sweep_json_records_the_config_and_refuses_another(tmp_path):
  extra = ("data.path=/corpus", "data=txt_folder", "hydra.launcher.n_jobs=2")
  d = tmp_path / "s"
  record_sweep(d, "ci", {"experiment": "snr", "scale": "ci", "stats.log_every": 5}, extra)
  doc = json.loads((d / SWEEP_JSON).read_text())
  assert doc == {"preset": "ci",
                 "base": {"experiment": "snr", "scale": "ci", "stats.log_every": "5"},
                 "extra": ["data.path=/corpus", "data=txt_folder"], "train_version": None}
  record_sweep(d, "ci", {"experiment": "snr", "scale": "ci"}, extra[::-1])  # same config
  with pytest.raises(ValueError, match="holds runs of preset 'ci' with extra") as e:
    record_sweep(d, "ci", {"experiment": "snr", "scale": "ci"}, ("data=lm1b",))
  assert "\n" not in str(e.value)
  # Runs trained by other training code, or by unrecorded code, are not this code's runs.
  v = tmp_path / "v"
  record_sweep(v, "ci", {}, (), "aaa")
  record_sweep(v, "ci", {}, (), "aaa")  # resumed at the same version
  with pytest.raises(ValueError, match="trained at training version aaa, not this checkout's bbb"):
    record_sweep(v, "ci", {}, (), "bbb")
  legacy = tmp_path / "legacy"
  (legacy / "optimizer.lr=0.1").mkdir(parents=True)
  (legacy / "optimizer.lr=0.1" / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match="training version unrecorded, not this checkout's bbb"):
    record_sweep(legacy, "ci", {}, (), "bbb")
  (tmp_path / "bench").mkdir()
  (tmp_path / "bench" / "bench.json").write_text("{}")  # a benchmark's output, likewise
  with pytest.raises(ValueError, match="unrecorded"):
    record_sweep(tmp_path / "bench", "ci", {}, (), "bbb")
  assert not (legacy / SWEEP_JSON).exists()  # refused before writing anything


# --------------------------------------------------------------------------- real sweeps


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.parametrize("name", [n for n in record.builtin() if n not in ALONE])
def test_ci_preset_end_to_end(ci_sweeps, name):
  """`reproduce.py NAME --preset ci` through the real training entry or benchmark: its table,
  CSVs, figures, README and report.json."""
  sweep_dir = ci_sweeps["root"] / name / "ci"
  report = sweep_dir / "report"
  assert list(report.glob("*.png")) and list(report.glob("*.csv"))
  readme = (report / "README.md").read_text()
  doc = json.loads((report / "report.json").read_text())
  assert doc["verdict"] in readme and f"scripts/reproduce.py {name} --preset ci" in readme
  assert doc["rule"] and "**Rule.**" in readme and doc["commit"]
  exp = record.get(name)
  if exp.launch is not None:  # a benchmark: pergrad.bench.stats.run's document
    bench = json.loads((sweep_dir / "bench.json").read_text())
    assert bench["rows"] and "checks" in bench and "--presets" in bench["argv"]
    return
  table = read_csv(sweep_dir / "table.csv")
  sweep = exp.sweep_at("ci")
  expected = {run_dirname(p) for b in sweep.blocks for p in b.points()}
  assert expected <= set(table["run"])  # every first-stage point ran and is in the table
  assert not table.duplicated(["run", "step"]).any()  # one row per run and step
  assert table["train/loss"].notna().any() and table["eval/loss"].notna().any()
  assert json.loads((sweep_dir / SWEEP_JSON).read_text())["base"]["scale"] == "ci"
  assert f"Resolved (`experiment={name} scale=ci`" in readme
  cfg = OmegaConf.load(sweep_dir / sorted(expected)[0] / "config.yaml")  # the ci scale
  # gns_ramp fixes its own small model (20 tokens per parameter): only the tokenizer is ci's
  model = (1, 32) if name != "gns_ramp" else (2, 16)
  assert (cfg.model.n_layers, cfg.model.d_model, cfg.data.tokenizer) == (*model, "byte")


@pytest.mark.slow
@pytest.mark.extended
def test_killed_real_sweep_restarts_only_missing_runs(tmp_path):
  """A real ci sweep killed once its first run finished, then restarted: the restart skips
  exactly the finished runs."""
  root = tmp_path / "sweeps"
  sweep_dir = root / "sign_placement" / "ci"
  cmd = [PY, str(REPO / "scripts" / "reproduce.py"), "sign_placement", "--preset", "ci",
         "--sweeps-root", str(root)]
  first, stdout = kill_and_restart(cmd, sweep_dir, env={**os.environ, "WANDB_MODE": "disabled"})
  assert first, "no run had finished before the kill"
  for name in first:
    assert f"[skip] {name} (completed)" in stdout
    assert (sweep_dir / name / runs.SUMMARY).stat().st_mtime_ns == first[name]
  names = [p.parent.name for p in sweep_dir.glob(f"*/{runs.METRICS}")]
  assert names and all(runs.run_status(sweep_dir / r) == "completed" for r in names)


@pytest.mark.slow
@pytest.mark.extended
def test_notebooks_execute_on_ci_sweep(ci_sweeps, tmp_path):
  import nbformat
  from nbclient import NotebookClient
  results = tmp_path / "results" / "ci"
  results.mkdir(parents=True)
  for name in (n for n in record.builtin() if n not in ALONE):
    (results / name).symlink_to(ci_sweeps["root"] / name / "ci" / "report")
  for nb_name, env in (("inspect_runs", {"PERGRAD_SWEEP_DIR": str(
      ci_sweeps["root"] / "sign_placement" / "ci")}), ("inspect_runs", {
          "PERGRAD_SWEEP_DIR": str(ci_sweeps["root"] / "gns_layers" / "ci")}), ("figures", {
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
    if "gns_layers" in env.get("PERGRAD_SWEEP_DIR", ""):  # the GNS section drew its curves
      assert any(o.get("output_type") == "display_data" for o in nb.cells[-1].outputs)
