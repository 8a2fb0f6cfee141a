"""Orbax checkpoints of the whole `TrainState` (`pergrad.train.state`).

    ckpt = Checkpoints(run_dir / "checkpoints", keep=2)
    state = ckpt.restore_latest(abstract_state)   # None when there is nothing to resume
    ckpt.save(step, state); ckpt.wait(); ckpt.close()

Saving is asynchronous; a run killed while writing leaves only a temporary directory that
Orbax never lists as a step. A listed step whose restore fails is moved aside to
`<step>.corrupt` with a message and the previous step is tried: nothing is deleted silently.
When no checkpoint is readable but some were, the run stops with one line instead of starting
again from step 0, unless `train.restart=true`. A save that cannot write (disk full,
read-only or missing folder) raises `OutputError` naming the path, its temporary folder
removed, the earlier checkpoints intact. `check_progress_kept`, before anything is written:
a run directory that records progress but holds no checkpoint at all is not silently trained
again from step 0, unless `train.restart=true`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gc
import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp

from pergrad.files import METRICS, SUMMARY, read_json, read_records

CHECKPOINTS = "checkpoints"  # a run directory's checkpoints folder
TMP_SUFFIX = ".orbax-checkpoint-tmp"
_WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                 errno.EDQUOT, errno.ENOENT, errno.EEXIST}


class OutputError(RuntimeError):
  """The run directory (or a checkpoint in it) cannot be written or read; one line."""

  @classmethod
  def of(cls, e: OSError, path: Path, what: str = "the run directory") -> OutputError:
    why = e.strerror or type(e).__name__
    return cls(f"cannot write {what} {path} ({why}"
               + (f": {e.filename}" if e.filename and str(e.filename) != str(path) else "")
               + "); free disk space there or set train.out_dir to a writable folder.")


# TensorStore reports a failed write as a status (a ValueError), e.g. 'RESOURCE_EXHAUSTED:
# Error writing "..." ...: No space left on device [os_error_code='28']'.
_TS_ERRNO = re.compile(r"\[os_error_code='(\d+)'\]")
_TS_STATUS = {"RESOURCE_EXHAUSTED": errno.ENOSPC, "PERMISSION_DENIED": errno.EACCES}


def _write_error(e: BaseException) -> OSError | None:
  """The OSError of a failed write in `e`'s chain (Orbax wraps its thread's errors; a
  TensorStore status naming an OS error or an exhausted resource counts as one)."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in _WRITE_ERRNOS:
      return e
    code = _TS_ERRNO.search(str(e))
    code = int(code.group(1)) if code else next(
        (c for status, c in _TS_STATUS.items() if str(e).startswith(status)), None)
    if code in _WRITE_ERRNOS:
      return OSError(code, os.strerror(code))
    e = e.__cause__ or e.__context__
  return None


@contextlib.contextmanager
def _quiet():
  """Silences Orbax's and asyncio's logging of a failed restore (a page per array)."""
  loggers = [logging.getLogger(n) for n in ("absl", "asyncio", "orbax")]
  levels = [lg.level for lg in loggers]
  for lg in loggers:
    lg.setLevel(logging.CRITICAL)
  try:
    yield
  finally:
    gc.collect()  # the failed read's futures log "never retrieved" when collected
    for lg, level in zip(loggers, levels, strict=True):
      lg.setLevel(level)


def check_progress_kept(run_dir: Path, train, max_batch_size: int) -> None:
  """OutputError (one line) when `run_dir` records progress (a summary.json, or metrics
  past the run's first checkpoint: `train.checkpoints_at`, `max_batch_size` examples per
  full-batch step) but holds no checkpoint, readable or not, unless `train.restart`. A run
  killed before its first checkpoint starts again from step 0, as it must."""
  directory = Path(run_dir) / CHECKPOINTS
  if train.restart or (directory.is_dir() and any(
      p.name.split(".")[0].isdigit() and TMP_SUFFIX not in p.name for p in directory.iterdir())):
    return
  records = read_records(Path(run_dir) / METRICS)
  seen = max((r.get("examples_seen", 0) for r in records), default=0)
  summary = Path(run_dir) / SUMMARY
  status = read_json(summary).get("status") if summary.exists() else None
  if status is None and not train.checkpoints_at(0, seen, max_batch_size):
    return
  train = [r["step"] for r in records if r.get("split") == "train"]
  found = [f"{METRICS} logs {len(train):,} training records up to step "
           f"{max(train, default=0):,}"]
  if status is not None:
    found.append(f"{SUMMARY} has status {status!r}")
  raise OutputError(
      f"{run_dir} records progress ({'; '.join(found)}) but {directory} holds no "
      "checkpoint; nothing was started. Set train.restart=true to train again from step 0 "
      f"on purpose ({METRICS} is then rewritten), or set another train.out_dir.")


def _reason(e: BaseException, step_dir: Path) -> str:
  """One readable line for why a restore failed: for TensorStore's status ('OUT_OF_RANGE:
  Error opening "cast" driver: ... local file "<f>": <cause> [tensorstore_spec='<escaped
  JSON>']'), its code, the file under `step_dir` and the innermost cause, without the spec."""
  text = str(e).strip().splitlines()[0] if str(e).strip() else ""
  text = re.sub(r"\s*\[(tensorstore_spec|source locations)[^=]*=.*", "", text)
  status = re.match(r"([A-Z_]+): (.*)", text)
  if status:
    read = re.findall(r'local file "([^"]+)"', text)
    where = f" reading {os.path.relpath(read[-1], step_dir)}" if read else ""
    text = f"{status.group(1)}{where}: {status.group(2).rsplit(': ', 1)[-1]}"
  return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


RESTORE_BELOW_BYTES = 64 << 20  # `unreadable` restores a checkpoint smaller than this


def unreadable(step_dir: Path, restore_below: int = RESTORE_BELOW_BYTES) -> str | None:
  """Why the checkpoint in `step_dir` (`<run>/checkpoints/<step>`) cannot be read, or None:
  it must exist, be committed (Orbax's marker) and restore whole when it is smaller than
  `restore_below` bytes; a larger one is checked by its metadata only (a damaged array file
  is then found when a resume restores it, which moves it aside)."""
  step_dir = Path(step_dir)
  if not step_dir.is_dir():
    return f"{step_dir} does not exist"
  if not any((step_dir / f).exists() for f in ("commit_success.txt", "_CHECKPOINT_METADATA")):
    return f"{step_dir} was never committed (a save that did not finish)"
  size = sum(p.stat().st_size for p in step_dir.rglob("*") if p.is_file())
  try:
    with _quiet(), ocp.StandardCheckpointer() as reader:
      if size < restore_below:
        reader.restore(step_dir / "default")
      elif reader.metadata(step_dir / "default").item_metadata is None:
        return f"{step_dir} holds no readable metadata"
  except Exception as e:  # noqa: BLE001 - any failure: it cannot be read
    return f"{step_dir} cannot be read ({_reason(e, step_dir)})"
  return None


class IncompatibleCheckpoint(ValueError):
  """A checkpoint whose optimizer state this pergrad's optimizer cannot hold (another
  version wrote it): refused in one line, never moved aside as corrupt."""


class Checkpoints:
  """A `CheckpointManager` keeping the last `keep` steps of one run."""

  def __init__(self, directory: str | Path, *, keep: int):
    if keep < 1:
      raise ValueError(f"train.keep_checkpoints={keep} must be >= 1.")
    self.directory = Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)
    self._saving: int | None = None  # the step of the save in flight

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def latest(self) -> int | None:
    """The newest complete checkpoint's step (after the pending save finished)."""
    self.wait()
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, train_time_s: float | None = None) -> None:
    """Saves `state` as `step`, with the seconds of training before it (the step's
    metadata, not the state: wall-clock time never enters the training computation)."""
    with self._writing(self._saving):  # the previous save's error surfaces here
      self.manager.check_for_errors()
    self._saving = step
    meta = None if train_time_s is None else {"train_time_s": float(train_time_s)}
    with self._writing(step):
      self.manager.save(step, args=ocp.args.StandardSave(state), force=True,
                        custom_metadata=meta)

  def train_time_s(self, step: int) -> float:
    """The seconds of training before `step`'s checkpoint (0.0 when it recorded none)."""
    meta = self.manager.metadata(step).custom_metadata or {}
    return float(meta.get("train_time_s", 0.0))

  @contextlib.contextmanager
  def _writing(self, step: int | None):
    try:
      yield
    except Exception as e:
      os_error = _write_error(e)
      if os_error is None:
        raise
      named = re.search(rf"/(\d+){re.escape(TMP_SUFFIX)}", str(e))  # TensorStore's path
      step = int(named.group(1)) if named else step
      self._remove_temporary()
      what = "a checkpoint to" if step is None else f"the checkpoint of step {step} to"
      kept = [s for s in self.steps() if s != step]
      raise OutputError(str(OutputError.of(os_error, self.directory, what)).rstrip(".")
                        + f"; the earlier checkpoints are intact (steps {kept}).") from None

  def _remove_temporary(self) -> None:
    """Removes the temporary folders of a failed save. Its other writes may still be in
    flight (Orbax raises at the first failure) and recreate them: wait for those, then
    remove again until none comes back within 0.2 s (at most about 5 s)."""
    with contextlib.suppress(Exception):
      self.manager.wait_until_finished()
    for _ in range(25):
      tmp = list(self.directory.glob(f"*{TMP_SUFFIX}*"))
      for p in tmp:
        shutil.rmtree(p, ignore_errors=True)
      time.sleep(0.2)
      if not tmp and not list(self.directory.glob(f"*{TMP_SUFFIX}*")):
        return

  def restore_latest(self, abstract_state: Any, echo: Callable[[str], None] = print,
                     restart: bool = False, fresh: dict[str, Callable] | None = None
                     ) -> Any | None:
    """The newest step that restores completely, or None when there is none to resume;
    damaged steps are moved aside. OutputError when every checkpoint is unreadable,
    unless `restart` (then None: start again from step 0). `fresh`: {field: state -> value}
    for fields of the (dataclass) state that a checkpoint may lack or hold with other
    leaves (a logging state turned on or off by a resumable setting, or older than the
    field): such a field is read as saved, if at all, then set to fresh[field](state)."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        with _quiet():
          target, redo = self._target(step, abstract_state, fresh or {})
          state = self.manager.restore(step, args=ocp.args.StandardRestore(target))
          if redo:
            state = abstract_state.replace(**{k: v for k, v in state.items() if k not in redo})
            state = state.replace(**{f: fresh[f](state) for f in redo})
        got = int(jax.device_get(state.step))
        if got != step:
          raise ValueError(f"it holds step {got}")
        return state
      except IncompatibleCheckpoint:
        raise  # intact, from another pergrad: left where it is
      except Exception as e:  # noqa: BLE001 - any failure means this step is unusable
        moved = self._move_aside(step)
        echo(f"[checkpoint] step {step} in {self.directory} is corrupt or incomplete "
             f"({_reason(e, self.directory / str(step))}); moved it to {moved.name} and "
             "trying the previous checkpoint.")
        self.manager.reload()
    corrupt = sorted(p.name for p in self.directory.glob("*.corrupt*"))
    if corrupt and not restart:
      raise OutputError(
          f"every checkpoint in {self.directory} is unreadable ({', '.join(corrupt)}); "
          "nothing was restored. Set train.restart=true to start again from step 0 on "
          "purpose (this run's metrics are then rewritten), or set another train.out_dir.")
    return None

  def _target(self, step: int, abstract_state: Any, fresh: dict) -> tuple[Any, list[str]]:
    """The restore target of `step` and the `fresh` fields to set after it: those whose
    saved leaves differ in number from the target's (a dict target holding them as saved).
    IncompatibleCheckpoint when its optimizer state has another number of arrays."""
    with ocp.StandardCheckpointer() as reader:  # the manager knows no handler before a restore
      saved = reader.metadata(self.directory / str(step) / "default").item_metadata
    if saved is None:  # unreadable: the restore then fails, saying why
      return abstract_state, []
    n = lambda tree: len(jax.tree.leaves(tree))
    mine = getattr(abstract_state, "opt_state", None)
    if "opt_state" in saved.keys() and n(saved["opt_state"]) != n(mine):
      raise IncompatibleCheckpoint(
          f"the checkpoint of step {step} in {self.directory} holds an optimizer state of "
          f"{n(saved['opt_state'])} arrays where this pergrad's optimizer has {n(mine)} (written "
          "by another version, e.g. one whose optimizer state did not hold its lr, betas and "
          "eps yet, or whose Adam-family chain held its eps); resume it with the pergrad that "
          "wrote it, or set another train.out_dir.")
    if not fresh:
      return abstract_state, []
    redo = [f for f in fresh
            if f not in saved.keys() or n(saved[f]) != n(getattr(abstract_state, f))]
    if not redo:
      return abstract_state, []
    target = {f.name: getattr(abstract_state, f.name) for f in dataclasses.fields(abstract_state)}
    for f in redo:
      target.pop(f)
      if f in saved.keys():  # read to host memory, then dropped
        target[f] = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), saved[f])
    return target, redo

  def _move_aside(self, step: int) -> Path:
    src = self.directory / str(step)
    dst = self.directory / f"{step}.corrupt"
    i = 1
    while dst.exists():
      dst = self.directory / f"{step}.corrupt.{i}"
      i += 1
    if src.exists():
      src.rename(dst)
    return dst

  def wait(self) -> None:
    with self._writing(self._saving):
      self.manager.wait_until_finished()
    self._saving = None

  def finish(self) -> OutputError | None:
    """Waits for the save in flight; returns (not raises) its OutputError, if any."""
    try:
      self.wait()
    except OutputError as e:
      self._saving = None
      return e
    return None

  def close(self) -> None:
    self.manager.close()
