"""Orbax checkpoints of the whole `TrainState` (`pergrad.train.state`).

    ckpt = Checkpoints(run_dir / "checkpoints", keep=2)
    state = ckpt.restore_latest(abstract_state)   # None when there is nothing to resume
    ckpt.save(step, state); ckpt.wait(); ckpt.close()

Saving is asynchronous (Orbax copies the arrays to host memory before `save`
returns, then writes in the background); a run killed while writing leaves only a
temporary directory that Orbax never lists as a step. A listed step whose restore
fails (missing or damaged files) is moved aside to `<step>.corrupt` with a message
and the previous step is tried: nothing is deleted silently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import jax
import orbax.checkpoint as ocp


class Checkpoints:
  """A `CheckpointManager` keeping the last `keep` steps of one run."""

  def __init__(self, directory: str | Path, *, keep: int):
    if keep < 1:
      raise ValueError(f"train.keep_checkpoints={keep} must be >= 1.")
    self.directory = Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                           cleanup_tmp_directories=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: Any) -> None:
    self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore_latest(self, abstract_state: Any,
                     echo: Callable[[str], None] = print) -> Any | None:
    """The newest step that restores completely, or None; damaged steps are moved aside."""
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        state = self.manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
        got = int(jax.device_get(state.step))
        if got != step:
          raise ValueError(f"it holds step {got}")
        return state
      except Exception as e:  # noqa: BLE001 - any failure means this step is unusable
        reason = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        moved = self._move_aside(step)
        echo(f"[checkpoint] step {step} in {self.directory} is corrupt or incomplete "
             f"({type(e).__name__}: {reason}); moved it to {moved.name} and trying the "
             "previous checkpoint.")
        self.manager.reload()
    return None

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
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
