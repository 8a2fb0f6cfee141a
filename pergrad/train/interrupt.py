"""Stopping a run between two updates on SIGINT, SIGTERM or the cluster's pre-emption signal.

    stop = Interrupts()
    stop.install(every=log_every)          # main thread only; elsewhere it does nothing
    while ...: if stop.requested(k): break # then checkpoint, summary "interrupted"
    stop.restore(); stop.hand_over()       # submitit: its handler requeues the job

The first signal only sets a flag that the loop reads between updates; the loop then saves
a checkpoint, writes summary.json with status "interrupted" and returns, and re-running
the same command resumes bit-exactly. A second SIGINT raises KeyboardInterrupt (stop now,
without a checkpoint). PREEMPT_SIGNAL is the one submitit asks SLURM to send
`signal_delay_s` before the time limit and at a pre-emption (`SUBMITIT_PREEMPT_SIGNAL`,
default USR2). `hand_over` passes the signal on to the handler installed before: inside a
submitit job that is submitit's `checkpoint_and_try_requeue`, which pickles the launcher's
callable (Hydra's submitit launcher re-submits the same sweep point) and requeues the job;
the requeued job re-runs the same command and resumes from the checkpoint.

In a multi-process run every process must stop after the same update: the flags are
gathered every `every` updates (one small collective), and all stop when one was signalled.
"""

from __future__ import annotations

import os
import signal
import threading

import numpy as np

PREEMPT_SIGNAL = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"),
                         signal.SIGUSR2)
SIGNALS = tuple(dict.fromkeys((signal.SIGINT, signal.SIGTERM, PREEMPT_SIGNAL)))


class Interrupts:
  """The first of SIGNALS received while installed (`signum`), read between updates."""

  def __init__(self):
    self.signum: int | None = None
    self.every = 1
    self.before: dict[int, object] = {}  # the handlers replaced by `install`
    self._installed = False

  def install(self, every: int = 1) -> Interrupts:
    self.every = max(1, every)
    if not self._installed and threading.current_thread() is threading.main_thread():
      self.before = {s: signal.signal(s, self._handle) for s in SIGNALS}
      self._installed = True
    return self

  def restore(self) -> None:
    if self._installed:
      for s, handler in self.before.items():
        signal.signal(s, handler)
      self._installed = False

  def _handle(self, signum, frame) -> None:
    del frame
    if self.signum is not None and signum == signal.SIGINT:
      raise KeyboardInterrupt  # a second Ctrl-C: stop now
    if self.signum is None:
      self.signum = signum

  @property
  def name(self) -> str:
    return signal.Signals(self.signum).name if self.signum else "none"

  def requested(self, k: int) -> bool:
    """Whether to stop before update k + 1 (all processes agree)."""
    import jax

    if jax.process_count() == 1:
      return self.signum is not None
    if k % self.every:
      return False
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
    got = [int(f) for f in flags.ravel() if f]
    if got and self.signum is None:
      self.signum = got[0]
    return bool(got)

  def requeues(self) -> bool:
    """Whether the handler it replaced for this signal is submitit's requeue."""
    h = self.before.get(self.signum)
    return getattr(h, "__name__", "") == "checkpoint_and_try_requeue"

  def hand_over(self) -> None:
    """Calls the replaced handler when it is submitit's requeue (it pickles the job's
    callable, requeues the job and exits); otherwise returns."""
    if self.requeues():
      self.before[self.signum](self.signum, None)

  def exit_code(self) -> int:
    return 128 + int(self.signum or 0)
