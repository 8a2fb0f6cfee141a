"""When a run has diverged: the eval rule, and the same rule on the training loss for a run
that does not evaluate.

    eval_diverged(loss, {0: 7.3, 100: 5.1}, math.log(V))   # θ_k's eval loss after earlier ones
    watch = TrainLossWatch(math.log(V)); watch.add(k, loss) ...; watch.check(k) -> why or None

A run with validation batches checks each eval loss (`eval_diverged`), and every checkpoint
is evaluated before it is saved. A run with `train.eval_batches=0` has no eval loss, so the
training loop checks the mean training loss of the updates since the previous check with
the same rule instead (`TrainLossWatch`), at every logged step and before every checkpoint:
a checkpoint is never saved from a state that fails it. The mean over a window (at least
one logging interval between logged steps), not one batch's loss, so that a noisy batch
cannot stop a healthy run; the first window's mean stands for the untrained loss.
"""

from __future__ import annotations

import collections
import math

WINDOW = 10  # updates whose mean training loss is checked (`TrainLossWatch`)


def eval_diverged(loss: float, earlier: dict[int, float], ln_v: float) -> bool:
  """An eval loss after some updates diverged: non-finite, or above ln V when an earlier
  eval was at most ln V (the lr sweeps' rule, pergrad.analysis.rules) or when it is above the
  untrained model's loss (step 0)."""
  if not math.isfinite(loss):
    return True
  return loss > ln_v and (min(earlier.values(), default=math.inf) <= ln_v
                          or loss > earlier.get(0, math.inf))


class TrainLossWatch:
  """`eval_diverged` applied to the mean training loss of the last `window` updates at each
  check: the first check's mean is the reference of step 0, the later ones the earlier evals."""

  def __init__(self, ln_v: float, window: int = WINDOW, active: bool = True):
    """`active=False` (a run that evaluates): `add` and `check` do nothing."""
    self.ln_v, self.active = ln_v, active
    self.means: dict[int, float] = {}  # check index (0: the first) -> mean training loss
    self._last = collections.deque(maxlen=window)  # (update, loss)
    self._new = False  # an update since the last check

  def add(self, k: int, loss: float) -> None:
    """Update k's training loss (measured before the update)."""
    if self.active:
      self._last.append((k, loss))
      self._new = True

  def check(self, k: int) -> str | None:
    """What diverged at update k, if it did (None also when no update came since the last
    check)."""
    if not self._new:
      return None
    self._new = False
    mean = sum(loss for _, loss in self._last) / len(self._last)
    if eval_diverged(mean, self.means, self.ln_v):
      return (f"the training loss diverged at step {k} (mean {mean:.4g} over updates "
              f"{self._last[0][0]}-{k}, ln V={self.ln_v:.4g}; train.eval_batches=0, so no "
              "eval loss)")
    self.means[len(self.means)] = mean
    return None
