"""What an invocation of the command line may write, and when: nothing before the run is
accepted; one run per directory at a time.

    if accepts(plan, out_dir): with locked(out_dir): ...run...; record_invocation(...)
    remove_if_empty(out_dir, hydra_dir)

`accepts` runs the checks that refuse a run directory (another run's config or data, a
diverged run: `pergrad.config.plan.resume_decision`; progress without a checkpoint:
`pergrad.train.checkpoint.check_progress_kept`; progress past train.steps: `check_not_past`)
before anything is written there. Hydra writes nothing itself (`hydra.output_subdir: null`,
no `<job>.log`); `record_invocation` writes `.hydra/{config,hydra,overrides}.yaml` into the
directory of a run that was accepted and wrote its config, so a refused run cannot overwrite
another's record; `remove_if_empty` removes Hydra's run folder and a run directory left
empty. A run whose storage fails still writes summary.json with status "failed" where it can
(`write_failed_summary`). `locked(out_dir)` holds an exclusive `fcntl` lock on `LOCK` (naming
its holder: pid, host, start) from acceptance to the end, however the run ends; a second
process is refused in one line (`check_unlocked`: --dry-run's check); a lock file left by a
dead process is taken over with a note.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import re
import socket
from pathlib import Path
from typing import Callable

from pergrad import files
from pergrad.config.plan import CONFIG, RunPlan, resume_decision
from pergrad.files import METRICS, SUMMARY, read_json, read_records
from pergrad.train.checkpoint import CHECKPOINTS, OutputError, check_progress_kept

RECORD = ".hydra"  # the invocation's record in the run directory (Hydra's name for it)
LOCK = "run.lock"  # held by the process running in the directory (`locked`)
_held: dict[Path, int] = {}  # run directories this process holds: their lock's descriptor
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")  # the date folder of Hydra's default run folders


def accepts(plan: RunPlan, out_dir: Path) -> bool:
  """True when the run may write into `out_dir` (new, or to resume); False for a completed
  run (skipped, nothing written); ValueError / OutputError (one line) when it is refused."""
  if resume_decision(out_dir, plan) == "completed":
    return False
  check_progress_kept(out_dir, plan.train, plan.batch.max_batch_size)
  check_not_past(out_dir, plan.train, plan.batch.max_batch_size)
  return True


def record_invocation(out_dir: Path, record_yaml: dict[str, str]) -> None:
  """Writes `.hydra/` ({file name: YAML text}: the composed config, Hydra's config, the
  command-line overrides, rendered by the CLI), as Hydra would, once the run has written its
  own config (it started); not where the disk refuses it."""
  if not (out_dir / CONFIG).exists():
    return
  with contextlib.suppress(OSError):  # a full disk: the run's own error is the one to report
    for name, text in record_yaml.items():
      files.write_text(out_dir / RECORD / name, text)


def remove_if_empty(out_dir: Path, hydra_dir: Path) -> None:
  """Removes the run directory and Hydra's run folder when nothing was written into them
  (and, above Hydra's default run folder, `<date>/` and `outputs/` when they are empty then)."""
  for d in dict.fromkeys((out_dir, hydra_dir)):
    with contextlib.suppress(OSError):
      d.rmdir()  # only an empty folder
  if _DATE.fullmatch(hydra_dir.parent.name):
    for d in (hydra_dir.parent, hydra_dir.parent.parent):
      with contextlib.suppress(OSError):
        d.rmdir()


def write_failed_summary(run_dir: Path, summary: dict, error: BaseException | None) -> None:
  """summary.json with status "failed" and the error's line when the run's storage failed
  (OutputError, OSError), where it can still be written (a full disk may refuse even that).
  Other failures (a lost peer, a second Ctrl-C) leave the run as they found it: resumable."""
  if not isinstance(error, (OutputError, OSError)):
    return
  why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  with contextlib.suppress(OSError):
    files.write_json(Path(run_dir) / files.SUMMARY, {**summary, "status": "failed", "error": why})


@contextlib.contextmanager
def locked(out_dir: Path, echo: Callable[[str], None] = print):
  """Holds `out_dir`'s `LOCK` meanwhile (creating `out_dir`, removed again if left empty);
  re-entrant in one process.
  ValueError (one line naming the holder) when another process holds it; a lock file whose
  holder is gone (its lock released: the process died) is taken over with a note."""
  out_dir = Path(out_dir).absolute()
  if out_dir in _held:
    yield
    return
  check_creatable(out_dir)
  made = not out_dir.exists()
  try:
    out_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise OutputError.of(e, out_dir) from None
  path = out_dir / LOCK
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      os.close(fd)
      raise ValueError(_in_use(out_dir)) from None
    if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
      break  # not a file its holder removed meanwhile
    os.close(fd)
  left = os.read(fd, 4096).decode(errors="replace").strip()
  if left:
    echo(f"[pergrad] note: took over {path} left by {_holder(left)}, which is no longer "
         "running.")
  os.ftruncate(fd, 0)
  os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "started": datetime.datetime.now().isoformat(timespec="seconds")
                            }).encode(), 0)
  _held[out_dir] = fd
  try:
    yield
  finally:
    del _held[out_dir]
    with contextlib.suppress(OSError):
      path.unlink()
    os.close(fd)
    if made:  # a run that wrote nothing leaves no folder
      with contextlib.suppress(OSError):
        out_dir.rmdir()


def check_creatable(out_dir: Path) -> None:
  """OutputError (one line) when the run directory cannot be created; writes nothing."""
  why = files.not_creatable(out_dir)
  if why:
    raise OutputError(f"cannot write the run directory {out_dir} ({why}); set train.out_dir "
                      "to a writable folder.")


def check_unlocked(out_dir: Path) -> None:
  """ValueError (`locked`'s line) when another process holds `out_dir`'s lock; writes nothing."""
  out_dir = Path(out_dir).absolute()
  if out_dir in _held or not (out_dir / LOCK).exists():
    return
  with contextlib.suppress(FileNotFoundError), open(out_dir / LOCK) as f:
    try:
      fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      raise ValueError(_in_use(out_dir)) from None


def _in_use(out_dir: Path) -> str:
  try:
    holder = _holder((out_dir / LOCK).read_text())
  except OSError:
    holder = "an unknown process"
  return (f"{out_dir} is in use by another run ({holder}); one run per directory at a time: "
          "wait for it to end, or set another train.out_dir.")


def _holder(text: str) -> str:
  """'pid P on HOST since TIME' of a lock file's text."""
  try:
    d = json.loads(text)
    return f"pid {d['pid']} on {d['host']} since {d['started']}"
  except (ValueError, KeyError, TypeError):
    return "an unknown process"


def check_not_past(run_dir: Path, train, max_batch_size: int) -> None:
  """ValueError (one line) when `run_dir`'s run has trained past train.steps x
  `max_batch_size` examples (`is_past`; a run with a constant schedule may be resumed with
  more steps, extended, never with fewer than it has trained): the examples its summary
  records at a stop that saved a checkpoint, or its metrics record up to its newest
  checkpoint. The loop checks the restored state again (`pergrad.train.loop`)."""
  run_dir = Path(run_dir)
  directory = run_dir / CHECKPOINTS
  saved = [int(p.name) for p in directory.glob("*") if p.name.isdigit()] if directory.is_dir() \
      else []
  newest = max(saved, default=0)
  seen = max((r.get("examples_seen", 0) for r in read_records(run_dir / METRICS)
              if r.get("step", 0) <= newest), default=0)
  summary = read_json(run_dir / SUMMARY) if (run_dir / SUMMARY).exists() else {}
  if summary.get("status") in ("completed", "interrupted"):
    seen = max(seen, summary.get("examples_seen") or 0)
  if is_past(seen, train.steps, max_batch_size):
    raise_past(run_dir, train.steps, seen, max_batch_size)


def is_past(seen: int, steps: int, max_batch_size: int) -> bool:
  """Whether `seen` examples are more than a run of `steps` x `max_batch_size` trains: a
  batch schedule stops at the first update reaching that budget E (`batch_schedule`), so a
  finished run holds [E, E + max_batch_size − 1] (exactly E at a fixed batch size); past is
  seen ≥ E + max_batch_size."""
  return seen >= (steps + 1) * max_batch_size


def raise_past(run_dir: Path, steps: int, seen: int, max_batch_size: int) -> None:
  raise ValueError(
      f"{run_dir} holds a run trained past train.steps={steps} ({seen:,} examples, "
      f"{seen / max_batch_size:g} steps of {max_batch_size}); a run is never shortened: set "
      f"train.steps={seen // max_batch_size} or more to keep (or extend) it, or set another "
      "train.out_dir.")
