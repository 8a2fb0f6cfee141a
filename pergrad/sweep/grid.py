"""What a sweep runs: grids of Hydra overrides (`Block`), one experiment's runs at a preset
(`Sweep`), sweep directories (a run's is its swept keys as Hydra writes them,
`pergrad.analysis.runs.run_dirname`, so a relaunch lands on the same directories) and their
`sweep.json` (the preset, the config-changing overrides, the training version)."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from pathlib import Path
from typing import Sequence

from pergrad.analysis.runs import fmt
from pergrad.sweep.search import LrSearch


@dataclasses.dataclass(frozen=True)
class Block:
  """A Cartesian grid launched as one Hydra multirun: `grid` (swept keys -> values; they name
  the run directory) and `fixed` (keys -> value of the block, not in the name)."""

  grid: dict
  fixed: dict = dataclasses.field(default_factory=dict)

  def points(self) -> list[dict]:
    keys = list(self.grid)
    return [dict(zip(keys, vals, strict=False)) for vals in itertools.product(*self.grid.values())]


@dataclasses.dataclass(frozen=True)
class Sweep:
  """All runs of one experiment at one preset: `base` overrides (not in the run names), the
  first-stage `blocks`, an optional `lr_search`, the expected minutes on 2 cores."""

  base: dict
  blocks: tuple
  lr_search: LrSearch | None = None
  wall_estimate_min: float | None = None


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
  (`pergrad.sweep.reuse.training_version`); one clear error if the dir holds another config's
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
