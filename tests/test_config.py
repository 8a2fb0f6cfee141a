"""The config floor at its boundary: settings checked whether or not they are used, the
environment's W&B mode, internal schema nodes hidden, `--help`, a plugin's backend chosen
by name, and the configs shipped from one folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, compose

import pergrad.stats as ps
from pergrad.config import build_plan, configs_dir
from pergrad.layer_types import LAYER_TYPES


@pytest.mark.parametrize("stats", ["off", "example"])
def test_a_typo_in_stats_layers_fails_whether_or_not_statistics_are_on(stats):
  with pytest.raises(ValueError) as e:
    build_plan(compose([f"stats={stats}", "stats.layers=[nrom]"]))
  msg = str(e.value)
  assert "\n" not in msg and msg.startswith("stats.layers=['nrom']: 'nrom' is not a layer type")
  assert all(t in msg for t in LAYER_TYPES)
  plan = build_plan(compose(["stats=example", "stats.layers=[norm,'block_*/attn/*']"]))
  assert plan.stats.log_request.layers == ("block_*/attn/*", "norm")


@pytest.mark.parametrize("env,config_mode,want", [
    ({}, "offline", "offline"),
    ({"WANDB_MODE": "disabled"}, "offline", "disabled"),
    ({"WANDB_MODE": "offline"}, "online", "offline"),
    ({"WANDB_DISABLED": "true"}, "online", "disabled"),
])
def test_the_environments_wandb_mode_wins(monkeypatch, env, config_mode, want):
  monkeypatch.delenv("WANDB_MODE", raising=False)
  monkeypatch.delenv("WANDB_DISABLED", raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  plan = build_plan(compose([f"logging.wandb.mode={config_mode}"]))
  assert plan.logging.wandb.mode == want and plan.config["logging"]["wandb"]["mode"] == want
  monkeypatch.delenv("WANDB_DISABLED", raising=False)
  monkeypatch.setenv("WANDB_MODE", "sometimes")
  with pytest.raises(ValueError, match="WANDB_MODE=sometimes is unknown"):
    build_plan(compose())


@pytest.mark.parametrize("choice", ["adam_schema", "optimizer_adam_schema", "schema"])
def test_internal_schema_nodes_are_not_choices(choice):
  with pytest.raises(Exception, match=rf"Could not find 'optimizer/{choice}'"):
    compose([f"optimizer={choice}"])


@pytest.mark.parametrize("override,message", [
    ("train.stepz=20", "unknown key train.stepz: the config has no such field; did you mean "
                       "train.steps?"),
    ("+train.stepz=20", "unknown key train.stepz: the config has no such field; did you mean "
                        "train.steps?"),
    ("++train.stepz=20", "unknown key train.stepz"),
    ("+stepz=20", "unknown key stepz: the config has no such field;"),
    ("+optimizer.placement=batch", "it is a field of optimizer=sign, not of the chosen "
                                   "optimizer (adamw)"),
    ("data.batchsize=4", "did you mean data.batch_size?"),
])
def test_unknown_keys_are_refused_with_or_without_plus(override, message):
  """`+train.stepz=20` trained normally and wrote `stepz: 20` into config.yaml, ignored."""
  from hydra.errors import ConfigCompositionException

  with pytest.raises(ConfigCompositionException) as e:
    compose([override])
  assert message in str(e.value) and "\n" not in str(e.value) and "+" not in str(e.value)


def test_overrides_of_known_keys_and_free_form_values_still_pass():
  cfg = compose(["optimizer=sign", "optimizer.placement=batch", "+plugins=[]",
                 "experiment=quickstart", "train.steps=7"])
  assert cfg.optimizer.placement == "batch" and cfg.train.steps == 7


@pytest.mark.parametrize("name", ["pergrad_schema", "optimizer_sign_schema"])
def test_internal_schema_nodes_are_not_primary_configs(name):
  from pergrad.config import compose as compose_named

  with pytest.raises(ValueError, match=rf"--config-name={name} is an internal schema node"):
    compose_named(config_name=name)


def test_help_lists_each_groups_choices_and_a_line_per_field():
  env = {**os.environ, "PYTHONPATH": str(REPO)}
  out = subprocess.run([sys.executable, "-m", "pergrad.train", "--help"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  text = out.stdout
  assert "schema" not in text
  assert re.search(r"^optimizer: adam, adam_family, adamw, momentum, sgd, sign$", text, re.M)
  assert re.search(r"^model: paper, small, tiny$", text, re.M)
  for line in ("model.norm (layernorm|rmsnorm) = layernorm: normalization layers",
               "stats.gns_tied (include|exclude) = include:",
               "train.steps (int) = 400: run length in full-batch steps",
               "optimizer.b1 (float) = 0.9:", "optimizer.placement (example|token|batch|ema)",
               "stats.layers (", "logging.wandb.mode (online|offline|disabled) = offline",
               # what a run uses (configs/optimizer/adamw.yaml), not the dataclass's SGD, 0.0
               "optimizer.name (str) = adamw:", "optimizer.weight_decay (float) = 0.1:",
               # whole descriptions, not cut at the first colon
               "train.restart (bool) = False: every checkpoint unreadable: start again from "
               "step 0 (true) or stop with an error",
               "schedule.decay_steps (tuple[int, ...]) = []: step: the full-batch steps at "
               "which the lr is halved, ascending; []: where the cosine (warmup_steps, "
               "final_lr_frac) would halve it"):
    assert line in text, line


def test_help_shows_the_values_of_the_chosen_config():
  from omegaconf import OmegaConf

  from pergrad.config import help as help_lib

  cfg = compose(["optimizer=sign", "optimizer.lr=1e-4", "model=small"])
  text = help_lib.template(OmegaConf.to_container(cfg, resolve=True))
  for line in ("optimizer.name (str) = sign:", "optimizer.lr (float) = 0.0001:",
               "optimizer.placement (example|token|batch|ema) = ", "model.name (str) = small:",
               " optimizer=adam|adamw adds:"):
    assert line in text, line


def test_a_registered_backend_is_chosen_by_name(tiny_overrides):
  with pytest.raises(ValueError, match=r"^stats.backend=fast is not a registered backend; "
                                       r"choose one of auto, value_and_grad, contraction, vmap"):
    build_plan(compose(["stats.backend=fast"]))
  ps.register_backend("mine", ps.Backend(ps.backends.get("vmap").fn))
  try:
    plan = build_plan(compose([*tiny_overrides, "stats=example", "stats.backend=mine",
                               "stats.sign_agreement=2"]))
    assert plan.stats.log_backend == "mine" and plan.stats.sign_backend == "mine"
  finally:
    ps.unregister_backend("mine")


def test_configs_live_in_one_folder_shipped_as_a_package():
  """configs/ is the one copy (no link inside the package); the wheel maps it to the
  package `pergrad.configs` and lists every package of the library, not `experiments`."""
  assert not (REPO / "pergrad" / "configs").exists()
  assert configs_dir() == REPO / "configs"
  tomllib = pytest.importorskip("tomllib")
  tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]
  assert tool["setuptools"]["package-dir"] == {"pergrad.configs": "configs"}
  assert tool["setuptools"]["package-data"] == {"pergrad.configs": ["**/*.yaml"]}
  packages = {".".join(p.parent.relative_to(REPO).parts)
              for p in (REPO / "pergrad").rglob("__init__.py")}
  assert set(tool["setuptools"]["packages"]) == packages | {"pergrad.configs"}


@pytest.mark.parametrize("overrides, want", [
    ((), 0), (("train.seed=3",), 3), (("train.seed=3", "data.seed=7"), 7),
    (("experiment=sign_placement", "train.seed=2"), 2)])
def test_the_data_order_follows_the_training_seed_unless_set(overrides, want):
  """A seed draws the init and the data order (common to every arm at that seed); an
  explicit data.seed is honoured."""
  plan = build_plan(compose(list(overrides)))
  assert plan.data.seed == want and plan.config["data"]["seed"] == want
