"""A stopped reproduction carried to another machine (`pergrad.sweep.carry`): packed where it
stopped, unpacked under another sweeps root, it continues there without training a finished
run again; an unfinished run starts again; nothing already there is overwritten. The sweeps
use test_experiments' fake training entry (no JAX)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile

import pytest
from test_experiments import FAKE_TRAIN, REPO, _fake_cmd
from test_reuse import _fake_index

from pergrad.sweep import Block, carry, launch

BASE = {"steps": 3}
A = (Block({"optimizer.placement": ["ema"], "optimizer.lr": [0.1, 0.3], "seed": [0]}),)
B = (Block({"optimizer.placement": ["ema"], "optimizer.lr": [0.1], "seed": [0, 1]}),)


@pytest.fixture()
def stopped(tmp_path):
  """A sweeps root where sweep a finished, sweep b reused one of a's runs and trained one,
  and a third run of b stopped half-way (metrics, no summary); its record."""
  fake = tmp_path / "fake_train.py"
  fake.write_text(FAKE_TRAIN)
  root, quiet = tmp_path / "here", dict(train_cmd=_fake_cmd(fake), echo=lambda *_: None)
  launch.launch_blocks(root / "a" / "ci", BASE, A, index=_fake_index(root), **quiet)
  b = launch.launch_blocks(root / "b" / "ci", BASE, B, index=_fake_index(root), **quiet)
  assert len(b.reused) == 1 and len(b.launched) == 1
  done = root / "a" / "ci" / "optimizer.lr=0.1,optimizer.placement=ema,seed=0"
  for left_out in ("checkpoints/100/state", "wandb/offline-run/x"):
    (done / left_out).parent.mkdir(parents=True)
    (done / left_out).write_text("big")
  (done / "train.log").write_text("log")
  half = root / "b" / "ci" / "optimizer.lr=0.1,optimizer.placement=ema,seed=2"
  half.mkdir()
  (half / "metrics.jsonl").write_text('{"step": 1, "split": "train", "loss": 1.0}\n')
  started = root / "b" / "ci" / "optimizer.lr=0.1,optimizer.placement=ema,seed=3"
  started.mkdir()  # a run that has written its config only
  (started / "config.yaml").write_text("seed: 3\n")
  record = tmp_path / "results" / "reproduction.json"
  (record.parent / "a").mkdir(parents=True)
  (record.parent / "old.md").write_text("committed before")  # not this reproduction's
  os.utime(record.parent / "old.md", (0, 0))
  record.write_text(json.dumps({"command": "all", "started": "2026-11-29T08:00:00",
                                "experiments": {"a": {}}, "invocations": []}))
  (record.parent / "a" / "report.json").write_text('{"verdict": "reproduced"}')  # a's report
  return root, record, quiet


def test_a_carried_reproduction_continues_elsewhere_training_nothing_twice(tmp_path, stopped):
  root, record, quiet = stopped
  packed = carry.pack(root, record, tmp_path / "carry.tar.xz")
  assert packed["runs"] == 3  # a's two, b's own; b's reused run is links, its half run left out
  assert packed["results"] == 1  # a's report, not what was there before the reproduction
  with tarfile.open(tmp_path / "carry.tar.xz") as tar:  # no machine's path inside
    texts = [tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()]
  assert not any(str(root) in t or str(REPO) in t or str(tmp_path) in t for t in texts)
  assert any(carry.ROOT in t for t in texts)  # Hydra's records name the run's directory
  shutil.rmtree(root)  # the machine is gone: only the archive is left
  record.unlink()
  there, record_there = tmp_path / "there", tmp_path / "other" / "reproduction.json"
  out = carry.unpack(tmp_path / "carry.tar.xz", there, record_there)
  assert out["runs"] == 3 and json.loads(record_there.read_text())["experiments"] == {"a": {}}
  assert (record_there.parent / "a" / "report.json").read_text() == '{"verdict": "reproduced"}'
  assert not (record_there.parent / "old.md").exists()

  done = there / "a" / "ci" / "optimizer.lr=0.1,optimizer.placement=ema,seed=0"
  assert (done / "summary.json").exists() and (done / ".hydra" / "overrides.yaml").exists()
  assert not any((done / x).exists() for x in ("checkpoints", "wandb", "train.log"))
  assert not any((there / "b" / "ci" / f"optimizer.lr=0.1,optimizer.placement=ema,seed={s}")
                 .exists() for s in (2, 3))  # unfinished: they start again
  linked = there / "b" / "ci" / "optimizer.lr=0.1,optimizer.placement=ema,seed=0"
  assert (linked / "metrics.jsonl").is_symlink()
  assert (linked / "metrics.jsonl").resolve() == (done / "metrics.jsonl").resolve()
  hydra = (done / ".hydra" / "hydra.yaml").read_text()
  assert str(there) in hydra and carry.ROOT not in hydra  # the paths of where it now lies
  index = _fake_index(there)
  key = index.key(launch.run_overrides(BASE, B[0], {"optimizer.placement": "ema",
                                                   "optimizer.lr": 0.1, "seed": 0}, ()))
  assert index.find(key) == done.resolve()  # the index names the run under the new root

  again = launch.launch_blocks(there / "b" / "ci", BASE, B + (Block(
      {"optimizer.placement": ["ema"], "optimizer.lr": [0.1], "seed": [2]}),),
      index=index, **quiet)
  assert again.launched == ["optimizer.lr=0.1,optimizer.placement=ema,seed=2"]
  assert (done / "launches.txt").read_text() == "x\n"  # trained once, on the first machine


def test_unpacking_over_runs_or_another_record_refuses_and_writes_nothing(tmp_path, stopped):
  root, record, _ = stopped
  archive = tmp_path / "carry.tar.xz"
  carry.pack(root, record, archive)
  before = sorted(p for p in root.rglob("*"))
  with pytest.raises(ValueError, match="exist already"):
    carry.unpack(archive, root, record)
  assert sorted(p for p in root.rglob("*")) == before

  other = tmp_path / "other.json"
  other.write_text(json.dumps({"command": "all", "experiments": {}, "invocations": []}))
  with pytest.raises(ValueError, match="another reproduction, unfinished"):
    carry.unpack(archive, tmp_path / "empty", other)
  assert not (tmp_path / "empty").exists()
  other.write_text(json.dumps({"command": "all", "finished": "2026-11-28T00:00:00"}))
  assert carry.unpack(archive, tmp_path / "empty", other)["runs"] == 3  # a finished one: replaced

  evil = tmp_path / "evil.tar.xz"  # a link out of the root: refused, nothing written
  with tarfile.open(evil, "w:xz") as tar:
    tar.add(record, arcname=carry.RECORD)
    link = tarfile.TarInfo("runs/a/ci/x/metrics.jsonl")
    link.type, link.linkname = tarfile.SYMTYPE, "../../../../etc/passwd"
    tar.addfile(link)
  with pytest.raises(ValueError, match="lies outside the sweeps root"):
    carry.unpack(evil, tmp_path / "evil_root", tmp_path / "evil.json")
  assert not (tmp_path / "evil_root").exists() and not (tmp_path / "evil.json").exists()

  with pytest.raises(FileNotFoundError, match="no reproduction record"):
    carry.pack(root, tmp_path / "none.json", tmp_path / "x.tar.xz")


def test_the_cli_carries_out_alone_and_a_carried_in_record_keeps_its_command(tmp_path, stopped,
                                                                              monkeypatch):
  from test_record import _reproduce_module

  root, record, _ = stopped
  repro = _reproduce_module()
  monkeypatch.setattr(repro.runner, "RESULTS", tmp_path / "results")
  (tmp_path / "results" / "cpu").mkdir(parents=True)
  record.rename(tmp_path / "results" / "cpu" / "reproduction.json")
  out = tmp_path / "c.tar.xz"
  assert repro.main(["--carry-out", str(out), "--sweeps-root", str(root)]) == 0 and out.exists()
  with pytest.raises(SystemExit):  # packing before a run: refused
    repro.main(["all", "--carry-out", str(out), "--sweeps-root", str(root)])
  seen = {}

  def record_then_stop(path, command, fresh):  # the record `all` would continue; no training
    seen["command"] = command
    raise KeyboardInterrupt

  monkeypatch.setattr(repro, "Record", record_then_stop)
  (tmp_path / "results" / "cpu" / "reproduction.json").unlink()
  with pytest.raises(KeyboardInterrupt):
    repro.main(["all", "--carry-in", str(out), "--sweeps-root", str(tmp_path / "new"),
                "--launcher", "joblib"])
  assert seen["command"].endswith(f"--sweeps-root {tmp_path / 'new'} --launcher joblib")
  assert "--carry-in" not in seen["command"] and (tmp_path / "new" / "a").is_dir()


def test_a_file_the_checkout_holds_as_committed_is_not_carried(tmp_path, stopped):
  """A carried archive that a pull brought in beside the record (newer than its start, but
  not written by the reproduction) stays out; a report the reproduction rewrote travels."""
  root, record, _ = stopped
  git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],
                                  cwd=tmp_path, check=True, capture_output=True)
  git("init", "-q")  # the checkout holding results/ (the record's folder)
  (record.parent / "carry.tar.xz").write_bytes(b"an earlier carry")
  git("add", "results/carry.tar.xz", "results/a/report.json")
  git("commit", "-qm", "carried")
  (record.parent / "a" / "report.json").write_text('{"verdict": "partly reproduced"}')
  carry.pack(root, record, tmp_path / "out.tar.xz")
  with tarfile.open(tmp_path / "out.tar.xz") as tar:
    names = [m.name for m in tar.getmembers() if m.name.startswith("results/")]
  assert names == ["results/a/report.json"]


def test_a_commit_that_adds_only_results_keeps_the_experiments_it_finished(tmp_path):
  import subprocess

  from pergrad.sweep import record

  git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a],
                                  cwd=tmp_path, capture_output=True, text=True,
                                  check=True).stdout.strip()
  git("init", "-q")
  (tmp_path / "code.py").write_text("x = 1\n")
  git("add", "-A")
  git("commit", "-qm", "code")
  code = git("rev-parse", "HEAD")
  (tmp_path / "results" / "cpu").mkdir(parents=True)
  (tmp_path / "results" / "cpu" / "carry.tar.xz").write_bytes(b"runs")
  git("add", "-A")
  git("commit", "-qm", "the carried runs")
  carried = git("rev-parse", "HEAD")
  (tmp_path / "code.py").write_text("x = 2\n")
  git("commit", "-qam", "a change of code")
  changed = git("rev-parse", "HEAD")
  assert record.same_code(code, carried, tmp_path)  # its reports stand: not analysed again
  assert not record.same_code(code, changed, tmp_path)  # analysed again at the new code
  assert not record.same_code(code, "unknown", tmp_path) and not record.same_code(None, code)


def test_the_run_layout_carry_reads_is_the_one_training_writes():
  from pergrad.config.plan import CONFIG
  from pergrad.sweep import reuse
  from pergrad.train.checkpoint import CHECKPOINTS
  from pergrad.train.run_dir import RECORD

  assert (carry.CONFIG, carry.RECORD_DIR, carry.LEFT_OUT[0]) == (CONFIG, RECORD, CHECKPOINTS)
  assert reuse.CHECKPOINTS == CHECKPOINTS
