"""The scale presets (configs/scale/): `scale=<preset>` composes to the sizes every
experiment ran at, under every experiment's config, and a sweep's multirun command runs
the installed entry point at that scale."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import compose
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pergrad.sweep import (  # noqa: E402
  PRESETS,
  RUNG_PRESETS,
  launch,
  record,
  scale_file,
)

# The scale of every preset as it was set before configs/scale/ (command-line overrides
# of every run): `scale=<preset>` must resolve to exactly these values.
OLD_SCALE = {
    "ci": {
        "model.n_layers": 1, "model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64,
        "model.vocab_size": 256, "model.seq_len": 32,
        "data.tokenizer": "byte", "data.vocab_size": 256, "data.seq_len": 32,
        "data.batch_size": 8, "data.eval_batch_size": 8,
        "train.steps": 20, "train.eval_every": 10, "train.eval_batches": 2,
        "train.checkpoint_every": 10, "schedule.warmup_steps": 2,
        "logging.log_every": 5, "logging.progress": False, "logging.wandb.mode": "disabled",
    },
    "cpu": {
        "model.n_layers": 2, "model.d_model": 128, "model.n_heads": 4, "model.d_ff": 512,
        "model.vocab_size": 1024, "model.seq_len": 64,
        "data.tokenizer": "bpe", "data.vocab_size": 1024, "data.seq_len": 64,
        "data.batch_size": 32, "data.eval_batch_size": 32,
        "train.steps": 400, "train.eval_every": 50, "train.eval_batches": 4,
        "train.checkpoint_every": 100, "schedule.warmup_steps": 20,
        "logging.log_every": 10, "logging.progress": False, "logging.wandb.mode": "disabled",
    },
    "paper": {
        "model.n_layers": 6, "model.d_model": 512, "model.n_heads": 8, "model.d_ff": 2048,
        "model.vocab_size": 32768, "model.seq_len": 512, "model.compute_dtype": "bfloat16",
        "data.name": "c4", "data.tokenizer": "bpe", "data.vocab_size": 32768,
        "data.seq_len": 512, "data.batch_size": 256, "data.eval_batch_size": 256,
        "train.steps": 20000, "train.eval_every": 1000, "train.eval_batches": 16,
        "train.checkpoint_every": 1000, "schedule.warmup_steps": 1000,
        "logging.log_every": 50, "logging.progress": False, "logging.wandb.mode": "offline",
    },
}


OWN_MODEL = {"model.n_layers": 2, "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 64}


def _value(cfg, key):
  v = OmegaConf.select(cfg, key)
  return getattr(v, "value", v)  # enums of the typed schema -> their string


@pytest.mark.parametrize("preset", PRESETS)
def test_scale_presets_compose_to_the_old_values(preset):
  on_disk = {p.stem for p in scale_file("ci").parent.glob("*.yaml")}
  assert set(PRESETS) == set(OLD_SCALE) == on_disk - set(RUNG_PRESETS)  # rungs: test_ladder.py
  for experiment in (None, *[n for n in record.builtin() if record.get(n).sweep is not None]):
    overrides = [f"scale={preset}"] + ([f"experiment={experiment}"] if experiment else [])
    cfg = compose(overrides)
    own = OWN_MODEL if experiment == "gns_ramp" else {}  # its own, Chinchilla-sized model
    got = {k: _value(cfg, k) for k in OLD_SCALE[preset] if k not in own}
    assert got == {k: v for k, v in OLD_SCALE[preset].items() if k not in own}, (experiment,
                                                                                  preset)
    assert {k: _value(cfg, k) for k in own} == own
    if experiment:  # the experiment's own settings still apply on top of the scale
      assert cfg.experiment == experiment


def test_multirun_command_runs_the_installed_entry_at_a_scale(tmp_path):
  sweep = record.get("snr").sweep_at("ci")
  cmd = launch.multirun_command(tmp_path, sweep.base, sweep.blocks[0],
                                extra=["logging.log_every=7"])
  assert cmd[:4] == [sys.executable, "-m", "pergrad.train", "-m"]
  assert "scale=ci" in cmd and "experiment=snr" in cmd and "logging.log_every=7" in cmd
  exclude = next(c for c in cmd if c.startswith("hydra.job.config.override_dirname.exclude"))
  assert "scale" in exclude and "logging.log_every" in exclude
  assert (REPO / "pergrad" / "train" / "__main__.py").exists()
