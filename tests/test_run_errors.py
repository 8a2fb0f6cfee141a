"""Bad settings fail before any compute, in one line naming the key and the fix (the
config and the plan's checks seen from the command line and from `run`)."""

from __future__ import annotations

import pytest
from conftest import compose, run_cli

from pergrad.config import build_plan
from pergrad.train.loop import run

BASE = ("train.steps=12", "train.eval_every=6", "train.checkpoint_every=6",
        "logging.log_every=1", "optimizer.lr=1e-2")  # tests/test_train.py's


def _train(tmp, overrides, extra=()):
  return run(build_plan(compose([*overrides, *BASE, *extra])), tmp, echo=lambda _: None)


@pytest.mark.parametrize("override,expect", [
    ("optimizer.lrr=1", ["unknown key optimizer.lrr", "did you mean optimizer.lr?"]),
    ("+train.stepz=20", ["unknown key train.stepz", "did you mean train.steps?"]),
    ("optimizer.name=adamx", ["optimizer.name=adamx", "'sgd', 'momentum', 'adam', 'adamw'",
                              "optimizer=<name>"]),
    ("model=huge", ["Could not find 'model/huge'", "tiny", "small", "paper"]),
    ("train.steps=many", ["train.steps", "could not be converted to Integer"]),
])
def test_config_errors_are_short_and_name_the_key(override, expect, tmp_path):
  out = run_cli([override, f"hydra.run.dir={tmp_path}"], timeout=120)
  assert out.returncode != 0
  text = out.stdout + out.stderr
  for e in expect:
    assert e in text, text
  assert "Traceback" not in text and len(text.splitlines()) < 20, text
  assert "+train" not in text and "To append" not in text, text  # no hint toward `+key`
  assert not (tmp_path / "config.yaml").exists()


@pytest.mark.parametrize("name", ["pergrad_schema", "optimizer_adam_schema"])
def test_internal_schema_nodes_cannot_be_the_primary_config(name, tmp_path):
  """`--config-name=pergrad_schema` trained the bare dataclass defaults (SGD, not the
  documented AdamW) with rc 0; `optimizer_adam_schema` was a raw traceback."""
  out = run_cli([f"--config-name={name}", f"train.out_dir={tmp_path / 'run'}"], timeout=120)
  assert out.returncode == 1
  assert out.stderr.strip() == (
      f"error: --config-name={name} is an internal schema node (the dataclass defaults Hydra "
      "checks configs against), not a config; choose one of ['config'] (the default: "
      "config), and pick an experiment with experiment=<name>."), out.stderr
  assert not (tmp_path / "run").exists()


def test_bad_sizes_are_one_line_errors_before_compute(tmp_path, tiny_overrides):
  with pytest.raises(ValueError, match=r"data.seq_len=64 exceeds model.seq_len=32"):
    _train(tmp_path, tiny_overrides, ("data.seq_len=64",))
  with pytest.raises(ValueError, match=r"tokenizer has \d+ tokens .* model.vocab_size=100"):
    _train(tmp_path, tiny_overrides, ("model.vocab_size=100",))
  assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("extra,match", [
    (("optimizer=sign", "optimizer.placement=token", "stats.backend=vmap"),
     r"granularity='token' is not supported by backend='vmap'.*backend='surgery'"),
    (("optimizer=sign", "optimizer.placement=token", "optimizer.per_example_clip=1.0"),
     r"per_example_clip clips whole examples and cannot go with granularity='token'"),
    (("optimizer=sign", "optimizer.b1=1.0"), r"optimizer.b1=1.0 is outside \[0, 1\)"),
    (("optimizer=adam_family", "optimizer.eps=-1"), r"optimizer.eps=-1.0 .* must be >= 0"),
])
def test_optimizer_and_backend_mismatch_fails_before_compute(tmp_path, tiny_overrides, extra,
                                                              match):
  with pytest.raises(ValueError, match=match):
    _train(tmp_path, tiny_overrides, extra)
  assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "metrics.jsonl").exists()


def test_batch_not_divisible_by_devices_is_one_line(tmp_path, tiny_overrides):
  out = run_cli([*tiny_overrides, "data.batch_size=7", f"hydra.run.dir={tmp_path}"],
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}, timeout=120)
  assert out.returncode == 1
  assert "error: data.batch_size=7 is not divisible by the 2 devices" in out.stderr
  assert "Traceback" not in out.stderr, out.stderr[-2000:]


def test_bad_microbatch_is_reported_before_compiling(tmp_path, tiny_overrides):
  with pytest.raises(ValueError, match=r"stats.microbatch_size=3 must be a positive divisor "
                                       r"of the batch size B=8"):
    _train(tmp_path, tiny_overrides, ("stats=vmap", "stats.log_every=6",
                                      "stats.microbatch_size=3"))
  assert not any(tmp_path.iterdir())
