#!/usr/bin/env python
"""Weak scaling of the train step over CPU processes on this machine; prints JSON.

    python scripts/bench_scaling.py                       # 1, 2, 4 processes, scale=cpu
    python scripts/bench_scaling.py --procs 1,2 --per-process-batch 16 model=small

For each process count P it launches P processes of `scripts/bench_throughput.py`
(jax.distributed on localhost, one CPU device each) at a FIXED per-process batch (the
global batch is P times it) and reads tokens/s, once without per-example statistics
(`optimizer=adam`: plain value_and_grad) and once with them (`optimizer=adam_family
optimizer.variant=micro_adam`: per-example second moments every step, whose sums are
reduced across processes). Reported: tokens/s per process and the weak-scaling
efficiency (tokens/s per process at P over that at 1). On one machine the processes
share its cores, so the efficiency also holds the cores' contention, not only the
cross-process reductions: compare the two rows at each P to see what the statistics add.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {
    "no_stats": ["optimizer=adam"],
    "with_stats": ["optimizer=adam_family", "optimizer.variant=micro_adam"],
}


def _port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def measure(n: int, batch: int, steps: int, overrides: list[str]) -> dict:
  port, env = _port(), {**os.environ, "WANDB_MODE": "disabled"}
  env.pop("XLA_FLAGS", None)
  procs = []
  for i in range(n):
    dist = ([f"dist.coordinator_address=localhost:{port}", f"dist.num_processes={n}",
             f"dist.process_id={i}"] if n > 1 else [])
    procs.append(subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "bench_throughput.py"), "--steps", str(steps),
         *overrides, f"data.batch_size={batch * n}", *dist],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  outs = [p.communicate(timeout=1800) for p in procs]
  for p, (_, err) in zip(procs, outs, strict=True):
    if p.returncode:
      raise RuntimeError(f"a benchmark process failed ({p.returncode}): {err[-1500:]}")
  text = outs[0][0]  # gloo prints its own lines to stdout before the JSON document
  return json.loads(text[text.index("{\n"):] if not text.startswith("{") else text)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--procs", default="1,2,4")
  p.add_argument("--per-process-batch", type=int, default=16)
  p.add_argument("--steps", type=int, default=20)
  args, overrides = p.parse_known_args(argv)
  overrides = overrides or ["scale=cpu"]
  rows = []
  for name, extra in VARIANTS.items():
    base = None
    for n in map(int, args.procs.split(",")):
      r = measure(n, args.per_process_batch, args.steps, [*overrides, *extra])
      per_proc = r["tokens_per_s"] / n
      base = per_proc if base is None else base
      rows.append(dict(variant=name, processes=n, global_batch=r["batch_size"],
                       tokens_per_s=r["tokens_per_s"], tokens_per_s_per_process=per_proc,
                       efficiency=round(per_proc / base, 4), stats_request=r["stats_request"]))
  out = {"per_process_batch": args.per_process_batch, "overrides": overrides,
         "cpus": os.cpu_count(), "rows": rows}
  print(json.dumps(out, indent=1))
  return out


if __name__ == "__main__":
  main()
