#!/usr/bin/env python
"""Throughput and peak memory of the jitted train step; prints one JSON object.

    python scripts/bench_throughput.py model=tiny data.batch_size=32
    python scripts/bench_throughput.py model=small data.seq_len=256 --steps 20
    python scripts/bench_throughput.py optimizer=adam_family optimizer.variant=micro_adam

Arguments are Hydra overrides of configs/config.yaml (model, data sizes, optimizer,
stats backend...). The batches are random tokens (no data preparation), so this
measures the step alone: the same `pergrad.train.step.Steps` the trainer uses (same
shardings over all local devices, same donation), `--warmup` untimed steps after an
ahead-of-time compile, then `--steps` timed steps, the device synchronised at both ends.

Memory (`pergrad.xla_costs`): XLA's peak of simultaneously live buffers of the train
step (`peak_bytes`) and its footprint `mem_bytes` = argument + output + temp - alias
bytes of `memory_analysis()`; the process's peak RSS; on GPU/TPU the device allocator's
`peak_bytes_in_use`.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--steps", type=int, default=10, help="timed steps")
  p.add_argument("--warmup", type=int, default=2, help="untimed steps after compiling")
  args, overrides = p.parse_known_args(argv)

  from hydra import compose, initialize_config_dir

  from pergrad import config

  config.register()
  with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
    cfg = compose(config_name="config", overrides=overrides)

  import jax
  import jax.numpy as jnp
  import numpy as np

  from pergrad.model import count_params
  from pergrad.optim import build_optimizer
  from pergrad.train.loop import validate
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps
  from pergrad.xla_costs import compile_with_peak, memory_of

  mesh = make_mesh()
  spec = validate(cfg, mesh.devices.size)
  B, T = cfg.data.batch_size, cfg.data.seq_len
  opt = build_optimizer(cfg.optimizer, cfg.schedule, total_steps=args.warmup + args.steps,
                        batch_size=B, track_snr=bool(cfg.stats.track_snr))
  backend = getattr(cfg.stats.backend, "value", cfg.stats.backend)
  steps = Steps(spec, opt, mesh, seq_len=T, backend=backend,
                microbatch_size=cfg.stats.microbatch_size)
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, spec.vocab_size, (B, T + 1), dtype=np.int32)
  host_batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  batch = steps.put_batch(host_batch)

  state = steps.init(jnp.int32(0))
  t0 = time.perf_counter()
  compiled, peak_bytes = compile_with_peak(steps.train.lower(state, batch))
  compile_s = time.perf_counter() - t0  # includes writing the XLA dump the peak is read from
  mem_d = memory_of(compiled) | {"peak_bytes": peak_bytes}

  for _ in range(args.warmup):
    state, m = compiled(state, batch)
  jax.block_until_ready((state, m))
  t0 = time.perf_counter()
  for _ in range(args.steps):
    state, m = compiled(state, batch)
  jax.block_until_ready((state, m))
  dt = time.perf_counter() - t0

  dev = jax.devices()[0]
  dev_stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
  maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  rss_bytes = maxrss if platform.system() == "Darwin" else maxrss * 1024
  out = {
      "model": cfg.model.name,
      "n_params": count_params(state.params),
      "optimizer": getattr(cfg.optimizer.name, "value", cfg.optimizer.name),
      "stats_request": list(opt.request.want),
      "batch_size": B,
      "seq_len": T,
      "devices": f"{mesh.devices.size}x {dev.platform} ({dev.device_kind})",
      "compile_s": round(compile_s, 3),
      "timed_steps": args.steps,
      "step_s": float(f"{dt / args.steps:.6g}"),  # 6 significant digits, not decimals
      "tokens_per_s": round(args.steps * B * T / dt, 1),
      "examples_per_s": round(args.steps * B / dt, 2),
      "final_loss": float(m["loss"]),
      "memory_analysis": mem_d,
      "peak_rss_bytes": int(rss_bytes),
      "device_peak_bytes_in_use": (dev_stats or {}).get("peak_bytes_in_use"),
      "overrides": overrides,
  }
  print(json.dumps(out, indent=1))
  return out


if __name__ == "__main__":
  main()
