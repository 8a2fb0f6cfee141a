"""Shared machinery of the experiments: sweep definitions, launch, skip, aggregation.

An experiment module (e.g. `experiments.sign_placement`) defines

    NAME: str                      the module / config name
    CLAIM: str                     the paper's claim it tests, one sentence
    def sweep(preset) -> Sweep     the grid of runs for preset "ci" | "cpu" | "paper"
    def analyze(table, finals, out_dir) -> dict   writes the compact CSVs of its findings
    def figures(out_dir) -> list[Path]            draws every PNG from those CSVs only
    def report(out_dir) -> dict                   {"verdict", "finding", "numbers"} from them

and this module turns a `Sweep` into Hydra multirun calls of `scripts/train.py`,
finds which points already finished, and aggregates every run's `metrics.jsonl`
into one tidy table (one row per run and step).

Run directories are deterministic: `<sweep_dir>/<override_dirname>` where the
override dirname holds only the swept ("identity") keys of the point, sorted, as
Hydra writes it (`key=value,key=value`). Everything fixed is excluded from the name
(`hydra.job.config.override_dirname.exclude_keys`), so re-launching the same sweep
lands on the same directories and the training entry skips or resumes them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from pergrad.train.metrics import read_records

REPO = Path(__file__).resolve().parents[1]
PRESETS = ("ci", "cpu", "paper")
LAUNCHERS = ("basic", "joblib", "submitit")
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"


# --------------------------------------------------------------------------- sweeps


def fmt(value) -> str:
  """Formats an override value the way it appears on the command line and in run dirs."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


@dataclasses.dataclass(frozen=True)
class Block:
  """A Cartesian grid launched as one Hydra multirun.

  grid: swept keys -> values; they name the run directory.
  fixed: keys -> value shared by the block but derived from the point (e.g. the number
    of steps for a batch size); excluded from the run directory name.
  """

  grid: dict
  fixed: dict = dataclasses.field(default_factory=dict)

  def points(self) -> list[dict]:
    keys = list(self.grid)
    return [dict(zip(keys, vals, strict=False)) for vals in itertools.product(*self.grid.values())]


@dataclasses.dataclass(frozen=True)
class LrSearch:
  """Per-group learning-rate search: extend the grid past an edge, then add seeds.

  group_keys: the keys that define a variant (e.g. ("optimizer.placement",)).
  lr_key: the swept learning-rate key.
  factor: ratio between neighbouring grid values (used to extend past an edge).
  max_extend: how many times the grid may be extended on each side.
  seeds: extra values of `seed_key` run at each group's best learning rate.
  """

  group_keys: tuple
  lr_key: str = "optimizer.lr"
  factor: float = 3.0
  max_extend: int = 2
  seed_key: str = "train.seed"
  seeds: tuple = ()


@dataclasses.dataclass(frozen=True)
class Sweep:
  """All runs of one experiment at one preset.

  base: overrides shared by every run (excluded from run directory names).
  blocks: the first-stage grids.
  lr_search: optional follow-up stages chosen from the first stage's results.
  wall_estimate_min: expected compute on this 2-core machine (documentation).
  """

  base: dict
  blocks: tuple
  lr_search: LrSearch | None = None
  wall_estimate_min: float | None = None
  notes: str = ""


def run_dirname(point: dict) -> str:
  """Hydra's `${hydra.job.override_dirname}` for a point whose only overrides are its keys."""
  return ",".join(sorted(f"{k}={fmt(v)}" for k, v in point.items()))


def parse_dirname(name: str) -> dict:
  out = {}
  for item in name.split(","):
    k, _, v = item.partition("=")
    out[k] = v
  return out


def run_status(run_dir: Path) -> str:
  """'completed' | a summary's other status (e.g. 'diverged') | 'partial' | 'missing'."""
  summ = run_dir / SUMMARY
  if summ.exists():
    try:
      return str(json.loads(summ.read_text()).get("status", "unknown"))
    except json.JSONDecodeError:
      return "partial"
  return "partial" if (run_dir / METRICS).exists() else "missing"


# Scale of every training experiment per preset (command-line overrides, so the
# experiment configs under configs/experiment/ hold only what the experiment is about).
SCALE = {
    # Seconds per run: a 1-layer, 32-wide model on bytes, 20 steps.
    "ci": {
        "model.n_layers": 1, "model.d_model": 32, "model.n_heads": 2, "model.d_ff": 64,
        "model.vocab_size": 256, "model.seq_len": 32,
        "data.tokenizer": "byte", "data.vocab_size": 256, "data.seq_len": 32,
        "data.batch_size": 8, "data.eval_batch_size": 8,
        "train.steps": 20, "train.eval_every": 10, "train.eval_batches": 2,
        "train.checkpoint_every": 10, "schedule.warmup_steps": 2,
        "logging.log_every": 5, "logging.progress": False, "logging.wandb.mode": "disabled",
    },
    # The reproduction on a 2-core CPU: the `tiny` transformer (2 layers, width 128,
    # 0.5M parameters) on Shakespeare with a 1024-token BPE, B = 32 sequences of 64 tokens.
    "cpu": {
        "model.n_layers": 2, "model.d_model": 128, "model.n_heads": 4, "model.d_ff": 512,
        "model.vocab_size": 1024, "model.seq_len": 64,
        "data.tokenizer": "bpe", "data.vocab_size": 1024, "data.seq_len": 64,
        "data.batch_size": 32, "data.eval_batch_size": 32,
        "train.steps": 400, "train.eval_every": 50, "train.eval_batches": 4,
        "train.checkpoint_every": 100, "schedule.warmup_steps": 20,
        "logging.log_every": 10, "logging.progress": False, "logging.wandb.mode": "disabled",
    },
    # OUR GUESS at GPU/TPU-scale settings (the paper's hyper-parameters are unknown):
    # a nanodo-like 6-layer, 512-wide transformer on C4 with a 32k vocabulary, T = 512,
    # B = 256, 20k steps, bf16 compute. Needs `data=c4` prepared under data.tfds_dir.
    "paper": {
        "model.n_layers": 6, "model.d_model": 512, "model.n_heads": 8, "model.d_ff": 2048,
        "model.vocab_size": 32768, "model.seq_len": 512, "model.compute_dtype": "bfloat16",
        "data.name": "c4", "data.tokenizer": "bpe", "data.vocab_size": 32768,
        "data.seq_len": 512, "data.batch_size": 256, "data.eval_batch_size": 256,
        "train.steps": 20000, "train.eval_every": 1000, "train.eval_batches": 16,
        "train.checkpoint_every": 1000, "schedule.warmup_steps": 1000,
        "logging.log_every": 50, "logging.progress": False, "logging.wandb.mode": "offline",
    },
}


def base_for(name: str, preset: str, **over) -> dict:
  """Overrides shared by every run of experiment `name` at `preset`."""
  return {"experiment": name, **SCALE[preset], **over}


# --------------------------------------------------------------------------- launching


def launcher_overrides(launcher: str, n_jobs: int) -> list[str]:
  if launcher == "basic":
    return []
  if launcher == "joblib":
    return ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={n_jobs}"]
  if launcher == "submitit":
    # Needs the `slurm` extra (hydra-submitit-launcher); partition/time via extra overrides.
    return ["hydra/launcher=submitit_slurm"]
  raise ValueError(f"unknown launcher {launcher!r}; choose one of {LAUNCHERS}.")


def multirun_command(
    sweep_dir: Path,
    base: dict,
    block: Block,
    *,
    train_script: Path,
    launcher: str = "basic",
    n_jobs: int = 2,
    extra: Sequence[str] = (),
) -> list[str]:
  """The `python scripts/train.py -m ...` command that runs every point of `block`."""
  fixed = {k: v for k, v in {**base, **block.fixed}.items() if k not in block.grid}
  exclude = sorted({k for k in fixed} | {k.split("=")[0].lstrip("+~") for k in extra})
  cmd = [sys.executable, str(train_script), "-m"]
  cmd += [f"{k}={fmt(v)}" for k, v in fixed.items()]
  cmd += [f"{k}={','.join(fmt(v) for v in vals)}" for k, vals in block.grid.items()]
  cmd += list(extra)
  cmd += [
      f"hydra.sweep.dir={sweep_dir}",
      "hydra.sweep.subdir=${hydra.job.override_dirname}",
      f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude)}]",
  ]
  cmd += launcher_overrides(launcher, n_jobs)
  return cmd


@dataclasses.dataclass
class LaunchLog:
  """What one `launch` call did: points already done, points run, failures."""

  skipped: list = dataclasses.field(default_factory=list)
  launched: list = dataclasses.field(default_factory=list)
  failed: list = dataclasses.field(default_factory=list)
  wall_s: float = 0.0
  commands: list = dataclasses.field(default_factory=list)


DONE = ("completed", "diverged")  # statuses that are not launched again


def launch_blocks(
    sweep_dir: Path,
    base: dict,
    blocks: Iterable[Block],
    *,
    train_script: Path,
    launcher: str = "basic",
    n_jobs: int = 2,
    extra: Sequence[str] = (),
    dry_run: bool = False,
    log: LaunchLog | None = None,
    echo: Callable[[str], None] = print,
) -> LaunchLog:
  """Launches each block whose points are not all done; records skipped points.

  A block with at least one missing point is launched whole: the training entry exits
  at once for a run whose summary says completed and resumes a partial one from its
  checkpoint, so only the missing work is done.
  """
  log = log or LaunchLog()
  sweep_dir.mkdir(parents=True, exist_ok=True)
  for block in blocks:
    todo, done = [], []
    for p in block.points():
      name = run_dirname(p)
      (done if run_status(sweep_dir / name) in DONE else todo).append(name)
    log.skipped += done
    for name in done:
      echo(f"[skip] {name} ({run_status(sweep_dir / name)})")
    if not todo:
      continue
    cmd = multirun_command(
        sweep_dir, base, block, train_script=train_script, launcher=launcher, n_jobs=n_jobs,
        extra=extra)
    log.commands.append(cmd)
    echo(f"[launch] {len(todo)} run(s): " + " ".join(_quote(c) for c in cmd[1:]))
    if dry_run:
      log.launched += todo
      continue
    t0 = time.time()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env)
    log.wall_s += time.time() - t0
    log.launched += todo
    for name in todo:
      if run_status(sweep_dir / name) != "completed":
        log.failed.append(name)
    if proc.returncode:
      echo(f"[warn] multirun exited with code {proc.returncode}; failed: "
           f"{[n for n in todo if n in log.failed]}")
  return log


def _quote(s: str) -> str:
  return f"'{s}'" if any(c in s for c in " ${}[]*") else s


# --------------------------------------------------------------------------- reading runs


def run_table(run_dir: Path) -> pd.DataFrame:
  """One run's metrics as rows per step: `train/<k>`, `eval/<k>`, and stats keys as-is.

  If a run was resumed, a step logged twice keeps its last value. A NaN loss is stored
  as inf, so that NaN keeps meaning "not logged at this step".
  """
  recs = read_records(run_dir / METRICS)
  rows: dict[int, dict] = {}
  for r in recs:
    step = int(r.get("step", -1))
    split = r.get("split", "train")
    row = rows.setdefault(step, {"step": step})
    for k, v in r.items():
      if k in ("step", "split"):
        continue
      if k == "loss" and (v is None or (isinstance(v, float) and math.isnan(v))):
        v = math.inf  # a logged non-finite loss; NaN in the table means "not logged"
      if split == "stats" or "/" in k:
        row[k] = v
      else:
        row[f"{split}/{k}"] = v
  df = pd.DataFrame(sorted(rows.values(), key=lambda r: r["step"]))
  return df


def _coerce(v: str):
  if v in ("null", "None"):
    return np.nan
  for t in (int, float):
    try:
      return t(v)
    except ValueError:
      pass
  return v


def aggregate(sweep_dir: Path, names: Iterable[str] | None = None) -> pd.DataFrame:
  """The tidy table of a sweep: one row per (run, step), swept values as columns."""
  sweep_dir = Path(sweep_dir)
  if names is None:
    names = sorted(p.parent.name for p in sweep_dir.glob(f"*/{METRICS}"))
  frames = []
  for name in names:
    rd = sweep_dir / name
    if not (rd / METRICS).exists():
      continue
    df = run_table(rd)
    if df.empty:
      continue
    for k, v in parse_dirname(name).items():
      df.insert(0, k, _coerce(v))
    df.insert(0, "status", run_status(rd))
    df.insert(0, "run", name)
    frames.append(df)
  if not frames:
    return pd.DataFrame(columns=["run", "status", "step"])
  return pd.concat(frames, ignore_index=True, sort=False)


def x_examples(df: pd.DataFrame) -> pd.Series:
  """Examples seen at each row (from train/examples_seen, else step * batch size)."""
  if "train/examples_seen" in df:
    ex = df.groupby("run")["train/examples_seen"].transform(lambda s: s.ffill())
    if ex.notna().any():
      return ex
  bs = df["data.batch_size"] if "data.batch_size" in df else 1
  return df["step"] * bs


def finals(table: pd.DataFrame, tail: int = 3) -> pd.DataFrame:
  """One row per run: swept values, status, final eval loss, smoothed final train loss.

  A run whose losses became non-finite (or whose summary says diverged) gets
  `final_eval_loss = inf` so that it ranks last and shows at the top of a U-curve.
  """
  if table.empty:
    return pd.DataFrame()
  id_cols = [c for c in table.columns if c in ("run", "status") or "." in c and "/" not in c]
  out = []
  for _run, df in table.groupby("run", sort=False):
    row = {c: df[c].iloc[0] for c in id_cols}
    ev = df["eval/loss"].dropna() if "eval/loss" in df else pd.Series(dtype=float)
    tr = df["train/loss"].dropna() if "train/loss" in df else pd.Series(dtype=float)
    nonfinite = bool((~np.isfinite(ev)).any() or (~np.isfinite(tr)).any())
    diverged = nonfinite or row["status"] == "diverged"
    row["final_step"] = int(df["step"].max())
    row["final_eval_loss"] = math.inf if diverged or ev.empty else float(ev.iloc[-1])
    row["final_train_loss"] = math.inf if diverged or tr.empty else float(tr.iloc[-tail:].mean())
    row["diverged"] = diverged
    out.append(row)
  return pd.DataFrame(out)


def best_lr(fin: pd.DataFrame, group_keys: Sequence[str], lr_key: str,
            seed_key: str = "train.seed", metric: str = "final_eval_loss") -> pd.DataFrame:
  """Per group: the lr with the lowest seed-mean final loss, and whether it is at an edge.

  Columns: group keys, lr_key, `loss_mean`, `loss_std`, `n_seeds`, `at_edge`,
  `grid` (sorted lrs tried), `n_diverged` (lrs of the grid that diverged).
  """
  rows = []
  completed = fin[fin["status"].isin(DONE)] if "status" in fin else fin
  for gvals, g in completed.groupby(list(group_keys), sort=False, dropna=False):
    gvals = gvals if isinstance(gvals, tuple) else (gvals,)
    per_lr = g.groupby(lr_key)[metric].agg(["mean", "std", "count"]).sort_index()
    lrs = list(per_lr.index)
    # Seed-0-only comparison first so extra seeds do not bias the choice of lr.
    if seed_key in g:
      s0 = g[g[seed_key] == g[seed_key].min()].groupby(lr_key)[metric].mean()
      best = s0.idxmin()
    else:
      best = per_lr["mean"].idxmin()
    i = lrs.index(best)
    rows.append({
        **dict(zip(group_keys, gvals, strict=False)),
        lr_key: best,
        "loss_mean": float(per_lr.loc[best, "mean"]),
        "loss_std": float(per_lr.loc[best, "std"]) if per_lr.loc[best, "count"] > 1 else 0.0,
        "n_seeds": int(per_lr.loc[best, "count"]),
        "at_edge": bool(np.isfinite(per_lr.loc[best, "mean"]) and (i == 0 or i == len(lrs) - 1)),
        "edge": "low" if i == 0 else ("high" if i == len(lrs) - 1 else ""),
        "grid": " ".join(fmt(float(x)) for x in lrs),
        "n_diverged": int((~np.isfinite(per_lr["mean"])).sum()),
    })
  return pd.DataFrame(rows)


def follow_up_blocks(sweep: Sweep, fin: pd.DataFrame, round_: int) -> tuple[list[Block], str]:
  """(blocks, kind): blocks extending a group's lr grid past an edge ("extend"), or else
  the extra seeds at each group's best lr ("seeds"); ([], "none") when nothing to add.

  Deterministic given the finished runs, so a re-launched sweep recomputes the same
  blocks (already finished ones are then skipped).
  """
  ls = sweep.lr_search
  if ls is None or fin.empty:
    return [], "none"
  best = best_lr(fin, ls.group_keys, ls.lr_key, ls.seed_key)
  seed0 = _first_seed(sweep, ls)
  blocks = []
  for _, b in best.iterrows():
    group = {k: _from_table(b[k]) for k in ls.group_keys}
    grid = [float(x) for x in b["grid"].split()]
    if b["at_edge"] and round_ < ls.max_extend:
      lr = grid[0] / ls.factor if b["edge"] == "low" else grid[-1] * ls.factor
      blocks.append(Block({**{k: [v] for k, v in group.items()},
                           ls.lr_key: [_round_lr(lr)], ls.seed_key: [seed0]}))
  if blocks:
    return blocks, "extend"
  for _, b in best.iterrows():
    group = {k: _from_table(b[k]) for k in ls.group_keys}
    if ls.seeds and np.isfinite(b["loss_mean"]):
      blocks.append(Block({**{k: [v] for k, v in group.items()},
                           ls.lr_key: [float(b[ls.lr_key])], ls.seed_key: list(ls.seeds)}))
  return blocks, ("seeds" if blocks else "none")


def _first_seed(sweep: Sweep, ls: LrSearch):
  for bl in sweep.blocks:
    if ls.seed_key in bl.grid:
      return bl.grid[ls.seed_key][0]
  return 0


def _round_lr(x: float) -> float:
  return float(f"{x:.3g}")


def _from_table(v):
  if isinstance(v, float) and math.isnan(v):
    return None
  if isinstance(v, (np.integer,)):
    return int(v)
  if isinstance(v, (np.floating,)):
    return float(v)
  return v


# --------------------------------------------------------------------------- figures


def plt():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as pyplot
  return pyplot


def label(group: dict) -> str:
  return ", ".join(f"{k.split('.')[-1]}={fmt(_from_table(v))}" for k, v in group.items())


def plot_u_curves(ax, fin: pd.DataFrame, group_keys, lr_key: str, labeler=label,
                  metric: str = "final_eval_loss"):
  """Final loss vs learning rate per group (mean over seeds, error bar = std).

  Diverged runs are drawn as crosses at the top of the axis; runs that finished far above
  the best (more than `window` nats) as triangles there, so they do not squash the rest.
  """
  window = 3.0
  finite = fin[np.isfinite(fin[metric])]
  top = finite[metric].max() if not finite.empty else 1.0
  lo = finite[metric].min() if not finite.empty else 0.0
  top = min(top, lo + window)
  cap = top + 0.1 * (top - lo + 1e-9)
  for gvals, g in fin.groupby(list(group_keys), sort=False, dropna=False):
    gvals = gvals if isinstance(gvals, tuple) else (gvals,)
    agg = g.groupby(lr_key)[metric].agg(
        mean=lambda s: s.mean(), std=lambda s: s[np.isfinite(s)].std()).sort_index()
    high = np.isfinite(agg["mean"]) & (agg["mean"] > top)
    agg.loc[high, "mean"] = np.nan  # drawn as a triangle at the top, not on the curve
    ok = np.isfinite(agg["mean"])
    line, = ax.plot(agg.index[ok], agg["mean"][ok], "o-",
                    label=labeler(dict(zip(group_keys, gvals, strict=False))))
    if ok.any():
      ax.errorbar(agg.index[ok], agg["mean"][ok], yerr=agg["std"][ok].fillna(0), fmt="none",
                  ecolor=line.get_color(), capsize=2)
    for mask, marker in ((~ok & ~high, "x"), (high, "^")):
      if mask.any():
        ax.plot(agg.index[mask], [cap] * int(mask.sum()), marker, color=line.get_color(), ms=8)
  ax.set_xscale("log")
  ax.set_xlabel(lr_key)
  ax.set_ylabel(metric.replace("_", " ") + f" (x diverged, ^ > best + {window:g})")
  ax.grid(alpha=0.3)


def plot_curves(ax, curves: pd.DataFrame, group_keys, y: str, x: str = "examples_seen",
                seed_key: str = "train.seed", labeler=label):
  """Mean curve per group over seeds, with the min-max band across seeds."""
  for gvals, g in curves.groupby(list(group_keys), sort=False, dropna=False):
    gvals = gvals if isinstance(gvals, tuple) else (gvals,)
    g = g.dropna(subset=[y])
    if g.empty:
      continue
    agg = g.groupby(x)[y].agg(["mean", "min", "max", "count"]).sort_index()
    n = int(g[seed_key].nunique()) if seed_key in g else 1
    name = labeler(dict(zip(group_keys, gvals, strict=False)))
    line, = ax.plot(agg.index, agg["mean"], label=name + (f" ({n} seeds)" if n > 1 else ""))
    if n > 1:
      ax.fill_between(agg.index, agg["min"], agg["max"], color=line.get_color(), alpha=0.2)
  ax.set_xlabel(x.replace("_", " "))
  ax.set_ylabel(y)
  ax.grid(alpha=0.3)


def curves_at(table: pd.DataFrame, best: pd.DataFrame, keys: Sequence[str],
              cols: Sequence[str]) -> pd.DataFrame:
  """Rows of `table` whose (keys) match a row of `best`, with an `examples_seen` column."""
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  b = best[list(keys)].copy()
  for k in keys:  # align dtypes (NaN-able keys)
    b[k] = b[k].astype(t[k].dtype) if k in t else b[k]
  m = t.merge(b, on=list(keys), how="inner")
  keep = ["run", *[c for c in t.columns if "." in c and "/" not in c], "step", "examples_seen",
          *[c for c in cols if c in m]]
  return m[list(dict.fromkeys(keep))]


def savefig(fig, path: Path) -> Path:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt().close(fig)
  return path


# --------------------------------------------------------------------------- stats keys


def stat_columns(table: pd.DataFrame, name: str, prefix: str | None = None) -> list[str]:
  """Columns `<prefix>/<leaf path>/<name>` (prefix 'stats' or 'opt'; any if None)."""
  out = []
  for c in table.columns:
    parts = c.split("/")
    if len(parts) >= 3 and parts[-1] == name and (prefix is None or parts[0] == prefix):
      out.append(c)
  return out


def leaf_of(col: str) -> str:
  return "/".join(col.split("/")[1:-1])


def median_over_leaves(table: pd.DataFrame, name: str, prefix: str | None = None) -> pd.Series:
  cols = stat_columns(table, name, prefix)
  if not cols:
    return pd.Series(np.nan, index=table.index)
  return table[cols].median(axis=1, skipna=True)


def fmt_num(x: float, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "n/a"
  if isinstance(x, float) and math.isinf(x):
    return "diverged"
  return f"{x:.{digits}g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits}f}"


def md_table(df: pd.DataFrame) -> str:
  """A small DataFrame as a Markdown table (no tabulate dependency)."""
  cols = list(df.columns)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for _, r in df.iterrows():
    cells = [fmt_num(v) if isinstance(v, float) else str(v) for v in r]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


# --------------------------------------------------------------------------- lr sweeps


CURVE_COLS = ("train/loss", "eval/loss", "train/lr", "train/grad_norm")


def lr_sweep_analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path,
                     group_keys: Sequence[str], lr_key: str = "optimizer.lr") -> None:
  """Writes finals.csv (every run), best.csv (best lr per group), curves.csv (best lr)."""
  out_dir = Path(out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)
  best = best_lr(fin, group_keys, lr_key)
  best.to_csv(out_dir / "best.csv", index=False)
  curves = curves_at(table, best, [*group_keys, lr_key], CURVE_COLS)
  curves.to_csv(out_dir / "curves.csv", index=False)


def lr_sweep_figures(out_dir: Path, group_keys: Sequence[str], title: str,
                     lr_key: str = "optimizer.lr", labeler=label) -> list[Path]:
  """u_curves.png (final eval loss vs lr) and curves_at_best.png, from the CSVs."""
  out_dir = Path(out_dir)
  fin = pd.read_csv(out_dir / "finals.csv")
  curves = pd.read_csv(out_dir / "curves.csv")
  pyplot = plt()
  fig, ax = pyplot.subplots(figsize=(6.5, 4.2))
  plot_u_curves(ax, fin, group_keys, lr_key, labeler=labeler)
  ax.set_title(f"{title}: final eval loss vs learning rate")
  ax.legend(fontsize=7)
  paths = [savefig(fig, out_dir / "u_curves.png")]
  fig, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
  for ax, y in zip(axes, ("train/loss", "eval/loss"), strict=False):
    if y in curves:
      plot_curves(ax, curves, group_keys, y, labeler=labeler)
      finite = curves[y][np.isfinite(curves[y])]
      if not finite.empty:  # clip the initial transient so differences stay visible
        ax.set_ylim(finite.min() - 0.05, np.percentile(finite, 90) + 0.1)
  axes[0].set_title(f"{title}: each at its best lr")
  axes[1].legend(fontsize=7)
  paths.append(savefig(fig, out_dir / "curves_at_best.png"))
  return paths


def best_md(best: pd.DataFrame, group_keys: Sequence[str], lr_key: str = "optimizer.lr") -> str:
  """The best-lr table as Markdown, sorted by loss, edges flagged."""
  b = best.sort_values("loss_mean").copy()
  cols = [*group_keys, lr_key, "loss_mean", "loss_std", "n_seeds", "grid", "n_diverged", "at_edge"]
  b = b[cols].rename(columns={k: k.split(".")[-1] for k in [*group_keys, lr_key]})
  b = b.rename(columns={"loss_mean": "final eval loss (mean)", "loss_std": "std over seeds",
                        "grid": "lr grid", "n_diverged": "diverged lrs", "at_edge": "best at edge"})
  return md_table(b)


def overlap(a_mean, a_std, b_mean, b_std) -> bool:
  """Whether two mean±std intervals overlap (a crude 'within noise' test)."""
  return abs(a_mean - b_mean) <= (a_std or 0) + (b_std or 0)
