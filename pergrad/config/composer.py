"""Hydra's side: the ConfigStore, the configs' folder, plugins, and composition.

    cfg = compose(["optimizer=sign", "plugins=[my_plugin]"])   # outside a Hydra app

`register()` stores the schema (`pergrad.config.schema.Config`) as `pergrad_schema`, which
`configs/config.yaml` extends, and each registered optimizer's dataclass as the internal
`optimizer_<name>_schema` (extended by `configs/optimizer/<name>.yaml`; not a choice of
the `optimizer` group). A plugin's optimizer that has no YAML is stored as
`optimizer/<name>`, so `optimizer=<name>` selects it. `load_plugins` imports each
plugin module once, before Hydra composes, and stores the schema.

Every key of an override must be a field of the schema, with or without Hydra's `+`
(`strict_overrides`), and a config group's option must exist (`strict_choices`): each
error is one line with the nearest names. The internal nodes cannot be the primary
config (`check_config_name`).

The YAML lives in the repository's top-level `configs/`, shipped in the wheel as the
package `pergrad.configs` (pyproject's package-dir), so `configs_dir()` is
`pergrad/configs` in an installed wheel and `configs/` in a checkout.
"""

from __future__ import annotations

import dataclasses
import difflib
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


SCHEMA = "pergrad_schema"  # the internal ConfigStore name of `Config`


def register() -> None:
  """Stores the schema, every registered optimizer's dataclass, and the `--help` page;
  installs `strict_overrides`."""
  cs = ConfigStore.instance()
  cs.store(name=SCHEMA, node=_schema())
  shipped = configs_dir() / "optimizer"
  for name, entry in OPTIMIZERS.items():
    cs.store(name=schema_name(name), node=entry.config(name=name))
    if not (shipped / f"{name}.yaml").exists():
      cs.store(group="optimizer", name=name, node=entry.config(name=name))
  cs.store(group="hydra/help", name="pergrad", node=help_lib.node())
  cs.store(group="hydra/job_logging", name="pergrad", node=JOB_LOGGING)
  strict_overrides()
  strict_choices()


# The run's Python logging (`hydra/job_logging`): warnings and errors to stderr, no log file
# in Hydra's run folder, and no INFO lines (JAX's backend probe logs a missing libtpu.so at
# INFO, which reads like an error); the run prints its own lines.
JOB_LOGGING = {
    "version": 1,
    "formatters": {"simple": {"format": "[%(name)s] %(levelname)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "simple",
                             "stream": "ext://sys.stderr"}},
    "root": {"level": "WARNING", "handlers": ["console"]},
    "disable_existing_loggers": False,
}


def primary_configs() -> list[str]:
  """The configs that can be chosen with --config-name (the shipped top-level YAML files)."""
  return sorted(p.stem for p in configs_dir().glob("*.yaml"))


def check_config_name(name: str) -> None:
  """ValueError (one line) when `name` is an internal schema node, not a config."""
  name = name.removesuffix(".yaml")
  internal = {SCHEMA, *(schema_name(n) for n in OPTIMIZERS)}
  if name in internal:
    raise ValueError(
        f"--config-name={name} is an internal schema node (the dataclass defaults Hydra "
        f"checks configs against), not a config; choose one of {primary_configs()} (the "
        "default: config), and pick an experiment with experiment=<name>.")


def unknown_key(key: str, cfg: DictConfig) -> str:
  """The one-line message for a key the composed `cfg` (typed by the schema) lacks, with
  the nearest field names."""
  known = [k for k in _keys(cfg) if not k.startswith("hydra.")]
  score = {k: difflib.SequenceMatcher(None, key, k).ratio() for k in known}
  best = max(score.values(), default=0.0)
  near = sorted((k for k, r in score.items() if r >= max(0.6, best - 0.1)), key=score.get,
                reverse=True)[:3]
  hint = (f"did you mean {' or '.join(near)}?" if near else
          "`python scripts/train.py --help` lists every field.")
  head, _, leaf = key.partition(".")
  owners = [n for n, e in OPTIMIZERS.items()
            if head == "optimizer" and leaf in {f.name for f in dataclasses.fields(e.config)}]
  if owners:
    hint = (f"it is a field of optimizer={'|'.join(owners)}, not of the chosen optimizer "
            f"({cfg.optimizer.name}); {hint}")
  return f"unknown key {key}: the config has no such field; {hint}"


def _keys(node, prefix: str = "") -> list[str]:
  out = []
  for k in node.keys() if isinstance(node, DictConfig) else ():
    key = f"{prefix}{k}"
    child = node._get_node(k)  # noqa: SLF001 - not resolved: ${...} values stay unread
    out += [key, *_keys(child, f"{key}.")] if isinstance(child, DictConfig) else [key]
  return out


def _in_schema(key: str, cfg: DictConfig) -> bool:
  """Whether `key` is a field of `cfg`, or lies below a node that is not a dataclass (a
  free-form value such as `experiment`, which takes any key)."""
  node = cfg
  for part in key.split("."):
    if not isinstance(node, DictConfig):
      return True  # below a leaf: OmegaConf's own error names it
    if part not in node.keys():
      return not dataclasses.is_dataclass(OmegaConf.get_type(node)) and node is not cfg
    node = node._get_node(part)  # noqa: SLF001
  return True


def strict_overrides() -> None:
  """Makes Hydra refuse a command-line key that the schema does not have, with or without
  `+`, in one line naming the nearest fields (`unknown_key`). Hydra applies key overrides in
  `ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)` (hydra-core 1.3, pinned),
  which this wraps: `+key=value` adds a key to a structured node unchecked, and a plain
  typo's error recommends that `+` form."""
  from hydra._internal.config_loader_impl import ConfigLoaderImpl
  from hydra.errors import ConfigCompositionException
  from omegaconf.errors import ConfigAttributeError, ConfigKeyError

  apply = ConfigLoaderImpl._apply_overrides_to_config  # noqa: SLF001
  if getattr(apply, "_pergrad", False):
    return

  def checked(overrides, cfg: DictConfig) -> None:
    for o in overrides:
      key = o.key_or_group
      if not o.is_hydra_override() and not _in_schema(key, cfg):
        raise ConfigCompositionException(unknown_key(key, cfg))
    try:
      apply(overrides, cfg)
    except ConfigCompositionException as e:
      if isinstance(e.__cause__, (ConfigAttributeError, ConfigKeyError)):
        key = str(e).split("'")[1] if "'" in str(e) else str(e)
        raise ConfigCompositionException(unknown_key(key, cfg)) from None
      raise

  checked._pergrad = True
  ConfigLoaderImpl._apply_overrides_to_config = staticmethod(checked)  # noqa: SLF001


def unknown_choice(group: str, choice: str, options: list[str]) -> str:
  """The one-line message for a config group's option that does not exist, with the
  choices and the closest one."""
  near = difflib.get_close_matches(choice, options, n=1, cutoff=0.5)
  hint = f"; did you mean {group}={near[0]}?" if near else ""
  return (f"Could not find '{group}/{choice}': {group}={choice} is no config of "
          f"configs/{group}/; the choices are {', '.join(options) or 'none'}{hint}")


def strict_choices() -> None:
  """Makes Hydra's error for a config group option that does not exist (`experiment=nope`,
  `model=huge`, or an `override /optimizer: ...` in a YAML file) one line with the choices and
  the closest one (`unknown_choice`). Hydra raises it in
  `hydra._internal.defaults_list.config_not_found_error(repo, tree)` (hydra-core 1.3,
  pinned), which this replaces for a group's option; a group marked `optional` in a defaults
  list never reaches it (Hydra skips the missing option), so configs/config.yaml marks none."""
  from hydra._internal import defaults_list
  from hydra.core.default_element import GroupDefault
  from hydra.core.object_type import ObjectType
  from hydra.errors import MissingConfigException

  original = defaults_list.config_not_found_error
  if getattr(original, "_pergrad", False):
    return

  def one_line(repo, tree) -> None:
    element = tree.node
    if not isinstance(element, GroupDefault) or element.primary:
      original(repo=repo, tree=tree)
    group = element.get_group_path()
    options = sorted(repo.get_group_options(group, ObjectType.CONFIG))
    options = [o for o in options if not o.endswith("_schema")]  # internal schema nodes
    parent = tree.parent.node.get_config_path() if tree.parent is not None else None
    where = f"in '{parent}': " if parent not in (None, "config") else ""
    raise MissingConfigException(
        missing_cfg_file=element.get_config_path(), options=options,
        message=where + unknown_choice(group, str(element.get_name()), options))

  one_line._pergrad = True
  defaults_list.config_not_found_error = one_line


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
  check_config_name(config_name)
  with initialize_config_dir(config_dir=str(configs_dir()), version_base="1.3"):
    return hydra_compose(config_name=config_name, overrides=list(overrides))
