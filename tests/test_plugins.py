"""The README's "How to add" recipes from outside the package: a plugin module (one file,
on PYTHONPATH) registers a statistic, a statistics backend and an optimizer, and a Hydra
multirun of the installed entry point selects them with
`plugins=[toy_plugin] optimizer=toy stats.backend=toy_vmap`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, TINY, cache_env

from pergrad.train.metrics import read_records

PLUGIN = '''
"""A user's plugin: one statistic, one backend and one optimizer, registered at import."""
import dataclasses

import jax
import jax.numpy as jnp
import optax

import pergrad.stats as ps
from pergrad.optim import Direction, OptimizerConfig, configs
from pergrad.stats import StatsRequest

ps.register(ps.Statistic(name="toy_abs", kind="coordinate", phi=jnp.abs, clip_power=1,
                         multiplicative=True, doc="sum_n |g_n| per coordinate"))
ps.register_backend("toy_vmap", ps.Backend(ps.backends.get("vmap").fn))


@dataclasses.dataclass
class ToyConfig(OptimizerConfig):
  name: str = "toy"
  power: float = 0.5  # u = mean g / (mean_i |g_i| + eps)^power
  eps: float = 1e-8


def build(cfg, hp):
  def update(updates, state, params=None, *, grad_stats=None, **extra):
    a = grad_stats.coord_mean("toy_abs")
    return jax.tree.map(lambda g, s: g / (s + cfg.eps) ** cfg.power, updates, a), state

  return Direction(optax.GradientTransformationExtraArgs(optax.init_empty_state, update),
                   StatsRequest(want=("mean", "toy_abs")))


configs.register("toy", ToyConfig, build)
'''


@pytest.mark.slow
@pytest.mark.extended
def test_plugin_optimizer_and_statistic_in_a_cli_sweep(tmp_path, tfds_dir, jax_cache_dir):
  (tmp_path / "toy_plugin.py").write_text(textwrap.dedent(PLUGIN))
  env = {**os.environ, **cache_env(jax_cache_dir), "WANDB_MODE": "disabled",
         "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
  env.pop("HYDRA_FULL_ERROR", None)
  sweep = tmp_path / "sweep"
  # Every step logs statistics and nothing is evaluated: one compiled step per run.
  args = ["-m", "plugins=[toy_plugin]", "optimizer=toy", "optimizer.lr=1e-3,2e-3",
          "stats.backend=toy_vmap",
          *TINY, f"data.tfds_dir={tfds_dir}", "train.steps=3", "train.eval_batches=0",
          "train.checkpoint_every=0", "stats.log_every=1", "stats.want=[mean]",
          f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=${hydra.job.num}"]
  out = subprocess.run([sys.executable, "-m", "pergrad.train", *args], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  for job, lr in (("0", 1e-3), ("1", 2e-3)):
    summary = json.loads((sweep / job / "summary.json").read_text())
    assert summary["status"] == "completed" and math.isfinite(summary["final_train_loss"])
    recs = read_records(sweep / job / "metrics.jsonl")
    assert all(math.isfinite(r["loss"]) for r in recs if r["split"] == "train")
    stats = [r for r in recs if r["split"] == "stats"]
    assert len(stats) == 3 and any(k.endswith("/toy_abs_mean") for k in stats[0])
    config = (sweep / job / "config.yaml").read_text()
    assert "name: toy" in config and f"lr: {lr}" in config and "toy_plugin" in config
    assert "backend: toy_vmap" in config
