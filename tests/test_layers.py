"""The import contract: floors, no circles, and who may touch the config libraries.

Every top-level module or package is its own unit, on a floor (lowest first, `FLOORS`):

    pergrad (the package's __init__) < fields, files, registry, layer_types, bounds < loss, model
    < stats, data < optim < config < train < bench, analysis < sweep < experiments < scripts,
    notebooks

A unit imports its own modules and the units of lower floors only: never one on its
floor or above. Every import counts, at any depth (a function-level import as much as a
top-level one); relative imports are resolved against the module's package (in an
`__init__.py`, the package itself). Scripts (`scripts/*.py`) and notebooks (the code cells
of `notebooks/*.ipynb`) are checked like modules. Besides the floors: no import circle
between modules; `experiments` reads pergrad through its reading surface (`EXPERIMENT_SURFACE`);
Hydra and OmegaConf are imported only where a config is composed (`CONFIG_TOUCHERS`).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from conftest import REPO

FLOORS = (
    ("pergrad",),
    ("pergrad.fields", "pergrad.files", "pergrad.registry", "pergrad.layer_types",
     "pergrad.bounds"),
    ("pergrad.loss", "pergrad.model"),
    ("pergrad.stats", "pergrad.data"),
    ("pergrad.optim",),
    ("pergrad.config",),
    ("pergrad.train",),
    ("pergrad.bench", "pergrad.analysis"),
    ("pergrad.sweep",),
    ("experiments",),
    ("scripts", "notebooks"),
)
FLOOR = {unit: rank for rank, units in enumerate(FLOORS) for unit in units}
EXPERIMENT_SURFACE = (*FLOORS[1], "pergrad.analysis", "pergrad.bench", "pergrad.sweep")
CONFIG_LIBS = ("hydra", "omegaconf")
CONFIG_TOUCHERS = ("pergrad.config", "pergrad.train.cli", "scripts", "notebooks")
# Violations that other branches remove; the lead empties this after merging them.
KNOWN_VIOLATIONS: frozenset[str] = frozenset()


def _under(name: str, prefixes) -> str | None:
  """The longest of `prefixes` that is `name` or a package above it."""
  found = [p for p in prefixes if name == p or name.startswith(p + ".")]
  return max(found, key=len) if found else None


def unit_of(module: str) -> str | None:
  return _under(module, FLOOR)


def module_name(path: Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def notebook_code(path: Path) -> str:
  """The code cells of a notebook, IPython magics and shell lines left out."""
  cells = json.loads(path.read_text())["cells"]
  lines = [line for c in cells if c["cell_type"] == "code"
           for line in "".join(c["source"]).splitlines()
           if not line.lstrip().startswith(("%", "!"))]
  return "\n".join(lines)


def repo_sources() -> dict[str, tuple[str, bool]]:
  """{module: (source, is a package's __init__)} of every checked file."""
  out = {}
  for top in ("pergrad", "experiments"):
    for path in sorted((REPO / top).rglob("*.py")):
      out[module_name(path)] = (path.read_text(), path.name == "__init__.py")
  for path in sorted((REPO / "scripts").glob("*.py")):
    out[module_name(path)] = (path.read_text(), False)
  for path in sorted((REPO / "notebooks").glob("*.ipynb")):
    out[module_name(path)] = (notebook_code(path), False)
  return out


def imports(source: str, module: str, is_init: bool) -> set[str]:
  """Every name `source` imports, absolute ("a.b.name" for `from a.b import name`: the
  module a.b.name, or the name defined by a.b), relative imports resolved against the
  module's package. A relative import that climbs above the top package yields
  "<above the top package>"."""
  package = module.split(".") if is_init else module.split(".")[:-1]
  out = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        if node.level > len(package):
          out.add("<above the top package>")
          continue
        keep = package[:len(package) - node.level + 1]
        base = ".".join(keep + ([base] if base else []))
      out |= {f"{base}.{a.name}" if a.name != "*" else base for a in node.names}
  return out


def targets(names: set[str], modules) -> set[str]:
  """The repository modules that `names` refer to (a module, or the module defining a name)."""
  return {m for m in (_under(n, modules) for n in names) if m}


def module_violations(module: str, names: set[str], script_names=()) -> list[str]:
  """The violations of one module's imports (every rule but circles)."""
  own = unit_of(module)
  bad = []
  for name in sorted(names):
    if name == "<above the top package>":
      bad.append(f"{module}: a relative import climbs above the top package")
      continue
    unit = unit_of(name)
    if own in ("scripts", "notebooks") and name.split(".")[0] in script_names:
      bad.append(f"{module} imports the script {name}: scripts import no other script")
    if unit is None or unit == own or own is None:
      continue
    if FLOOR[unit] >= FLOOR[own]:
      where = "its own floor" if FLOOR[unit] == FLOOR[own] else "a floor above"
      bad.append(f"{module} ({own}) imports {name} ({unit}, {where})")
    elif own == "experiments" and unit not in EXPERIMENT_SURFACE:
      bad.append(f"{module} imports {name}: experiments read pergrad through "
                 f"{', '.join(EXPERIMENT_SURFACE)}")
  libs = sorted({n.split(".")[0] for n in names} & set(CONFIG_LIBS))
  if libs and own is not None and not _under(module, CONFIG_TOUCHERS):
    bad.append(f"{module} imports {', '.join(libs)}: only {', '.join(CONFIG_TOUCHERS)} "
               "touch the config libraries; take a RunPlan instead")
  return bad


def circles(graph: dict[str, set[str]]) -> list[str]:
  """One line per import circle (strongly connected component of more than one module),
  as a path from its smallest module back to it."""
  index, low, stack, on, comps = {}, {}, [], set(), []

  def visit(v):  # Tarjan
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = set()
      while True:
        w = stack.pop()
        on.discard(w)
        comp.add(w)
        if w == v:
          break
      if len(comp) > 1:
        comps.append(comp)

  for v in sorted(graph):
    if v not in index:
      visit(v)
  out = []
  for comp in comps:  # the shortest circle through the component's smallest module
    start = min(comp)
    paths, seen = [[start]], {start}
    while not any(start in graph[p[-1]] for p in paths):
      paths = [p + [w] for p in paths for w in sorted(graph[p[-1]] & comp - seen)
               if not seen.add(w)]
    path = next(p for p in paths if start in graph[p[-1]])
    out.append("circle: " + " -> ".join([*path, start]))
  return sorted(out)


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
  """Every violation of the contract by `sources` ({module: (source, is_init)})."""
  script_names = {m.split(".", 1)[1] for m in sources if unit_of(m) in ("scripts", "notebooks")}
  graph, bad = {}, []
  for module, (source, is_init) in sources.items():
    names = imports(source, module, is_init)
    bad += module_violations(module, names, script_names)
    graph[module] = targets(names, sources) - {module}
  return sorted(bad + circles(graph))


def test_the_repository_keeps_the_contract():
  found = set(violations(repo_sources()))
  new, stale = sorted(found - KNOWN_VIOLATIONS), sorted(KNOWN_VIOLATIONS - found)
  assert not new, "import contract broken:\n" + "\n".join(new)
  assert not stale, "fixed; remove from KNOWN_VIOLATIONS:\n" + "\n".join(stale)


def _one(module: str, source: str, is_init: bool = False, **more) -> list[str]:
  return violations({module: (source, is_init), **{m: (s, False) for m, s in more.items()}})


@pytest.mark.parametrize("module,source,is_init,expect", [
    # an import back up a floor, at the top or inside a function
    ("pergrad.stats.api", "from pergrad.optim import build\n", False,
     "imports pergrad.optim.build (pergrad.optim, a floor above)"),
    ("pergrad.optim.sign", "def f():\n  import pergrad.train.step\n", False,
     "imports pergrad.train.step (pergrad.train, a floor above)"),
    ("pergrad.config.plan", "from pergrad.train.heldout import HELDOUT_REQUEST\n", False,
     "(pergrad.train, a floor above)"),
    ("pergrad.analysis.runs", "from experiments.runner import get\n", False,
     "imports experiments.runner.get (experiments, a floor above)"),
    ("pergrad.sweep.reuse", "def f():\n  from experiments.runner import REPO\n", False,
     "imports experiments.runner.REPO (experiments, a floor above)"),
    ("pergrad.analysis.runs", "from pergrad.sweep import Block\n", False,
     "(pergrad.sweep, a floor above)"),
    # a sibling on the same floor
    ("pergrad.stats.api", "from pergrad.data import DataSpec\n", False,
     "(pergrad.data, its own floor)"),
    # relative imports: in an __init__.py, `..` is the package's parent
    ("pergrad.stats", "from ..train import loop\n", True,
     "imports pergrad.train.loop (pergrad.train, a floor above)"),
    ("pergrad.stats.api", "from ..train import loop\n", False, "imports pergrad.train.loop"),
    ("pergrad.stats", "from ... import x\n", True, "climbs above the top package"),
    # scripts and notebooks: no script imports another
    ("scripts.bench_stats", "import reproduce\n", False, "imports the script reproduce"),
    ("notebooks.figures", "from train import main\n", False, "imports the script train"),
    # experiments read pergrad through its reading surface
    ("experiments.snr", "from pergrad.train.step import Steps\n", False,
     "experiments read pergrad through"),
    # the config libraries
    ("pergrad.train.loop", "from omegaconf import OmegaConf\n", False, "touch the config"),
    ("experiments.snr", "import omegaconf\n", False, "touch the config"),
])
def test_the_check_catches_each_violation(module, source, is_init, expect):
  more = {"scripts.reproduce": "", "scripts.train": ""}
  found = _one(module, source, is_init, **more)
  assert any(expect in v for v in found), found


def test_the_check_catches_a_circle():
  found = violations({"experiments.a": ("from experiments import b\n", False),
                      "experiments.b": ("def f():\n  import experiments.c\n", False),
                      "experiments.c": ("from .a import x\n", False)})
  assert found == ["circle: experiments.a -> experiments.b -> experiments.c -> experiments.a"]


@pytest.mark.parametrize("module,source,is_init", [
    ("pergrad.optim.sign", "from pergrad.stats import GradStats\nimport jax\n", False),
    ("pergrad.stats", "from . import api\nfrom .api import compute\n", True),
    ("pergrad.stats.api", "from . import backends\n", False),
    ("pergrad.model", "from pergrad.fields import Choice\n", False),
    ("pergrad.config.plan", "from pergrad.optim import build_optimizer\n", False),
    ("pergrad.train.loop", "from pergrad.config.plan import RunPlan\n", False),
    ("pergrad.config.composer", "from omegaconf import OmegaConf\n", False),
    ("experiments.overhead", "from pergrad.bench import stats\n", False),
    ("pergrad.analysis.rules", "from pergrad.layer_types import layer_type\n", False),
    ("experiments.snr", "from pergrad.analysis.rules import PAIR_WIN\n", False),
    ("experiments.snr", "from pergrad.sweep import Block, LrSearch\n", False),
    ("pergrad.sweep.launch", "from pergrad.analysis.runs import run_status\n", False),
    ("scripts.train", "from pergrad.train.cli import main\nimport experiments\n", False),
    ("notebooks.figures", "from pergrad.train.metrics import resmooth\n", False),
])
def test_allowed_imports_pass(module, source, is_init):
  assert _one(module, source, is_init) == []
