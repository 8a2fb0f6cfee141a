"""Data pipeline: split by document, tokenizers, (seed, step)-pure batches, txt folders,
errors for missing data, and lm1b / c4 through `tfds.testing.mock_data` (no network)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import tensorflow_datasets as tfds

from pergrad.data import DataError, DataSpec, LMData, make_data
from pergrad.data.corpus import split_documents
from tests.conftest import REPO, compose

B, T, EB = 5, 24, 3  # batch, sequence length, eval batch: all different


def _cfg(tfds_dir, **kw) -> DataSpec:
  base = dict(tfds_dir=str(tfds_dir), seq_len=T, batch_size=B, eval_batch_size=EB)
  return DataSpec(**{**base, **kw})


@pytest.fixture(scope="session")
def bpe_cfg(tfds_dir) -> DataSpec:
  return _cfg(tfds_dir, tokenizer="bpe", vocab_size=1024)


@pytest.fixture(scope="session")
def bpe_data(bpe_cfg) -> LMData:
  return make_data(bpe_cfg)


@pytest.fixture()
def no_download():
  """Fails the test if anything asks TFDS to download or prepare a built-in dataset."""
  def forbidden(self, *a, **k):
    raise AssertionError(f"download_and_prepare called for {self.name}")
  with mock.patch.object(tfds.core.DatasetBuilder, "download_and_prepare", forbidden):
    yield


def _corpus(tmp_path, n_files=4):
  d = tmp_path / "corpus"
  (d / "sub").mkdir(parents=True)
  for i in range(n_files):
    sub = "sub/" if i % 2 else ""
    (d / f"{sub}doc{i}.txt").write_text(
        f"Document {i}: " + " ".join(f"word{(i * 7 + j) % 13} é{j % 5}" for j in range(60))
        + "\nsecond line\n")
  return d


def test_split_documents_disjoint_and_deterministic():
  for n in (2, 3, 10, 42, 57):
    names = [f"d{i:03d}" for i in range(n)][::-1]
    train, val = split_documents(names)
    assert set(train).isdisjoint(val) and sorted(train + val) == sorted(names)
    assert len(val) == max(1, round(0.1 * n)) and (train, val) == split_documents(names)


def test_shakespeare_splits_hold_out_whole_works(bpe_data, tfds_dir):
  from pergrad.data.builder import SHAKESPEARE, PergradText, read_split

  builder = PergradText(config=SHAKESPEARE, data_dir=str(tfds_dir))
  names = {s: [n for n, _ in read_split(builder, s)] for s in ("train", "validation")}
  assert len(names["train"]) == 38 and len(names["validation"]) == 4
  assert set(names["train"]).isdisjoint(names["validation"])
  assert not any(n.endswith("_f") for n in names["train"] + names["validation"])
  assert "shakespeare" in bpe_data.describe() and "38 docs" in bpe_data.describe()


def test_byte_tokenizer_round_trip(tfds_dir):
  tok = make_data(_cfg(tfds_dir, tokenizer="byte")).tokenizer
  text = "Ay, there's the rub —\n\tÆther ünïcode 🎭 end "
  ids = tok.encode(text)
  assert ids == list(text.encode("utf-8")) and tok.decode(ids) == text


def test_bpe_tokenizer_round_trip_and_compression(bpe_data):
  tok = bpe_data.tokenizer
  text = ("HAMLET.\nTo be, or not to be, that is the question:\n  Whether 'tis nobler in "
          "the mind to suffer\n\nThe slings and arrows of outrageous fortune,  ")
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert bpe_data.vocab_size == 1024 and max(ids) < 1024
  assert len(ids) < len(text) / 2  # merges were learnt (bytes would give len(text))


def _splitmix64(x: int) -> int:
  mask = 2**64 - 1
  z = (x + 0x9E3779B97F4A7C15) & mask
  z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
  z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
  return z ^ (z >> 31)


def test_batches_shapes_dtypes_and_shift(bpe_data, bpe_cfg, tfds_dir):
  batch = bpe_data.train_batch(7)
  for k in ("inputs", "targets"):
    assert batch[k].shape == (B, T) and batch[k].dtype == np.int32
    assert 0 <= batch[k].min() and batch[k].max() < bpe_data.vocab_size
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  # Reference: windows of T+1 tokens of the cached training stream; example i = 7B + b
  # starts at splitmix64(splitmix64(seed) + i) mod (positions), here in Python integers.
  stream = np.load(tfds_dir / "pergrad_tokens/shakespeare/v1/bpe_1024.train.npy")
  offsets = [_splitmix64(_splitmix64(bpe_cfg.seed) + 7 * B + b) % (len(stream) - T)
             for b in range(B)]
  windows = np.stack([stream[o:o + T + 1] for o in offsets])
  np.testing.assert_array_equal(batch["inputs"], windows[:, :-1])
  np.testing.assert_array_equal(batch["targets"], windows[:, 1:])
  evals = bpe_data.eval_batches(2)
  assert len(evals) == 2 and all(e["inputs"].shape == (EB, T) for e in evals)
  np.testing.assert_array_equal(evals[1]["inputs"][:, 1:], evals[1]["targets"][:, :-1])


def test_train_batch_is_pure_function_of_seed_and_step(bpe_data, bpe_cfg):
  fresh = make_data(bpe_cfg)  # as after a resume
  for step in (0, 1, 123):
    a, b = bpe_data.train_batch(step), fresh.train_batch(step)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert not np.array_equal(fresh.train_batch(1)["inputs"], fresh.train_batch(2)["inputs"])
  other = make_data(dataclasses.replace(bpe_cfg, seed=1))
  assert not np.array_equal(other.train_batch(1)["inputs"], fresh.train_batch(1)["inputs"])
  # Evaluation batches: fixed, the same for every call and every seed.
  for x, y in zip(fresh.eval_batches(3), other.eval_batches(3), strict=True):
    np.testing.assert_array_equal(x["inputs"], y["inputs"])
  np.testing.assert_array_equal(fresh.eval_batches(2)[0]["targets"],
                                bpe_data.eval_batches(2)[0]["targets"])


def test_txt_folder(tmp_path, tfds_dir):
  folder = _corpus(tmp_path)
  cfg = _cfg(tfds_dir, name="txt_folder", path=str(folder), tokenizer="byte")
  data = make_data(cfg)
  assert data.vocab_size == 256 and data.train_batch(0)["inputs"].shape == (B, T)
  assert "txt_folder" in data.describe() and str(folder) in data.describe()
  meta = json.loads(next((tfds_dir / "pergrad_tokens").glob("txt_*/v1/byte.json")
                         ).read_text())
  assert sorted(meta["train"]["names"] + meta["validation"]["names"]) == sorted(
      str(p.relative_to(folder)) for p in folder.rglob("*.txt"))
  assert meta["validation"]["docs"] == 1 and meta["train"]["docs"] == 3
  # BPE on a tiny corpus: a smaller vocabulary than asked rather than a failure.
  small = make_data(dataclasses.replace(cfg, tokenizer="bpe", vocab_size=300))
  text = "word3 é1 second line\n"
  assert small.tokenizer.decode(small.tokenizer.encode(text)) == text
  assert small.vocab_size <= 300


def test_txt_folder_concurrent_prepare(tmp_path):
  """Two processes preparing the same corpus at once both succeed and agree."""
  folder, out = _corpus(tmp_path, n_files=3), tmp_path / "tfds"
  code = ("import sys, numpy as np; from pergrad.data import DataSpec; "
          "from pergrad.data import make_data; "
          f"d = make_data(DataSpec(name='txt_folder', path='{folder}', tfds_dir='{out}', "
          f"tokenizer='byte', seq_len={T}, batch_size={B})); "
          "np.save(sys.argv[1], d.train_batch(5)['inputs'])")
  procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"b{i}.npy")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for i in range(2)]
  for p in procs:
    assert p.wait(timeout=120) == 0, p.stdout.read().decode()[-2000:]
  np.testing.assert_array_equal(np.load(tmp_path / "b0.npy"), np.load(tmp_path / "b1.npy"))


@pytest.mark.parametrize("n_files,path,match", [
    (None, None, "set data.path"),
    (None, "does/not/exist", "not an existing folder"),
    (0, "corpus", "holds 0 .txt file"),
    (1, "corpus", "at least 2 .txt"),
])
def test_txt_folder_errors(tmp_path, n_files, path, match):
  if n_files is not None:
    (tmp_path / "corpus").mkdir()
    for i in range(n_files):
      (tmp_path / "corpus" / f"{i}.txt").write_text("text")
  full = None if path is None else str(tmp_path / path)
  with pytest.raises(DataError, match=match) as e:
    make_data(_cfg(tmp_path / "tfds", name="txt_folder", path=full))
  assert "\n" not in str(e.value) and "data.path" in str(e.value)
  assert not (tmp_path / "tfds").exists()  # nothing prepared


@pytest.mark.parametrize("name,tfds_name", [("lm1b", "lm1b"), ("c4", "c4/en")])
def test_unprepared_tfds_dataset_is_a_clear_error(tmp_path, no_download, name, tfds_name):
  with pytest.raises(DataError, match="not prepared under") as e:
    make_data(_cfg(tmp_path, name=name))
  msg = str(e.value)
  assert "\n" not in msg and f"'{tfds_name}'" in msg and "array_record" in msg


@pytest.mark.parametrize("name", ["lm1b", "c4"])
def test_tfds_dataset_through_mock_data(tmp_path, no_download, name):
  """The lm1b / c4 path on fake examples. mock_data drives `as_data_source` but not the
  on-disk `is_prepared` check, which is patched to True here."""
  with tfds.testing.mock_data(num_examples=40), \
       mock.patch.object(tfds.core.DatasetBuilder, "is_prepared", lambda self: True):
    cfg = _cfg(tmp_path, name=name, vocab_size=260)
    data = make_data(cfg)
    batch = data.train_batch(3)
    assert batch["inputs"].shape == (B, T) and batch["targets"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    assert batch["inputs"].max() < data.vocab_size <= 260
    again = make_data(cfg)  # the BPE model is now cached; same batches
    np.testing.assert_array_equal(again.train_batch(3)["inputs"], batch["inputs"])
    assert not np.array_equal(again.train_batch(4)["inputs"], batch["inputs"])
    np.testing.assert_array_equal(again.eval_batches(2)[1]["inputs"],
                                  data.eval_batches(2)[1]["inputs"])
    assert "40 docs" in data.describe()
  assert list(tmp_path.glob("pergrad_tokens/*/*/v1/spm_bpe_260.model"))


@pytest.mark.parametrize("group", ["shakespeare", "txt_folder", "lm1b", "c4"])
def test_data_configs_compose(group):
  cfg = compose([f"data={group}"]).data
  assert getattr(cfg.name, "value", cfg.name) == group
  assert cfg.seq_len > 0 and cfg.tokenizer in ("bpe", "byte")
