"""Hydra's side of the schema: stores `pergrad.plan.Config` in the ConfigStore, finds
`configs/`, and imports the config's plugins.

Every YAML file under `configs/` is merged into the frozen dataclasses of the schema
(`pergrad.plan.Config` and the dataclasses of its nodes), so a typo in a key or a value
of the wrong type fails at start-up with a message naming the key (and, for a choice,
the options), before anything is compiled. Only the entry points (`pergrad.configure`,
`pergrad.train.cli`) import this module.

The configs ship inside the package (`pergrad.configs`, a link to the repository's
`configs/`), so an installed `pergrad-train` finds them outside a checkout.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from pergrad.data import DataSpec
from pergrad.model import ModelSpec
from pergrad.optim import configs as optim_configs
from pergrad.optim.schedule import ScheduleConfig
from pergrad.plan import Config, LoggingSpec, StatsSpec
from pergrad.train.batch_schedule import BatchConfig

CONFIGS_PACKAGE = "pergrad.configs"
PLUGINS = "plugins"


def configs_dir() -> Path:
  """The folder of the shipped configs (`pergrad/configs` = the repository's `configs/`)."""
  spec = importlib.util.find_spec(CONFIGS_PACKAGE)
  return Path(next(iter(spec.submodule_search_locations)))


def _node(cls: type, **values) -> DictConfig:
  """`cls` as a writable structured config: Hydra composes by merging into the schema,
  which OmegaConf marks read-only for a frozen dataclass; the frozen object is built
  afterwards by `OmegaConf.to_object`."""
  node = OmegaConf.structured(cls)
  stack = [node]
  while stack:
    n = stack.pop()
    OmegaConf.set_readonly(n, None)
    if isinstance(n, DictConfig):
      stack.extend(n._get_node(k) for k in n.keys())
    elif isinstance(n, ListConfig):
      stack.extend(n._get_node(i) for i in range(len(n)))
  for key, value in values.items():
    node[key] = value
  return node


def register() -> None:
  """Stores the schema, so that `configs/config.yaml` and each group's YAML extend it,
  and every registered optimizer: `optimizer/<name>_schema` (its dataclass, for
  `configs/optimizer/<name>.yaml`) and, when the package has no such YAML (a plugin's
  optimizer), `optimizer/<name>` itself, so that `optimizer=<name>` selects it."""
  cs = ConfigStore.instance()
  cs.store(name="pergrad_schema", node=_node(Config))
  for group, cls in (("model", ModelSpec), ("data", DataSpec), ("schedule", ScheduleConfig),
                     ("logging", LoggingSpec), ("stats", StatsSpec), ("batch", BatchConfig)):
    cs.store(group=group, name="schema", node=_node(cls))
  shipped = configs_dir() / "optimizer"
  for name, entry in optim_configs.REGISTRY.items():
    node = _node(entry.config, name=name)
    cs.store(group="optimizer", name=f"{name}_schema", node=node)
    if not (shipped / f"{name}.yaml").exists():
      cs.store(group="optimizer", name=name, node=node)


def plugins_in(overrides) -> tuple[str, ...]:
  """The modules of a `plugins=[a,b]` (or `+plugins=...`) command-line override."""
  from hydra.core.override_parser.overrides_parser import OverridesParser

  found = [o for o in overrides if o.lstrip("+").startswith(f"{PLUGINS}=")]
  out = []
  for o in OverridesParser.create().parse_overrides(found):
    value = o.value()
    for v in getattr(value, "list", None) or [value]:  # a sweep: every choice
      out.extend(v if isinstance(v, list) else [v])
  return tuple(str(v) for v in out if v)


def load_plugins(modules) -> None:
  """Imports each plugin module (registering its statistics and optimizers), then
  stores the schema again, so that its optimizers can be chosen by name."""
  for module in modules:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ValueError(f"plugins: cannot import {module!r} ({e}); put it on PYTHONPATH or "
                       "remove it from plugins.") from None
  register()


def plugins_from_argv(argv=None) -> tuple[str, ...]:
  return plugins_in([a for a in (sys.argv[1:] if argv is None else argv)
                     if not a.startswith("-")])


__all__ = ["CONFIGS_PACKAGE", "configs_dir", "register", "load_plugins", "plugins_in",
           "plugins_from_argv"]
