#!/usr/bin/env python
"""Scanned (`ModelSpec.scan_layers`: nn.scan + remat) against unrolled blocks, on the
surgery statistics step (mean, sq, sign, norms) of a tiny-width transformer.

compile_s: lower + compile of a fresh `jax.jit` of the step, at each depth in --layers.
At --paired-layers: the scanned model runs on the unrolled one's block parameters stacked
(`stack_blocks`; max_rel_diff: the largest statistic difference over its leaf's scale),
timed in the interleaved sequence U S U S ... U (`pergrad.bench.paired`): the paired
ratios t_scanned / t_unrolled, median and location (`paired.summary`); peak_ratio: XLA's
peak of live buffers, scanned over unrolled, and mem_ratio: its memory analysis
(`pergrad.bench.xla_costs`). Prints one JSON document; --out writes it.

  .venv/bin/python scripts/bench_scan.py --out results/bench_scan.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import pergrad.stats as ps  # noqa: E402
from pergrad.bench import paired  # noqa: E402
from pergrad.bench.xla_costs import compile_with_peak, memory_of  # noqa: E402
from pergrad.files import write_json  # noqa: E402
from pergrad.loss import make_loss_fn  # noqa: E402
from pergrad.model import ModelSpec, Transformer, init_params, stack_blocks  # noqa: E402
from pergrad.sweep.record import provenance  # noqa: E402

ALL = ("mean", "sq", "sign", "norms")
WIDTHS = dict(d_model=32, n_heads=2, d_ff=64, vocab_size=64)


def setup(n_layers: int, scan: bool, B: int, T: int):
  """(step, params, batch): the jitted surgery statistics step of a model of n_layers;
  the scanned model's params are the unrolled model's blocks stacked."""
  spec = ModelSpec(n_layers=n_layers, seq_len=T, scan_layers=scan, **WIDTHS)
  params = init_params(dataclasses.replace(spec, scan_layers=False), jax.random.key(0), T)
  params = stack_blocks(params, n_layers) if scan else params
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, spec.vocab_size, (B, T)), jnp.int32)
           for k in ("inputs", "targets")}
  loss_fn = make_loss_fn(Transformer(spec))
  step = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=ALL, backend="surgery"))
  return step, params, batch


def compile_s(n_layers: int, scan: bool, B: int, T: int) -> float:
  step, params, batch = setup(n_layers, scan, B, T)
  t0 = time.perf_counter()
  step.lower(params, batch).compile()
  return round(time.perf_counter() - t0, 2)


def max_rel_diff(out_u, out_s, n_layers: int) -> float:
  """Largest |scanned - unrolled| / scale over the leaves of mean, sq and norms (signs:
  counts, off by 2 where an example's gradient is near 0)."""
  worst = 0.0
  for name in ("mean", "sq", "norms"):
    u, s = out_u[1].get(name), out_s[1].get(name)
    if name == "norms":  # a stacked leaf's squared norm: the sum over its blocks
      blocks = [u[f"block_{i}"] for i in range(n_layers)]
      u = {**{k: v for k, v in u.items() if not k.startswith("block_")},
           "blocks": jax.tree.map(lambda *x: sum(x), *blocks)}
    else:
      u = stack_blocks(u, n_layers)
    for a, b in zip(jax.tree.leaves(u), jax.tree.leaves(s), strict=True):
      scale = float(np.abs(a).max()) or 1.0
      worst = max(worst, float(np.abs(np.asarray(a) - np.asarray(b)).max()) / scale)
  return worst


def paired_run(n_layers: int, B: int, T: int, reps: int) -> dict:
  progs, costs, outs, args = {}, {}, {}, {}
  for name, scan in (("unrolled", False), ("scanned", True)):
    step, params, batch = setup(n_layers, scan, B, T)
    progs[name], peak = compile_with_peak(step.lower(params, batch))
    costs[name] = dict(peak_bytes=peak, **memory_of(progs[name]))
    args[name] = (params, batch)
    outs[name] = jax.device_get(jax.block_until_ready(progs[name](*args[name])))  # warm-up
  run = lambda name: _timed(progs[name], args[name])
  run("unrolled"), run("scanned")  # one untimed pair
  base, var = [run("unrolled")], []
  for _ in range(reps):  # U S U S ... U
    var.append(run("scanned"))
    base.append(run("unrolled"))
  ratios = paired.paired_ratios(var, paired.bracketed(base))
  cu, cs = costs["unrolled"], costs["scanned"]
  return dict(
      n_layers=n_layers, reps=reps, time_ratio=paired.summary(ratios),
      median_s=dict(unrolled=float(np.median(base)), scanned=float(np.median(var))),
      peak_ratio=(cs["peak_bytes"] / cu["peak_bytes"]
                  if cs["peak_bytes"] and cu["peak_bytes"] else None),
      mem_ratio=cs["mem_bytes"] / cu["mem_bytes"], costs=costs,
      max_rel_diff=max_rel_diff(outs["unrolled"], outs["scanned"], n_layers))


def _timed(compiled, args) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  return time.perf_counter() - t0


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
  ap.add_argument("--paired-layers", type=int, default=12)
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq-len", type=int, default=16)
  ap.add_argument("--reps", type=int, default=30)
  ap.add_argument("--out", default=None)
  a = ap.parse_args(argv)
  compile_times = {str(L): {name: compile_s(L, scan, a.batch, a.seq_len)
                            for name, scan in (("unrolled", False), ("scanned", True))}
                   for L in a.layers}
  doc = dict(widths=WIDTHS, batch_size=a.batch, seq_len=a.seq_len, want=list(ALL),
             backend="surgery", remat_policy="dots_saveable", compile_s=compile_times,
             paired=paired_run(a.paired_layers, a.batch, a.seq_len, a.reps),
             platform=jax.default_backend(), device=jax.devices()[0].device_kind,
             command="scripts/bench_scan.py " + " ".join(sys.argv[1:] if argv is None
                                                         else argv),
             **provenance())
  print(json.dumps(doc, indent=1))
  if a.out:
    write_json(a.out, doc)  # the same text and newline, written whole
  return doc


if __name__ == "__main__":
  main()
