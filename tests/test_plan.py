"""The run plan: the import rule, and adding a statistic and an optimizer through the
README's "How to add" recipes."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from conftest import REPO, compose

import pergrad.stats as ps
from pergrad.configure import build_plan
from pergrad.optim import Direction, OptimizerConfig, configs
from pergrad.stats import StatsRequest
from pergrad.train import run
from pergrad.train.metrics import read_records

# The entry points and the plan builder: the only modules that may read pergrad.config.
CONFIG_READERS = {"pergrad/config.py", "pergrad/configure.py", "pergrad/train/cli.py"}


def _imports(path: Path) -> set[str]:
  names = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names |= {f"{node.module}.{a.name}" for a in node.names}
  return names


def test_only_the_entry_points_and_the_plan_builder_import_the_config():
  offenders = []
  for path in sorted((REPO / "pergrad").rglob("*.py")):
    rel = path.relative_to(REPO).as_posix()
    if rel not in CONFIG_READERS and "pergrad.config" in _imports(path):
      offenders.append(rel)
  assert offenders == [], f"{offenders} import pergrad.config; take a RunPlan instead"


# --- "How to add an optimizer" (README), exercised: a config dataclass + a builder
# registered with pergrad.optim.configs.register, and configs/optimizer/<name>.yaml. ---
# "How to add a statistic": one registration; every backend computes it.
ABS = ps.Statistic(name="toy_abs", kind="coordinate", phi=jnp.abs, clip_power=1,
                   multiplicative=True, doc="Σ_n |g_n| per coordinate")


@dataclasses.dataclass
class ToyConfig(OptimizerConfig):
  name: str = "toy"
  power: float = 1.0  # u = ḡ / (mean_i |g_i|)^power


def _toy_build(cfg: ToyConfig, hp):
  """Reads the toy statistic, so the plan must ask the engine for it."""
  def update(updates, state, params=None, *, grad_stats=None, **extra):
    del params, extra
    a = grad_stats.coord_mean("toy_abs")
    return jax.tree.map(lambda g, s: g / (s + hp.eps) ** cfg.power, updates, a), state

  return Direction(optax.GradientTransformationExtraArgs(optax.init_empty_state, update),
                   StatsRequest(want=("mean", "toy_abs")))


@pytest.fixture()
def toy_optimizer(tmp_path):
  ps.register(ABS)
  configs.register("toy", ToyConfig, _toy_build)
  (tmp_path / "optimizer").mkdir()
  (tmp_path / "optimizer" / "toy.yaml").write_text(
      "defaults:\n  - toy_schema\n  - _self_\n\nname: toy\nlr: 1e-3\npower: 1.0\n")
  yield f"hydra.searchpath=[file://{tmp_path}]"
  configs.unregister("toy")
  ps.unregister("toy_abs")


def test_toy_optimizer_through_the_recipe(toy_optimizer, tmp_path, tiny_overrides):
  cfg = compose([*tiny_overrides, toy_optimizer, "optimizer=toy", "optimizer.power=0.5",
                 "optimizer.lr=3e-3", "train.steps=6", "train.eval_every=3",
                 "stats.log_every=3", "stats.want=[mean,sq]"])
  plan = build_plan(cfg)
  assert plan.optimizer.request.want == ("mean", "toy_abs") and plan.stats.backend == "surgery"
  assert set(plan.stats.log_request.want) == {"mean", "sq", "toy_abs"}  # one request
  with pytest.raises(Exception, match="optimizer.powr"):  # typed like every optimizer's
    compose([*tiny_overrides, toy_optimizer, "optimizer=toy", "optimizer.powr=1"])
  summary = run(plan, tmp_path / "run", echo=lambda s: None)
  assert summary["status"] == "completed"
  assert summary["final_eval_loss"] < summary["initial_eval_loss"]
  stats = [r for r in read_records(tmp_path / "run" / "metrics.jsonl") if r["split"] == "stats"]
  assert [r["step"] for r in stats] == [1, 3, 6]
  assert any(k.endswith("/toy_abs_mean") for k in stats[0])  # logged without other edits
  assert bool(jnp.isfinite(summary["final_train_loss"]))
