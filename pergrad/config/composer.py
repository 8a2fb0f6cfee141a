"""Hydra's side: the ConfigStore, the configs' folder, plugins, and composition.

    cfg = compose(["optimizer=sign", "plugins=[my_plugin]"])   # outside a Hydra app

`register()` stores the schema (`pergrad.config.schema.Config`) as `pergrad_schema`, which
`configs/config.yaml` extends, and each registered optimizer's dataclass as the internal
`optimizer_<name>_schema` (extended by `configs/optimizer/<name>.yaml`; not a choice of
the `optimizer` group). A plugin's optimizer that has no YAML is stored as
`optimizer/<name>`, so `optimizer=<name>` selects it. `load_plugins` imports each
plugin module once, before Hydra composes, and stores the schema.

The YAML lives in the repository's top-level `configs/`, shipped in the wheel as the
package `pergrad.configs` (pyproject's package-dir), so `configs_dir()` is
`pergrad/configs` in an installed wheel and `configs/` in a checkout.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from pergrad.config import help as help_lib
from pergrad.config.schema import Config
from pergrad.optim.configs import REGISTRY as OPTIMIZERS

CONFIGS_PACKAGE = "pergrad.configs"
_PLUGINS_KEY = "plugins"
_loaded: list[str] = []  # plugin modules imported so far, in order


def configs_dir() -> Path:
  """The folder of the shipped configs: `pergrad/configs` of an installed wheel, else
  the checkout's top-level `configs/`."""
  package = Path(__file__).resolve().parents[1]
  for folder in (package / "configs", package.parent / "configs"):
    if (folder / "config.yaml").is_file():
      return folder
  raise FileNotFoundError(f"no configs next to {package}: neither {package / 'configs'} "
                          f"(an installed wheel) nor {package.parent / 'configs'} (a checkout)")


def schema_name(optimizer: str) -> str:
  """The internal ConfigStore name of optimizer `optimizer`'s dataclass."""
  return f"optimizer_{optimizer}_schema"


def _schema() -> DictConfig:
  """`Config` as a structured config whose nodes hold their classes' field defaults (a
  node's default_factory would run `__post_init__`, which normalizes some values, e.g.
  the `~` of data.tfds_dir, before the YAML is merged)."""
  node = OmegaConf.structured(Config)
  for f in dataclasses.fields(Config):
    if isinstance(f.default_factory, type):
      node[f.name] = OmegaConf.structured(f.default_factory)
  return node


def register() -> None:
  """Stores the schema, every registered optimizer's dataclass, and the `--help` page."""
  cs = ConfigStore.instance()
  cs.store(name="pergrad_schema", node=_schema())
  shipped = configs_dir() / "optimizer"
  for name, entry in OPTIMIZERS.items():
    cs.store(name=schema_name(name), node=entry.config(name=name))
    if not (shipped / f"{name}.yaml").exists():
      cs.store(group="optimizer", name=name, node=entry.config(name=name))
  cs.store(group="hydra/help", name="pergrad", node=help_lib.node())


def plugins_in(overrides) -> tuple[str, ...]:
  """The modules of a `plugins=[a,b]` (or `+plugins=...`) command-line override."""
  from hydra.core.override_parser.overrides_parser import OverridesParser

  found = [o for o in overrides
           if not o.startswith("-") and o.lstrip("+").startswith(f"{_PLUGINS_KEY}=")]
  out = []
  for o in OverridesParser.create().parse_overrides(found):
    value = o.value()
    for v in getattr(value, "list", None) or [value]:  # a sweep: every choice
      out.extend(v if isinstance(v, list) else [v])
  return tuple(str(v) for v in out if v)


def load_plugins(modules) -> None:
  """Imports each plugin module not imported yet (registering its statistics, backends
  and optimizers), then stores the schema (`register`), so that every registered
  optimizer can be chosen by name; ValueError (one line) for a module that cannot be
  imported."""
  new = [m for m in modules if m not in _loaded]
  for module in new:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ValueError(f"plugins: cannot import {module!r} ({e}); put it on PYTHONPATH or "
                       "remove it from plugins.") from None
    _loaded.append(module)
  register()


def compose(overrides=(), config_name: str = "config") -> DictConfig:
  """The composed config of the shipped configs with Hydra `overrides` (outside a Hydra
  app); the modules of a `plugins=[...]` override are imported first."""
  from hydra import compose as hydra_compose
  from hydra import initialize_config_dir

  load_plugins(plugins_in(overrides))
  with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
    return hydra_compose(config_name=config_name, overrides=list(overrides))
