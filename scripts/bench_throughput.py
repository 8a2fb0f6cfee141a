#!/usr/bin/env python
"""Throughput and peak memory of the jitted train step; prints one JSON object.

    python scripts/bench_throughput.py model=tiny data.batch_size=32
    python scripts/bench_throughput.py model=small data.seq_len=256 --steps 20
    python scripts/bench_throughput.py optimizer=adam_family optimizer.variant=micro_adam
    python scripts/bench_throughput.py --compare --steps 400 --reps 4 scale=cpu stats=example

Arguments are Hydra overrides of configs/config.yaml. The default mode measures the step
alone (`bare_step`: the trainer's own `pergrad.train.step.Steps` on random tokens, `--warmup`
untimed steps, then `--steps` timed ones); `--compare` also the full training loop with
statistics logging off and on (`loop_tokens_per_s`), and prints the ratios. `--preset
tiny|small|paper` picks a model and batch; MFU (`pergrad.bench.mfu`) is the model FLOPs
per token 6N + 12·L·T·d times tokens/s over the device's peak (`--peak-flops` overrides);
memory (`pergrad.bench.xla_costs`): XLA's peak of live buffers and `memory_analysis()`
footprint, the process's peak RSS, on GPU/TPU the allocator's `peak_bytes_in_use`. With
`dist.*` overrides it runs as one process of a multi-process job (`scripts/bench_scaling.py`).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def bare_step(plan, steps: int, warmup: int) -> dict:
  """Tokens/s of the compiled plain train step on random tokens."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from pergrad.bench.xla_costs import compile_with_peak, flops_of, memory_of
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps

  mesh = make_mesh()
  st = Steps(plan, mesh)
  B, T = plan.data.batch_size, plan.data.seq_len
  tokens = np.random.default_rng(0).integers(0, plan.model.vocab_size, (B, T + 1),
                                             dtype=np.int32)
  batch = st.put_batch({"inputs": tokens[:, :-1], "targets": tokens[:, 1:]})
  state = st.init(jnp.int32(0))
  t0 = time.perf_counter()
  # The trainer's plain step, compiled once more to read XLA's buffer-liveness peak.
  compiled, peak_bytes = compile_with_peak(st.train_jit.lower(state, batch))
  compile_s = time.perf_counter() - t0
  for _ in range(warmup):
    state, m = compiled(state, batch)
  jax.block_until_ready((state, m))
  t0 = time.perf_counter()
  for _ in range(steps):
    state, m = compiled(state, batch)
  jax.block_until_ready((state, m))
  dt = time.perf_counter() - t0
  return {"xla_flops_per_step": flops_of(compiled),
          "step_s": float(f"{dt / steps:.6g}"), "tokens_per_s": round(steps * B * T / dt, 1),
          "examples_per_s": round(steps * B / dt, 2), "compile_s": round(compile_s, 3),
          "final_loss": float(m["loss"]), "n_params": sum(x.size for x in
                                                        jax.tree.leaves(state.params)),
          "memory_analysis": memory_of(compiled) | {"peak_bytes": peak_bytes},
          "devices": f"{mesh.devices.size}x {jax.devices()[0].platform} "
                     f"({jax.devices()[0].device_kind})"}


def loop_tokens_per_s(overrides: list[str], steps: int) -> float:
  """Tokens/s of the full training loop, as the loop reports it."""
  import jax

  from pergrad.config import build_plan, compose
  from pergrad.train import run

  with tempfile.TemporaryDirectory() as d:
    cfg = compose([*overrides, f"train.steps={steps}", "train.eval_batches=0",
                   "train.checkpoint_every=0", "logging.progress=false",
                   "logging.wandb.mode=disabled"])
    summary = run(build_plan(cfg, jax.device_count()), d, echo=lambda s: None)
  return float(summary["tokens_per_s"])


def microbatch_table(overrides: list[str], chunk: int, sizes: list[int], reps: int) -> dict:
  """`pergrad.bench.microbatch.plain_microbatch` at each batch size, both plain backends."""
  import jax

  from pergrad.bench.microbatch import plain_microbatch
  from pergrad.config import build_plan, compose

  rows = []
  for B in sizes:
    plan = build_plan(compose([*overrides, f"data.batch_size={B}"]), jax.device_count())
    for backend in ("contraction", "value_and_grad"):
      r = plain_microbatch(plan, backend, chunk, reps)
      rows.append({"batch_size": B, "backend": backend, "chunk": chunk, **r})
  out = {"benchmark": "plain step microbatched / direct", "device": jax.devices()[0].device_kind,
         "overrides": overrides, "reps": reps, "rows": rows}
  print(json.dumps(out, indent=1))
  return out


def nanodo_table(overrides: list[str], sizes: list[int], reps: int, steps: int) -> dict:
  """`pergrad.bench.nanodo.versus_nanodo` at each batch size, both plain backends."""
  import jax

  from pergrad.bench.nanodo import versus_nanodo
  from pergrad.config import build_plan, compose

  rows = []
  for B in sizes:
    for backend in ("contraction", "value_and_grad"):
      plan = build_plan(compose(["optimizer=adamw", *overrides, f"data.batch_size={B}",
                                 f"stats.backend={backend}", "stats.log_every=0"]),
                        jax.device_count())
      rows.append({"batch_size": B, **versus_nanodo(plan, reps, steps)})
  out = {"benchmark": "plain train step / nanodo-style step",
         "device": jax.devices()[0].device_kind, "overrides": overrides, "reps": reps,
         "rows": rows}
  print(json.dumps(out, indent=1))
  return out


# --preset: the model presets' sizes (random tokens: no dataset is read in the default mode).
PRESETS = {
    "tiny": ["scale=cpu"],
    "small": ["model=small", "data.seq_len=256", "data.batch_size=32"],
    "paper": ["scale=paper"],
}


def main(argv=None) -> dict:
  from pergrad.train import process

  process.quiet()  # this entry point's process: other libraries' logging, as training's CLI
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--preset", choices=tuple(PRESETS), default=None,
                 help="model/batch preset (overrides given after it still apply)")
  p.add_argument("--peak-flops", type=float, default=None,
                 help="device peak FLOP/s for MFU (default: pergrad.bench.mfu's table)")
  p.add_argument("--steps", type=int, default=10, help="timed steps")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  p.add_argument("--compare", action="store_true",
                 help="bare step vs full loop vs loop with statistics logging (ratios)")
  p.add_argument("--reps", type=int, default=3, help="repetitions of each --compare variant")
  p.add_argument("--microbatch", type=int, default=None, metavar="CHUNK",
                 help="the plain step's ḡ over chunks of CHUNK examples vs the whole batch, "
                      "at --batch-sizes, both plain backends (paired ratios, parity)")
  p.add_argument("--nanodo", action="store_true",
                 help="the loop's plain step vs a nanodo-style step (optax.adamw + "
                      "value_and_grad) at --batch-sizes, both plain backends (paired ratios "
                      "of --steps steps per rep, with the baseline against itself and the "
                      "gradient alone: pergrad.bench.nanodo)")
  p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")],
                 default=[8, 32, 128])
  args, overrides = p.parse_known_args(argv)
  overrides = [*PRESETS.get(args.preset, []), *overrides]
  if args.microbatch:
    return microbatch_table(overrides, args.microbatch, args.batch_sizes, max(args.reps, 8))
  if args.nanodo:
    return nanodo_table(overrides, args.batch_sizes, max(args.reps, 8), args.steps)

  import jax

  from pergrad.bench import mfu
  from pergrad.config import build_plan, compose
  from pergrad.train import distributed

  cfg = compose(overrides)
  distributed.initialize(cfg.dist.coordinator_address, cfg.dist.num_processes,
                         cfg.dist.process_id, auto=cfg.dist.auto)
  plan = build_plan(cfg, jax.device_count())
  out = {
      "model": plan.config["model"]["name"],
      "optimizer": plan.config["optimizer"]["name"],
      "stats_request": list(plan.stats.request.want),
      "batch_size": plan.data.batch_size,
      "seq_len": plan.data.seq_len,
      **bare_step(plan, args.steps, args.warmup),
  }
  if args.compare:
    no_log = [*overrides, "stats.log_every=0"]
    rows = {"bare": [], "loop": [], "loop_stats": []}
    for _ in range(args.reps):  # round-robin, so drifts of the machine hit all alike
      rows["bare"].append(bare_step(plan, args.steps, args.warmup)["tokens_per_s"])
      rows["loop"].append(loop_tokens_per_s(no_log, args.steps))
      rows["loop_stats"].append(loop_tokens_per_s(overrides, args.steps))
    med = {k: statistics.median(v) for k, v in rows.items()}
    out["compare"] = {
        "tokens_per_s": rows, "median_tokens_per_s": med,
        "stats_log_every": plan.stats.log_every,
        "stats_logged": list(plan.stats.log_request.want) if plan.stats.log_request else [],
        "loop_over_bare": round(med["loop"] / med["bare"], 4),
        "loop_stats_over_loop": round(med["loop_stats"] / med["loop"], 4),
    }
  m = plan.model
  per_token = mfu.model_flops_per_token(out["n_params"], m.n_layers, plan.data.seq_len,
                                        m.d_model)
  peak = mfu.peak_flops(jax.devices()[0].device_kind, args.peak_flops)
  out.update(model_flops_per_token=per_token, peak_flops_per_device=peak,
             mfu=mfu.mfu(out["tokens_per_s"], per_token, jax.device_count(), peak),
             xla_flops_per_step=out.pop("xla_flops_per_step"),
             processes=jax.process_count())
  maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  dev = jax.local_devices()[0]
  dev_stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  out.update({
      "timed_steps": args.steps,
      "peak_rss_bytes": int(maxrss if platform.system() == "Darwin" else maxrss * 1024),
      "device_peak_bytes_in_use": (dev_stats or {}).get("peak_bytes_in_use"),
      "overrides": overrides,
  })
  if jax.process_index() == 0:
    print(json.dumps(out, indent=1))
  return out


if __name__ == "__main__":
  main()
