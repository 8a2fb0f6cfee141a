"""The layer contract: stats <- optim <- train <- experiments, and who may touch OmegaConf.

Each module of the repository belongs to one layer; a module may import its own layer and
the layers below it, never one above. Hydra and OmegaConf are read only where a config
becomes a run plan (the schema, `pergrad.configure`) and at the command line (the CLI):
everything else takes plain objects.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

# Lowest first. A module's layer is that of the longest prefix that names it.
LAYERS = (
    ("base", ("pergrad.files", "pergrad.fields", "pergrad.model", "pergrad.loss",
              "pergrad.data")),
    ("stats", ("pergrad.stats",)),
    ("optim", ("pergrad.optim",)),
    ("train", ("pergrad.train", "pergrad.plan", "pergrad.config", "pergrad.configure",
               "pergrad.bench", "pergrad.analysis")),
    ("experiments", ("experiments",)),
)
RANK = {prefix: rank for rank, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes}
CONFIG_LIBS = ("omegaconf", "hydra")
CONFIG_TOUCHERS = {"pergrad/config.py", "pergrad/configure.py", "pergrad/train/cli.py"}


def layer_of(module: str) -> int | None:
  """The rank of `module`'s layer (None: not a module of this repository)."""
  best = None
  for prefix, rank in RANK.items():
    if module == prefix or module.startswith(prefix + "."):
      if best is None or len(prefix) > len(best[0]):
        best = (prefix, rank)
  return None if best is None else best[1]


def module_name(path: Path) -> str:
  parts = list(path.relative_to(REPO).with_suffix("").parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def imports(source: str, module: str) -> set[str]:
  """Every module `source` imports (absolute; relative imports resolved against
  `module`), at any depth: a function-level import counts as much as a top-level one."""
  out = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        pkg = module.split(".")[: -node.level] if node.level else []
        base = ".".join(pkg + ([base] if base else []))
      out.add(base)
      out |= {f"{base}.{a.name}" for a in node.names}
  return out


def violations(source: str, module: str, rel: str) -> list[str]:
  """The contract's violations by one module's source (empty: none)."""
  own = layer_of(module)
  names = imports(source, module)
  bad = []
  for name in sorted(names):
    target = layer_of(name)
    if own is not None and target is not None and target > own:
      bad.append(f"{rel} ({LAYERS[own][0]}) imports {name} ({LAYERS[target][0]})")
  libs = sorted({n.split(".")[0] for n in names} & set(CONFIG_LIBS))
  if libs and own is not None and rel not in CONFIG_TOUCHERS:
    bad.append(f"{rel} imports {', '.join(libs)}: only {sorted(CONFIG_TOUCHERS)} touch the "
               "config libraries; take a RunPlan (or read the run's files with yaml) instead")
  return bad


def _sources():
  for top in ("pergrad", "experiments"):
    for path in sorted((REPO / top).rglob("*.py")):
      yield path


def test_every_module_respects_the_layer_contract():
  bad = []
  for path in _sources():
    rel = path.relative_to(REPO).as_posix()
    bad += violations(path.read_text(), module_name(path), rel)
  assert bad == [], "layer contract broken:\n" + "\n".join(bad)


@pytest.mark.parametrize("module,source,expect", [
    ("pergrad.stats.api", "from pergrad.optim import build\n", "imports pergrad.optim"),
    ("pergrad.stats.api", "from ..train import loop\n", "imports pergrad.train"),
    ("pergrad.optim.sign", "def f():\n  import pergrad.train.step\n", "pergrad.train.step"),
    ("pergrad.train.loop", "from experiments import runner\n", "imports experiments"),
    ("pergrad.train.loop", "from omegaconf import OmegaConf\n", "touch the config"),
    ("experiments.snr", "import omegaconf\n", "touch the config"),
])
def test_the_contract_check_catches_a_violation(module, source, expect):
  rel = module.replace(".", "/") + ".py"
  found = violations(source, module, rel)
  assert any(expect in v for v in found), found


def test_allowed_imports_pass():
  assert violations("from pergrad.stats import GradStats\nimport jax\n",
                    "pergrad.optim.sign", "pergrad/optim/sign.py") == []
  assert violations("from . import types\n", "pergrad.stats.api", "pergrad/stats/api.py") == []
  assert violations("from pergrad.train.step import x\n", "experiments.overhead",
                    "experiments/overhead.py") == []
