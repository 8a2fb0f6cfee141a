"""The `--help` page of `python -m pergrad.train`: each group's choices and one line per
field, read from the schema's dataclasses (a field's trailing comment, else the whole
comment block above it), with the value a run actually uses: the composed config's (the
shipped defaults, e.g. optimizer=adamw's weight decay, and the command line's overrides),
not the bare dataclass default. Hydra renders `hydra.help.template`, which the resolver
`pergrad_help` fills from the composed config it belongs to (`node`)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import typing
from typing import Any

from pergrad.optim.configs import REGISTRY as OPTIMIZERS

_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+")


def field_docs(cls: type) -> dict[str, str]:
  """{field: one-line description} from the comments in the source of `cls` and its
  dataclass bases."""
  docs: dict[str, str] = {}
  for klass in reversed(cls.__mro__):
    if not dataclasses.is_dataclass(klass):
      continue
    try:
      lines = inspect.getsource(klass).splitlines()
    except (OSError, TypeError):
      continue
    block: list[str] = []
    for line in lines:
      text = line.strip()
      if text.startswith("#"):
        block.append(text.lstrip("#").strip())
        continue
      m = _FIELD.match(line)
      if m:
        trailing = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        above = " ".join(block).rstrip(".")
        if trailing or above:
          docs[m.group(1)] = trailing or above
      block = []
  return docs


def _kind(hint) -> str:
  if isinstance(hint, type) and issubclass(hint, enum.Enum):
    return "|".join(m.value for m in hint)
  return re.sub(r"typing\.|<class '(\w+)'>", r"\1", str(hint)).replace("NoneType", "null")


_ABSENT = object()


def _default(f: dataclasses.Field, used: Any = _ABSENT):
  """The value a run uses (`used`, from the composed config), else the dataclass's."""
  v = f.default if used is _ABSENT else used
  if v is dataclasses.MISSING:
    return None
  return v.value if isinstance(v, enum.Enum) else v


def field_lines(cls: type, prefix: str, skip: tuple[str, ...] = (),
                values: dict | None = None) -> list[str]:
  """`key (kind) = default: description` for every field of `cls`, nodes expanded; the
  defaults from `values` (the composed config, resolved) where it holds the key."""
  hints, docs, out = typing.get_type_hints(cls), field_docs(cls), []
  for f in dataclasses.fields(cls):
    hint, key = hints[f.name], f"{prefix}{f.name}"
    if f.name in skip:
      continue
    used = (values or {}).get(f.name, _ABSENT)
    if dataclasses.is_dataclass(hint):
      out += field_lines(hint, f"{key}.", values=used if isinstance(used, dict) else None)
      continue
    doc = docs.get(f.name, "")
    out.append(f"  {key} ({_kind(hint)}) = {_default(f, used)}" + (f": {doc}" if doc else ""))
  return out


def _optimizer_lines(chosen: type) -> list[str]:
  """The fields each other registered optimizer adds to `optimizer` (beyond `chosen`'s)."""
  base = {f.name for f in dataclasses.fields(chosen)}
  by_class: dict[type, list[str]] = {}
  for name, entry in OPTIMIZERS.items():
    if entry.config is not chosen:
      by_class.setdefault(entry.config, []).append(name)
  out = []
  for cls, names in by_class.items():
    lines = field_lines(cls, "optimizer.", skip=tuple(base))
    if lines:
      out += [f" optimizer={'|'.join(names)} adds:", *lines]
  return out


RESOLVER = "pergrad_help"  # fills hydra.help.template from the composed config (`node`)


def node() -> dict:
  """The `hydra/help` config: `hydra.help.template` and the keys Hydra reads beside it; the
  template is the resolver `pergrad_help` over the composed config (registered here)."""
  from omegaconf import OmegaConf

  if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, _from_root)
  return {"app_name": "pergrad-train", "header": "", "footer": "",
          "template": f"${{{RESOLVER}:}}"}


def _from_root(*, _root_) -> str:
  from omegaconf import OmegaConf

  task = {k: v for k, v in _root_.items() if k != "hydra"}
  return template(OmegaConf.to_container(OmegaConf.create(task), resolve=True))


def template(values: dict | None = None) -> str:
  """Hydra's help template (`hydra.help.template`); the defaults shown are those of `values`
  (the composed config, resolved) where given."""
  from pergrad.config.schema import Config

  hints = typing.get_type_hints(Config)
  values = values or {}
  fields = []
  for f in dataclasses.fields(Config):
    if dataclasses.is_dataclass(hints[f.name]):
      cls = hints[f.name]
      if f.name == "optimizer" and "name" in values.get("optimizer", {}):
        cls = OPTIMIZERS.get(values["optimizer"]["name"]).config  # the chosen one's fields
      fields += [f" {f.name}:", *field_lines(cls, f"{f.name}.", values=values.get(f.name))]
      if f.name == "optimizer":
        fields += _optimizer_lines(cls)
  fields += [" top level:", *field_lines(Config, "", values=values, skip=tuple(
      f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])))]
  text = "\n".join([
      "pergrad-train: train one run (python -m pergrad.train [group=option] [key=value] ...)",
      "",
      "== Config groups ==", "Choose one option per group (e.g. optimizer=sign):", "",
      "$APP_CONFIG_GROUPS", "",
      "== Fields ==", "Set any field as key=value (e.g. optimizer.lr=1e-3); "
      "(a|b) lists a field's choices:", "",
      *fields, "",
      "--dry-run checks a command without training or writing (config, plan, run directory, data,\n"
      "shapes; exit 1 on anything a run would refuse); --cfg job prints the composed config,\n"
      "unchecked; --hydra-help shows Hydra's own options."])
  return text.replace("${", "\\${")
