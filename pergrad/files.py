"""Atomic file writes (a reader, or a killed writer, never sees a half-written file), the
reader of a run's JSON-lines metrics, and whether a folder can be made (`not_creatable`)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_bytes(path: str | Path, data: bytes) -> None:
  """Writes `data` to a temporary file next to `path`, then renames it into place."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def not_creatable(path: str | Path) -> str | None:
  """Why the folder `path` cannot be used or created (a file there or above it, a folder
  above it that is not writable), or None; nothing is written."""
  path = Path(path).expanduser().absolute()
  if path.is_dir():
    return None if os.access(path, os.W_OK | os.X_OK) else f"{path} is not writable"
  for p in (path, *path.parents):
    if p.is_dir():
      return None if os.access(p, os.W_OK | os.X_OK) else f"{p} is not writable"
    if p.exists() or p.is_symlink():
      return f"{p} is a file, not a folder"
  return None


def write_text(path: str | Path, text: str) -> None:
  write_bytes(path, text.encode())


def write_json(path: str | Path, obj) -> None:
  write_text(path, json.dumps(obj, indent=1, default=str) + "\n")


def read_json(path: str | Path):
  return json.loads(Path(path).read_text())


METRICS = "metrics.jsonl"  # a run's metrics, one JSON object per line
SUMMARY = "summary.json"  # a run's status and final numbers, written when it stops


def read_records(path: str | Path) -> list[dict]:
  """The records of a metrics.jsonl; a torn line (killed writer) is skipped."""
  path, out = Path(path), []
  if not path.exists():
    return out
  for line in path.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return out
