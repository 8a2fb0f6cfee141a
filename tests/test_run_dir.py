"""A refused run touches nothing: the checks that refuse a run directory come before any
write there (its `.hydra/` record is not overwritten), and no `outputs/<date>/<time>/`
folder is left behind when train.out_dir is given or the run fails before starting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import TRAIN

SHORT = ("train.steps=4", "train.eval_every=4", "train.checkpoint_every=4")


@pytest.fixture(scope="module")
def cache_env(compilation_cache):
  return compilation_cache


def _cli(args, cwd, env=None) -> subprocess.CompletedProcess:
  """`python scripts/train.py ARGS` run from `cwd` (where Hydra's outputs/ would go)."""
  env = {**os.environ, "WANDB_MODE": "disabled", **(env or {})}
  env.pop("HYDRA_FULL_ERROR", None)
  return subprocess.run([sys.executable, str(TRAIN), *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


def _tree(d):
  return sorted((str(p.relative_to(d)), p.read_bytes() if p.is_file() else None)
                for p in d.rglob("*"))


@pytest.mark.slow
def test_a_run_failing_at_start_leaves_no_folder(tmp_path, tiny_overrides):
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  out = _cli([*tiny_overrides, "data.seq_len=64"], cwd)
  assert out.returncode == 1 and "data.seq_len=64 exceeds model.seq_len=32" in out.stderr
  assert not any(cwd.iterdir())
  missing = tmp_path / "no_corpus"
  out = _cli([*tiny_overrides, "data=txt_folder", f"data.path={missing}",
              f"data.tfds_dir={tmp_path / 'tfds'}", f"train.out_dir={tmp_path / 'run'}"], cwd)
  assert out.returncode == 1 and str(missing) in out.stderr, out.stderr
  assert not (tmp_path / "run").exists() and not any(cwd.iterdir())


@pytest.mark.slow
@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_an_accepted_run_records_its_invocation_and_a_refused_one_touches_nothing(
    tmp_path, tiny_overrides, cache_env):
  """With train.out_dir given, Hydra's record goes under the run directory, written by the
  run once it started; the output holds no INFO lines (JAX's libtpu probe), and Hydra leaves
  no folder or cli.log in the working directory. A second run into that directory with
  another lr was refused, but had already overwritten <run>/.hydra/overrides.yaml (lr 0.01
  for a run trained at 0.003) and left outputs/<date>/<time>/: now it touches nothing."""
  d, cwd = tmp_path / "run", tmp_path / "cwd"
  cwd.mkdir()
  out = _cli([*tiny_overrides, *SHORT, "optimizer.lr=0.003", f"train.out_dir={d}"], cwd,
             cache_env)
  assert out.returncode == 0, out.stderr[-3000:]
  assert (d / ".hydra" / "overrides.yaml").read_text().splitlines()[-2:] == [
      "- optimizer.lr=0.003", f"- train.out_dir={d}"]
  assert {p.name for p in (d / ".hydra").iterdir()} == {"config.yaml", "hydra.yaml",
                                                          "overrides.yaml"}
  assert not any(cwd.iterdir()) and not list(d.glob("*.log"))
  assert "libtpu" not in out.stdout + out.stderr and "INFO" not in out.stdout + out.stderr

  before = _tree(d)
  out = _cli([*tiny_overrides, *SHORT, "optimizer.lr=0.01", f"train.out_dir={d}"], cwd,
             cache_env)
  assert out.returncode == 1
  assert out.stderr.startswith(f"error: {d} holds a run with a different config "
                               "(optimizer.lr: 0.003 -> 0.01)"), out.stderr
  assert _tree(d) == before and not any(cwd.iterdir())
