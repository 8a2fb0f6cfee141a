"""Docs as docs: a module docstring says what the module is and the math it implements in a
few lines; measured figures live in results/*.json and the README, history in git."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("pergrad", "experiments", "scripts")
MAX_LINES = 20
# The shapes a run's figure took in code: a timing ("took 6,690 s", "~3.5 s a model",
# "(~46 min)"), a speed ratio ("2x faster"), a measured range ("1.13-1.31x", "+10-19% peak").
MEASURED = re.compile(r"\btook [\d,.]+ ?(s|ms|min|h)\b|~ ?[\d.]+ ?(s|ms|min|h)\b"
                      r"|\d(\.\d+)? ?[x×] (faster|slower)|\d(\.\d+)?-\d+(\.\d+)? ?[x×]"
                      r"|[+−-]\d+(\.\d+)?(-\d+(\.\d+)?)? ?% (FLOPs|peak|time|memory)")


def files() -> list[Path]:
  return sorted(f for root in ROOTS for f in (REPO / root).rglob("*.py"))


def prose(src: str) -> list[tuple[int, str]]:
  """(line, text) of every comment and docstring line of a module's source."""
  out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
         if t.type == tokenize.COMMENT]
  for node in ast.walk(ast.parse(src)):
    if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      doc = ast.get_docstring(node, clean=False)
      if doc is not None:
        out += [(node.body[0].lineno + i, line) for i, line in enumerate(doc.splitlines())]
  return out


def test_module_docstrings_are_short():
  long = {}
  for f in files():
    doc = ast.get_docstring(ast.parse(f.read_text()))
    if doc and len(doc.splitlines()) > MAX_LINES:
      long[str(f.relative_to(REPO))] = len(doc.splitlines())
  assert not long, (f"module docstrings over {MAX_LINES} lines: {long}; move what belongs to "
                    "one function into its docstring, a guide into README.md")


@pytest.mark.parametrize("text", ["took 6,690 s", "~3.5 s a model", "(~46 min)",
                                  "XLA:CPU 1.1-1.3x faster", "was 2x slower",
                                  "takes 1.13-1.31x its time", "+29% FLOPs on the cpu presets",
                                  "+10-19% peak memory"])
def test_a_measured_figure_is_recognised(text):
  assert MEASURED.search(text)


@pytest.mark.parametrize("text", ["within 0.2 s (at most about 5 s)", "4× past the first grid",
                                  "≤ 1.17× time (the paper's figure)", "2x projection"])
def test_a_bound_is_not_a_figure(text):
  assert not MEASURED.search(text)


def test_no_measured_figure_in_code():
  found = [f"{f.relative_to(REPO)}:{line}: {text.strip()}" for f in files()
           for line, text in prose(f.read_text()) if MEASURED.search(text)]
  assert not found, ("measured figures in code (put them in results/*.json or the README and "
                     "point there):\n" + "\n".join(found))


MAX_FUNCTION_LINES = 80  # outside scripts/, whose `main`s read top to bottom


def test_no_function_over_80_lines():
  long = [f"{f.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
          for root in ("pergrad", "experiments", "tests") for f in (REPO / root).rglob("*.py")
          for node in ast.walk(ast.parse(f.read_text()))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into steps): {long}"
