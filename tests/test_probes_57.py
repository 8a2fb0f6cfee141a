"""Nothing taken for what it is not: a typo'd config group option, a damaged or vanished run
reused, a resume on other data or another length, two runs in one directory, and a dry run
that passes what the run refuses. Each probe is refused in one line naming the fix (or
behaves honestly), `--dry-run` and the real run agree, and nothing already written is lost."""

from __future__ import annotations

import json

import pytest
from conftest import compose, run_cli
from hydra.errors import MissingConfigException


@pytest.mark.parametrize("override,near", [
    ("experiment=sign_placment", "did you mean experiment=sign_placement?"),
    ("scale=cii", "did you mean scale=ci?"),
    ("optimizer=sgn", "did you mean optimizer=sign?"),
])
def test_a_config_group_option_that_does_not_exist_is_refused_with_the_closest(override, near):
  """`experiment=sign_placment` and `scale=cii` trained the defaults (both groups were
  `optional` in the defaults list, and Hydra skips a missing optional config)."""
  group, choice = override.split("=")
  with pytest.raises(MissingConfigException) as e:
    compose([override])
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith(f"Could not find '{group}/{choice}'"), msg
  assert msg.endswith(near) and "the choices are " in msg, msg
  assert compose([]).get("experiment") is None  # no experiment, no scale: still the defaults


@pytest.mark.parametrize("dry", [True, False])
def test_a_typod_experiment_stops_a_run_and_a_dry_run_alike(tmp_path, dry):
  out = run_cli([*(["--dry-run"] if dry else []), "experiment=nope", "train.steps=2",
                 f"train.out_dir={tmp_path / 'run'}"], timeout=120)
  assert out.returncode == 1, out.stdout[-2000:]
  assert out.stderr.splitlines()[0] == (
      "Could not find 'experiment/nope': experiment=nope is no config of configs/experiment/; "
      "the choices are batch_scaling, gns_layers, gns_ramp, gns_schedule, ladder, "
      "lr_exponent, moments, msq_eps, norm_cost, overhead, preconditioner, quickstart, "
      "sign_placement, snr"), out.stderr
  assert "Traceback" not in out.stderr and not (tmp_path / "run").exists()


SHORT = ("train.steps=4", "train.eval_every=2", "train.checkpoint_every=2")


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_overrides, compilation_cache):
  """A tiny run of 4 steps, completed (checkpoints at 2 and 4); tests copy it."""
  from pergrad.config import build_plan
  from pergrad.train.loop import run

  d = tmp_path_factory.mktemp("finished") / "run"
  run(build_plan(compose([*tiny_overrides, *SHORT])), d, echo=lambda _: None)
  return d


def test_a_run_is_whole_only_with_its_metrics_and_last_checkpoint(finished, tmp_path):
  import shutil

  from pergrad.sweep import is_whole

  assert is_whole(finished) is None
  cut = shutil.copytree(finished, tmp_path / "cut")
  lines = (cut / "metrics.jsonl").read_text().splitlines()
  (cut / "metrics.jsonl").write_text("\n".join(lines[:3]) + "\n")  # up to eval at 2
  assert is_whole(cut) == "has metrics.jsonl ending at step 2, before its last step 4"
  damaged = shutil.copytree(finished, tmp_path / "damaged")
  for p in (damaged / "checkpoints" / "4" / "default").rglob("ocdbt.process_*"):
    shutil.rmtree(p)
  assert is_whole(damaged).startswith(
      f"has a checkpoint that cannot be read: {damaged / 'checkpoints' / '4'} cannot be read")
  lost = shutil.copytree(finished, tmp_path / "lost")
  shutil.rmtree(lost / "checkpoints" / "4")
  assert is_whole(lost) == (f"has a checkpoint that cannot be read: {lost / 'checkpoints' / '4'}"
                            " does not exist")


def _train(d, overrides):
  from pergrad.config import build_plan
  from pergrad.train.loop import run

  return run(build_plan(compose(overrides)), d, echo=lambda _: None)


def _refused_alike(d, overrides, match):
  """`run` and `dry_run` refuse `overrides` on `d` with the same line; nothing written."""
  from pergrad.config import build_plan
  from pergrad.train.dry_run import dry_run

  before = {p: p.stat().st_mtime_ns for p in d.rglob("*")}
  with pytest.raises(ValueError, match=match) as real:
    _train(d, overrides)
  with pytest.raises(ValueError) as dry:
    dry_run(build_plan(compose(overrides)), d)
  assert str(dry.value) == str(real.value) and "\n" not in str(real.value)
  assert {p: p.stat().st_mtime_ns for p in d.rglob("*")} == before
  return str(real.value)


def test_a_resume_on_other_data_is_refused_naming_the_difference(tmp_path, tiny_overrides,
                                                                  compilation_cache):
  """A run resumed after its text folder changed (3 documents -> 4) continued from its
  checkpoint without a word."""
  folder = tmp_path / "texts"
  folder.mkdir()
  for i in range(3):
    (folder / f"doc{i}.txt").write_text(f"Document {i}: the quick brown fox. " * 40)
  over = [*tiny_overrides, "data=txt_folder", f"data.path={folder}", "schedule=constant",
          *SHORT]
  d = tmp_path / "run"
  _train(d, [*over, "train.steps=2"])  # then extended to 4 steps
  (folder / "doc3.txt").write_text("One more document, longer than the others. " * 80)
  msg = _refused_alike(d, over, r"holds a run trained on other data \(")
  assert "bytes: 3960 -> 7400; content: '" in msg and "documents: 3 -> 4" in msg, msg
  assert msg.endswith("put that data back (data.path, data.tokenizer's cache in data.tfds_dir)"
                      ", or set another train.out_dir."), msg
  (folder / "doc3.txt").unlink()  # the data it started on: it resumes
  assert _train(d, over)["resumed_from"] == 2


def test_a_finished_run_is_never_shortened_and_extended_on_purpose(tmp_path, tiny_overrides,
                                                                   compilation_cache):
  """A run finished at 600 steps, re-invoked with train.steps=200: "completed", summary.json
  said "steps": 200, "last_step": 600. With a constant schedule train.steps may grow (the
  run is extended, as documented in pergrad.config.plan), never shrink."""
  over = [*tiny_overrides, "schedule=constant", *SHORT]
  d = tmp_path / "run"
  _train(d, over)
  msg = _refused_alike(d, [*over, "train.steps=2"], "trained past train.steps=2")
  assert msg == (f"{d} holds a run trained past train.steps=2 (32 examples, 4 steps of 8); a "
                 "run is never shortened: set train.steps=4 or more to keep (or extend) it, or "
                 "set another train.out_dir.")
  longer = _train(d, [*over, "train.steps=6"])
  assert (longer["status"], longer["steps"], longer["last_step"], longer["resumed_from"]) == (
      "completed", 6, 6, 4)
  cosine = [*tiny_overrides, *SHORT]  # with a decaying schedule the length is the run's
  _train(tmp_path / "cos", cosine)
  with pytest.raises(ValueError, match=r"holds a run with a different config \(train.steps: "
                                       r"4 -> 2\)"):
    _train(tmp_path / "cos", [*cosine, "train.steps=2"])


def _hold(d):
  """A process that holds `d`'s run lock until killed (as a run training there would)."""
  import subprocess
  import sys
  import time

  from conftest import REPO

  code = ("import sys, time; from pergrad.train.run_dir import locked\n"
          "with locked(sys.argv[1], echo=lambda _: None):\n"
          "  print('held', flush=True); time.sleep(600)")
  proc = subprocess.Popen([sys.executable, "-c", code, str(d)], cwd=REPO,
                          stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "held"
  time.sleep(0.1)
  return proc


def test_one_run_per_directory_and_a_dead_holders_lock_is_taken_over(tmp_path, tiny_overrides,
                                                                      compilation_cache):
  """Two runs started at once on one train.out_dir both trained to the end, and one started
  late made the first fail to write its checkpoint."""
  import os
  import socket

  from pergrad.config import build_plan
  from pergrad.train.dry_run import dry_run

  d = tmp_path / "run"
  over = [*tiny_overrides, *SHORT]
  holder = _hold(d)
  try:
    line = (f"{d} is in use by another run (pid {holder.pid} on {socket.gethostname()} since ")
    with pytest.raises(ValueError, match="is in use by another run") as real:
      _train(d, over)
    assert str(real.value).startswith(line) and str(real.value).endswith(
        "); one run per directory at a time: wait for it to end, or set another train.out_dir.")
    with pytest.raises(ValueError) as dry:
      dry_run(build_plan(compose(over)), d)
    assert str(dry.value) == str(real.value)
    out = run_cli([*over, f"train.out_dir={d}"], env=compilation_cache, timeout=120)
    assert out.returncode == 1 and out.stderr == f"error: {real.value}\n", out.stderr
    assert sorted(p.name for p in d.iterdir()) == ["run.lock"]  # nothing written beside it
  finally:
    holder.kill()  # SIGKILL: its lock file stays behind, its lock goes with it
    holder.wait()
  said = []
  from pergrad.train.loop import run

  summary = run(build_plan(compose(over)), d, echo=said.append)
  assert summary["status"] == "completed" and not (d / "run.lock").exists()
  assert said[0].startswith(f"[pergrad] note: took over {d / 'run.lock'} left by pid "
                            f"{holder.pid} on {socket.gethostname()} since "), said[0]
  assert said[0].endswith(", which is no longer running.") and os.getpid() != holder.pid


def _both_refuse(d, overrides, exc):
  """The one-line errors of `run` and `dry_run` for `overrides` on `d` (which must agree)."""
  from pergrad.config import build_plan
  from pergrad.train.dry_run import dry_run

  with pytest.raises(exc) as real:
    _train(d, overrides)
  with pytest.raises(exc) as dry:
    dry_run(build_plan(compose(overrides)), d)
  assert str(dry.value) == str(real.value) and "\n" not in str(real.value)
  return str(real.value)


@pytest.fixture()
def no_jax_cache():
  """JAX's own compilation cache setting off (it wins over train.compile_cache) meanwhile."""
  import jax

  old = jax.config.jax_compilation_cache_dir
  jax.config.update("jax_compilation_cache_dir", None)
  yield
  jax.config.update("jax_compilation_cache_dir", old)


def test_dry_run_refuses_what_the_run_refuses(tmp_path, tiny_overrides, no_jax_cache):
  """--dry-run passed an out dir under a file and a 12-token corpus, which the run then
  refused; train.compile_cache pointing at a file said "set train.out_dir"."""
  from pergrad.data import DataError
  from pergrad.train.checkpoint import OutputError

  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  over = [*tiny_overrides, "train.steps=2"]
  assert _both_refuse(a_file / "run", over, OutputError) == (
      f"cannot write the run directory {a_file / 'run'} ({a_file} is a file, not a folder); "
      "set train.out_dir to a writable folder.")
  assert _both_refuse(tmp_path / "r1", [*over, f"train.compile_cache={a_file}"], ValueError) == (
      f"train.compile_cache={a_file}: cannot keep the compilation cache in {a_file} ({a_file} "
      "is a file, not a folder); set train.compile_cache to a writable folder, or to null for "
      "none.")
  texts = tmp_path / "texts"
  texts.mkdir()
  (texts / "a.txt").write_text("hello")
  (texts / "b.txt").write_text("world!")
  short = [*over, "data=txt_folder", f"data.path={texts}"]
  assert _both_refuse(tmp_path / "r2", short, DataError) == (
      "the train split of data.name=txt_folder has 7 tokens, fewer than data.seq_len+1=33; "
      "lower data.seq_len or add text.")
  bpe = [*short, "data.tokenizer=bpe", "data.vocab_size=256"]  # not prepared: a bound
  from pergrad.config import build_plan
  from pergrad.train.dry_run import dry_run

  with pytest.raises(DataError, match=r"the train split of data.name=txt_folder has at most 6 "
                                      r"tokens, fewer than data.seq_len\+1=33"):
    dry_run(build_plan(compose(bpe)), tmp_path / "r3")
  assert not any(p.name.startswith("r") for p in tmp_path.iterdir())  # no run directory left


@pytest.mark.extended  # the CLI's line of test_dry_run_refuses_what_the_run_refuses (~15 s)
def test_dry_run_cli_and_run_cli_agree_on_a_bad_compile_cache(tmp_path, tiny_overrides):
  a_file = tmp_path / "a_file"
  a_file.write_text("x")
  args = [*tiny_overrides, "train.steps=2", f"train.out_dir={tmp_path / 'run'}",
          f"train.compile_cache={a_file}"]
  real, dry = run_cli(args, timeout=120), run_cli(["--dry-run", *args], timeout=120)
  assert real.returncode == dry.returncode == 1
  assert real.stderr == dry.stderr == (
      f"error: train.compile_cache={a_file}: cannot keep the compilation cache in {a_file} "
      f"({a_file} is a file, not a folder); set train.compile_cache to a writable folder, or "
      "to null for none.\n"), real.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_reproduce_ends_a_bad_override_or_a_garbage_archive_in_one_line(tmp_path, capsys):
  """reproduce.py with a bad override ended in a RuntimeError traceback (after its runs
  failed); a garbage carry-in archive in tarfile.ReadError."""
  from test_record import _reproduce_module

  from pergrad.sweep import carry

  repro = _reproduce_module()
  root = tmp_path / "sweeps"
  with pytest.raises(SystemExit) as e:
    repro.main(["snr", "--preset", "ci", "--hydra-arg", "train.stpes=3", "--sweeps-root",
                str(root)])
  assert e.value.code == ("error: --hydra-arg train.stpes=3: unknown key train.stpes: the "
                          "config has no such field; did you mean train.steps?")
  assert not root.exists()  # nothing launched
  garbage = tmp_path / "carry.tar.xz"
  garbage.write_bytes(bytes(range(256)) * 4)
  line = (f"{garbage}: not a readable carried archive (.tar.xz: not an lzma file); make one "
          "with `scripts/reproduce.py --carry-out FILE`")
  with pytest.raises(ValueError) as v:
    carry.unpack(garbage, root, tmp_path / "record.json")
  assert str(v.value) == line
  with pytest.raises(SystemExit) as e:
    repro.main(["all", "--preset", "ci", "--carry-in", str(garbage), "--sweeps-root", str(root)])
  assert e.value.code == f"error: {line}" and not root.exists()
  assert "Traceback" not in capsys.readouterr().err


def test_a_finished_variable_batch_run_is_not_past_its_own_budget(tmp_path):
  """A batch schedule stops at the first update reaching E = train.steps x B_max, so a finished
  ramp holds up to B_max − 1 examples past E: re-invoked with its own train.steps it is not
  'trained past' (it was refused, advising one more step); one step fewer still is."""
  from types import SimpleNamespace

  from pergrad.train.run_dir import check_not_past, is_past

  d = tmp_path / "ramp"
  d.mkdir()
  (d / "summary.json").write_text(json.dumps({"status": "completed", "examples_seen": 12832}))
  check_not_past(d, SimpleNamespace(steps=100), 128)  # E = 12,800: its own budget
  with pytest.raises(ValueError, match=r"trained past train.steps=99 \(12,832 examples"):
    check_not_past(d, SimpleNamespace(steps=99), 128)
  assert not is_past(100 * 8, 100, 8) and is_past(101 * 8, 100, 8)  # fixed B: exact
  assert not is_past(100 * 128 + 127, 100, 128) and is_past(100 * 128 + 128, 100, 128)
