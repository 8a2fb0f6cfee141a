"""No run trained twice: finished runs found by what they compute, whichever sweep asks.

    index = RunIndex.at(sweeps_root)               # <sweeps root>/.runs, at this code version
    key = index.key(overrides)                     # the run's resolved config + code version
    index.find(key) -> run dir | None;  index.add(key, run_dir);  index.link(run_dir, found)

A run's key is the SHA-256 of its resolved config (the Hydra overrides composed against
configs/, as the run itself resolves them) without what only labels or places it
(`LABELS`: the experiment's tag and name, the output, data-cache and compile-cache
directories, W&B, the progress bar, the run's figure, checkpoints kept), together with the
code version (HEAD's commit and, for a tree with uncommitted changes, the hash of its
diff): a run with any other difference (a seed, a step count, a logged statistic, a
cadence) is another run.
Outside a git checkout the code version is unknown and nothing is reused.

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
import json
import subprocess
from pathlib import Path
from typing import Callable, Sequence

from pergrad.analysis import composed
from pergrad.analysis.runs import DONE, run_status

# Keys (and nodes) of the resolved config that do not change what a run computes or writes.
LABELS = ("experiment", "name", "train.out_dir", "train.restart", "train.keep_checkpoints",
          "train.compile_cache", "data.tfds_dir", "logging.wandb", "logging.progress",
          "logging.figure")
INDEX = ".runs"
REUSED = "reused.json"  # in a run directory linked to another sweep's run


def is_reused(run_dir: Path) -> bool:
  return (Path(run_dir) / REUSED).exists()


def code_version(repo: Path) -> str | None:
  """HEAD's commit, with the hash of `git diff HEAD` when the tree differs from it (results/
  aside); None outside a git checkout."""
  git = lambda *a: subprocess.run(["git", *a], cwd=repo, capture_output=True, text=True,
                                  check=True).stdout
  try:
    head = git("rev-parse", "HEAD").strip()
    diff = git("diff", "HEAD", "--", ".", ":(exclude)results")
    untracked = git("ls-files", "--others", "--exclude-standard", "--", ".",
                    ":(exclude)results")
  except (OSError, subprocess.CalledProcessError):
    return None
  if not diff and not untracked:
    return head
  extra = diff + "".join(f"\n{p}\n" + (repo / p).read_text(errors="replace")
                         for p in untracked.split() if (repo / p).is_file())
  return f"{head}+{hashlib.sha256(extra.encode()).hexdigest()[:16]}"


def run_key(config: dict, code: str) -> str:
  """The SHA-256 of a resolved config without `LABELS`, and the code version."""
  kept = {k: v for k, v in _flat(config).items()
          if not any(k == lab or k.startswith(lab + ".") for lab in LABELS)}
  doc = json.dumps({"config": kept, "code": code}, sort_keys=True, default=str)
  return hashlib.sha256(doc.encode()).hexdigest()


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
  return out


@dataclasses.dataclass
class RunIndex:
  """The finished runs of a sweeps root (module docstring)."""

  root: Path  # <sweeps root>/.runs
  code: str | None
  resolve: Callable[[Sequence[str]], dict] = composed  # overrides -> resolved config


  @classmethod
  def at(cls, sweeps_root: Path, repo: Path | None = None) -> RunIndex:
    """The index of `sweeps_root` (its `INDEX` folder) at the code version of `repo`."""
    from experiments.sweep import REPO

    return cls(Path(sweeps_root) / INDEX, code_version(repo or REPO))

  def key(self, overrides: Sequence[str]) -> str | None:
    """The run's key; None (not reused, trained) when the code version is unknown or the
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
