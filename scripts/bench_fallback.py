#!/usr/bin/env python
"""The per-leaf fallback against whole-model vmap, on a transformer with one refused leaf.

The model: a preset's Transformer whose per-example loss adds a penalty on the position
table (λ‖E_pos‖², so surgery's proof refuses that one leaf). Both programs compute every
statistic (mean, sq, sign, norms) exactly: "surgery_vmap" (surgery for the proven leaves,
the refused leaf's per-example gradients through its example-free slice, `surgery/cuts.py`,
where it can be read: "cut" lists those leaves; else vmap of the gradient with respect to
it alone) and "vmap" (per-example gradients of every leaf); beside them "surgery" on the
model without the penalty (what the proven leaves alone cost). Each is compiled once
(XLA's peak of live buffers and its footprint, `pergrad.bench.xla_costs`), checked equal
on every leaf, then timed in interleaved reps; the time ratio is the location of the paired
ratios with its 90 % interval (`pergrad.bench.paired.summary`). Prints one JSON document;
--out writes it.

  .venv/bin/python scripts/bench_fallback.py --preset tiny --batch 32 --reps 8 \
      --out results/bench_fallback.json
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
from pergrad.bench.paired import paired_ratios, summary  # noqa: E402
from pergrad.bench.stats import PRESETS  # noqa: E402
from pergrad.bench.xla_costs import compile_with_peak, memory_of  # noqa: E402
from pergrad.files import write_json  # noqa: E402
from pergrad.loss import make_loss_fn  # noqa: E402
from pergrad.model import Transformer, init_params  # noqa: E402
from pergrad.stats import surgery  # noqa: E402
from pergrad.sweep.record import provenance  # noqa: E402

ALL = ("mean", "sq", "sign", "norms")
BACKENDS = ("surgery_vmap", "vmap")  # on the penalised model; "surgery": the plain one


def penalised_loss(spec):
  """The preset's per-example loss plus 0.01·‖E_pos‖² (one leaf refused by surgery)."""
  base = make_loss_fn(Transformer(spec))
  return lambda p, b: base(p, b) + 0.01 * jnp.sum(jnp.square(p["pos_embed"]["embedding"]))


def run(preset: str, B: int, reps: int) -> dict:
  spec, T = PRESETS[preset]
  loss_fn = penalised_loss(spec)
  params = init_params(spec, jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, spec.vocab_size, (B, T)), jnp.int32)
           for k in ("inputs", "targets")}
  plan = ps.api.make_plan(loss_fn, params, batch, ps.StatsRequest(ALL))
  plain_fn = make_loss_fn(Transformer(spec))
  progs, costs, outs = {}, {}, {}
  for be in BACKENDS + ("surgery",):
    f = plain_fn if be == "surgery" else loss_fn
    fn = jax.jit(lambda p, b, be=be, f=f: ps.compute(f, p, b, want=ALL, backend=be))
    t0 = time.perf_counter()
    progs[be], peak = compile_with_peak(fn.lower(params, batch))
    costs[be] = dict(peak_bytes=peak, compile_s=round(time.perf_counter() - t0, 2),
                     **memory_of(progs[be]))
    outs[be] = jax.block_until_ready(progs[be](params, batch))  # also the warm-up
  worst = 0.0
  for name in ("mean", "sq", "norms"):  # signs: counts, off by 2 where a g_b is near 0
    for a, b in zip(jax.tree.leaves(outs[BACKENDS[0]][1].get(name)),
                    jax.tree.leaves(outs[BACKENDS[1]][1].get(name)), strict=True):
      scale = float(np.abs(b).max()) or 1.0
      worst = max(worst, float(np.abs(np.asarray(a) - np.asarray(b)).max()) / scale)
  times = {be: [] for be in progs}
  for _ in range(reps):  # interleaved: drift and contention hit each alike
    for be in progs:
      t0 = time.perf_counter()
      jax.block_until_ready(progs[be](params, batch))
      times[be].append(time.perf_counter() - t0)
  a, b = BACKENDS
  return dict(
      preset=preset, spec=dataclasses.asdict(spec) | {"T": T}, batch_size=B, reps=reps,
      want=list(ALL), refused=[list(r) for r in plan.refused],
      cut=list(surgery.cut_paths(loss_fn, params, batch, ps.StatsRequest(ALL))),
      n_leaves=len(plan.keys), max_rel_diff=worst,
      median_s={be: float(np.median(times[be])) for be in progs}, times=times,
      costs=costs, time_ratio=summary(paired_ratios(times[a], times[b])),
      time_ratio_vs_surgery_alone=summary(paired_ratios(times[a], times["surgery"])),
      peak_ratio=(costs[a]["peak_bytes"] / costs[b]["peak_bytes"]
                  if costs[a]["peak_bytes"] and costs[b]["peak_bytes"] else None),
      mem_ratio=costs[a]["mem_bytes"] / costs[b]["mem_bytes"],
      platform=jax.default_backend(), device=jax.devices()[0].device_kind,
      command="scripts/bench_fallback.py " + " ".join(sys.argv[1:]), **provenance())


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--out", default=None)
  a = ap.parse_args(argv)
  doc = run(a.preset, a.batch, a.reps)
  print(json.dumps(doc, indent=1))
  if a.out:
    write_json(a.out, doc)  # the same text and newline, written whole
  return doc


if __name__ == "__main__":
  main()
