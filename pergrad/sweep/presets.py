"""Scale presets (`configs/scale/<preset>.yaml`) and where a sweep at one lives: the checkout
(`REPO`), the values its configs set, the default sweep and results directories."""

from __future__ import annotations

from pathlib import Path

import yaml

from pergrad.sweep.grid import sweep_dir

REPO = Path(__file__).resolve().parents[2]  # the checkout: configs/, results/, runs/
PRESETS = ("ci", "cpu", "paper")
RESULTS = REPO / "results"
# The scale ladder's rungs (experiments/ladder.py writes their configs/scale/<preset>.yaml):
# `<family>_<rung>`, a smaller model at its family's batch and sequence sizes, its steps giving
# every rung of the family the same tokens per parameter.
RUNG_PRESETS = ("ci_xxs", "ci_xs", "ci_s", "cpu_xxs", "cpu_xs", "cpu_s", "paper_xxs", "paper_xs",
                "paper_s")
SEEDS = {"ci": (0,), "cpu": (0, 1, 2), "paper": (0, 1, 2)}  # of a preset's repeated-seed sweeps


def family(preset: str) -> str:
  """The base preset of a ladder rung (`cpu_xs` -> `cpu`); a base preset itself."""
  return preset.split("_", 1)[0]


def is_rung(preset: str) -> bool:
  return preset in RUNG_PRESETS


def check_preset(preset: str) -> None:
  """One clear error for a preset that is not known."""
  if preset not in PRESETS + RUNG_PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {PRESETS + RUNG_PRESETS}.")


def scale_file(preset: str) -> Path:
  return REPO / "configs" / "scale" / f"{preset}.yaml"


def config_value(path: Path, key: str):
  """The value of dotted `key` in the YAML file `path` (KeyError if it is not set there)."""
  node = yaml.safe_load(Path(path).read_text()) or {}
  for part in key.split("."):
    if not isinstance(node, dict) or node.get(part) is None:
      raise KeyError(f"{key} is not set by {path}")
    node = node[part]
  return node


def experiment_value(name: str, key: str):
  """A value that `configs/experiment/<name>.yaml` sets."""
  return config_value(REPO / "configs" / "experiment" / f"{name}.yaml", key)


def scale_value(preset: str, key: str):
  """A value that `configs/scale/<preset>.yaml` sets."""
  return config_value(scale_file(preset), key)


def base_for(name: str, preset: str, **over) -> dict:
  """Overrides shared by every run of experiment `name` at `preset` (no figure per run: the
  experiment's report draws its own)."""
  return {"experiment": name, "scale": preset, "logging.figure": False, **over}


def default_sweep_dir(name: str, preset: str, root: Path | None = None,
                      extra: tuple = ()) -> Path:
  return sweep_dir(root or REPO / "runs" / "sweeps", name, preset, extra)


def default_results_dir(name: str, preset: str, sdir: Path) -> Path:
  """results/<preset>/<name>[-<hash>] for the real presets, results/<family>/ladder/<rung>/
  <name>[-<hash>] for a ladder rung's; ci (and its rungs) report beside the sweep."""
  tag = sdir.name.removeprefix(preset)
  if family(preset) == "ci":
    return sdir / "report"
  if is_rung(preset):
    return RESULTS / family(preset) / "ladder" / preset.split("_", 1)[1] / (name + tag)
  return RESULTS / preset / (name + tag)
