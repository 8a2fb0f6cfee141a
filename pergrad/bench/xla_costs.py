"""What a compiled XLA program costs: FLOPs and memory, as XLA itself accounts them.

    compiled, peak = compile_with_peak(jax.jit(f).lower(*args))
    flops_of(compiled), memory_of(compiled)

Shared by the benchmarks (`pergrad.bench.stats`, `scripts/bench_throughput.py`).
Two memory figures, both from XLA's buffer assignment of the compiled program:
  - peak (`compile_with_peak`): the largest total of simultaneously live buffers
    (arguments, temporaries, outputs) over the program's schedule, from the
    buffer-liveness report XLA writes with its dumps. `memory_analysis()` has a
    `peak_memory_in_bytes` field for this, but on XLA:CPU it holds argument + output
    bytes only.
  - footprint (`memory_of`): argument + output + temp - alias bytes, what XLA:CPU
    reserves for a call (output buffers sit beside the temp arena for the whole call).
"""

from __future__ import annotations

import glob
import os
import re
import tempfile

_PEAK_RE = re.compile(r"Stack trace breakdown for peak usage: ([\d ]+) bytes")


def flops_of(compiled) -> float:
  """XLA's `cost_analysis()` FLOPs (a while-loop body is counted once, not per trip)."""
  ca = compiled.cost_analysis()
  if isinstance(ca, (list, tuple)):
    ca = ca[0]
  return float(ca.get("flops", float("nan")))


def memory_of(compiled) -> dict:
  """`memory_analysis()` in bytes; mem_bytes = argument + output + temp - alias."""
  ma = compiled.memory_analysis()
  out = {k: int(getattr(ma, f"{k}_size_in_bytes", 0) or 0)
         for k in ("argument", "output", "temp", "alias")}
  return dict(temp_bytes=out["temp"], out_bytes=out["output"], arg_bytes=out["argument"],
              alias_bytes=out["alias"],
              mem_bytes=out["argument"] + out["output"] + out["temp"] - out["alias"])


def compile_with_peak(lowered):
  """(compiled, peak_bytes): compiles `lowered` once with an XLA dump and reads the
  peak of live buffers from it (None if this XLA writes no parsable report)."""
  with tempfile.TemporaryDirectory() as d:
    compiled = lowered.compile(compiler_options={"xla_dump_to": d})
    reports = glob.glob(os.path.join(d, "*after_optimizations-live-range.txt"))
    if len(reports) != 1:
      return compiled, None
    with open(reports[0]) as f:
      m = _PEAK_RE.search(f.read())
  return compiled, (int(m.group(1).replace(" ", "")) if m else None)
