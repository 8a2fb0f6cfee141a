"""Overhead of gradient statistics: every backend × granularity × statistic set.

For each model preset and batch size, every variant is compiled once and compared with the
fastest plain step of the same shape (`pergrad.bench.baselines`, checked to compute the same
gradient; the least median time over interleaved reps), timed between runs of it, B V B ...
V B (`pergrad.bench.paired`). Reported per variant: flops_ratio (XLA's cost analysis over
the least plain candidate's; surgery's traced with unrolled scans, since XLA counts a loop
body once), the paired time ratios' median (time_ratio), location with its 90 % interval
(time_location, time_lo, time_hi: `pergrad.bounds.location`, what a time check judges) and,
for the `overhead` report, quartiles (time_ratio_q25, _q75: spread, never judged), peak_bytes
(XLA's peak of live buffers, `pergrad.bench.xla_costs`) and mem_bytes (XLA's memory analysis;
mem_ratio_wo_outputs without the statistics' own result trees), each over the least plain
candidate's, rss_mb (process-wide, indicative), time_vs_micro_grad and
time_vs_value_and_grad.

  run(presets=("tiny", "medium"))   # -> the JSON document (baselines, rows, checks)
  run(quick=True)                    # smoke test (seconds)
"""

from __future__ import annotations

import contextlib
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
from pergrad import bounds
from pergrad.bench import baselines, mfu, paired
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
    # configs/model/small.yaml and paper.yaml (for an accelerator; minutes on a CPU); 1b:
    # ~1.24B parameters, the scale of the paper's vmap claim (its shape is our guess).
    "small": (ModelSpec(n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=4096,
                        seq_len=256, positions="rope"), 256),
    "paper": (ModelSpec(n_layers=6, d_model=512, n_heads=8, d_ff=2048, vocab_size=32768,
                        seq_len=512, positions="rope", compute_dtype="bfloat16"), 512),
    "1b": (ModelSpec(n_layers=22, d_model=2048, n_heads=16, d_ff=8192, vocab_size=32768,
                     seq_len=512, positions="rope", compute_dtype="bfloat16"), 512),
}
STAT_SETS = {
    "sq+sign": ("mean", "sq", "sign"),
    "norms": ("mean", "norms"),
    "all": ("mean", "sq", "sign", "norms"),
    "clip": ("mean",),  # the mean of per-example gradients clipped to norm CLIP
}
CLIP = 1.0  # the clipping norm of the "clip" rows (their cost does not depend on it)


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
  materialised or Gram statistics, and (clip) clipping by surgery from the layers' factors
  only, no per-example gradient tensor (`surgery.clip.keeps_g`). The plain steps
  they are compared with are
  `pergrad.bench.baselines.candidates`."""
  R = ps.StatsRequest
  surgery = functools.partial(_stats, loss_fn, backend="surgery", scan_unroll=scan_unroll)
  out = []
  for name in stat_sets:
    want = STAT_SETS[name]
    if name == "clip":  # per-example clipping, vmap and surgery side by side
      clipped = R(want, per_example_clip=CLIP)
      out.append(("vmap", "example", name, _stats(loss_fn, clipped, "vmap")))
      out.append(("surgery", "example", name, surgery(clipped)))
      out.append(("surgery-separate", "example", name,  # factors only (clip.keeps_g)
                  surgery(clipped, dense_method="separate")))
      continue
    out.append(("vmap", "example", name, _stats(loss_fn, R(want), "vmap")))
    if with_layout_first:
      out.append(("vmap-first", "example", name,
                  _stats(loss_fn, R(want), "vmap", vmap_layout="first")))
    out.append(("micro_grad", "example", name, micro_grad_fn(loss_fn, want)))
    out.append(("surgery", "example", name, surgery(R(want))))
    if name == "norms":  # the norm methods side by side
      out.append(("surgery-separate", "example", name, surgery(R(want), dense_method="separate")))
      out.append(("surgery", "example", "norms@norm", surgery(R(want, layers=("norm",)))))
    if "norms" not in want:
      out.append(("surgery", "token", name, surgery(R(want, "token"))))
  return out


def rss_mb() -> float:
  with contextlib.suppress(OSError), open("/proc/self/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return float("nan")


def counted_flops(fn, params, batch) -> float:
  """FLOPs of `fn` as XLA counts them; for surgery, pass the variant built with
  scan_unroll=True: XLA's cost analysis counts a loop body once (the surgery backend
  chunks per-token statistics with lax.scan), so the FLOPs of the compiled step itself
  would be undercounted. Time and memory come from the real step."""
  return flops_of(jax.jit(fn).lower(params, batch).compile())


def _compile(fn, params, batch, unrolled=None) -> dict:
  """The compiled step and XLA's costs; FLOPs of `unrolled` when given (`counted_flops`)."""
  t0 = time.perf_counter()
  c, peak = compile_with_peak(jax.jit(fn).lower(params, batch))
  compile_s = time.perf_counter() - t0  # includes writing the dump
  flops = counted_flops(unrolled, params, batch) if unrolled is not None else flops_of(c)
  return dict(compiled=c, peak_bytes=peak, flops=flops, compile_s=round(compile_s, 2),
              **memory_of(c))


def _time(c, params, batch) -> float:
  t0 = time.perf_counter()
  jax.block_until_ready(c(params, batch))
  return time.perf_counter() - t0


def _add_ratios(rows: list[dict], cand_times: dict, least: dict, spec, tokens: int,
                peak_flops: float | None) -> None:
  """Each timed row's paired time ratios and their summary, its ratios to the least
  FLOPs, peak and memory of the plain candidates, and its MFU (`tokens` a step)."""
  micro = {r["stats"]: float(np.median(r["times"])) for r in rows if r["backend"] == "micro_grad"}
  vag = float(np.median(cand_times.get("value_and_grad", [np.nan])))
  for r in rows:
    r["time_s"] = float(np.median(r["times"]))
    r["time_ratios"] = [round(x, 4) for x in paired.paired_ratios(r["times"], r["base_times"])]
    q = paired.summary(r["time_ratios"])
    r["time_ratio"], r["time_location"], r["time_lo"], r["time_hi"] = (
        q["median"], q["location"], q["lo"], q["hi"])
    r["time_ratio_q25"], r["time_ratio_q75"] = map(float, bounds.quartiles(r["time_ratios"]))
    r["time_vs_value_and_grad"] = r["time_s"] / vag
    r["flops_ratio"] = r["flops"] / least["flops"]["flops"]
    lp, lm = least["peak_bytes"], least["mem_bytes"]
    r["peak_ratio"] = (r["peak_bytes"] / lp["peak_bytes"]
                       if r["peak_bytes"] and lp["peak_bytes"] else None)
    r["mem_ratio"] = r["mem_bytes"] / lm["mem_bytes"]
    # The same without the statistics' own output buffers (each asked statistic is one
    # more params-sized tree that any method must return).
    r["mem_ratio_wo_outputs"] = (r["mem_bytes"] - r["out_bytes"] + lm["out_bytes"]) / lm[
        "mem_bytes"]
    r["time_vs_micro_grad"] = (r["time_s"] / micro[r["stats"]] if r["stats"] in micro
                               else None)
    # MFU of the model's own training FLOPs (statistics' extra work not counted: it lowers it)
    per_token = mfu.model_flops_per_token(r["n_params"], spec.n_layers, r["T"], spec.d_model)
    r["mfu"] = mfu.mfu(tokens / r["time_s"], per_token, 1, peak_flops)
    r["times"] = [round(t, 5) for t in r["times"]]
    r["base_times"] = [round(t, 5) for t in r["base_times"]]


def bench_group(preset: str, B: int, stat_sets: Sequence[str], layout_first: bool,
                reps: int, peak_flops: float | None = None) -> tuple[list[dict], dict]:
  """(rows, baseline): every variant of one shape, timed paired with the fastest plain
  step (`pergrad.bench.paired`), and the plain candidates' medians and FLOPs."""
  spec, T = PRESETS[preset]
  params = init_params(spec, jax.random.key(0))
  loss_fn = make_loss_fn(Transformer(spec))
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, spec.vocab_size, (B, T)), jnp.int32)
           for k in ("inputs", "targets")}
  cands = [dict(name=n, **_compile(f, params, batch)) for n, f in baselines.candidates(loss_fn)]
  outs = {c["name"]: c["compiled"](params, batch) for c in cands}  # also the warm-up
  rtol = 1e-4 if jnp.dtype(spec.compute_dtype) == jnp.float32 else 5e-2  # bfloat16: 8 bits
  timed = baselines.choose_baseline(cands, outs, rtol)
  cand_times = {c["name"]: [] for c in timed}
  for _ in range(reps):  # interleaved: drift and contention hit every candidate alike
    for c in timed:
      cand_times[c["name"]].append(_time(c["compiled"], params, batch))
  best = next(c for c in timed if c["name"] == paired.fastest(cand_times))
  # Exact measures: over the least of the candidates (each its own; None: not reported).
  least = {k: min((c for c in cands if c[k]), key=lambda c: c[k], default=best)
           for k in ("flops", "peak_bytes", "mem_bytes")}
  rows, compiled = [], []
  plain = [(c["name"], "example", "mean", None) for c in timed]
  vs = variants(loss_fn, stat_sets, layout_first)
  unrolled = [v[-1] for v in variants(loss_fn, stat_sets, layout_first, scan_unroll=True)]
  for (backend, gran, sset, fn), fn_unrolled in zip(plain + vs, [None] * len(plain) + unrolled,
                                                    strict=True):
    if fn is None:  # a plain candidate: its own row, timed against the fastest
      info = dict(next(c for c in timed if c["name"] == backend), candidate=True)
    else:
      info = _compile(fn, params, batch,
                      fn_unrolled if backend.startswith("surgery") else None)
      info["candidate"] = False
      jax.block_until_ready(info["compiled"](params, batch))  # warm-up
    compiled.append(info["compiled"])
    info = {k: v for k, v in info.items() if k not in ("compiled", "name", "same_program_as")}
    rows.append(dict(preset=preset, B=B, T=T, n_params=count_params(params), backend=backend,
                     granularity=gran, stats=sset, **info, rss_mb=round(rss_mb(), 1),
                     baseline=best["name"], flops_baseline=least["flops"]["name"],
                     peak_baseline=least["peak_bytes"]["name"],
                     mem_baseline=least["mem_bytes"]["name"], times=[], base_times=[]))
  for row, c in zip(rows, compiled, strict=True):  # each variant bracketed by the baseline
    base = best["compiled"]
    _time(base, params, batch), _time(c, params, batch)  # untimed: both equally warm
    base_times = [_time(base, params, batch)]
    for _ in range(reps):
      row["times"].append(_time(c, params, batch))
      base_times.append(_time(base, params, batch))
    row["base_times"] = paired.bracketed(base_times)
  _add_ratios(rows, cand_times, least, spec, B * T, peak_flops)
  baseline = dict(preset=preset, B=B, fastest=best["name"],
                  **{f"least_{k}": c["name"] for k, c in least.items()},
                  candidates={c["name"]: dict(
                      time_s=(float(np.median(cand_times[c["name"]]))
                              if c["name"] in cand_times else None),
                      flops=c["flops"], same_program_as=c["same_program_as"]) for c in cands})
  return rows, baseline


def _time_check(check: str, where: str, r: dict, bound: float, scale: float = 1.0,
                self_ratios=None) -> dict:
  """A time bound on the paired ratios (over `scale`) by `pergrad.bounds.location`, the bound
  floored at the baseline's self-ratio interval (`pergrad.bounds.floored`)."""
  loc = bounds.location(np.asarray(r["time_ratios"], float) / scale,
                        bounds.floored(bound, self_ratios))
  return dict(check=check, where=where, value=round(loc.ratio, 3), lo=round(loc.lo, 3),
              hi=round(loc.hi, 3), bound=round(loc.bound, 3),
              median=round(r["time_ratio"] / scale, 3), outcome=loc.verdict,
              ok=None if loc.verdict == bounds.UNDETERMINED else loc.verdict == bounds.HOLDS,
              gating=True)


def _bound_check(check: str, where: str, value: float | None, bound: float,
                 gating: bool = True) -> dict:
  ok = value is not None and value <= bound
  return dict(check=check, where=where, value=None if value is None else round(value, 3),
              outcome="holds" if ok else "fails", ok=ok, gating=gating)


def checks(rows: list[dict]) -> list[dict]:
  """The "done when" conditions, evaluated on the measured rows.

  FLOP and memory bounds are exact (XLA's accounting); a time bound is judged on the
  location of the paired per-rep ratios to the fastest plain step (`pergrad.bounds.RULE`;
  "undetermined": ok None), the bound floored at the fastest step's own self-ratio interval
  (its row timed against itself). gating=False marks a figure shown beside a condition, not
  the condition itself.
  """
  out = []
  selfs = {(r["preset"], r["B"]): r["time_ratios"] for r in rows
           if r.get("candidate") and r["backend"] == r.get("baseline")}
  for r in rows:
    own = selfs.get((r["preset"], r["B"]))
    where = f'{r["preset"]} B={r["B"]} {r["backend"]}/{r["granularity"]}/{r["stats"]}'
    surgery = r["backend"] == "surgery"
    norms = surgery and r["granularity"] == "example" and r["stats"] == "norms"
    if surgery and r["granularity"] == "token" and r["stats"] == "sq+sign" or norms:
      out.append(_time_check("surgery time_ratio <= 1.15 * flops_ratio", where, r, 1.15,
                             r["flops_ratio"], own))
    if surgery and r["granularity"] == "token":
      out.append(_bound_check("surgery per-token peak_ratio <= 1.1", where, r["peak_ratio"],
                              1.1))
      out.append(_bound_check("  (footprint mem_ratio <= 1.1)", where, r["mem_ratio"], 1.1,
                              gating=False))
    if norms:
      out.append(_bound_check("all-layer per-example norms: flops_ratio <= 1.05", where,
                              r["flops_ratio"], 1.05))
      out.append(_time_check("all-layer per-example norms: time_ratio <= 1.03", where, r,
                             1.03, self_ratios=own))
    if surgery and r["stats"] == "clip":
      out.append(_bound_check("per-example clipping: flops_ratio <= 1.15", where,
                              r["flops_ratio"], 1.15))
      out.append(_bound_check("per-example clipping: peak_ratio <= 1.1", where,
                              r["peak_ratio"], 1.1))
    if surgery and r["stats"] == "norms@norm":
      out.append(_bound_check("normalization-layer norms only: flops_ratio <= 1.01", where,
                              r["flops_ratio"], 1.01))
      out.append(_time_check("normalization-layer norms only: time_ratio <= 1.01", where, r,
                             1.01, self_ratios=own))
    if r["backend"] == "vmap" and r["time_vs_micro_grad"] is not None:
      out.append(_bound_check("vmap time <= micro_grad time (medians)", where,
                              r["time_vs_micro_grad"], 1.0))
  return out


def table(rows: list[dict]) -> str:
  """Ratios to the fastest plain step ("t/base": the paired ratios' location [90 % interval])."""
  head = (f'{"preset":7} {"B":>3} {"backend":16} {"gran":8} {"stats":10} {"time_s":>8} '
          f'{"t/base [90%]":>19} {"flop/base":>9} {"peak/base":>9} {"mem/base":>8} '
          f'{"mem-out":>7} {"t/micro":>7} {"rss_mb":>7}')
  lines = [head, "-" * len(head)]
  for r in rows:
    tm = "" if r["time_vs_micro_grad"] is None else f'{r["time_vs_micro_grad"]:.2f}'
    pk = "" if r["peak_ratio"] is None else f'{r["peak_ratio"]:.2f}'
    tr = f'{r["time_location"]:.2f} [{r["time_lo"]:.2f}, {r["time_hi"]:.2f}]'
    lines.append(
        f'{r["preset"]:7} {r["B"]:>3} {r["backend"]:16} {r["granularity"]:8} {r["stats"]:10} '
        f'{r["time_s"]:8.4f} {tr:>19} {r["flops_ratio"]:9.3f} {pk:>9} '
        f'{r["mem_ratio"]:8.2f} {r["mem_ratio_wo_outputs"]:7.2f} {tm:>7} {r["rss_mb"]:7.0f}')
  if rows:
    r = rows[0]
    lines.append(f'baseline: {r["baseline"]} (fastest plain step); FLOPs over '
                 f'{r["flops_baseline"]}\'s, peak over {r["peak_baseline"]}\'s, mem over '
                 f'{r["mem_baseline"]}\'s (the least of the plain steps\')')
  return "\n".join(lines)


DEFAULTS = dict(presets=("tiny", "medium"), batch_sizes=(8, 32), medium_batch_sizes=(8,),
                reps=5, stat_sets=("sq+sign", "norms", "all", "clip"), layout_first=True,
                peak_flops=None)
QUICK = dict(presets=("micro",), batch_sizes=(4,), reps=3,
             stat_sets=("all", "sq+sign", "norms", "clip"), layout_first=False)


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
  """Measures every variant; returns the JSON document (baselines, rows, "done when" checks).

  Keywords as in DEFAULTS (presets, batch_sizes, medium_batch_sizes, reps, stat_sets,
  layout_first); quick=True: the micro preset, B=4, 3 reps, 'all', 'sq+sign', 'norms', 'clip'.
  argv: recorded in the document (default: the equivalent command-line arguments).
  echo: called with each (preset, B) group's table as it is measured.
  """
  unknown = set(kw) - set(DEFAULTS)
  if unknown:
    raise TypeError(f"unknown benchmark option(s) {sorted(unknown)}; known: {list(DEFAULTS)}")
  o = {**DEFAULTS, **kw, **(QUICK if quick else {})}
  rows, bases = [], []
  for preset in o["presets"]:
    sizes = o["medium_batch_sizes"] if preset == "medium" else o["batch_sizes"]
    for B in map(int, sizes):
      group, base = bench_group(preset, B, o["stat_sets"], o["layout_first"], o["reps"],
                                mfu.peak_flops(jax.devices()[0].device_kind, o["peak_flops"]))
      rows += group
      bases.append(base)
      if echo:
        echo(table([r for r in rows if r["preset"] == preset and r["B"] == B]))
  return dict(
      argv=list(as_argv(quick, **kw) if argv is None else argv), jax=jax.__version__,
      optax=optax.__version__, backend=jax.default_backend(),
      devices=[str(d) for d in jax.devices()],
      machine=dict(platform=platform.platform(), cpus=os.cpu_count(),
                   loadavg_at_end=os.getloadavg()),
      spec={k: dataclasses.asdict(v[0]) | {"T": v[1]} for k, v in PRESETS.items()},
      baselines=bases, rows=rows, checks=checks(rows))
