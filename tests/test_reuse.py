"""No run trained twice (`pergrad.sweep.reuse`): a run another sweep of the sweeps root has
finished is linked, not trained; the key is what the run computes and the training version.
The sweeps use test_experiments' fake training entry (no JAX)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_experiments import FAKE_TRAIN, REPO, _fake_cmd
from test_record import _reproduce_module

sys.path.insert(0, str(REPO))

from experiments import reproduction, runner  # noqa: E402
from pergrad.analysis import runs  # noqa: E402
from pergrad.sweep import (  # noqa: E402
  Block,
  LaunchLog,
  default_sweep_dir,
  launch,
  record,
  report_md,
)


@pytest.fixture()
def fake_train(tmp_path):
  path = tmp_path / "fake_train.py"
  path.write_text(FAKE_TRAIN)
  return path



def fake_whole(run_dir: Path) -> str | None:
  """`reuse.is_whole` for the fake entry's runs, whose checkpoints are empty folders."""
  from pergrad.sweep import is_whole

  return is_whole(run_dir, lambda d: None if d.is_dir() else f"{d} does not exist")


def _fake_index(root: Path, code: str = "c0"):
  from pergrad.sweep import RunIndex

  # The fake entry's keys are not pergrad's: the config is the overrides themselves.
  return RunIndex(root / ".runs", code, resolve=lambda ov: dict(o.split("=", 1) for o in ov),
                  whole=fake_whole)


def test_a_run_another_sweep_finished_is_linked_not_trained(tmp_path, fake_train):
  from pergrad.sweep import REUSED, is_reused

  root, cmd = tmp_path / "root", _fake_cmd(fake_train)
  quiet = dict(train_cmd=cmd, echo=lambda *_: None)
  a = launch.launch_blocks(root / "a" / "ci", {"steps": 3}, (Block(
      {"optimizer.placement": ["ema"], "optimizer.lr": [0.1, 0.3], "seed": [0]}),),
      index=_fake_index(root), **quiet)
  assert len(a.launched) == 2 and not a.reused
  first = root / "a" / "ci" / "optimizer.lr=0.1,optimizer.placement=ema,seed=0"
  hydra_a = (first / ".hydra" / "overrides.yaml").read_text()
  blocks = (Block({"optimizer.placement": ["ema"], "optimizer.lr": [0.1], "seed": [0, 1]}),)
  b = launch.launch_blocks(root / "b" / "ci", {"steps": 3}, blocks, index=_fake_index(root),
                           **quiet)
  assert b.reused == ["optimizer.lr=0.1,optimizer.placement=ema,seed=0"]
  assert b.launched == ["optimizer.lr=0.1,optimizer.placement=ema,seed=1"]
  linked = root / "b" / "ci" / b.reused[0]
  assert is_reused(linked) and (linked / "metrics.jsonl").is_symlink()
  assert (linked / "launches.txt").read_text() == "x\n"  # trained once, by sweep a
  assert (first / ".hydra" / "overrides.yaml").read_text() == hydra_a  # a's record untouched
  assert not (first / REUSED).exists()
  table = runs.aggregate(root / "b" / "ci")
  assert set(table["seed"]) == {0, 1}
  # Again: the linked run counts as reused, not as skipped; nothing runs.
  again = launch.launch_blocks(root / "b" / "ci", {"steps": 3}, blocks,
                               index=_fake_index(root), **quiet)
  assert again.reused == b.reused and again.skipped == b.launched and not again.launched
  (tmp_path / "out").mkdir()
  info = runner.run_info(tmp_path / "out", "b", "ci", root / "b" / "ci", b, 1.0, None, "basic",
                         {"commit": "c0", "clean": True})
  assert (info["reused"], info["launched"], info["n_runs_completed"]) == (1, 1, 2)
  assert info["runs_compute_s"] == 0.1  # the reused run's compute is sweep a's
  # Another code version, another seed or another step count: another run.
  c = launch.launch_blocks(root / "c" / "ci", {"steps": 3}, blocks[:1],
                           index=_fake_index(root, "c1"), **quiet)
  assert not c.reused and len(c.launched) == 2
  d = launch.launch_blocks(root / "d" / "ci", {"steps": 4}, blocks[:1],
                           index=_fake_index(root), **quiet)
  assert not d.reused


def test_run_key_reads_what_the_run_computes():
  from pergrad.sweep import run_key

  cfg = {"experiment": "a", "name": "a", "optimizer": {"lr": 0.1}, "train": {
      "seed": 0, "steps": 400, "out_dir": "/x", "compile_cache": "/c"},
         "data": {"tfds_dir": "/d", "seq_len": 64}, "logging": {"log_every": 10,
                                                                 "wandb": {"mode": "offline"}}}
  relabeled = json.loads(json.dumps(cfg))
  relabeled.update(experiment="b", name="b")
  relabeled["train"].update(out_dir="/y", compile_cache=None)
  relabeled["data"]["tfds_dir"] = "/e"
  relabeled["logging"]["wandb"]["mode"] = "disabled"
  assert run_key(relabeled, "c") == run_key(cfg, "c")
  for path, value in ((("train", "seed"), 1), (("train", "steps"), 401),
                      (("logging", "log_every"), 5), (("data", "seq_len"), 32)):
    other = json.loads(json.dumps(cfg))
    other[path[0]][path[1]] = value
    assert run_key(other, "c") != run_key(cfg, "c"), path
  assert run_key(cfg, "c2") != run_key(cfg, "c")


def test_training_version_follows_the_training_code_only(tmp_path):
  import subprocess

  from pergrad.sweep import training_version

  assert training_version(tmp_path) is None  # not a git checkout: nothing reused
  git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)
  git("init", "-q")
  files = {"pergrad/model.py": "x = 1\n", "pergrad/analysis/rules.py": "r = 1\n",
           "pergrad/sweep/launch.py": "l = 1\n",
           "configs/config.yaml": "a: 1\n", "experiments/snr.py": "s = 1\n",
           "tests/test_a.py": "t = 1\n", "README.md": "# r\n"}
  for path, text in files.items():
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(text)
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "a")
  v0 = training_version(tmp_path)
  assert len(v0) == 24 and training_version(tmp_path, "HEAD") == v0
  for path in ("pergrad/analysis/rules.py", "pergrad/sweep/launch.py", "experiments/snr.py",
               "tests/test_a.py", "README.md"):  # reports, sweeps, experiments, tests, docs
    (tmp_path / path).write_text("changed = 2\n")
  (tmp_path / "experiments/new.py").write_text("n = 1\n")
  assert training_version(tmp_path) == v0
  seen = {v0}
  # an experiment's declared block (stated effects, caps: the analysis's) leaves it too
  (tmp_path / "configs/config.yaml").write_text(
      "a: 1\ndeclared:  # stated\n  seed_cap:\n    value: 15\n    why: \"x\n      y\"\n")
  assert training_version(tmp_path) == v0
  (tmp_path / "configs/config.yaml").write_text("a: 1\ndeclared:\n  seed_cap:\n    value: 9\n")
  assert training_version(tmp_path) == v0
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "declared")
  assert training_version(tmp_path, "HEAD") == v0
  (tmp_path / "configs/config.yaml").write_text("a: 1\ndeclared:\n  x: 1\nb: 2\n")
  assert training_version(tmp_path) != v0  # a key after the block is the run's again
  for path, text in (("pergrad/model.py", "x = 2\n"), ("configs/config.yaml", "a: 2\n"),
                     ("pergrad/new.py", "n = 1\n")):  # changed, changed, untracked
    (tmp_path / path).write_text(text)
    assert (v := training_version(tmp_path)) not in seen
    seen.add(v)
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b")
  assert training_version(tmp_path) == v == training_version(tmp_path, "HEAD")
  assert training_version(tmp_path, "HEAD~1") == v0  # a commit's version, read from git


def test_training_imports_nothing_the_version_leaves_out():
  # training_version skips NOT_TRAINING (the reports' code): valid only while the trainer
  # never imports it.
  import subprocess

  from pergrad.sweep.reuse import NOT_TRAINING

  mods = [p.replace("/", ".") for p in NOT_TRAINING]
  code = ("import sys, pergrad.train.cli, pergrad.train.loop; "
          f"print([m for m in sys.modules if m.startswith({tuple(mods)!r})])")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       check=True).stdout
  assert out.strip() == "[]"



def test_a_sweep_of_other_training_code_is_refused_before_any_run(tmp_path):
  # A sweeps root resumed (or analysed) by a checkout whose training code differs from the one
  # its runs were trained with: one line, nothing launched or written.
  from pergrad.sweep import SWEEP_JSON, record_sweep

  sdir = default_sweep_dir("snr", "ci", tmp_path)
  record_sweep(sdir, "ci", record.get("snr").sweep_at("ci", None).base, (), "another")
  before = sorted(p.name for p in sdir.iterdir())
  with pytest.raises(ValueError, match="trained at training version another, not this"):
    runner.run_experiment("snr", "ci", sweeps_root=tmp_path, echo=lambda *_: None)
  assert sorted(p.name for p in sdir.iterdir()) == before == [SWEEP_JSON]


def test_reproduction_record_continues_across_commits_of_one_training_version(tmp_path,
                                                                               monkeypatch):
  """A stopped `all` resumed at a later commit whose training code is the same continues the
  record (the runs are the same runs) and analyses again what an older commit completed; at
  another training version it starts a new record."""
  mod = _reproduce_module()
  monkeypatch.setattr(mod.rec, "provenance", lambda: {"commit": "abc1234", "clean": True})
  monkeypatch.setattr(reproduction, "training_version", lambda repo, rev=None: "v1")
  path, cmd = tmp_path / "reproduction.json", "python scripts/reproduce.py all --preset cpu"
  first = mod.Record(path, cmd, fresh=True)
  first.experiment("a", {"wall_s": 10.0, "launch_wall_s": 9.0, "launched": 3, "skipped": 0,
                         "status": "completed"})
  first.begin("b")
  first._stop.set()
  monkeypatch.setattr(mod.rec, "provenance", lambda: {"commit": "def5678", "clean": True})
  second = mod.Record(path, cmd, fresh=False)
  second._stop.set()
  assert second.d["fresh"] is True and second.d["commit"] == "def5678"
  assert [i["commit"] for i in second.d["invocations"]] == ["abc1234", "def5678"]
  assert not second.finished_before("a")  # completed at abc1234: analysed again here
  second.experiment("a", {"wall_s": 1.0, "launch_wall_s": 9.0, "launched": 3, "skipped": 0,
                          "status": "completed"})  # run_info.json sums the launches
  assert second.d["experiments"]["a"] | {"wall_s": 0} == {
      "wall_s": 0, "launch_wall_s": 9.0, "launched": 3, "skipped": 0, "status": "completed",
      "commit": "def5678"}
  second._stop.set()
  third = mod.Record(path, cmd, fresh=False)
  third._stop.set()
  assert third.finished_before("a")
  text = "\n".join(report_md.reproduction_lines(tmp_path))
  assert "at commit `def5678`" in text and "at commits `abc1234` ×1, `def5678` ×2" in text
  monkeypatch.setattr(reproduction, "training_version", lambda repo, rev=None: "v2")
  other = mod.Record(path, cmd, fresh=False)
  other._stop.set()
  assert len(other.d["invocations"]) == 1 and other.d["train_version"] == "v2"


def test_run_info_sums_the_launches_of_one_training_version_across_commits(tmp_path):
  out, sdir = tmp_path / "out", tmp_path / "sweep"
  out.mkdir()
  sdir.mkdir()
  info = lambda log, commit, version: runner.run_info(
      out, "toy", "ci", sdir, log, 1.0, None, "basic", {"commit": commit, "clean": True}, version)
  info(LaunchLog(launched=["r0", "r1"], wall_s=10.0), "abc", "v1")
  again = info(LaunchLog(skipped=["r0", "r1"]), "def", "v1")  # analysed again at a new commit
  assert (again["launched"], again["launch_wall_s"], again["invocations"]) == (2, 10.0, 2)
  assert (again["commit"], again["train_version"]) == ("def", "v1")
  other = info(LaunchLog(launched=["r0"], wall_s=3.0), "def", "v2")  # other training code
  assert (other["launched"], other["launch_wall_s"], other["invocations"]) == (1, 3.0, 1)


def test_a_run_is_reused_only_whole_and_a_link_to_a_lost_run_is_run_again(tmp_path, fake_train):
  """A finished run whose metrics.jsonl was cut to its first records was reused ("final step
  4, eval loss inf"); a reused run whose source was deleted failed with "File exists ...
  checkpoints"."""
  import shutil

  root, cmd, said = tmp_path / "root", _fake_cmd(fake_train), []
  quiet = dict(train_cmd=cmd, echo=said.append)
  block = (Block({"optimizer.placement": ["ema"], "optimizer.lr": [0.1], "seed": [0]}),)
  name = "optimizer.lr=0.1,optimizer.placement=ema,seed=0"
  launch.launch_blocks(root / "a" / "ci", {"steps": 3}, block, index=_fake_index(root), **quiet)
  source = root / "a" / "ci" / name
  metrics = (source / "metrics.jsonl").read_text().splitlines()
  (source / "metrics.jsonl").write_text("\n".join(metrics[:4]) + "\n")  # cut at step 2 of 3
  b = launch.launch_blocks(root / "b" / "ci", {"steps": 3}, block, index=_fake_index(root),
                           **quiet)
  assert not b.reused and b.launched == [name]
  assert f"[reuse] not reusing {source}: it has metrics.jsonl ending at step 2, before its " \
         "last step 3; running it again." in said
  assert (root / "b" / "ci" / name / "launches.txt").read_text() == "x\n"  # trained here
  # c reuses b's whole run; then b's run is deleted: c's links are dropped, the run runs again.
  c = launch.launch_blocks(root / "c" / "ci", {"steps": 3}, block, index=_fake_index(root),
                           **quiet)
  assert c.reused == [name]
  shutil.rmtree(root / "b")
  said.clear()
  again = launch.launch_blocks(root / "c" / "ci", {"steps": 3}, block, index=_fake_index(root),
                               **quiet)
  assert again.launched == [name] and not again.failed and not again.reused
  assert said[0] == (f"[reuse] {name}: its source "
                     f"{(root / 'b' / 'ci' / name).resolve()} is gone; running it again.")
  assert runs.run_status(root / "c" / "ci" / name) == "completed"
  assert not (root / "c" / "ci" / name / "metrics.jsonl").is_symlink()


def test_no_run_reads_a_configs_declared_block():
  """`training_version` leaves a config's `declared:` block out: valid only while no training
  code reads it (the schema field alone, resumable: outside a run's identity). A run that read
  a declared value would change with it at an unchanged version: this test names it."""
  import re

  from pergrad.sweep.reuse import NOT_TRAINING

  reads = re.compile(r"\.declared\b|\[\s*[\"']declared[\"']\s*\]|get\(\s*[\"']declared[\"']")
  found = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "pergrad").rglob("*.py"))
           if not str(p.relative_to(REPO)).startswith(NOT_TRAINING)
           for i, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
  assert found == []
  schema = (REPO / "pergrad/config/schema.py").read_text()
  assert re.search(r"^\s*declared: Any = resumable\(None\)", schema, re.M)
