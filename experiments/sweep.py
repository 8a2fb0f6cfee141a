"""What an experiment sweeps: grids of Hydra overrides, scale presets, run and sweep dirs.

An experiment (`experiments.record.Experiment`, registered by its module, e.g.
`experiments.sign_placement`) gives `sweep(preset) -> Sweep`: the grids of runs for preset
"ci" | "cpu" | "paper", defined here.

Run directories are deterministic: `<sweep_dir>/<override_dirname>` where the
override dirname holds only the swept ("identity") keys of the point, sorted, as
Hydra writes it (`key=value,key=value`). Everything fixed is excluded from the name
(`hydra.job.config.override_dirname.exclude_keys`), so re-launching the same sweep
lands on the same directories and the training entry skips or resumes them.

The scale of every run (model, data, steps, logging) is the Hydra config group
`configs/scale/<preset>.yaml`, selected by the override `scale=<preset>`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from pathlib import Path
from typing import Sequence

import yaml

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("ci", "cpu", "paper")


def fmt(value) -> str:
  """Formats an override value the way it appears on the command line and in run dirs."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


@dataclasses.dataclass(frozen=True)
class Block:
  """A Cartesian grid launched as one Hydra multirun.

  grid: swept keys -> values; they name the run directory.
  fixed: keys -> value shared by the block but derived from the point (e.g. the number
    of steps for a batch size); excluded from the run directory name.
  """

  grid: dict
  fixed: dict = dataclasses.field(default_factory=dict)

  def points(self) -> list[dict]:
    keys = list(self.grid)
    return [dict(zip(keys, vals, strict=False)) for vals in itertools.product(*self.grid.values())]


POLICY = ("each group's lr is chosen on its selection seeds alone and its numbers are the "
          "mean ± std of fresh seeds at that lr, never a selection seed")


@dataclasses.dataclass(frozen=True)
class LrSearch:
  """Per-group learning-rate search on selection seeds, then fresh seeds at the chosen lr.

  `POLICY` (`experiments.lr_search`): the lowest mean final eval loss over the selection
  seeds (the first block's `seed_key` values; diverged runs lose) picks each group's lr; a
  best lr at an edge extends the grid by `factor`, up to `max_extend` times a side; an
  all-diverged group extends downward to `diverged_floor` below its first grid; `seeds`
  (fresh) then run at the chosen lr and are the only reported numbers.

  group_keys: the keys that define a variant (e.g. ("optimizer.placement",)).
  lr_key: the swept learning-rate key.
  factor: ratio between neighbouring grid values (used to extend past an edge).
  max_extend: how many times the grid may be extended past an edge on each side.
  seed_key: the seed key; its values in the first block are the selection seeds.
  seeds: the fresh seeds run at each group's chosen lr (the reported numbers).
  diverged_floor: how far below its first grid an all-diverged group is searched.
  """

  group_keys: tuple
  lr_key: str = "optimizer.lr"
  factor: float = 3.0
  max_extend: int = 2
  seed_key: str = "train.seed"
  seeds: tuple = ()
  diverged_floor: float = 100.0

  @property
  def rounds(self) -> int:
    """Follow-up rounds that can add runs: edge extensions, downward extensions of an
    all-diverged group (the larger of the two), and the fresh seeds."""
    import math

    down = math.ceil(math.log(self.diverged_floor) / math.log(self.factor) - 1e-9)
    return max(self.max_extend, down) + 1


@dataclasses.dataclass(frozen=True)
class Sweep:
  """All runs of one experiment at one preset.

  base: overrides shared by every run (excluded from run directory names).
  blocks: the first-stage grids.
  lr_search: optional follow-up stages chosen from the first stage's results.
  wall_estimate_min: expected compute on this 2-core machine (documentation).
  """

  base: dict
  blocks: tuple
  lr_search: LrSearch | None = None
  wall_estimate_min: float | None = None


def run_dirname(point: dict) -> str:
  """Hydra's `${hydra.job.override_dirname}` for a point whose only overrides are its keys."""
  return ",".join(sorted(f"{k}={fmt(v)}" for k, v in point.items()))


def parse_dirname(name: str) -> dict:
  out = {}
  for item in name.split(","):
    k, _, v = item.partition("=")
    out[k] = v
  return out


# --------------------------------------------------------------------------- scale presets


def scale_file(preset: str) -> Path:
  return REPO / "configs" / "scale" / f"{preset}.yaml"


def config_value(path: Path, key: str):
  """The value of dotted `key` in the YAML file `path` (None: not set there)."""
  node = yaml.safe_load(Path(path).read_text()) or {}
  for part in key.split("."):
    if not isinstance(node, dict) or part not in node:
      return None
    node = node[part]
  return node


def experiment_value(name: str, key: str):
  """A value that `configs/experiment/<name>.yaml` sets (KeyError if it does not)."""
  path = REPO / "configs" / "experiment" / f"{name}.yaml"
  value = config_value(path, key)
  if value is None:
    raise KeyError(f"{key} is not set by {path}")
  return value


def scale_value(preset: str, key: str):
  """A value of `configs/scale/<preset>.yaml`, e.g. scale_value("cpu", "train.steps")."""
  value = config_value(scale_file(preset), key)
  if value is None:
    raise KeyError(f"{key} is not set by {scale_file(preset)}")
  return value


def base_for(name: str, preset: str, **over) -> dict:
  """Overrides shared by every run of experiment `name` at `preset`."""
  return {"experiment": name, "scale": preset, **over}


# --------------------------------------------------------------------------- sweep dirs

SWEEP_JSON = "sweep.json"
# Overrides that do not change what a run computes: the launcher's, the logging's, and
# where the prepared data is cached.
NEUTRAL = ("hydra", "logging", "data.tfds_dir")


def override_key(override: str) -> str:
  """`+a.b=1` -> `a.b`; `hydra/launcher=joblib` -> `hydra/launcher`."""
  return override.split("=", 1)[0].lstrip("+~")


def config_extras(extra: Sequence[str]) -> list[str]:
  """The extra overrides that change the runs' config, sorted."""
  def neutral(key: str) -> bool:
    key = key.replace("/", ".")
    return any(key == n or key.startswith(n + ".") for n in NEUTRAL)

  return sorted(e for e in extra if not neutral(override_key(e)))


def sweep_dir(root: Path, name: str, preset: str, extra: Sequence[str] = ()) -> Path:
  """`<root>/<name>/<preset>`, with `-<hash>` of the config-changing extras when any.

  The same experiment rerun with other data or model overrides thus gets its own sweep
  directory instead of being skipped onto finished runs of another config.
  """
  extras = config_extras(extra)
  if not extras:
    return Path(root) / name / preset
  digest = hashlib.sha256("\n".join(extras).encode()).hexdigest()[:8]
  return Path(root) / name / f"{preset}-{digest}"


def record_sweep(path: Path, preset: str, base: dict, extra: Sequence[str]) -> None:
  """Writes `<sweep dir>/sweep.json`; one clear error if the dir holds another config's runs."""
  doc = {"preset": preset, "base": {k: fmt(v) for k, v in base.items()},
         "extra": config_extras(extra)}
  f = Path(path) / SWEEP_JSON
  if f.exists():
    old = json.loads(f.read_text())
    if (old.get("preset"), old.get("extra")) != (doc["preset"], doc["extra"]):
      raise ValueError(f"{path} holds runs of preset {old.get('preset')!r} with extra "
                       f"overrides {old.get('extra')}, not {preset!r} with {doc['extra']}; "
                       "pass another --sweeps-root.")
  Path(path).mkdir(parents=True, exist_ok=True)
  f.write_text(json.dumps(doc, indent=1))
