#!/usr/bin/env python
"""How a sweep should use the machine's cores: parallel jobs x XLA threads per job; prints
one JSON object (and writes it with --out).

    python scripts/bench_cores.py --steps 40 --out results/cpu/bench_cores.json

Each layout trains the same small sweep of the cpu preset (an lr grid x seeds, fresh sweep
directories) through `pergrad.sweep.launch_blocks` with Hydra's joblib launcher, as
`reproduce.py --launcher joblib --n-jobs N` does:
  NxT    N parallel jobs, each with XLA:CPU's intra-op threads at T (T = 1:
         `XLA_FLAGS=--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1`;
         otherwise XLA's default, one thread per core).
A layout's compile cache is its own and warmed by one untimed run first (the flags change
the programs), so every timed run pays what a later run of a reproduction pays. Reported
per layout: the sweep's wall time, over rounds that take the layouts in turn (order
reversed every other round), and its ratio to the first layout's in the same round.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def sweep_wall(layout: str, root: Path, args, tag: str) -> float:
  """Seconds to train the sweep (module docstring) with `layout` ("NxT")."""
  from pergrad.sweep import Block, launch_blocks

  n_jobs, threads = (int(x) for x in layout.split("x"))
  base = {"scale": "cpu", "train.steps": args.steps, "train.eval_batches": 1,
          "train.checkpoint_every": 0, "logging.figure": False}
  extra = (f"train.compile_cache={root / ('cache_' + layout)}",)
  flags = os.environ.get("XLA_FLAGS", "")
  os.environ["XLA_FLAGS"] = f"{flags} {ONE_THREAD}".strip() if threads == 1 else flags
  try:
    grid = {"optimizer.lr": args.lrs, "train.seed": args.seeds}
    t0 = time.time()
    log = launch_blocks(root / f"{layout}_{tag}", base, [Block(grid)], launcher="joblib",
                        n_jobs=n_jobs, extra=extra, echo=lambda line: None)
    wall = time.time() - t0
  finally:
    os.environ["XLA_FLAGS"] = flags
  if log.failed:
    raise SystemExit(f"layout {layout}: runs failed: {log.failed}")
  return wall


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--layouts", default="1x2,2x1,2x2", help="comma-separated NxT")
  p.add_argument("--steps", type=int, default=40)
  p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")], default=[3e-3, 1e-2])
  p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
  p.add_argument("--rounds", type=int, default=1)
  p.add_argument("--out", default=None)
  args = p.parse_args(argv)
  os.environ.setdefault("WANDB_MODE", "disabled")
  layouts = args.layouts.split(",")
  walls = {k: [] for k in layouts}
  with tempfile.TemporaryDirectory() as d:
    root = Path(d)
    for layout in layouts:  # warms each layout's compile cache (untimed)
      one = argparse.Namespace(**{**vars(args), "lrs": args.lrs[:1], "seeds": args.seeds[:1]})
      sweep_wall(layout, root, one, "warm")
    for r in range(args.rounds):
      for layout in layouts[::1 if r % 2 == 0 else -1]:
        walls[layout].append(sweep_wall(layout, root, args, str(r)))
  first = layouts[0]
  out = {"benchmark": "sweep wall time by jobs x threads per job", "cores": os.cpu_count(),
         "load_avg_1min": os.getloadavg()[0], "runs": len(args.lrs) * len(args.seeds),
         "steps": args.steps, "rounds": args.rounds,
         "wall_s": {k: [round(w, 1) for w in v] for k, v in walls.items()},
         "ratio_to_" + first: {k: [round(w / w0, 3) for w, w0 in zip(v, walls[first], strict=True)]
                               for k, v in walls.items()},
         "fastest": min(walls, key=lambda k: sorted(walls[k])[len(walls[k]) // 2])}
  print(json.dumps(out, indent=1))
  if args.out:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
  return out


if __name__ == "__main__":
  main()
