"""The training loop: `run(cfg, out_dir) -> summary`.

    summary = run(cfg, "outputs/my_run")   # cfg: the composed Hydra config (or a Config)

Order of work: validate everything that can be validated before any compute (one
ValueError line each), prepare the data, build the jitted steps, restore the latest
good checkpoint of `out_dir` if any (so re-running the same command resumes), then
train. Metrics of step k are pulled from the device after step k+1 is dispatched
(as in nanodo), so the device never waits for logging; before an evaluation or a
checkpoint the pending step is pulled and checked, so a checkpoint never holds a state
whose loss or parameters are non-finite.

Vocabulary: the model presets set `model.vocab_size: ${data.vocab_size}`, so the model
follows the tokenizer's configured size; at start-up a tokenizer with more tokens than
model.vocab_size is an error (one line naming both), and a larger model vocabulary (e.g.
padding, or byte tokens with the default 1024) is allowed with a note.

Step numbering: the train record of step k (1..steps) is the k-th update: its loss is
measured on batch k-1 at θ_{k-1}; eval at step k is at θ_k (step 0: initial params).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from omegaconf import DictConfig, OmegaConf

from pergrad.model import ModelSpec, count_params

SUMMARY = "summary.json"
CONFIG = "config.yaml"
# Config keys whose change makes an existing run's checkpoints unusable.
_IDENTITY = ("model", "data", "optimizer", "schedule", "train.seed", "train.steps",
             "stats.track_snr")
_IGNORED = ("data.tfds_dir",)


class NonFiniteLossError(RuntimeError):
  """The loss, gradient or parameters became NaN/inf; the message names the step."""


def _value(x: Any) -> Any:
  return getattr(x, "value", x)


def as_dictconfig(cfg: Any) -> DictConfig:
  return cfg if isinstance(cfg, DictConfig) else OmegaConf.structured(cfg)


def to_plain(cfg: Any) -> dict:
  return OmegaConf.to_container(as_dictconfig(cfg), resolve=True, enum_to_str=True)


def _flat(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(_flat(v, key + "."))
    else:
      out[key] = v
  return out


def _identity(plain: dict) -> dict:
  flat = _flat(plain)
  return {k: v for k, v in flat.items()
          if any(k == p or k.startswith(p + ".") for p in _IDENTITY) and k not in _IGNORED}


def check_same_run(out_dir: Path, plain: dict) -> None:
  """ValueError if `out_dir` holds checkpoints of a run with a different config."""
  saved = out_dir / CONFIG
  if not saved.exists():
    return
  old = _identity(OmegaConf.to_container(OmegaConf.load(saved), resolve=True))
  new = _identity(plain)
  diff = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k)]
  if diff:
    raise ValueError(
        f"{out_dir} holds checkpoints of a run with a different config ({'; '.join(diff[:4])}"
        f"{' ...' if len(diff) > 4 else ''}); resuming needs the same config: set another "
        "train.out_dir (or delete that directory).")


def validate(cfg: Any, n_devices: int) -> ModelSpec:
  """Every check that needs no data and no compute; returns the model spec."""
  spec = ModelSpec.from_config(cfg.model)
  t, d = cfg.train, cfg.data
  if t.steps < 1:
    raise ValueError(f"train.steps={t.steps} must be >= 1.")
  for key in ("eval_every", "checkpoint_every", "eval_batches"):
    if getattr(t, key) < 0:
      raise ValueError(f"train.{key}={getattr(t, key)} must be >= 0 (0 turns it off).")
  if cfg.logging.log_every < 1:
    raise ValueError(f"logging.log_every={cfg.logging.log_every} must be >= 1.")
  if cfg.stats.log_every < 0:
    raise ValueError(f"stats.log_every={cfg.stats.log_every} must be >= 0 (0: never).")
  if d.seq_len > spec.seq_len:
    raise ValueError(
        f"data.seq_len={d.seq_len} exceeds model.seq_len={spec.seq_len} (the longest "
        f"sequence the model supports); lower data.seq_len or raise model.seq_len.")
  for key in ("batch_size", "eval_batch_size"):
    b = getattr(d, key)
    if b < 1:
      raise ValueError(f"data.{key}={b} must be >= 1.")
    if b % n_devices:
      lo, hi = (b // n_devices) * n_devices, (b // n_devices + 1) * n_devices
      raise ValueError(
          f"data.{key}={b} is not divisible by the {n_devices} devices of the ('data',) "
          f"mesh; use a multiple of {n_devices} (e.g. data.{key}={lo or hi}).")
  return spec


def _finite(m: dict) -> bool:
  return all(math.isfinite(float(m[k])) for k in ("loss", "grad_norm", "param_norm"))


def _write_json(path: Path, obj: dict) -> None:
  tmp = path.with_suffix(".tmp")
  tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
  tmp.replace(path)


def run(cfg: Any, out_dir: str | Path, *, hydra_info: dict | None = None,
        echo: Callable[[str], None] = print) -> dict:
  """Trains (or resumes, or skips a completed run in `out_dir`); returns the summary."""
  t_begin = time.time()
  for name in ("absl", "jax"):  # Orbax logs every file at INFO; JAX its backend search
    logging.getLogger(name).setLevel(logging.WARNING)
  out_dir = Path(out_dir)
  cfg = as_dictconfig(cfg)
  prev = json.loads((out_dir / SUMMARY).read_text()) if (out_dir / SUMMARY).exists() else {}
  if prev.get("status") == "completed" and prev.get("steps") == cfg.train.steps:
    echo(f"already completed: {out_dir}")
    return prev
  if prev.get("status") == "diverged":
    raise NonFiniteLossError(
        f"{prev.get('error', 'the run diverged')} (recorded in {out_dir / SUMMARY}; delete "
        "that file to try again).")

  # ---- checks before any compute ------------------------------------------------------
  from pergrad.optim import build_optimizer
  from pergrad.stats import normalize_want, resolve_backend
  from pergrad.train.mesh import make_mesh

  mesh = make_mesh()
  n_dev = mesh.devices.size
  spec = validate(cfg, n_dev)
  t, d = cfg.train, cfg.data
  B, T, steps_total = d.batch_size, d.seq_len, t.steps
  stats_every = cfg.stats.log_every
  # stats.track_snr adds the EMA-SNR tracker (opt/<leaf>/snr_ema in the diagnostics); it
  # needs 'sq' at EVERY step, so it is a separate switch: plain statistics logging
  # (stats.log_every > 0) costs nothing on other steps and leaves the trajectory unchanged.
  opt = build_optimizer(cfg.optimizer, cfg.schedule, total_steps=steps_total, batch_size=B,
                        track_snr=bool(cfg.stats.track_snr))
  backend = _value(cfg.stats.backend)
  resolve_backend(opt.request.want, opt.request.granularity, backend,
                  opt.request.per_example_clip)
  # What is logged, plus 'sq' which the optimizer diagnostics need.
  stats_want = normalize_want([*cfg.stats.want, "sq"])
  stats_gran = _value(cfg.stats.granularity)
  if stats_every:
    resolve_backend(stats_want, stats_gran, backend)
  plain = to_plain(cfg)
  if (out_dir / "checkpoints").exists():
    check_same_run(out_dir, plain)

  # ---- data -----------------------------------------------------------------------------
  from pergrad.data import make_data

  data = make_data(cfg.data)
  if data.vocab_size > spec.vocab_size:
    raise ValueError(
        f"the tokenizer has {data.vocab_size} tokens (data.tokenizer="
        f"{_value(d.tokenizer)}, data.vocab_size={d.vocab_size}) but model.vocab_size="
        f"{spec.vocab_size}; set model.vocab_size={data.vocab_size} (the presets follow "
        "data.vocab_size).")
  if data.vocab_size < spec.vocab_size:
    echo(f"[pergrad] note: model.vocab_size={spec.vocab_size} > tokenizer vocabulary "
         f"{data.vocab_size}; the extra embedding rows are never used.")

  # ---- run directory, compiled steps, state ---------------------------------------------
  from pergrad.train.checkpoint import Checkpoints
  from pergrad.train.metrics import MetricsLogger, read_records
  from pergrad.train.step import Steps

  out_dir.mkdir(parents=True, exist_ok=True)
  OmegaConf.save(OmegaConf.create(plain), out_dir / CONFIG)
  steps = Steps(spec, opt, mesh, seq_len=T, backend=backend,
                microbatch_size=cfg.stats.microbatch_size, stats_want=stats_want,
                stats_granularity=stats_gran)
  ckpt = Checkpoints(out_dir / "checkpoints", keep=t.keep_checkpoints)
  state = ckpt.restore_latest(steps.abstract_sharded_state(), echo=echo)
  start = 0 if state is None else int(jax.device_get(state.step))
  if state is None:
    state = steps.init(jnp.int32(t.seed))
  else:
    echo(f"[pergrad] resuming {out_dir} from the checkpoint of step {start}.")
  n_params = count_params(state.params)

  wandb_config = dict(plain)
  if hydra_info:
    wandb_config["hydra"] = hydra_info
  logger = MetricsLogger(
      out_dir, resume_step=start if start else None,
      wandb_cfg=cfg.logging.wandb, config=wandb_config, name=cfg.name)
  kept = read_records(logger.path)
  evals = {r["step"]: r["loss"] for r in kept if r.get("split") == "eval"}
  train_kept = [r for r in kept if r.get("split") == "train"]
  describe = data.describe() if hasattr(data, "describe") else ""
  echo(f"[pergrad] {n_params:,} parameters, {n_dev} device(s) "
       f"({jax.devices()[0].platform}), B={B} T={T}, {steps_total} steps; data: {describe}")
  echo(f"[pergrad] run directory: {out_dir}")

  eval_batches = [steps.put_batch(b) for b in data.eval_batches(t.eval_batches)] \
      if t.eval_batches else []

  def evaluate(k: int) -> None:
    if not eval_batches:
      return
    losses = jax.device_get([steps.eval(state.params, b) for b in eval_batches])
    evals[k] = float(np.mean(losses))
    logger.write({"step": k, "split": "eval", "loss": evals[k]})

  def is_eval(k):
    return k == steps_total or (t.eval_every > 0 and k % t.eval_every == 0)

  def is_ckpt(k):
    return k == steps_total or (t.checkpoint_every > 0 and k % t.checkpoint_every == 0)

  def is_log(k):
    return k == start + 1 or k == steps_total or k % cfg.logging.log_every == 0

  def is_stats(k):
    return stats_every > 0 and (k == 1 or k % stats_every == 0)

  from tqdm.auto import tqdm

  bar = tqdm(total=steps_total, initial=start, disable=not cfg.logging.progress,
             desc=cfg.name, unit="step", dynamic_ncols=True, mininterval=0.5)
  clock = {"t0": None, "k0": None, "t_log": None, "k_log": None, "excluded": 0.0,
           "excl_log": 0.0}
  last = {"train_loss": train_kept[-1]["loss"] if train_kept else None, "k": start}
  tok_per_step = B * T

  def pull(pending) -> None:
    """Brings step k's metrics to the host, checks them, logs them."""
    k, m = pending
    m = {key: float(v) for key, v in jax.device_get(m).items()}
    now = time.time()
    if clock["t0"] is None:  # the first step (compilation) is not timed
      clock.update(t0=now, k0=k, t_log=now, k_log=k)
    rec = {"step": k, "split": "train", **m, "examples_seen": k * B,
           "tokens_seen": k * tok_per_step}
    if not _finite(m):
      logger.write(rec)
      last["diverged_step"] = k
      raise NonFiniteLossError(
          f"non-finite training loss at step {k} (loss={m['loss']}, grad_norm="
          f"{m['grad_norm']}, param_norm={m['param_norm']}); stopped, the last good "
          f"checkpoint is kept in {ckpt.directory} (steps {ckpt.steps()}). Lower "
          "optimizer.lr or set optimizer.clip_norm.")
    last.update(train_loss=m["loss"], k=k)
    bar.update(k - bar.n)
    if is_log(k):
      if k > clock["k_log"]:
        dt = now - clock["t_log"] - (clock["excluded"] - clock["excl_log"])
        rec["tokens_per_s"] = (k - clock["k_log"]) * tok_per_step / max(dt, 1e-9)
        clock.update(t_log=now, k_log=k, excl_log=clock["excluded"])
      logger.write(rec)
      post = {"loss": f"{m['loss']:.3f}"}
      if "tokens_per_s" in rec:
        post["tok/s"] = f"{rec['tokens_per_s']:,.0f}"
      if evals:
        post["eval"] = f"{evals[max(evals)]:.3f}"
      bar.set_postfix(post, refresh=False)

  def excluded(fn):
    t_in = time.time()
    out = fn()
    clock["excluded"] += time.time() - t_in
    return out

  status, error = "interrupted", None
  try:
    if start == 0:
      evaluate(0)
    pending = None
    for k in range(start + 1, steps_total + 1):
      batch = steps.put_batch(data.train_batch(k - 1))
      stats_vals = None
      if is_stats(k):  # fetched before the state is donated to the train step
        stats_vals = excluded(lambda s=state, b=batch: jax.device_get(steps.stats(s, b)))
      state, metrics = steps.train(state, batch)
      if pending is not None:
        pull(pending)
      pending = (k, metrics)
      if stats_vals is not None:
        logger.write({"step": k, "split": "stats",
                      **{a: float(v) for a, v in stats_vals.items()}})
      if is_eval(k) or is_ckpt(k):
        pull(pending)
        pending = None
        if is_eval(k):
          excluded(lambda k=k: evaluate(k))
        if is_ckpt(k):
          excluded(lambda k=k, s=state: ckpt.save(k, s))
    if pending is not None:
      pull(pending)
    if steps_total not in evals and eval_batches:
      evaluate(steps_total)
    status = "completed"
  except NonFiniteLossError as e:
    status, error = "diverged", str(e)
    raise
  finally:
    bar.close()
    ckpt.wait()
    ckpt.close()
    wall = time.time() - t_begin
    tps = None
    if clock["t0"] is not None and last["k"] > clock["k0"]:
      dt = time.time() - clock["t0"] - clock["excluded"]
      tps = (last["k"] - clock["k0"]) * tok_per_step / max(dt, 1e-9)
    summary = {
        "status": status,
        "steps": steps_total,
        "last_step": last["k"],
        "final_train_loss": last["train_loss"],
        "initial_eval_loss": evals.get(0),
        "final_eval_loss": evals.get(steps_total) if status == "completed" else None,
        "tokens_per_s": tps,
        "wall_time_s": round(wall, 2),
        "resumed_from": start or None,
        "n_params": n_params,
        "n_devices": n_dev,
        "run_dir": str(out_dir),
        "metrics": str(logger.path),
        "checkpoints": str(ckpt.directory),
        "checkpoint_steps": ckpt.steps(),
        "wandb": str(logger.wandb_dir) if logger.wandb_dir else None,
        "config": str(out_dir / CONFIG),
    }
    if error:
      summary["error"] = error
      summary["diverged_step"] = last.get("diverged_step")
    if status == "completed" or error:
      logger.summary({k: v for k, v in summary.items() if isinstance(v, (int, float))})
      _write_json(out_dir / SUMMARY, summary)
    logger.close(exit_code=0 if status == "completed" else 1)
  _print_summary(summary, echo)
  return summary


def _fmt(x, spec=".4f"):
  return "n/a" if x is None else format(x, spec)


def _print_summary(s: dict, echo) -> None:
  echo(f"[pergrad] done: {s['steps']} steps in {s['wall_time_s']:.1f} s"
       + (f" (resumed from step {s['resumed_from']})" if s["resumed_from"] else ""))
  echo(f"[pergrad]   eval loss {_fmt(s['initial_eval_loss'])} (step 0) -> "
       f"{_fmt(s['final_eval_loss'])} (step {s['steps']}); final train loss "
       f"{_fmt(s['final_train_loss'])}; {_fmt(s['tokens_per_s'], ',.0f')} tokens/s")
  echo(f"[pergrad]   metrics: {s['metrics']}")
  echo(f"[pergrad]   checkpoints: {s['checkpoints']} (steps {s['checkpoint_steps']})")
  if s["wandb"]:
    echo(f"[pergrad]   W&B: {s['wandb']} (upload with `wandb sync {s['wandb']}`)")
  echo(f"[pergrad]   config: {s['config']}; summary: {Path(s['run_dir']) / SUMMARY}")
