"""The training loop: `run(plan, out_dir) -> summary`.

    plan = pergrad.config.build_plan(cfg, jax.device_count())
    summary = run(plan, "outputs/my_run")

Three steps, with a `Session` between them: `_setup` decides from the plan's fingerprint
whether `out_dir` is new, to resume or already completed, prepares the data, builds the
jitted steps and restores the latest good checkpoint; `_loop` trains; `_finish` closes the
checkpoints and the log and writes the summary, whatever stopped the loop. Metrics stay on
the device until about `logging.log_every` steps are pending, then are pulled in one transfer
(one step late, as in nanodo); before an evaluation or a checkpoint every pending step is
pulled and checked (`pergrad.train.recorder`), so a saved checkpoint is a good one.
Divergence (`pergrad.train.divergence`) stops the run with status "diverged"; SIGINT, SIGTERM
and the pre-emption signal (`pergrad.train.interrupt`) stop it between two updates with a
checkpoint and status "interrupted"; the same command resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import jax
import numpy as np
import yaml

from pergrad import files
from pergrad.config.plan import CONFIG, DATA, RunPlan, check_same_data, resume_decision
from pergrad.model import count_params
from pergrad.optim import gns_metrics
from pergrad.train import compile_cache, distributed
from pergrad.train.batch_schedule import next_batch_size
from pergrad.train.checkpoint import Checkpoints, OutputError, check_progress_kept
from pergrad.train.heldout import HeldOutData
from pergrad.train.interrupt import Interrupts
from pergrad.train.metrics import MetricsLogger, read_records
from pergrad.train.progress import Clock, Progress, print_summary
from pergrad.train.recorder import History, NonFiniteLossError, Recorder
from pergrad.train.run_dir import (
  check_not_past,
  is_past,
  locked,
  raise_past,
  write_failed_summary,
)

if TYPE_CHECKING:
  from pergrad.train.step import Steps


def run(plan: RunPlan, out_dir: str | Path, **kwargs) -> dict:
  """Trains (or resumes, or skips a completed run in `out_dir`); returns the summary. kwargs:
  hydra_info (recorded), echo (print), stop (the signal flags read between updates; default:
  installed here). With JAX's compilation cache in plan.train.compile_cache meanwhile.

  Step numbering: the train record of step k (1, 2, ...) is the k-th update: its loss is
  measured on the batch of update k at θ_{k-1}; eval at step k is at θ_k (step 0: initial
  params). Every record carries examples_seen and tokens_seen after it, train records the
  update's batch_size. A fixed-batch run makes train.steps updates; with a batch-size schedule
  (`pergrad.train.batch_schedule`) the loop asks it for each update's size and runs the step
  compiled for B until train.steps x data.batch_size examples are seen; evaluations and
  checkpoints fall at the same examples seen whatever the schedule.

  Divergence: a non-finite training loss, gradient or parameter norm, or an eval loss at a
  step > 0 that is non-finite or above ln V after an earlier eval was below it (the lr sweeps'
  rule, `pergrad.analysis.rules`) or above the step-0 loss (without eval batches, the mean
  training loss of the last 10 updates); a one-line error names the step and the last good
  checkpoint. A tokenizer with more tokens than model.vocab_size is an error, a larger model
  vocabulary a note.
  """
  with compile_cache.using(plan.train.compile_cache):
    return _run(plan, out_dir, **kwargs)


def _run(plan: RunPlan, out_dir: str | Path, *, hydra_info: dict | None = None,
         echo: Callable[[str], None] = print, stop: Interrupts | None = None) -> dict:
  """The checks that refuse or skip the run, then `_train` holding the run directory's lock
  (`pergrad.train.run_dir.locked`)."""
  t_begin = time.time()
  out_dir = Path(out_dir)
  echo = echo if distributed.is_main() else (lambda _: None)
  if resume_decision(out_dir, plan) == "completed":
    echo(f"already completed: {out_dir}")
    return files.read_json(out_dir / files.SUMMARY)
  check_progress_kept(out_dir, plan.train, plan.batch.max_batch_size)
  check_not_past(out_dir, plan.train, plan.batch.max_batch_size)
  with locked(out_dir, echo) if distributed.is_main() else contextlib.nullcontext():
    return _train(plan, out_dir, hydra_info, echo, stop, t_begin)


def _train(plan: RunPlan, out_dir: Path, hydra_info: dict | None, echo, stop: Interrupts | None,
           t_begin: float) -> dict:
  """`_setup`, `_loop`, `_finish`; then the run's last line (interrupted, or its summary)."""
  s = _setup(plan, out_dir, hydra_info, echo, t_begin)
  s.stop = (stop or Interrupts()).install(every=plan.logging.log_every)
  gc.collect()
  gc.freeze()  # setup's objects leave the collector's generations: cheaper collections
  try:
    _loop(s)
  except NonFiniteLossError as e:
    s.status, s.error = "diverged", str(e)
    raise
  finally:
    summary = _finish(s)
  if s.status == "interrupted":
    echo(f"[pergrad] interrupted by {s.stop.name} after step {summary['last_step']}: "
         f"checkpoint saved in {summary['checkpoints']}; re-run the same command to resume"
         + (" (this submitit job requeues itself)." if s.stop.requeues() else "."))
  else:
    print_summary(summary, echo)
  return summary


@dataclasses.dataclass
class Session:
  """What `_setup` hands `_loop` and `_loop` hands `_finish`. The loop advances `state` (θ_k
  and the optimizer's state after update k), `k`, `seen` (examples after update k) and
  `batch_size` (update k's), and sets `status`; `start` is the step the run began from."""
  plan: RunPlan
  out_dir: Path
  echo: Callable[[str], None]
  steps: Steps
  data: Any
  part: tuple[int, int]  # (this process, processes): the rows of each batch it loads
  heldout: HeldOutData | None
  evaluate: Evaluator
  ckpt: Checkpoints
  logger: MetricsLogger
  recorder: Recorder
  clock: Clock
  progress: Progress
  state: Any
  start: int
  seen: int
  batch_size: int
  n_devices: int
  t_begin: float
  setup_s: float  # the fixed cost: imports aside, data, compiles, restore
  compiles: Any  # compile_cache.counts() before setup's compiles
  k: int = 0
  stop: Interrupts | None = None
  status: str = "failed"
  error: str | None = None


def _setup(plan: RunPlan, out_dir: Path, hydra_info: dict | None, echo, t_begin: float
           ) -> Session:
  """Prepares the data, builds the jitted steps, restores the latest good checkpoint (or
  initialises), opens the metrics log and prints the run's first lines."""
  from pergrad.data import make_data
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps

  compiles = compile_cache.counts()
  try:
    out_dir.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise OutputError.of(e, out_dir) from None
  main = distributed.is_main()
  data = make_data(plan.data)
  _check_vocab(data.vocab_size, plan.model.vocab_size, plan.data, echo)
  data_record = check_same_data(out_dir, plan.data)  # again: its tokenizer is trained now
  if (out_dir / CONFIG).exists() and not (out_dir / DATA).exists():
    echo(f"[pergrad] note: {out_dir} records no data identity (an older run): resuming "
         f"without comparing its data; {DATA} records this data from now on.")
  mesh = make_mesh()
  steps = Steps(plan, mesh)
  ckpt = Checkpoints(out_dir / "checkpoints", keep=plan.train.keep_checkpoints)
  state = ckpt.restore_latest(steps.abstract_sharded_state(), echo=echo,
                             restart=plan.train.restart, fresh=steps.fresh)
  start = 0 if state is None else int(jax.device_get(state.step))
  if state is None:
    state = steps.init(np.int32(plan.train.seed))
  seen, batch_size = map(int, jax.device_get((state.examples_seen, state.batch_size)))  # last
  if is_past(seen, plan.train.steps, plan.batch.max_batch_size):
    raise_past(out_dir, plan.train.steps, seen, plan.batch.max_batch_size)
  if start:
    echo(f"[pergrad] resuming {out_dir} from the checkpoint of step {start}.")
  if main:  # accepted: the run's config and data, before its first record
    files.write_text(out_dir / CONFIG, yaml.safe_dump(plan.config, sort_keys=False))
    files.write_json(out_dir / DATA, data_record)
  config = {**plan.config, **({"hydra": hydra_info} if hydra_info else {})}
  logger = MetricsLogger(out_dir, resume_step=start or None, wandb=plan.logging.wandb,
                         config=config, name=plan.name, enabled=main)
  history = History.of(read_records(logger.path) if main else [])
  sched, T, max_batch_size = plan.batch, plan.data.seq_len, plan.batch.max_batch_size
  batch_label = (f"B={max_batch_size}" if sched.kind == "fixed" else
                 f"B {sched.kind} schedule over {list(sched.sizes)}")
  echo(f"[pergrad] {count_params(state.params):,} parameters, {mesh.devices.size} device(s) "
       f"({jax.devices()[0].platform}), {batch_label}, T={T}, {plan.train.steps} steps of "
       f"{max_batch_size} examples; data: {data.describe()}")
  echo(f"[pergrad] run directory: {out_dir}")

  part = distributed.part()  # this process loads its rows of every batch
  heldout = (HeldOutData(data, plan.stats.sign_agreement, max_batch_size, part)
             if steps.sign is not None else None)
  evaluate = Evaluator(steps, data.eval_batches(plan.train.eval_batches, part))
  clock = Clock(tokens_per_example=T, elapsed_before=ckpt.train_time_s(start) if start else 0.0)
  recorder = Recorder(plan, logger, history, clock, start, seen, data.vocab_size, ckpt)
  progress = Progress(plan.train.steps, seen // max_batch_size, plan.logging, plan.name)
  return Session(plan, out_dir, echo, steps, data, part, heldout, evaluate, ckpt, logger,
                 recorder, clock, progress, state, start, seen, batch_size, mesh.devices.size,
                 t_begin, time.time() - t_begin, compiles, k=start)


def _loop(s: Session) -> None:
  """Updates until the plan's examples are seen (status "completed") or a signal stops the
  run between two updates (status "interrupted", with a checkpoint). Metrics are pulled one
  step late, all of them before an evaluation or a checkpoint; NonFiniteLossError when the
  run diverged."""
  plan, steps, sched, max_batch_size = s.plan, s.steps, s.plan.batch, s.plan.batch.max_batch_size

  def b_simple() -> float:  # the GNS schedule's decisions read the state after update k
    key = f"gns/{sched.gns_group}/b_simple"
    return float(jax.device_get(gns_metrics(s.state.gns)[key]))

  if s.start == 0:
    s.recorder.eval(0, 0, s.evaluate(s.state.params))
  pending = []  # (k, examples seen, B, metrics on the device), pulled one step late
  while not plan.train.done(s.seen, max_batch_size):
    if s.stop.requested(s.k):
      s.status = "interrupted"
      break
    s.batch_size = next_batch_size(sched, s.k, s.seen, s.batch_size, b_simple)
    batch = steps.put_batch(s.data.train_examples(s.seen, s.batch_size, s.part))
    extra = (steps.put_batch(s.heldout.batch(s.seen))
             if s.heldout is not None and steps.logs_at(s.k + 1) else None)
    s.state, metrics = steps.step(s.state, batch, s.k + 1, extra)
    before = s.seen
    s.k, s.seen = s.k + 1, s.seen + s.batch_size
    pending.append((s.k, s.seen, s.batch_size, metrics))
    evals = plan.train.evals_at(before, s.seen, max_batch_size)
    ckpts = plan.train.checkpoints_at(before, s.seen, max_batch_size)
    if evals or ckpts:
      pending = _pull(pending, 0, s.recorder, s.progress)
      _checkpoint(s, evals, ckpts)
    elif len(pending) > plan.logging.log_every:
      pending = _pull(pending, 1, s.recorder, s.progress)
  _pull(pending, 0, s.recorder, s.progress)
  if s.status == "interrupted":
    _checkpoint(s, False, True)
  else:
    s.status = "completed"


def _checkpoint(s: Session, log_eval: bool, save: bool) -> None:
  """Evaluates θ_k (logged if `log_eval`), stops on divergence, then saves if `save` (with
  the seconds of training so far, which a resumed run's clock starts from)."""
  trained = s.clock.elapsed()
  with s.clock.paused():
    if log_eval or (save and s.k not in s.ckpt.steps()):
      s.recorder.eval(s.k, s.seen, s.evaluate(s.state.params), log=log_eval)
      s.progress.show_eval(s.recorder.history.evals)
    if save and s.k not in s.ckpt.steps():
      s.ckpt.save(s.k, s.state, train_time_s=trained)


def _finish(s: Session) -> dict:
  """Restores the signal handlers, closes the progress bar, checkpoints and logger, and
  writes summary.json (a failed run's only when its storage failed) and the figure; returns
  the summary. Raises the OutputError of a checkpoint save that could not write."""
  s.stop.restore()
  gc.unfreeze()
  s.progress.close()
  failure = s.ckpt.finish()  # a save that could not write (OutputError)
  status = "failed" if failure else s.status
  summary = _summary(s.plan, s.out_dir, status, s.error, s.recorder, s.clock, s.start, s.ckpt,
                     s.logger, time.time() - s.t_begin, count_params(s.state.params),
                     s.n_devices)
  compiles = compile_cache.counts() - s.compiles
  summary.update(setup_s=round(s.setup_s, 2), compile_s=round(compiles.seconds, 2),
                 compile_cache_hits=compiles.hits, compile_misses=compiles.misses)
  if status == "interrupted":
    summary["signal"] = s.stop.name
  s.ckpt.close()
  main = distributed.is_main()
  if status == "completed" and main and s.plan.logging.figure:
    summary["figure"] = _figure(s.out_dir, s.echo)
  if status == "failed" and main:
    write_failed_summary(s.out_dir, summary, failure or sys.exc_info()[1])
  elif main:
    s.logger.summary({k: v for k, v in summary.items() if isinstance(v, (int, float))})
    files.write_json(s.out_dir / files.SUMMARY, summary)
  s.logger.close(exit_code=0 if status == "completed" else 1)
  if failure:
    raise failure
  return summary


def _pull(pending: list, keep: int, recorder: Recorder, progress: Progress) -> list:
  """Records all but the last `keep` pending steps (one transfer); returns those kept."""
  done, kept = pending[:len(pending) - keep], pending[len(pending) - keep:]
  host = jax.device_get([m for *_, m in done])
  if done:
    recorder.clock.tick(done[-1][1])
  for (k, seen, batch_size, _), m in zip(done, host, strict=True):
    progress.show(recorder.train(k, seen, batch_size, m))
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
