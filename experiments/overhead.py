"""Claim 1: per-example statistics are cheap.

Runs the statistics benchmark (`pergrad.bench.stats.run`: time, peak memory and XLA
FLOPs of each backend × granularity × statistic set, as ratios to a plain
`value_and_grad` step measured in the same process, and to
`optax.microbatching.micro_grad`) and turns its JSON document into a table and a
figure. No training runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.figures import plt, savefig
from experiments.launch import LaunchLog
from experiments.record import ROWS, Experiment, Report, register
from experiments.report_md import fmt_num, md_table

NAME = "overhead"
TITLE = "the cost of per-example gradient statistics"
CLAIM = ("Per-example statistics are cheap: graph surgery costs almost nothing over the "
         "mini-batch gradient for per-token (factorable) statistics, and vmap is viable for "
         "transformers (a third-party summary reports ~17% compute, no extra peak memory, at "
         "1.2B parameters).")
# Options of pergrad.bench.stats.run per preset.
# ci: a seconds-long smoke run; cpu: the tiny and medium models of this machine's
# reproduction; paper: the `small` and `paper` model presets at larger batches (GPU/TPU).
BENCH = {
    "ci": {"quick": True},
    "cpu": {"presets": ("tiny", "medium")},
    "paper": {"presets": ("small", "paper"), "batch_sizes": (32, 128)},
}


SETUP_MD = """`python scripts/bench_stats.py --presets tiny,medium` (no training runs): each
variant is compiled once and timed side by side with a plain `jax.value_and_grad` step of
the same model and batch (median of 5 interleaved runs). Memory columns:

- `peak_bytes`: XLA's peak of simultaneously live buffers (arguments, temporaries,
  outputs) over the compiled step's schedule, from its buffer-liveness analysis: what
  the step's buffers need at once; `peak_ratio` is the figure checked.
- `mem_bytes`: temp + argument + output bytes of `memory_analysis()`, what XLA:CPU
  actually reserves (output buffers sit beside the temp arena for the whole step), so
  each statistic's params-sized result tree counts as if it were live at the
  activations' peak.
  `mem_ratio_wo_outputs` is the same without the statistics' own result trees.
- `flops`: XLA's cost analysis; for surgery, of the step traced with unrolled scans
  (XLA counts a loop body once).
"""


def launch(preset: str, sweep_dir: Path, *, dry_run: bool = False, echo=print,
           bench: dict | None = None):
  """Runs the benchmark once (skipped when its JSON already exists in the sweep dir) with
  the options `bench` (default: this experiment's BENCH[preset])."""
  bench = BENCH[preset] if bench is None else bench
  log = LaunchLog()
  sweep_dir.mkdir(parents=True, exist_ok=True)
  out = sweep_dir / "bench.json"
  if out.exists():
    echo(f"[skip] {out} exists (delete it to re-measure)")
    log.skipped.append("bench")
    return log
  args = [f"{k}={v!r}" for k, v in bench.items()]
  log.commands.append(["pergrad.bench.stats.run", *args])
  echo(f"[launch] pergrad.bench.stats.run({', '.join(args)})")
  if dry_run:
    log.launched.append("bench")
    return log
  from pergrad.bench import stats  # imports JAX: only when measuring

  t0 = time.time()
  try:
    doc = stats.run(**bench, echo=echo)
  except Exception as e:  # one line for `reproduce.py all`, which goes on with the others
    log.failed.append("bench")
    raise RuntimeError(f"the statistics benchmark failed: {type(e).__name__}: {e}") from e
  log.wall_s = time.time() - t0
  out.write_text(json.dumps(doc, indent=1))
  log.launched.append("bench")
  return log


def describe_setup(preset: str, bench: dict | None = None) -> str:
  """The benchmark's command line at `preset` (the README's setup if the report has none),
  with the options `bench` (default: this experiment's BENCH[preset])."""
  from pergrad.bench import stats

  args = " ".join(stats.as_argv(**(BENCH[preset] if bench is None else bench)))
  return f"`python scripts/bench_stats.py {args}` (no training runs)."


def records(doc) -> pd.DataFrame:
  """Flattens the benchmark JSON into one row per measured configuration."""
  if isinstance(doc, dict):
    for key in ("results", "rows", "records", "benchmarks"):
      if isinstance(doc.get(key), list):
        doc = doc[key]
        break
  if isinstance(doc, dict):
    doc = [doc]
  return pd.json_normalize(doc)


def _col(df: pd.DataFrame, *names):
  for n in names:
    for c in df.columns:
      if c == n or c.endswith("." + n):
        return c
  return None


def analyze(sweep_dir: Path, out_dir: Path) -> None:
  doc = json.loads((Path(sweep_dir) / "bench.json").read_text())
  (Path(out_dir) / "bench.json").write_text(json.dumps(doc, indent=1))
  records(doc).to_csv(Path(out_dir) / "overhead.csv", index=False)


def _config_label(df: pd.DataFrame) -> pd.Series:
  parts = [c for c in ("model", "batch_size", "backend", "granularity", "want", "stats")
           if c in df]
  return df[parts].astype(str).agg(" ".join, axis=1) if parts else df.index.astype(str)


def figures(out_dir: Path) -> list[Path]:
  df = pd.read_csv(Path(out_dir) / "overhead.csv")
  ratios = [c for c in (_col(df, "time_ratio"), _col(df, "peak_ratio", "mem_ratio"),
                        _col(df, "flops_ratio")) if c]
  pyplot = plt()
  fig, axes = pyplot.subplots(1, max(len(ratios), 1), figsize=(5 * max(len(ratios), 1), 5),
                              squeeze=False)
  lab = _config_label(df)
  for ax, c in zip(axes[0], ratios, strict=False):
    ax.barh(range(len(df)), df[c])
    ax.set_yticks(range(len(df)))
    ax.set_yticklabels(lab, fontsize=6)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel(f"{c} (1 = plain value_and_grad)")
    ax.grid(alpha=0.3, axis="x")
  fig.suptitle("Cost of per-example statistics relative to the mini-batch gradient")
  return [savefig(fig, Path(out_dir) / "overhead.png")]


# The bounds of the verdict (a benchmark, no seeds: the measured ratios against fixed bounds).
SURGERY_TIME_MAX = 1.25  # surgery, per-token statistics: median time ratio
SURGERY_MEM_MAX = 1.1  # ... and its median memory ratio (when measured)
VMAP_TIME_MAX = 2.0  # vmap, per-example statistics: median time ratio
RULE = (f"Surgery is cheap when its per-token statistics' median time ratio to a plain "
        f"value_and_grad step is ≤ {SURGERY_TIME_MAX:g} and its median memory ratio ≤ "
        f"{SURGERY_MEM_MAX:g} (when measured), vmap is viable when its per-example median time "
        f"ratio is ≤ {VMAP_TIME_MAX:g}: reproduced if both hold, partly reproduced if one does, "
        "not reproduced if neither (one benchmark run, no seeds: no noise model).")


def decide(surg_time: float, surg_mem: float, vmap_time: float) -> str:
  """The verdict of `RULE` on the median ratios (NaN: not measured)."""
  cheap = bool(np.isfinite(surg_time) and surg_time <= SURGERY_TIME_MAX
               and (not np.isfinite(surg_mem) or surg_mem <= SURGERY_MEM_MAX))
  viable = bool(np.isfinite(vmap_time) and vmap_time <= VMAP_TIME_MAX)
  return ("reproduced" if cheap and viable else "partly reproduced" if cheap or viable
          else "not reproduced")


_MEMORY = {
    "peak_ratio": "memory = XLA's peak of simultaneously live buffers",
    "mem_ratio_wo_outputs": "memory = XLA's temp + argument + output bytes, without the "
                            "statistics' own outputs",
    "mem_ratio": "memory = XLA's temp + argument + output bytes",
}


def checks_md(out_dir: Path) -> str:
  """The benchmark's "done when" checks as a markdown table ('' if it wrote none)."""
  path = Path(out_dir) / "bench.json"
  doc = json.loads(path.read_text()) if path.exists() else {}
  rows = doc.get("checks") or []
  if not rows:
    return ""
  df = pd.DataFrame(rows)
  if "gating" in df:
    df["result"] = [("OK" if ok else "FAIL") if g else ("(within)" if ok else "(over)")
                    for ok, g in zip(df["ok"], df["gating"], strict=True)]
  else:
    df["result"] = ["OK" if ok else "FAIL" for ok in df["ok"]]
  return ("Checks (parenthesised rows are shown beside a check, not checks):\n\n"
          + md_table(df[["check", "where", "value", "result"]]) + "\n\n")


def report(out_dir: Path) -> Report:
  df = pd.read_csv(Path(out_dir) / "overhead.csv")
  # Memory: XLA's live peak when the benchmark reports it; else the footprint without the
  # statistics' own result trees (one params-sized tree per statistic).
  t, m = _col(df, "time_ratio"), _col(df, "peak_ratio", "mem_ratio_wo_outputs", "mem_ratio")
  f = _col(df, "flops_ratio")
  if t is None or "backend" not in df:
    return Report(verdict="not measured", rule=RULE,
                  finding="the benchmark JSON has no time ratios.",
                  numbers_md=md_table(df.head(30)))
  lines = []
  sur = df[df["backend"] == "surgery"]
  vm = df[df["backend"] == "vmap"]
  tok = sur[sur["granularity"] == "token"] if "granularity" in sur else sur
  surg_t = float(tok[t].median()) if len(tok) else np.nan
  surg_m = float(tok[m].median()) if m and len(tok) else np.nan
  vmap_t = float(vm[t].median()) if len(vm) else np.nan
  vmap_m = float(vm[m].median()) if m and len(vm) else np.nan
  surg_f = float(tok[f].median()) if f and len(tok) else np.nan
  vmap_f = float(vm[f].median()) if f and len(vm) else np.nan
  lines.append(f"surgery per-token statistics: median time ratio {fmt_num(surg_t)} "
               f"(FLOP ratio {fmt_num(surg_f)}), memory ratio {fmt_num(surg_m)}")
  lines.append(f"vmap per-example statistics: median time ratio {fmt_num(vmap_t)} "
               f"(FLOP ratio {fmt_num(vmap_f)}), memory ratio {fmt_num(vmap_m)}")
  verdict = decide(surg_t, surg_m, vmap_t)
  measured = "; ".join(lines) + (
      " (ratios to a plain value_and_grad step in the same process; "
      + _MEMORY.get(m.rsplit(".", 1)[-1] if m else "", "memory not measured") + ").")
  return Report(verdict=verdict, rule=RULE, finding=f"Rule: {RULE} Measured: {measured}",
                claim_row=measured,
                numbers_md=checks_md(out_dir) + md_table(df), setup_md=SETUP_MD)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["1"], launch=launch, analyze=analyze,
    figures=figures, report=report, describe_setup=describe_setup))
