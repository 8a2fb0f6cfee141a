"""Wall-clock throughput and the progress bar of the training loop.

`Clock` counts tokens per second of training only: the first pull of metrics starts it
(steps pulled together are known at one instant, so a pull ticks once, with its last
step), and time spent inside `paused()` (evaluation, checkpoints) is left out.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from pergrad import files


class Clock:
  """Ticks carry the examples seen so far (the batch size may change between updates)."""

  def __init__(self, tokens_per_example: int, elapsed_before: float = 0.0):
    self.tokens_per_example, self.elapsed_before = tokens_per_example, elapsed_before
    self._t0 = self._k0 = None  # first recorded step
    self._t_log = self._k_log = None  # last rate_since_last_log
    self._k = None
    self._paused = self._paused_at_log = self._paused_at_t0 = 0.0
    self._last_rate = None

  def tick(self, k: int) -> None:
    """The metrics of every update up to the one after which k examples were seen have
    reached the host."""
    if self._t0 is None:
      self._t0 = self._t_log = time.perf_counter()
      self._k0 = self._k_log = k
      self._paused_at_t0 = self._paused
    self._k = k

  def elapsed(self) -> float | None:
    """Seconds of training: `elapsed_before` (a resumed run's, from its checkpoint) plus
    those since the first tick (pauses left out; None before it)."""
    if self._t0 is None:
      return None
    return (self.elapsed_before + time.perf_counter() - self._t0
            - (self._paused - self._paused_at_t0))

  @contextlib.contextmanager
  def paused(self):
    t = time.perf_counter()
    try:
      yield
    finally:
      self._paused += time.perf_counter() - t

  def _rate(self, t_from: float, k_from: int, paused: float) -> float | None:
    if self._k is None or self._k <= k_from:
      return None
    dt = time.perf_counter() - t_from - paused
    return (self._k - k_from) * self.tokens_per_example / max(dt, 1e-9)

  def rate(self) -> float | None:
    """Tokens/s since the first recorded step (None before two steps)."""
    if self._t0 is None:
      return None
    return self._rate(self._t0, self._k0, self._paused - self._paused_at_t0)

  def rate_since_last_log(self) -> float | None:
    """Tokens/s since the previous call (or the first tick); restarts the interval. Steps
    pulled together share the rate of the interval that brought them."""
    if self._t0 is None:
      return None
    out = self._rate(self._t_log, self._k_log, self._paused - self._paused_at_log)
    if out is None:
      return self._last_rate
    self._t_log, self._k_log, self._paused_at_log = time.perf_counter(), self._k, self._paused
    self._last_rate = out
    return out


class Progress:
  """A tqdm bar over the run's steps (off with logging.progress=false)."""

  def __init__(self, total: int, start: int, logging_spec, name: str = "run"):
    from tqdm.auto import tqdm

    self._bar = tqdm(total=total, initial=start, disable=not logging_spec.progress,
                     desc=name, unit="step", dynamic_ncols=True, mininterval=0.5)
    self._postfix: dict[str, str] = {}

  def show(self, k_and_postfix: tuple[int, dict]) -> None:
    k, postfix = k_and_postfix
    self._bar.update(k - self._bar.n)
    if postfix:
      self._postfix.update(postfix)
      self._bar.set_postfix(self._postfix, refresh=False)

  def show_eval(self, evals: dict[int, float]) -> None:
    """The latest eval loss (an eval comes after the train steps it follows were shown:
    without this the bar ends on the eval before the last)."""
    if evals:
      self._postfix["eval"] = f"{evals[max(evals)]:.3f}"
      self._bar.set_postfix(self._postfix, refresh=False)

  def close(self) -> None:
    self._bar.close()


def fmt(x: Any, spec: str = ".4f") -> str:
  return "n/a" if x is None else format(x, spec)


def print_summary(s: dict, echo) -> None:
  """The end of a run in a few lines: updates, losses, throughput, where its files are."""
  echo(f"[pergrad] done: {s['last_step']} updates, {s['tokens_seen'] or 0:,} tokens in "
       f"{s['wall_time_s']:.1f} s"
       + (f" (resumed from step {s['resumed_from']})" if s["resumed_from"] else ""))
  echo(f"[pergrad]   eval loss {fmt(s['initial_eval_loss'])} (step 0) -> "
       f"{fmt(s['final_eval_loss'])} (step {s['last_step']}); final train loss "
       f"{fmt(s['final_train_loss'])}; {fmt(s['tokens_per_s'], ',.0f')} tokens/s")
  echo(f"[pergrad]   metrics: {s['metrics']}")
  if s.get("figure"):
    echo(f"[pergrad]   figure: {s['figure']}")
  echo(f"[pergrad]   checkpoints: {s['checkpoints']} (steps {s['checkpoint_steps']})")
  if s["wandb"]:
    echo(f"[pergrad]   W&B: {s['wandb']} (upload with `wandb sync {s['wandb']}`)")
  echo(f"[pergrad]   config: {s['config']}; summary: {Path(s['run_dir']) / files.SUMMARY}")
