"""The run plan: one schema, field checks, the resume fingerprint, and adding a statistic
and an optimizer through the README's "How to add" recipes."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from conftest import compose

import pergrad.stats as ps
from pergrad.config import build_plan, to_config, to_plain
from pergrad.config.plan import fingerprint, identity, marked_keys
from pergrad.config.schema import Config
from pergrad.data import DataSpec
from pergrad.fields import LABEL
from pergrad.model import ModelSpec
from pergrad.optim import AdamConfig, Direction, OptimizerConfig, SignConfig, configs
from pergrad.stats import StatsRequest
from pergrad.train import run
from pergrad.train.metrics import read_records

# --- "How to add an optimizer" (README), exercised in-process: a config dataclass and a
# builder registered with pergrad.optim.configs.register; `optimizer=toy` selects it with
# no YAML file (pergrad.config.composer stores its schema). tests/test_plugins.py does the same from
# a plugin module through the command line.
# "How to add a statistic": one registration; every backend computes it.
ABS = ps.Statistic(name="toy_abs", kind="coordinate", phi=jnp.abs, clip_power=1,
                   multiplicative=True, doc="Σ_n |g_n| per coordinate")


@dataclasses.dataclass
class ToyConfig(OptimizerConfig):
  name: str = "toy"
  power: float = 1.0  # u = ḡ / (mean_i |g_i| + eps)^power
  eps: float = 1e-8

  def __post_init__(self):
    super().__post_init__()
    if self.power < 0:
      raise ValueError(f"optimizer.power={self.power} must be >= 0")


def _toy_build(cfg: ToyConfig, hp):
  """Reads the toy statistic, so the plan must ask the engine for it."""
  def update(updates, state, params=None, *, grad_stats=None, **extra):
    del params, extra
    a = grad_stats.coord_mean("toy_abs")
    return jax.tree.map(lambda g, s: g / (s + cfg.eps) ** cfg.power, updates, a), state

  return Direction(optax.GradientTransformationExtraArgs(optax.init_empty_state, update),
                   StatsRequest(want=("mean", "toy_abs")))


@pytest.fixture()
def toy_optimizer():
  ps.register(ABS)
  configs.register("toy", ToyConfig, _toy_build)
  yield
  configs.REGISTRY.unregister("toy")
  ps.unregister("toy_abs")


@pytest.mark.extended
def test_toy_optimizer_through_the_recipe(toy_optimizer, tmp_path, tiny_overrides):
  cfg = compose([*tiny_overrides, "optimizer=toy", "optimizer.power=0.5",
                 "optimizer.lr=3e-3", "train.steps=6", "train.eval_every=3",
                 "stats.log_every=3", "stats.want=[mean,sq]"])
  plan = build_plan(cfg)
  assert plan.optimizer.request.want == ("mean", "toy_abs") and plan.stats.backend == "auto"
  assert set(plan.stats.log_request.want) == {"mean", "sq", "toy_abs"}  # one request
  with pytest.raises(Exception, match="optimizer.powr"):  # typed like every optimizer's
    compose([*tiny_overrides, "optimizer=toy", "optimizer.powr=1"])
  with pytest.raises(ValueError, match=r"optimizer.power=-1.0 must be >= 0"):
    build_plan(compose([*tiny_overrides, "optimizer=toy", "optimizer.power=-1"]))
  summary = run(plan, tmp_path / "run", echo=lambda s: None)
  assert summary["status"] == "completed"
  assert summary["final_eval_loss"] < summary["initial_eval_loss"]
  stats = [r for r in read_records(tmp_path / "run" / "metrics.jsonl") if r["split"] == "stats"]
  assert [r["step"] for r in stats] == [1, 3, 6]
  assert any(k.endswith("/toy_abs_mean") for k in stats[0])  # logged without other edits
  assert bool(jnp.isfinite(summary["final_train_loss"]))


# --- one schema ------------------------------------------------------------------------
def test_the_schema_is_what_the_library_takes():
  c = to_config(compose(["optimizer=sign", "model.norm=rmsnorm", "stats.want=[mean,sq]"]))
  assert isinstance(c, Config) and isinstance(c.model, ModelSpec) and isinstance(c.data, DataSpec)
  assert isinstance(c.optimizer, SignConfig) and not hasattr(c.optimizer, "b2")
  assert c.model.norm == "rmsnorm" and type(c.model.norm) is str  # choices: plain strings
  assert c.stats.want == ("mean", "sq") and c.logging.wandb.mode == "offline"
  plan = build_plan(compose(["optimizer=sign", "model.norm=rmsnorm"]))
  assert plan.model == c.model and plan.optimizer.request.want == ("mean",)
  with pytest.raises(dataclasses.FrozenInstanceError):
    plan.model = ModelSpec()  # type: ignore[misc]
  assert to_config(compose()) == Config(optimizer=AdamConfig(name="adamw", weight_decay=0.1),
                                        experiment=None)


@pytest.mark.parametrize("override,match", [
    ("model.norm=batchnorm", r"expected one of \[layernorm, rmsnorm\]"),
    ("optimizer.b2=0.9", r"optimizer.b2"),  # sign has no b2
    ("stats.gns_tied=both", r"expected one of \[include, exclude\]"),
])
def test_bad_keys_and_choices_fail_at_compose_time(override, match):
  with pytest.raises(Exception) as e:
    compose(["optimizer=sign", override])
  text = f"{e.value} {e.value.__cause__}"
  assert re.search(match, text) and override.split("=")[0] in text, text


@pytest.mark.parametrize("override,match", [
    ("train.steps=0", r"^train.steps=0 must be >= 1.$"),
    ("train.eval_every=-1", r"^train.eval_every=-1 must be >= 0"),
    ("logging.log_every=0", r"^logging.log_every=0 must be >= 1.$"),
    ("model.n_heads=3", r"^model.d_model=128 is not divisible by model.n_heads=3"),
    ("schedule.final_lr_frac=2", r"^schedule.final_lr_frac=2.0 must be in \[0, 1\]"),
])
def test_field_checks_run_from_yaml_and_from_python(override, match):
  with pytest.raises(ValueError, match=match):
    build_plan(compose([override]))
  key, value = override.split("=")
  node, field = key.split(".")
  cls = type(getattr(Config(), node))
  with pytest.raises(ValueError, match=match):
    cls(**{field: type(getattr(cls(), field))(value)})


def test_resumable_keys_are_declared_on_the_fields():
  keys = marked_keys()
  assert {"logging", "dist", "name", "train.out_dir", "train.eval_every", "stats.log_every",
          "data.tfds_dir", "plugins"} <= set(keys)
  assert not {"train.steps", "train.seed", "optimizer.lr", "model.n_layers"} & set(keys)
  config = to_plain(compose())
  fp = fingerprint(config)
  assert "optimizer.lr" in fp and "train.steps" in fp and "train.eval_every" not in fp
  assert not any(k.startswith("logging.") for k in fp)
  config["schedule"]["name"] = "constant"  # a constant schedule can be extended
  assert "train.steps" not in fingerprint(config)


def test_a_runs_identity_leaves_out_the_label_fields_only():
  """What a finished run is reused for (`pergrad.sweep.reuse`): every key but those marked
  `label()`, each of which is also resumable; cadences and steps stay in."""
  labels = set(marked_keys(LABEL))
  assert labels == {"experiment", "name", "train.out_dir", "train.restart",
                    "train.keep_checkpoints", "train.compile_cache", "data.tfds_dir",
                    "logging.wandb", "logging.progress", "logging.figure"}
  assert all(any(k == r or k.startswith(r + ".") for r in marked_keys()) for k in labels)
  ident = identity(to_plain(compose()))
  assert {"train.steps", "train.eval_every", "logging.log_every", "stats.want"} <= set(ident)
  assert not any(k in labels or k.startswith("logging.wandb.") for k in ident)
