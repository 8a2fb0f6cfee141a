"""The `Experiment` a module (or a plugin: `scripts/reproduce.py --plugin mine.py`) registers,
the registry the runner reads, provenance."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import math
import subprocess
from pathlib import Path
from typing import Callable

import pandas as pd

from pergrad.analysis.report import Report
from pergrad.registry import Registry
from pergrad.sweep import REPO, Sweep, sweep_dir


@dataclasses.dataclass(frozen=True)
class Inputs:
  """Where the runs of the experiments another one `needs` are (same root, preset, extras)."""

  root: Path
  preset: str
  extra: tuple = ()
  dry_run: bool = False  # a needed search not run yet gives placeholder lrs (`lr_search`)

  def sweep_dir(self, name: str) -> Path:
    return sweep_dir(self.root, name, self.preset, self.extra)


@dataclasses.dataclass
class Runs:
  """What `analyze(runs, out_dir)` gets: the sweep directory and, for a training sweep, its
  table (`pergrad.analysis.runs.aggregate`; the runs' shared overrides in `attrs`) and the
  finals with `DIVERGED_RULE` applied."""

  sweep_dir: Path
  table: pd.DataFrame | None = None
  finals: pd.DataFrame | None = None
  sweep: Sweep | None = None  # the plan the runs came from (its selection seeds, `select_seeds`)


@dataclasses.dataclass(frozen=True)
class Rung:
  """What an experiment measures on the scale ladder (`experiments.ladder`): `value(out_dir)`,
  its claim's number from a rung's result CSVs (NaN when absent), beside the paper's `paper`
  (a floor when `one_sided`: past it is as close as at it); `runs(b, steps)`, the (batch
  size, steps) of every run it launches at a rung of `steps` steps at batch size `b`;
  `own_model`: also read at the family's own model (False: its preset runs a rung-sized one)."""

  claim: str
  label: str
  paper: float
  value: Callable[[Path], float]
  runs: Callable[[int, int, str], list]
  one_sided: bool = False
  own_model: bool = True


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment: its module `experiments/<name>.py` and `configs/experiment/<name>.yaml`.
  Either `sweep(preset[, inputs]) -> Sweep` (training runs) or `launch(preset, sweep_dir,
  how) -> LaunchLog` (`launch.How`; a benchmark, or the ladder's launches); `analyze(runs,
  out_dir)` writes CSVs, `figures` and `report` read them only; `follow_up(preset, sweep_dir)
  -> blocks` chosen from the first stage's runs. `row`: its row of the claims table, decided
  by the paper's own test when `papers_test`, else a comparison of ours beside it; `rank`:
  its place in `all` and the results index; `stream`: the test suite's ci stream that runs it
  (tests/conftest.py; None: none); `rung`: what it measures on the scale ladder."""

  name: str
  title: str
  claim: str
  row: str
  analyze: Callable
  figures: Callable
  report: Callable[[Path], Report]
  sweep: Callable | None = None
  launch: Callable | None = None
  needs: tuple = ()
  follow_up: Callable | None = None
  describe_setup: Callable | None = None
  papers_test: bool = False
  rank: float = math.inf
  stream: int | None = None
  rung: Rung | None = None

  def sweep_at(self, preset: str, inputs: Inputs | None = None):
    """The Sweep at `preset` (`inputs` is passed when the experiment `needs` others)."""
    return self.sweep(preset, inputs) if self.needs else self.sweep(preset)

  def __post_init__(self):
    if (self.sweep is None) == (self.launch is None):
      raise ValueError(f"experiment {self.name!r}: give exactly one of sweep= (training "
                       "runs) and launch= (a benchmark).")


_REGISTRY: Registry[Experiment] = Registry(
    "experiment", hint="choose one of them or 'all', or register yours in a plugin: --plugin")

EXPERIMENTS_DIR = REPO / "experiments"
CONFIGS_DIR = REPO / "configs" / "experiment"


def builtin() -> tuple[str, ...]:
  """The built-in experiments' names: each `experiments/<name>.py` with its
  `configs/experiment/<name>.yaml`."""
  return tuple(sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml")
                      if (EXPERIMENTS_DIR / f"{p.stem}.py").exists()))


def register(exp: Experiment) -> Experiment:
  """Adds `exp` to the registry (again under its name when its module is re-imported)."""
  old = _REGISTRY.get(exp.name) if exp.name in _REGISTRY else None
  if old is not None and old.report.__module__ != exp.report.__module__:
    raise ValueError(f"experiment {exp.name!r} is registered by {old.report.__module__} "
                     f"already; give the one of {exp.report.__module__} another name.")
  return _REGISTRY.register(exp.name, exp, replace=True)


def load_plugin(spec: str) -> None:
  """Imports a plugin that registers experiments: a dotted module name or a .py file path."""
  if spec.endswith(".py"):
    path = Path(spec).resolve()
    if not path.exists():
      raise ValueError(f"plugin {spec} does not exist; pass a .py file or a module name.")
    mod_spec = importlib.util.spec_from_file_location(f"pergrad_plugin_{path.stem}", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
  else:
    importlib.import_module(spec)


def experiments() -> dict[str, Experiment]:
  """Every registered experiment by name: the built-in ones by `rank`, then those of plugins
  in the order they registered."""
  names = builtin()
  for n in names:
    if n not in _REGISTRY:
      importlib.import_module(f"experiments.{n}")
  own = sorted(names, key=lambda n: _REGISTRY.get(n).rank)
  return {**{n: _REGISTRY.get(n) for n in own}, **dict(_REGISTRY.items())}


def get(name: str) -> Experiment:
  experiments()
  return _REGISTRY.get(name)


def in_order(names) -> tuple:
  """`names` with each experiment's `needs` that are among them before it (stable)."""
  names, out = list(names), []

  def visit(n, stack=()):
    if n in out or n not in names:
      return
    if n in stack:
      raise ValueError(f"experiments {stack} need each other in a cycle; break it.")
    for d in get(n).needs:
      visit(d, (*stack, n))
    out.append(n)

  for n in names:
    visit(n)
  return tuple(out)


def same_code(a: str | None, b: str | None, repo: Path = REPO) -> bool:
  """Whether commits `a` and `b` hold the same files outside results/ (what a reproduction
  writes, and what a carried one commits, `pergrad.sweep.carry`): a report made at `a` is what
  `b` would make. False for an unknown commit."""
  if not a or not b or "unknown" in (a, b):
    return False
  if a == b:
    return True
  diff = subprocess.run(["git", "diff", "--quiet", a, b, "--", ".", ":(exclude)results"],
                        cwd=repo, capture_output=True)
  return diff.returncode == 0


def provenance(repo: Path = REPO) -> dict:
  """{"commit": HEAD's hash, "clean": no uncommitted change outside results/ (which the
  reproduction writes)}; "unknown" and False outside a git checkout."""
  git = lambda *a: subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True,
                                  check=True).stdout.strip()
  try:
    head, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", ".",
                                                  ":(exclude)results")
  except (OSError, subprocess.CalledProcessError):
    return {"commit": "unknown", "clean": False}
  return {"commit": head, "clean": not status}


def report_commits(results_root) -> dict[str, list[str]]:
  """{analysis commit: the report directories (relative to `results_root`) whose report.json
  records it} over every report.json under `results_root`, the ladder's rungs included ("none":
  a report without one). A reproduction's reports share one commit."""
  import json

  out: dict[str, list[str]] = {}
  for f in sorted(Path(results_root).rglob("report.json")):
    commit = json.loads(f.read_text()).get("commit") or "none"
    out.setdefault(commit, []).append(str(f.parent.relative_to(results_root)))
  return out
