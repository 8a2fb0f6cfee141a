"""What an experiment sweeps: grids of Hydra overrides, scale presets (`configs/scale/`), sweep
directories (a run's is its swept keys as Hydra writes them, `pergrad.analysis.runs.run_dirname`,
so a relaunch lands on the same directories)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import numbers
from pathlib import Path
from typing import Callable, Sequence

import yaml

from pergrad.analysis import sequential
from pergrad.analysis.runs import fmt

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("ci", "cpu", "paper")
RESULTS = REPO / "results"
# The scale ladder's rungs (experiments/ladder.py writes their configs/scale/<preset>.yaml):
# `<family>_<rung>`, a smaller model at its family's batch and sequence sizes, its steps giving
# every rung of the family the same tokens per parameter.
RUNG_PRESETS = ("ci_xxs", "ci_xs", "ci_s", "cpu_xxs", "cpu_xs", "cpu_s", "paper_xxs", "paper_xs",
                "paper_s")
SEEDS = {"ci": (0,), "cpu": (0, 1, 2), "paper": (0, 1, 2)}  # of moments, snr and gns_layers


def family(preset: str) -> str:
  """The base preset of a ladder rung (`cpu_xs` -> `cpu`); a base preset itself."""
  return preset.split("_", 1)[0]


def is_rung(preset: str) -> bool:
  return preset in RUNG_PRESETS


def check_preset(preset: str) -> None:
  """One clear error for a preset that is not known."""
  if preset not in PRESETS + RUNG_PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {PRESETS + RUNG_PRESETS}.")


@dataclasses.dataclass(frozen=True)
class Block:
  """A Cartesian grid launched as one Hydra multirun: `grid` (swept keys -> values; they name
  the run directory) and `fixed` (keys -> value of the block, not in the name)."""

  grid: dict
  fixed: dict = dataclasses.field(default_factory=dict)

  def points(self) -> list[dict]:
    keys = list(self.grid)
    return [dict(zip(keys, vals, strict=False)) for vals in itertools.product(*self.grid.values())]


POLICY = ("each group's lr is chosen on its selection seeds alone and its numbers are the "
          "mean ± std of fresh seeds at that lr, never a selection seed")


@dataclasses.dataclass(frozen=True)
class Tuned:
  """A value tuned beside the lr (Adam's ε, the fixed batch size) in each family of groups (the
  groups equal in `within`): the value whose group scores lowest at its chosen lr (`metric`:
  "select_loss", the selection seeds' mean, or "loss_mean", the search's own fresh seeds'). At
  an edge of the measured values the search adds the next value, `factor` past it, with the
  overrides `extra(value)` that go with it and the first-stage lrs of its nearest value's block,
  ≤ `max_extend` past the first-stage values a side, within the declared [`low`, `high`]."""

  key: str
  within: tuple
  factor: float
  low: float
  high: float
  max_extend: int = 2
  metric: str = "select_loss"
  extra: Callable[[float], dict] | None = None

  def point(self, value) -> dict:
    """{key: value, **extra(value)}: the overrides of a group at `value`."""
    return {self.key: value, **(self.extra(value) if self.extra else {})}

  def next(self, value, edge: str):
    """The value past `value` on side `edge` (low|high), as the grids write it; None outside
    [low, high]."""
    x = value / self.factor if edge == "low" else value * self.factor
    x = int(round(x)) if isinstance(value, numbers.Integral) else float(f"{x:.3g}")
    return x if self.low <= x <= self.high else None


@dataclasses.dataclass(frozen=True)
class MoreSeeds:
  """Group-sequential seeds for a comparison still open after the pilot
  (`experiments.more_seeds`): `pairs(best)`, the pairs of arms, each {key: value} of its group
  keys and lr (from `best`, `lr_search.best_lr`'s table, or an arm run at a fixed lr), that the
  report compares paired at the declared `effect`; `most`, the cap (seeds a side, declared with
  the experiment); `margin`, the equivalence margin (default `effect`); `spending`, the
  sequential design's (`pergrad.analysis.sequential.SPENDINGS`)."""

  pairs: Callable
  effect: float
  most: int
  margin: float | None = None
  spending: str = "pocock"

  def __post_init__(self):
    if self.margin is None:
      object.__setattr__(self, "margin", self.effect)

  def design(self, pilot: int):
    """The two-look design: the pilot's seeds, then the cap."""
    return sequential.design((pilot, self.most) if self.most > pilot else (pilot,),
                             self.spending)


# The fewest pilot seeds `MoreSeeds` accepts: the first look's paired t has pilot − 1 degrees
# of freedom (its critical value 4.3 at 3 seeds, 2.8 at 5), so a smaller pilot decides little.
MIN_PILOT = 5


@dataclasses.dataclass(frozen=True)
class LrSearch:
  """`POLICY` per group of `group_keys`: the lowest mean final eval loss over the selection
  seeds (the first block's) picks the lr; a best lr at an edge extends the grid by `factor`
  (≤ `max_extend` times a side, an all-diverged group down to `diverged_floor` below it);
  `each_seed`: also where one selection seed's own best lr is at an edge (an experiment that
  reads each seed's lr*, `lr_exponent`); `tuned`: a value chosen beside the lr, its grid
  extended past an edge likewise (`Tuned`);
  `more`: the fresh seeds are a pilot, more seeds added where a comparison is under-powered
  (`MoreSeeds`)."""

  group_keys: tuple
  lr_key: str = "optimizer.lr"
  factor: float = 3.0
  max_extend: int = 2
  seed_key: str = "train.seed"
  seeds: tuple = ()
  diverged_floor: float = 100.0
  tuned: Tuned | None = None
  more: MoreSeeds | None = None
  each_seed: bool = False

  def __post_init__(self):
    if self.more is not None and len(self.seeds) < MIN_PILOT:
      raise ValueError(f"LrSearch: more seeds after a pilot of {len(self.seeds)} seeds; the "
                       f"pilot needs ≥ {MIN_PILOT} (sweep.MIN_PILOT): give `seeds` more.")

  @property
  def rounds(self) -> int:
    """Follow-up rounds that can add runs: extensions (up or down) and the fresh seeds; with
    `tuned`, again for each value it can add (its first lrs, its seeds awaited); with `more`,
    one more (the pilot's seeds awaited)."""
    down = math.ceil(math.log(self.diverged_floor) / math.log(self.factor) - 1e-9)
    one = max(self.max_extend, down) + 1
    tuned = one if self.tuned is None else (one + 2) * (1 + 2 * self.tuned.max_extend)
    return tuned + (self.more is not None)


@dataclasses.dataclass(frozen=True)
class Sweep:
  """All runs of one experiment at one preset: `base` overrides (not in the run names), the
  first-stage `blocks`, an optional `lr_search`, the expected minutes on 2 cores."""

  base: dict
  blocks: tuple
  lr_search: LrSearch | None = None
  wall_estimate_min: float | None = None


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


SWEEP_JSON = "sweep.json"
# Overrides that do not change what a run computes: the launcher's, the logging's, the cache's.
NEUTRAL = ("hydra", "logging", "data.tfds_dir", "train.compile_cache")


def override_key(override: str) -> str:
  """`+a.b=1` -> `a.b`; `hydra/launcher=joblib` -> `hydra/launcher`."""
  return override.split("=", 1)[0].lstrip("+~")


def config_extras(extra: Sequence[str]) -> list[str]:
  """The extra overrides that change the runs' config, sorted."""
  neutral = lambda key: any(key == n or key.startswith(n + ".") for n in NEUTRAL)
  return sorted(e for e in extra if not neutral(override_key(e).replace("/", ".")))


def sweep_dir(root: Path, name: str, preset: str, extra: Sequence[str] = ()) -> Path:
  """`<root>/<name>/<preset>`, with `-<hash>` of the config-changing extras when any (so a
  rerun with other data or model overrides is not skipped onto another config's runs)."""
  extras = "\n".join(config_extras(extra))
  tag = "-" + hashlib.sha256(extras.encode()).hexdigest()[:8] if extras else ""
  return Path(root) / name / (preset + tag)


def record_sweep(path: Path, preset: str, base: dict, extra: Sequence[str],
                 version: str | None = None) -> None:
  """Writes `<sweep dir>/sweep.json` with the training version its runs are trained at
  (`experiments.reuse.training_version`); one clear error if the dir holds another config's
  runs, or runs (or a benchmark's output) trained at another version or at an unrecorded
  one: their numbers would not be this code's."""
  doc = {"preset": preset, "base": {k: fmt(v) for k, v in base.items()},
         "extra": config_extras(extra), "train_version": version}
  f = Path(path) / SWEEP_JSON
  old = json.loads(f.read_text()) if f.exists() else doc
  if (old.get("preset"), old.get("extra")) != (doc["preset"], doc["extra"]):
    raise ValueError(f"{path} holds runs of preset {old.get('preset')!r} with extra "
                     f"overrides {old.get('extra')}, not {preset!r} with {doc['extra']}; "
                     "pass another --sweeps-root.")
  made = old.get("train_version") if f.exists() else (
      "unrecorded" if _holds_output(Path(path)) else version)
  if made != version:
    raise ValueError(f"{path} holds runs trained at training version {made}, not this "
                     f"checkout's {version} (pergrad/, configs/ or the installed dependencies "
                     "differ): they are not this code's runs; pass another --sweeps-root.")
  Path(path).mkdir(parents=True, exist_ok=True)
  f.write_text(json.dumps(doc, indent=1))


def _holds_output(path: Path) -> bool:
  """Whether a sweep directory without sweep.json already holds a run or a benchmark's JSON."""
  return path.is_dir() and any((p / "metrics.jsonl").exists() or p.suffix == ".json"
                               for p in path.iterdir())
