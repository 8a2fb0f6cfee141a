"""Imports flow one way: no loop among the project's modules, counting the imports inside
functions (which `farm-studio look` and Python's import-time checks do not see)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("pergrad", "experiments", "scripts")


def modules() -> dict[str, Path]:
  """{dotted name: file} of every module of `ROOTS` (a package by its __init__.py)."""
  out = {}
  for root in ROOTS:
    for f in (REPO / root).rglob("*.py"):
      parts = f.relative_to(REPO).with_suffix("").parts
      out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
  return out


def imports(tree: ast.AST, mods: dict, here: str) -> set[str]:
  """The project modules that `tree` imports anywhere in it (at its top or in a function)."""
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out |= {a.name for a in node.names if a.name in mods}
    elif isinstance(node, ast.ImportFrom) and node.module:
      base = node.module
      if node.level:  # relative: from the package of `here`
        pkg = here.split(".")[: len(here.split(".")) - node.level + (here in PACKAGES)]
        base = ".".join([*pkg, node.module])
      for a in node.names:
        full = f"{base}.{a.name}"
        out.add(full if full in mods else base)
  return {m for m in out if m in mods and m != here}


PACKAGES: set = set()


def graph() -> dict[str, set[str]]:
  mods = modules()
  PACKAGES.update(m for m, f in mods.items() if f.name == "__init__.py")
  return {m: imports(ast.parse(f.read_text()), mods, m) for m, f in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
  """Loops among modules, a package's own submodules importing it (its face) left out."""
  inside = lambda a, b: b in PACKAGES and a.startswith(b + ".")
  edges = {a: {b for b in bs if not inside(a, b) and not inside(b, a)} for a, bs in g.items()}
  found, state = [], {}

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(edges.get(node, ())):
      if state.get(nxt) == 1:
        found.append(path[path.index(nxt):] + [nxt])
      elif nxt not in state:
        visit(nxt, [*path, nxt])
    state[node] = 2

  for m in sorted(edges):
    if m not in state:
      visit(m, [m])
  return found


def test_no_import_loop_even_through_function_level_imports():
  assert cycles(graph()) == []


def test_the_walk_sees_a_loop_through_a_function_level_import():
  g = {"a": {"b"}, "b": set()}
  assert cycles(g) == []
  tree = ast.parse("def f():\n  from a import x\n")
  g["b"] = imports(tree, {"a": None, "b": None}, "b")
  assert cycles(g) == [["a", "b", "a"]]
