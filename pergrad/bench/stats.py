"""Overhead of gradient statistics: every backend × granularity × statistic set.

For each model preset and batch size, every variant is compiled once and then timed
side by side in this process (round-robin over variants, median of --reps runs after
a warm-up). Reported per variant, each also as a ratio to the plain
`jax.value_and_grad` step of the same preset and batch size:
  time_s     median wall time of one jitted step
  flops      XLA's `compiled.cost_analysis()["flops"]`; for surgery, of the same step
             traced with unrolled scans (XLA counts a loop body once, not per trip)
  peak_bytes XLA's peak of simultaneously live buffers (arguments, temporaries and
             outputs) over the compiled step's schedule (`pergrad.bench.xla_costs`): what
             the step's buffers need at once
  mem_bytes  `compiled.memory_analysis()`: temp + argument + output (- alias) bytes, what XLA:CPU
             actually reserves (output buffers sit beside the temp arena for the whole
             step), so the result trees count as if they were live at the
             activations' peak, although they are written after it
             (mem_ratio_wo_outputs: the same with the baseline's outputs, i.e. without
             the statistics' own params-sized result trees)
  rss_mb     process resident memory after the variant's warm-up (process-wide, so
             only indicative; XLA's numbers are the per-variant ones)
and `time_vs_micro_grad`: time over `optax.microbatching.micro_grad` computing the same
statistics (per-example gradients with a leading batch axis, summed by micro_grad).

  run(presets=("tiny", "medium"))   # -> the JSON document (rows + the issue's checks)
  run(quick=True)                    # smoke test (seconds)

  .venv/bin/python scripts/bench_stats.py                    # CLI: prints the document
  .venv/bin/python scripts/bench_stats.py --quick
  .venv/bin/python scripts/reproduce.py overhead --preset cpu   # -> results/overhead/
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

import pergrad.stats as ps
from pergrad.bench import mfu
from pergrad.bench.xla_costs import compile_with_peak, flops_of, memory_of
from pergrad.loss import make_loss_fn
from pergrad.model import ModelSpec, Transformer, count_params, init_params

PRESETS = {
    "micro": (ModelSpec(n_layers=1, d_model=32, n_heads=2, d_ff=64, vocab_size=64, seq_len=16),
              16),
    "tiny": (ModelSpec(n_layers=2, d_model=128, n_heads=4, d_ff=512, vocab_size=1024,
                       seq_len=128), 128),
    "medium": (ModelSpec(n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=1024,
                         seq_len=256), 256),
    # configs/model/small.yaml and paper.yaml (for an accelerator; minutes on a CPU).
    "small": (ModelSpec(n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=4096,
                        seq_len=256, positions="rope"), 256),
    "paper": (ModelSpec(n_layers=6, d_model=512, n_heads=8, d_ff=2048, vocab_size=32768,
                        seq_len=512, positions="rope", compute_dtype="bfloat16"), 512),
}
STAT_SETS = {
    "sq+sign": ("mean", "sq", "sign"),
    "norms": ("mean", "norms"),
    "all": ("mean", "sq", "sign", "norms"),
}


def micro_grad_fn(loss_fn, want):
  """The same statistics from optax.microbatching.micro_grad (reference for speed)."""
  def transform(g):
    out = {"sum": g}
    if "sq" in want:
      out["sum_sq"] = jax.tree.map(jnp.square, g)
    if "sign" in want:
      out["sum_sign"] = jax.tree.map(jnp.sign, g)
    return out
  metrics = ((lambda g: jax.tree.map(lambda x: jnp.sum(jnp.square(x)), g))
             if "norms" in want else (lambda g: None))
  mg = optax.microbatching.micro_grad(
      lambda p, ex: loss_fn(p, ex)[0], batch_argnums=1,
      accumulator=optax.microbatching.AccumulationType.SUM, transform_fn=transform,
      metrics_fn=metrics)

  def f(p, b):
    out, aux = mg(p, b)
    return aux.values.mean(), out, aux.metrics
  return f


def _stats(loss_fn, request: ps.StatsRequest, backend: str = "auto", **options):
  """fn(params, batch) -> (loss, GradStats) of `backend` with StatsOptions(**options)."""
  opts = ps.StatsOptions(**options)
  return lambda p, b: ps.compute(loss_fn, p, b, request, opts, backend=backend)


def variants(loss_fn, stat_sets, with_layout_first: bool, scan_unroll: int | bool = 1):
  """[(backend, granularity, stat set name, fn(params, batch))]; scan_unroll: the surgery
  variants' `StatsOptions.scan_unroll` (True to count their FLOPs). "surgery-separate"
  is surgery with dense_method="separate": autodiff's weight gradient beside the tap's
  materialised or Gram statistics, the method before "simultaneous"."""
  R = ps.StatsRequest
  surgery = functools.partial(_stats, loss_fn, backend="surgery", scan_unroll=scan_unroll)
  out = [("value_and_grad", "example", "mean", _stats(loss_fn, R()))]
  for name in stat_sets:
    want = STAT_SETS[name]
    out.append(("vmap", "example", name, _stats(loss_fn, R(want), "vmap")))
    if with_layout_first:
      out.append(("vmap-first", "example", name,
                  _stats(loss_fn, R(want), "vmap", vmap_layout="first")))
    out.append(("micro_grad", "example", name, micro_grad_fn(loss_fn, want)))
    out.append(("surgery", "example", name, surgery(R(want))))
    if name == "norms":  # the norm methods side by side (issue 12)
      out.append(("surgery-separate", "example", name, surgery(R(want), dense_method="separate")))
      out.append(("surgery", "example", "norms@norm", surgery(R(want, layers=("norm",)))))
    if "norms" not in want:
      out.append(("surgery", "token", name, surgery(R(want, "token"))))
  return out


def rss_mb() -> float:
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) / 1024
  except OSError:
    pass
  return float("nan")


def counted_flops(fn, params, batch) -> float:
  """FLOPs of `fn` as XLA counts them; for surgery, pass the variant built with
  scan_unroll=True: XLA's cost analysis counts a loop body once (the surgery backend
  chunks per-token statistics with lax.scan), so the FLOPs of the compiled step itself
  would be undercounted. Time and memory come from the real step."""
  return flops_of(jax.jit(fn).lower(params, batch).compile())


def bench_group(preset: str, B: int, stat_sets: Sequence[str], layout_first: bool,
                reps: int, peak_flops: float | None = None) -> list[dict]:
  spec, T = PRESETS[preset]
  params = init_params(spec, jax.random.key(0))
  loss_fn = make_loss_fn(Transformer(spec))
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, spec.vocab_size, (B, T)), jnp.int32)
           for k in ("inputs", "targets")}
  vs = variants(loss_fn, stat_sets, layout_first)
  unrolled = [v[-1] for v in variants(loss_fn, stat_sets, layout_first, scan_unroll=True)]
  rows, compiled = [], []
  for (backend, gran, sset, fn), fn_unrolled in zip(vs, unrolled, strict=True):
    t0 = time.perf_counter()
    c, peak = compile_with_peak(jax.jit(fn).lower(params, batch))
    compile_s = time.perf_counter() - t0  # includes writing the dump
    flops = (counted_flops(fn_unrolled, params, batch) if backend.startswith("surgery")
             else flops_of(c))
    jax.block_until_ready(c(params, batch))  # warm-up
    compiled.append(c)
    rows.append(dict(preset=preset, B=B, T=T, n_params=count_params(params), backend=backend,
                     granularity=gran, stats=sset, flops=flops, peak_bytes=peak,
                     **memory_of(c),
                     rss_mb=round(rss_mb(), 1), compile_s=round(compile_s, 2), times=[]))
  for _ in range(reps):  # interleaved: drift and contention hit every variant alike
    for row, c in zip(rows, compiled, strict=True):
      t0 = time.perf_counter()
      jax.block_until_ready(c(params, batch))
      row["times"].append(time.perf_counter() - t0)
  base = rows[0]
  base_t = float(np.median(base["times"]))
  micro = {r["stats"]: float(np.median(r["times"])) for r in rows if r["backend"] == "micro_grad"}
  for r in rows:
    r["time_s"] = float(np.median(r["times"]))
    r["time_ratio"] = r["time_s"] / base_t
    r["flops_ratio"] = r["flops"] / base["flops"]
    r["peak_ratio"] = (r["peak_bytes"] / base["peak_bytes"]
                       if r["peak_bytes"] and base["peak_bytes"] else None)
    r["mem_ratio"] = r["mem_bytes"] / base["mem_bytes"]
    # The same without the statistics' own output buffers (each asked statistic is one
    # more params-sized tree that any method must return).
    r["mem_ratio_wo_outputs"] = (r["mem_bytes"] - r["out_bytes"] + base["out_bytes"]) / base[
        "mem_bytes"]
    r["time_vs_micro_grad"] = (r["time_s"] / micro[r["stats"]] if r["stats"] in micro
                               else None)
    # MFU of the model's own training FLOPs (statistics' extra work not counted: it lowers it)
    per_token = mfu.model_flops_per_token(r["n_params"], spec.n_layers, T, spec.d_model)
    r["mfu"] = mfu.mfu(B * T / r["time_s"], per_token, 1, peak_flops)
    r["times"] = [round(t, 4) for t in r["times"]]
  return rows


def checks(rows: list[dict]) -> list[dict]:
  """The issue's "done when" conditions, evaluated on the measured rows.

  gating=False marks a figure shown beside a condition, not the condition itself.
  """
  out = []
  for r in rows:
    where = f'{r["preset"]} B={r["B"]} {r["backend"]}/{r["granularity"]}/{r["stats"]}'
    if r["backend"] == "surgery" and (
        (r["granularity"] == "token" and r["stats"] == "sq+sign")
        or (r["granularity"] == "example" and r["stats"] == "norms")):
      ratio = r["time_ratio"] / r["flops_ratio"]
      out.append(dict(check="surgery time_ratio <= 1.15 * flops_ratio", where=where,
                      value=round(ratio, 3), ok=ratio <= 1.15, gating=True))
    if r["backend"] == "surgery" and r["granularity"] == "token":
      pr = r["peak_ratio"]
      out.append(dict(check="surgery per-token peak_ratio <= 1.1", where=where,
                      value=None if pr is None else round(pr, 3),
                      ok=pr is not None and pr <= 1.1, gating=True))
      out.append(dict(check="  (footprint mem_ratio <= 1.1)", where=where,
                      value=round(r["mem_ratio"], 3), ok=r["mem_ratio"] <= 1.1, gating=False))
    if r["backend"] == "surgery" and r["granularity"] == "example" and r["stats"] == "norms":
      out.append(dict(check="all-layer per-example norms: flops_ratio <= 1.05", where=where,
                      value=round(r["flops_ratio"], 3), ok=r["flops_ratio"] <= 1.05,
                      gating=True))
      out.append(dict(check="all-layer per-example norms: time_ratio <= 1.03", where=where,
                      value=round(r["time_ratio"], 3), ok=r["time_ratio"] <= 1.03,
                      gating=True))
    if r["backend"] == "surgery" and r["stats"] == "norms@norm":
      out.append(dict(check="normalization-layer norms only: time_ratio <= 1.01", where=where,
                      value=round(r["time_ratio"], 3), ok=r["time_ratio"] <= 1.01,
                      gating=True))
    if r["backend"] == "vmap" and r["time_vs_micro_grad"] is not None:
      out.append(dict(check="vmap time <= micro_grad time", where=where,
                      value=round(r["time_vs_micro_grad"], 3), ok=r["time_vs_micro_grad"] <= 1.0,
                      gating=True))
  return out


def table(rows: list[dict]) -> str:
  head = (f'{"preset":7} {"B":>3} {"backend":16} {"gran":8} {"stats":10} {"time_s":>8} '
          f'{"t/vag":>6} {"flop/vag":>8} {"peak/vag":>8} {"mem/vag":>7} {"mem-out":>7} '
          f'{"t/micro":>7} {"rss_mb":>7}')
  lines = [head, "-" * len(head)]
  for r in rows:
    tm = "" if r["time_vs_micro_grad"] is None else f'{r["time_vs_micro_grad"]:.2f}'
    pk = "" if r["peak_ratio"] is None else f'{r["peak_ratio"]:.2f}'
    lines.append(
        f'{r["preset"]:7} {r["B"]:>3} {r["backend"]:16} {r["granularity"]:8} {r["stats"]:10} '
        f'{r["time_s"]:8.4f} {r["time_ratio"]:6.2f} {r["flops_ratio"]:8.2f} {pk:>8} '
        f'{r["mem_ratio"]:7.2f} {r["mem_ratio_wo_outputs"]:7.2f} {tm:>7} {r["rss_mb"]:7.0f}')
  return "\n".join(lines)


DEFAULTS = dict(presets=("tiny", "medium"), batch_sizes=(8, 32), medium_batch_sizes=(8,),
                reps=5, stat_sets=("sq+sign", "norms", "all"), layout_first=True,
                peak_flops=None)
QUICK = dict(presets=("micro",), batch_sizes=(4,), reps=2, stat_sets=("all", "sq+sign"),
             layout_first=False)


def as_argv(quick: bool = False, **kw) -> list[str]:
  """The `scripts/bench_stats.py` arguments that make the same measurement as run(**kw)."""
  if quick:
    return ["--quick"]
  out = []
  for k, v in kw.items():
    if k == "layout_first":
      out += [] if v else ["--no-layout-first"]
    elif v is None:
      continue
    else:
      out += ["--" + k.replace("_", "-"),
              ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)]
  return out


def run(*, quick: bool = False, argv: Sequence[str] | None = None,
        echo: Callable[[str], None] | None = None, **kw) -> dict:
  """Measures every variant; returns the JSON document (rows + the issue's checks).

  Keywords as in DEFAULTS (presets, batch_sizes, medium_batch_sizes, reps, stat_sets,
  layout_first); quick=True: the micro preset, B=4, 2 reps, 'all' and 'sq+sign' only.
  argv: recorded in the document (default: the equivalent command-line arguments).
  echo: called with each (preset, B) group's table as it is measured.
  """
  unknown = set(kw) - set(DEFAULTS)
  if unknown:
    raise TypeError(f"unknown benchmark option(s) {sorted(unknown)}; known: {list(DEFAULTS)}")
  o = {**DEFAULTS, **kw, **(QUICK if quick else {})}
  rows = []
  for preset in o["presets"]:
    sizes = o["medium_batch_sizes"] if preset == "medium" else o["batch_sizes"]
    for B in map(int, sizes):
      rows += bench_group(preset, B, o["stat_sets"], o["layout_first"], o["reps"],
                          mfu.peak_flops(jax.devices()[0].device_kind, o["peak_flops"]))
      if echo:
        echo(table([r for r in rows if r["preset"] == preset and r["B"] == B]))
  return dict(
      argv=list(as_argv(quick, **kw) if argv is None else argv), jax=jax.__version__,
      optax=optax.__version__, backend=jax.default_backend(),
      devices=[str(d) for d in jax.devices()],
      machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                   loadavg_at_end=os.getloadavg()),
      spec={k: dataclasses.asdict(v[0]) | {"T": v[1]} for k, v in PRESETS.items()},
      rows=rows, checks=checks(rows))
