"""The training loop: `run(plan, out_dir) -> summary`.

    plan = pergrad.config.build_plan(cfg, jax.device_count())
    summary = run(plan, "outputs/my_run")

Order of work: decide from the plan's fingerprint whether `out_dir` is new, to resume
or already completed (a different run there is a one-line error), prepare the data,
build the jitted steps, restore the latest good checkpoint, then train. Metrics stay on
the device until about `logging.log_every` steps are pending, then all but the newest
are pulled in one transfer (one step late, as in nanodo), so the device never waits for
logging and the host syncs once per log interval, not once per step (on CPU, where host
and XLA share the cores, syncing every step cost ~6% of the cpu preset's tokens/s); before an
evaluation or a checkpoint every pending step is pulled and checked, so a checkpoint
never holds a state whose loss or parameters are non-finite. At the end the run draws
`curves.png` beside `metrics.jsonl`.

Divergence stops the run (status "diverged" in summary.json, a one-line error naming the
step and the last good checkpoint): a non-finite training loss, gradient or parameter
norm, or an eval loss at a step > 0 that is non-finite or above ln V (V: the tokenizer's
vocabulary; a uniform guess) after an earlier eval was below it (the lr sweeps' rule,
pergrad.analysis.rules) or above the step-0 loss (`pergrad.train.divergence`; without eval
batches, the mean training loss of the last 10 updates). Every checkpoint is evaluated (or
its training loss checked) before it is saved, so a saved checkpoint is a good one.
SIGINT, SIGTERM and the pre-emption signal (`pergrad.train.interrupt`) stop the run
between two updates with a checkpoint and status "interrupted"; the same command resumes.

Vocabulary: the model presets set `model.vocab_size: ${data.vocab_size}`; a tokenizer
with more tokens than model.vocab_size is an error (one line naming both), a larger
model vocabulary (padding, or byte tokens with the default 1024) a note.

Step numbering: the train record of step k (1, 2, ...) is the k-th update: its loss is
measured on the batch of update k at θ_{k-1}; eval at step k is at θ_k (step 0: initial
params). Every train and eval record carries examples_seen and tokens_seen after it, and
train records the update's batch_size. A fixed-batch run makes train.steps updates; with
a batch-size schedule (`pergrad.train.batch_schedule`) the loop asks it for each update's
size, feeds examples seen..seen+B-1 and runs the step compiled for B, until
train.steps x data.batch_size examples are seen; evaluations and checkpoints fall at the
same examples seen whatever the schedule (`pergrad.config.schema.TrainSpec`).
"""

from __future__ import annotations

import gc
import logging
import math
import sys
import time
from pathlib import Path
from typing import Callable

import jax
import numpy as np
import yaml

from pergrad import files
from pergrad.config.plan import CONFIG, RunPlan, resume_decision
from pergrad.model import count_params
from pergrad.optim.diagnostics import gns_metrics
from pergrad.train import compile_cache, distributed
from pergrad.train.batch_schedule import next_size
from pergrad.train.checkpoint import Checkpoints, OutputError, check_progress_kept
from pergrad.train.divergence import TrainLossWatch, eval_diverged
from pergrad.train.heldout import HeldOutData
from pergrad.train.interrupt import Interrupts
from pergrad.train.metrics import MetricsLogger, read_records
from pergrad.train.progress import Clock, Progress, print_summary
from pergrad.train.run_dir import write_failed_summary


class NonFiniteLossError(RuntimeError):
  """The run diverged (module docstring); the message names the step and the last good
  checkpoint."""


def run(plan: RunPlan, out_dir: str | Path, **kwargs) -> dict:
  """Trains (or resumes, or skips a completed run in `out_dir`); returns the summary. kwargs:
  hydra_info (recorded), echo (print), stop (the signal flags read between updates; default:
  installed here). With JAX's compilation cache in plan.train.compile_cache meanwhile."""
  with compile_cache.using(plan.train.compile_cache):
    return _run(plan, out_dir, **kwargs)


def _run(plan: RunPlan, out_dir: str | Path, *, hydra_info: dict | None = None,
         echo: Callable[[str], None] = print, stop: Interrupts | None = None) -> dict:
  t_begin = time.time()
  for name in ("absl", "jax"):  # Orbax logs every file at INFO; JAX its backend search
    logging.getLogger(name).setLevel(logging.WARNING)
  out_dir = Path(out_dir)
  main = distributed.is_main()
  echo = echo if main else (lambda _: None)
  if resume_decision(out_dir, plan) == "completed":
    echo(f"already completed: {out_dir}")
    return files.read_json(out_dir / files.SUMMARY)
  check_progress_kept(out_dir, plan.train, plan.batch.max_size)

  from pergrad.data import make_data
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps

  compiles = compile_cache.counts()
  try:
    out_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise OutputError.of(e, out_dir) from None
  data = make_data(plan.data)
  _check_vocab(data.vocab_size, plan.model.vocab_size, plan.data, echo)
  if main:
    files.write_text(out_dir / CONFIG, yaml.safe_dump(plan.config, sort_keys=False))
  mesh = make_mesh()
  steps = Steps(plan, mesh)
  ckpt = Checkpoints(out_dir / "checkpoints", keep=plan.train.keep_checkpoints)
  state = ckpt.restore_latest(steps.abstract_sharded_state(), echo=echo,
                             restart=plan.train.restart, fresh=steps.fresh)
  start = 0 if state is None else int(jax.device_get(state.step))
  if state is None:
    state = steps.init(np.int32(plan.train.seed))
  else:
    echo(f"[pergrad] resuming {out_dir} from the checkpoint of step {start}.")
  seen, size = map(int, jax.device_get((state.examples_seen, state.batch_size)))  # last B
  config = {**plan.config, **({"hydra": hydra_info} if hydra_info else {})}
  logger = MetricsLogger(out_dir, resume_step=start or None, wandb=plan.logging.wandb,
                         config=config, name=plan.name, enabled=main)
  history = History.of(read_records(logger.path) if main else [])
  sched, T, unit = plan.batch, plan.data.seq_len, plan.batch.max_size
  B = (f"B={unit}" if sched.kind == "fixed" else
       f"B {sched.kind} schedule over {list(sched.sizes)}")
  echo(f"[pergrad] {count_params(state.params):,} parameters, {mesh.devices.size} device(s) "
       f"({jax.devices()[0].platform}), {B}, T={T}, {plan.train.steps} steps of {unit} "
       f"examples; data: {data.describe()}")
  echo(f"[pergrad] run directory: {out_dir}")

  part = distributed.part()  # this process loads its rows of every batch
  heldout = (HeldOutData(data, plan.stats.sign_agreement, unit, part)
             if steps.sign is not None else None)
  evaluate = Evaluator(steps, data.eval_batches(plan.train.eval_batches, part))
  clock = Clock(tokens_per_example=T, elapsed_before=ckpt.train_time_s(start) if start else 0.0)
  recorder = Recorder(plan, logger, history, clock, start, seen, data.vocab_size, ckpt)
  progress = Progress(plan.train.steps, seen // unit, plan.logging, plan.name)

  def b_simple() -> float:  # the GNS schedule's decisions read the state after update k
    key = f"gns/{sched.gns_group}/b_simple"
    return float(jax.device_get(gns_metrics(state.gns)[key]))

  def checkpoint(k: int, seen: int, log_eval: bool, save: bool) -> None:
    """Evaluates θ_k (logged if `log_eval`), stops on divergence, then saves if `save`
    (with the seconds of training so far, which a resumed run's clock starts from)."""
    trained = clock.elapsed()
    with clock.paused():
      if log_eval or (save and k not in ckpt.steps()):
        recorder.eval(k, seen, evaluate(state.params), log=log_eval)
        progress.show_eval(recorder.history.evals)
      if save and k not in ckpt.steps():
        ckpt.save(k, state, train_time_s=trained)

  status, error = "failed", None
  setup_s = time.time() - t_begin  # the fixed cost: imports aside, data, compiles, restore
  stop = (stop or Interrupts()).install(every=plan.logging.log_every)
  gc.collect()
  gc.freeze()  # setup's objects leave the collector's generations: cheaper collections
  try:
    if start == 0:
      recorder.eval(0, 0, evaluate(state.params))
    pending = []  # (k, examples seen, B, metrics on the device), pulled one step late
    k = start
    while not plan.train.done(seen, unit):
      if stop.requested(k):
        status = "interrupted"
        break
      size = next_size(sched, k, seen, size, b_simple)
      batch = steps.put_batch(data.train_examples(seen, size, part))
      extra = (steps.put_batch(heldout.batch(seen))
               if heldout is not None and steps.logs_at(k + 1) else None)
      state, metrics = steps.step(state, batch, k + 1, extra)
      k, before, seen = k + 1, seen, seen + size
      pending.append((k, seen, size, metrics))
      evals = plan.train.evals_at(before, seen, unit)
      ckpts = plan.train.checkpoints_at(before, seen, unit)
      if evals or ckpts:
        pending = _pull(pending, 0, recorder, progress)
        checkpoint(k, seen, evals, ckpts)
      elif len(pending) > plan.logging.log_every:
        pending = _pull(pending, 1, recorder, progress)
    _pull(pending, 0, recorder, progress)
    if status == "interrupted":
      checkpoint(k, seen, False, True)
    else:
      status = "completed"
  except NonFiniteLossError as e:
    status, error = "diverged", str(e)
    raise
  finally:
    stop.restore()
    gc.unfreeze()
    progress.close()
    failure = ckpt.finish()  # a save that could not write (OutputError)
    status = "failed" if failure else status
    summary = _summary(plan, out_dir, status, error, recorder, clock, start, ckpt, logger,
                       time.time() - t_begin, count_params(state.params), mesh.devices.size)
    compiles = compile_cache.counts() - compiles
    summary.update(setup_s=round(setup_s, 2), compile_s=round(compiles.seconds, 2),
                   compile_cache_hits=compiles.hits, compile_misses=compiles.misses)
    if status == "interrupted":
      summary["signal"] = stop.name
    ckpt.close()
    if status == "completed" and main and plan.logging.figure:
      summary["figure"] = _figure(out_dir, echo)
    if status == "failed" and main:
      write_failed_summary(out_dir, summary, failure or sys.exc_info()[1])
    elif main:
      logger.summary({k: v for k, v in summary.items() if isinstance(v, (int, float))})
      files.write_json(out_dir / files.SUMMARY, summary)
    logger.close(exit_code=0 if status == "completed" else 1)
    if failure:
      raise failure
  if status == "interrupted":
    echo(f"[pergrad] interrupted by {stop.name} after step {summary['last_step']}: "
         f"checkpoint saved in {summary['checkpoints']}; re-run the same command to resume"
         + (" (this submitit job requeues itself)." if stop.requeues() else "."))
  else:
    print_summary(summary, echo)
  return summary


def _pull(pending: list, keep: int, recorder: Recorder, progress: Progress) -> list:
  """Records all but the last `keep` pending steps (one transfer); returns those kept."""
  done, kept = pending[:len(pending) - keep], pending[len(pending) - keep:]
  host = jax.device_get([m for *_, m in done])
  if done:
    recorder.clock.tick(done[-1][1])
  for (k, seen, size, _), m in zip(done, host, strict=True):
    progress.show(recorder.train(k, seen, size, m))
  return kept


def _check_vocab(tokenizer_vocab: int, model_vocab: int, data_spec, echo) -> None:
  if tokenizer_vocab > model_vocab:
    raise ValueError(
        f"the tokenizer has {tokenizer_vocab} tokens (data.tokenizer={data_spec.tokenizer}, "
        f"data.vocab_size={data_spec.vocab_size}) but model.vocab_size={model_vocab}; set "
        f"model.vocab_size={tokenizer_vocab} (the presets follow data.vocab_size).")
  if tokenizer_vocab < model_vocab:
    echo(f"[pergrad] note: model.vocab_size={model_vocab} > tokenizer vocabulary "
         f"{tokenizer_vocab}; the extra embedding rows are never used.")


class Evaluator:
  """Mean loss over fixed validation batches (None when there are none)."""

  def __init__(self, steps, host_batches: list[dict]):
    self._eval = steps.eval
    self._batches = [steps.put_batch(b) for b in host_batches]

  def __call__(self, params) -> float | None:
    if not self._batches:
      return None
    return float(np.mean(jax.device_get([self._eval(params, b) for b in self._batches])))


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
    self.T, self.unit, self.budget = (plan.data.seq_len, plan.batch.max_size,
                                      plan.train.steps * plan.batch.max_size)
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

  def train(self, k: int, seen: int, size: int, metrics: dict) -> tuple[int, dict]:
    """Checks and records update k's metrics (on the host; `seen` examples after it, of
    which `size` in this update); returns (progress in full-batch steps, what the
    progress bar shows). NonFiniteLossError on a NaN/inf loss, gradient or parameter norm."""
    m = {key: float(v) for key, v in metrics.items()}
    scalars = {key: v for key, v in m.items() if "/" not in key}
    rec = {"step": k, "split": "train", **scalars, "batch_size": size, "examples_seen": seen,
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
    return seen // self.unit, shown


def _summary(plan, out_dir, status, error, recorder, clock, start, ckpt, logger, wall,
             n_params, n_devices) -> dict:
  evals = recorder.history.evals
  last = recorder.last_step
  summary = {
      "status": status,
      "steps": plan.train.steps,
      "last_step": last,
      "examples_seen": recorder.last_seen,
      "tokens_seen": recorder.last_seen * plan.data.seq_len,
      "final_train_loss": recorder.history.train_loss,
      "initial_eval_loss": evals.get(0),
      "final_eval_loss": evals.get(last) if status == "completed" else None,
      "tokens_per_s": clock.rate(),
      "wall_time_s": round(wall, 2),
      "resumed_from": start or None,
      "n_params": n_params,
      "n_devices": n_devices,
      "run_dir": str(out_dir),
      "metrics": str(logger.path),
      "checkpoints": str(ckpt.directory),
      "checkpoint_steps": ckpt.steps(),
      "wandb": str(logger.wandb_dir) if logger.wandb_dir else None,
      "config": str(out_dir / CONFIG),
  }
  if error:
    summary.update(error=error, diverged_step=recorder.diverged_step)
  return summary


def _figure(out_dir: Path, echo) -> str | None:
  from pergrad.train.figure import plot_run

  try:
    return str(plot_run(out_dir))
  except Exception as e:  # noqa: BLE001 - a figure must never fail a finished run
    echo(f"[warning] could not draw the run's figure ({type(e).__name__}: {e}).")
    return None
