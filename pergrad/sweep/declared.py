"""Values an experiment states before its runs, in `configs/experiment/<name>.yaml`."""

from __future__ import annotations

import dataclasses

from pergrad.sweep import experiment_value


@dataclasses.dataclass(frozen=True)
class Declared:
  """A value stated before the runs in `configs/experiment/<name>.yaml` (`declared.<key>`),
  with its one-line justification."""

  key: str
  value: float
  why: str

  def text(self) -> str:
    return f"{self.key} {self.value:g} ({self.why})"


def declared(name: str, key: str) -> Declared:
  """`declared.<key>` of experiment `name`'s config: {value, why} (KeyError if not stated)."""
  d = experiment_value(name, f"declared.{key}")
  if not isinstance(d, dict) or "value" not in d or not str(d.get("why", "")).strip():
    raise KeyError(f"configs/experiment/{name}.yaml: declared.{key} needs a value and a why")
  return Declared(key, float(d["value"]), " ".join(str(d["why"]).split()))


def declared_text(*items: Declared) -> str:
  """"Declared before the run: margin 0.02 (why); ..."."""
  return "Declared before the run: " + "; ".join(d.text() for d in items)
