"""The `--help` page of `python -m pergrad.train`: each group's choices and one line per
field, read from the schema's dataclasses (a field's trailing comment, else the first
sentence of the comment block above it)."""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import typing

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
        above = re.split(r"\. | \(|: ", " ".join(block))[0].rstrip(".")
        if trailing or above:
          docs[m.group(1)] = trailing or above
      block = []
  return docs


def _kind(hint) -> str:
  if isinstance(hint, type) and issubclass(hint, enum.Enum):
    return "|".join(m.value for m in hint)
  return re.sub(r"typing\.|<class '(\w+)'>", r"\1", str(hint)).replace("NoneType", "null")


def _default(f: dataclasses.Field):
  if f.default is not dataclasses.MISSING:
    v = f.default
    return v.value if isinstance(v, enum.Enum) else v
  return None


def field_lines(cls: type, prefix: str, skip: tuple[str, ...] = ()) -> list[str]:
  """`key (kind) = default: description` for every field of `cls`, nodes expanded."""
  hints, docs, out = typing.get_type_hints(cls), field_docs(cls), []
  for f in dataclasses.fields(cls):
    hint, key = hints[f.name], f"{prefix}{f.name}"
    if f.name in skip:
      continue
    if dataclasses.is_dataclass(hint):
      out += field_lines(hint, f"{key}.")
      continue
    doc = docs.get(f.name, "")
    out.append(f"  {key} ({_kind(hint)}) = {_default(f)}" + (f": {doc}" if doc else ""))
  return out


def _optimizer_lines() -> list[str]:
  """The fields each registered optimizer adds to `optimizer`."""
  base = {f.name for f in dataclasses.fields(OPTIMIZERS.get("sgd").config)}
  by_class: dict[type, list[str]] = {}
  for name, entry in OPTIMIZERS.items():
    by_class.setdefault(entry.config, []).append(name)
  out = []
  for cls, names in by_class.items():
    lines = field_lines(cls, "optimizer.", skip=tuple(base))
    if lines:
      out += [f" optimizer={'|'.join(names)} adds:", *lines]
  return out


def node() -> dict:
  """The `hydra/help` config: `hydra.help.template` and the keys Hydra reads beside it."""
  return {"app_name": "pergrad-train", "header": "", "footer": "", "template": template()}


def template() -> str:
  """Hydra's help template (`hydra.help.template`)."""
  from pergrad.config.schema import Config

  hints = typing.get_type_hints(Config)
  fields = []
  for f in dataclasses.fields(Config):
    if dataclasses.is_dataclass(hints[f.name]):
      fields += [f" {f.name}:", *field_lines(hints[f.name], f"{f.name}.")]
      if f.name == "optimizer":
        fields += _optimizer_lines()
  fields += [" top level:", *field_lines(Config, "", skip=tuple(
      f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])))]
  text = "\n".join([
      "pergrad-train: train one run (python -m pergrad.train [group=option] [key=value] ...)",
      "",
      "== Config groups ==", "Choose one option per group (e.g. optimizer=sign):", "",
      "$APP_CONFIG_GROUPS", "",
      "== Fields ==", "Set any field as key=value (e.g. optimizer.lr=1e-3); "
      "(a|b) lists a field's choices:", "",
      *fields, "",
      "--cfg job prints the composed config; --hydra-help shows Hydra's own options."])
  return text.replace("${", "\\${")
