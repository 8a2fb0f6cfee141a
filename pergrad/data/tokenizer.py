"""Tokenizers: raw UTF-8 bytes, or a SentencePiece BPE model trained on the training split.

Both expose `encode(str) -> list[int]`, `decode(list[int]) -> str`, `vocab_size` and
`separator` (the ids placed between two documents in a token stream).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable

from pergrad import files


class ByteTokenizer:
  """Token = one UTF-8 byte (vocabulary 256, no special tokens); documents are
  separated by a blank line ("\\n\\n")."""

  vocab_size = 256
  name = "byte"

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def decode(self, ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

  @property
  def separator(self) -> list[int]:
    return self.encode("\n\n")


class SentencePieceTokenizer:
  """A SentencePiece model (see `train_bpe`); documents are separated by `</s>`."""

  def __init__(self, model_path: str | os.PathLike):
    import sentencepiece as spm

    self.model_path = str(model_path)
    self._sp = spm.SentencePieceProcessor(model_file=self.model_path)
    self.vocab_size = int(self._sp.get_piece_size())
    self.name = f"bpe({self.vocab_size})"

  def encode(self, text: str) -> list[int]:
    return self._sp.encode(text)

  def decode(self, ids) -> str:
    return self._sp.decode([int(i) for i in ids])

  @property
  def separator(self) -> list[int]:
    return [int(self._sp.eos_id())]


def train_bpe(texts: Iterable[str], vocab_size: int, model_path: str | os.PathLike) -> None:
  """Trains a SentencePiece BPE model on `texts` (one sentence per line) and writes it
  atomically to `model_path`.

  Deterministic and quiet: one thread, every input line used in order (no sampling or
  shuffling). Identity normalisation, no dummy prefix, and '\\n' as its own symbol make
  `decode(encode(s)) == s` for any text whose characters were seen in training. With
  `hard_vocab_limit=False` a corpus too small for `vocab_size` gives a smaller vocabulary
  instead of failing.
  """
  import sentencepiece as spm

  def sentences():
    for text in texts:
      for line in text.splitlines():
        if line.strip():
          yield line

  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=sentences(), model_writer=model, model_type="bpe",
      vocab_size=vocab_size, character_coverage=1.0, num_threads=1, minloglevel=2,
      input_sentence_size=0, shuffle_input_sentence=False, hard_vocab_limit=False,
      unk_id=0, eos_id=1, bos_id=-1, pad_id=-1, normalization_rule_name="identity",
      remove_extra_whitespaces=False, add_dummy_prefix=False, user_defined_symbols=["\n"],
      byte_fallback=False)
  files.write_bytes(model_path, model.getvalue())
