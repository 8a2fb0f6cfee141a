"""The training records: `Recorder` checks each update's metrics and each evaluation on the
host and writes them to the metrics log; `History` is what a resumed run already logged.

Divergence (pergrad.train.loop's docstring) raises `NonFiniteLossError`, whose message
names the step and the last good checkpoint.
"""

from __future__ import annotations

import math

from pergrad.config.plan import RunPlan
from pergrad.train.checkpoint import Checkpoints
from pergrad.train.divergence import TrainLossWatch, eval_diverged
from pergrad.train.metrics import MetricsLogger
from pergrad.train.progress import Clock


class NonFiniteLossError(RuntimeError):
  """The run diverged (module docstring); the message names the step and the last good
  checkpoint."""


class History:
  """What a resumed run already logged: eval losses by step and the last train loss."""

  def __init__(self, evals: dict[int, float], train_loss: float | None):
    self.evals, self.train_loss = evals, train_loss

  @classmethod
  def of(cls, records: list[dict]) -> History:
    train = [r for r in records if r.get("split") == "train"]
    return cls({r["step"]: r["loss"] for r in records if r.get("split") == "eval"},
               train[-1]["loss"] if train else None)


class Recorder:
  """Pulls a step's metrics to the host, checks them and writes the records."""

  def __init__(self, plan: RunPlan, logger: MetricsLogger, history: History, clock: Clock,
               start: int, seen: int, vocab_size: int, ckpt: Checkpoints):
    self.logger, self.history, self.clock, self.ckpt = logger, history, clock, ckpt
    self.ln_v = math.log(vocab_size)
    self.first, self.every = start + 1, plan.logging.log_every
    self.T, self.max_batch_size = plan.data.seq_len, plan.batch.max_batch_size
    self.budget = plan.train.steps * self.max_batch_size
    self.last_step, self.last_seen = start, seen
    self.diverged_step = None
    self.watch = TrainLossWatch(self.ln_v, active=plan.train.eval_batches == 0)

  def eval(self, k: int, seen: int, loss: float | None, log: bool = True) -> None:
    """Records (if `log`) and checks the eval loss of θ_k; NonFiniteLossError when it
    diverged (`eval_diverged`; without eval batches, the training loss: `_check_train`)."""
    if loss is None:
      self._check_train(k)
      return
    earlier = dict(self.history.evals)
    if log:
      self.history.evals[k] = loss
      self.logger.write({"step": k, "split": "eval", "loss": loss, "examples_seen": seen,
                         "tokens_seen": seen * self.T})
    if k > 0 and eval_diverged(loss, earlier, self.ln_v):
      self.diverged_step = k
      raise NonFiniteLossError(
          f"the eval loss diverged at step {k} (loss={loss:.4g}, ln V={self.ln_v:.4g}); "
          f"stopped, {self._kept()}. Lower optimizer.lr or set optimizer.clip_norm.")

  def _check_train(self, k: int) -> None:
    if why := self.watch.check(k):
      self.diverged_step = k
      raise NonFiniteLossError(f"{why}; stopped, {self._kept()}. Lower optimizer.lr or set "
                               "optimizer.clip_norm.")

  def _kept(self) -> str:
    good = self.ckpt.latest()
    return ("no checkpoint was saved before it" if good is None else
            f"the last good checkpoint is step {good} in {self.ckpt.directory}")

  def train(self, k: int, seen: int, batch_size: int, metrics: dict) -> tuple[int, dict]:
    """Checks and records update k's metrics (on the host; `seen` examples after it, of
    which `batch_size` in this update); returns (progress in full-batch steps, what the
    progress bar shows). NonFiniteLossError on a NaN/inf loss, gradient or parameter norm."""
    m = {key: float(v) for key, v in metrics.items()}
    scalars = {key: v for key, v in m.items() if "/" not in key}
    rec = {"step": k, "split": "train", **scalars, "batch_size": batch_size, "examples_seen": seen,
           "tokens_seen": seen * self.T}
    if not all(math.isfinite(m[key]) for key in ("loss", "grad_norm", "param_norm")):
      self.logger.write(rec)
      self.diverged_step = k
      raise NonFiniteLossError(
          f"non-finite training loss at step {k} (loss={m['loss']}, grad_norm="
          f"{m['grad_norm']}, param_norm={m['param_norm']}); stopped, {self._kept()}. "
          "Lower optimizer.lr or set optimizer.clip_norm.")
    self.history.train_loss, self.last_step, self.last_seen = m["loss"], k, seen
    self.watch.add(k, m["loss"])
    shown = {}
    if k == self.first or seen >= self.budget or k % self.every == 0:
      tps = self.clock.rate_since_last_log()
      if tps is not None:
        rec["tokens_per_s"] = tps
        rec["train_time_s"] = self.clock.elapsed()  # a resumed run's includes its earlier time
      self.logger.write(rec)
      self._check_train(k)
      shown = {"loss": f"{m['loss']:.3f}"}
      if tps is not None:
        shown["tok/s"] = f"{tps:,.0f}"
      if self.history.evals:
        shown["eval"] = f"{self.history.evals[max(self.history.evals)]:.3f}"
    stats = {key: v for key, v in m.items() if "/" in key}
    if stats:
      self.logger.write({"step": k, "split": "stats", **stats})
    return seen // self.max_batch_size, shown
