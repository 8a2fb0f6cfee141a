"""Claim 1: per-example statistics are cheap.

Runs the statistics benchmark (`pergrad.bench.stats.run`: XLA FLOPs, paired time ratios
and peak memory of each backend × granularity × statistic set, as ratios to the fastest
plain step computing the same gradient, measured in the same process, and to
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
from pergrad.bench.paired import judge

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


SETUP_MD = """`python scripts/bench_stats.py --presets tiny,medium` (no training runs). Per
model and batch, the baseline is the fastest plain step computing the same gradient
(`baseline`): `jax.value_and_grad`, the surgery backend asked for the mean alone, or the
simultaneous method's weight-gradient contraction without per-example axes (checked to
agree leaf by leaf, then timed interleaved). Each variant is compiled once and timed
between runs of that baseline (B V B ... V B): rep i's ratio is the variant's time over
the mean of its two neighbours; `time_ratio` is the median of the per-rep ratios,
`time_ratio_q25` / `time_ratio_q75` their quartiles. Columns:

- `flops`: XLA's cost analysis; for surgery, of the step traced with unrolled scans
  (XLA counts a loop body once). `flops_ratio` (over the least of the plain candidates'
  FLOPs, `flops_baseline`) is the primary ratio: it does not depend on the machine's load.
- `peak_bytes`: XLA's peak of simultaneously live buffers (arguments, temporaries,
  outputs) over the compiled step's schedule, from its buffer-liveness analysis: what
  the step's buffers need at once; `peak_ratio` (over the least of the plain candidates',
  `peak_baseline`; `mem_ratio` likewise, `mem_baseline`) is the figure checked.
- `mem_bytes`: temp + argument + output bytes of `memory_analysis()`, what XLA:CPU
  actually reserves (output buffers sit beside the temp arena for the whole step), so
  each statistic's params-sized result tree counts as if it were live at the
  activations' peak.
  `mem_ratio_wo_outputs` is the same without the statistics' own result trees.
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
    ax.set_xlabel(f"{c} (1 = fastest plain step)")
    ax.grid(alpha=0.3, axis="x")
  fig.suptitle("Cost of per-example statistics relative to the mini-batch gradient")
  return [savefig(fig, Path(out_dir) / "overhead.png")]


# The bounds of the verdict, each on the FLOP ratio (exact) and on the paired time ratio
# (judged on its quartiles, `pergrad.bench.paired.judge`).
SURGERY_MAX = 1.25  # surgery, per-token statistics
SURGERY_MEM_MAX = 1.1  # ... and its memory ratio (when measured)
VMAP_MAX = 2.0  # vmap, per-example statistics
RULE = (f"Against the fastest plain step computing the same gradient: surgery is cheap when "
        f"its per-token statistics' FLOP ratio is ≤ {SURGERY_MAX:g}, its memory ratio ≤ "
        f"{SURGERY_MEM_MAX:g} (when measured) and its paired time ratio ≤ {SURGERY_MAX:g}; "
        f"vmap is viable when its per-example FLOP and paired time ratios are ≤ "
        f"{VMAP_MAX:g}. FLOP and memory ratios are exact (XLA's accounting; medians over "
        "shapes); a time bound holds when the medians over shapes of the per-rep ratios' "
        "quartiles lie within it (q75 ≤ bound), fails when they lie above (q25 > bound), and "
        "is within noise when they straddle it. Reproduced if both hold, not reproduced if "
        "neither holds nor is within noise, partly reproduced otherwise.")


def part(flops: float, t_q25: float, t_q75: float, bound: float, mem: float = np.nan,
         mem_bound: float = np.inf) -> str:
  """"holds" | "fails" | "within noise" | "not measured" for one side of `RULE`: an exact
  bound exceeded fails; otherwise the time quartiles decide (NaN: not measured)."""
  if not (np.isfinite(flops) or np.isfinite(t_q75)):
    return "not measured"
  if (np.isfinite(flops) and flops > bound) or (np.isfinite(mem) and mem > mem_bound):
    return "fails"
  return judge(t_q25, t_q75, bound) if np.isfinite(t_q75) else "holds"


def decide(surgery: str, vmap: str) -> str:
  """The verdict of `RULE` from the two sides' outcomes (`part`)."""
  if surgery == vmap == "holds":
    return "reproduced"
  if {surgery, vmap} <= {"fails", "not measured"}:
    return "not reproduced"
  return "partly reproduced"


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
  result = {"holds": "OK", "fails": "FAIL", "within noise": "within noise"}
  df["result"] = [result[o] if g else ("(within)" if o == "holds" else "(over)")
                  for o, g in zip(df["outcome"], df["gating"], strict=True)]
  cols = ["check", "where", "value", *(c for c in ("q25", "q75") if c in df), "result"]
  return ("Checks (time: median paired ratio and its quartiles; within noise: the quartiles "
          "straddle the bound; parenthesised rows are shown beside a check, not checks):\n\n"
          + md_table(df[cols]) + "\n\n")


_PER_REP = ("times", "base_times", "time_ratios")  # lists: in overhead.csv, not in the table


def _medians(rows: pd.DataFrame, cols: dict) -> dict:
  """{name: median over `rows` of column cols[name]} (NaN where absent or no rows)."""
  return {k: float(rows[c].median()) if c and len(rows) else np.nan for k, c in cols.items()}


def report(out_dir: Path) -> Report:
  df = pd.read_csv(Path(out_dir) / "overhead.csv")
  # Memory: XLA's live peak when the benchmark reports it; else the footprint without the
  # statistics' own result trees (one params-sized tree per statistic).
  m = _col(df, "peak_ratio", "mem_ratio_wo_outputs", "mem_ratio")
  cols = dict(t=_col(df, "time_ratio"), q25=_col(df, "time_ratio_q25"),
              q75=_col(df, "time_ratio_q75"), f=_col(df, "flops_ratio"), m=m)
  if cols["t"] is None or cols["q25"] is None or "backend" not in df:
    return Report(verdict="not measured", rule=RULE,
                  finding="the benchmark JSON has no paired time ratios.",
                  numbers_md=md_table(df.head(30)))
  sur = df[df["backend"] == "surgery"]
  tok = sur[sur["granularity"] == "token"] if "granularity" in sur else sur
  s, v = _medians(tok, cols), _medians(df[df["backend"] == "vmap"], cols)
  s_out = part(s["f"], s["q25"], s["q75"], SURGERY_MAX, s["m"], SURGERY_MEM_MAX)
  v_out = part(v["f"], v["q25"], v["q75"], VMAP_MAX)
  lines = [f"{what}: FLOP ratio {fmt_num(x['f'])}, time ratio {fmt_num(x['t'])} [q25 "
           f"{fmt_num(x['q25'])}, q75 {fmt_num(x['q75'])}], memory ratio {fmt_num(x['m'])}: "
           f"{o}" for what, x, o in (("surgery per-token statistics", s, s_out),
                                      ("vmap per-example statistics", v, v_out))]
  base = (", ".join(sorted(df["baseline"].dropna().astype(str).unique()))
          if "baseline" in df else "?")
  measured = "; ".join(lines) + (
      f" (medians over shapes; ratios to the fastest plain step in the same process: {base}; "
      + _MEMORY.get(m.rsplit(".", 1)[-1] if m else "", "memory not measured") + ").")
  return Report(verdict=decide(s_out, v_out), rule=RULE,
                finding=f"Rule: {RULE} Measured: {measured}", claim_row=measured,
                numbers_md=checks_md(out_dir) + md_table(df.drop(columns=[
                    c for c in df if c.rsplit(".", 1)[-1] in _PER_REP])), setup_md=SETUP_MD)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["1"], launch=launch, analyze=analyze,
    figures=figures, report=report, describe_setup=describe_setup))
