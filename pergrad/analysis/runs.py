"""Reading run directories (metrics.jsonl, summary.json): status, a sweep's tidy table (a row
per run and step, the swept values as columns), final numbers, where a curve reaches a target
(per run and on an arm's seed-mean curve: `to_target`, `seed_mean_to_target`).

A sweep's run directory is named by its swept overrides as Hydra's
`${hydra.job.override_dirname}` writes them (`run_dirname`), so the table reads the swept
values back from the names (`parse_dirname`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from pergrad.files import METRICS, SUMMARY, read_records

DONE = ("completed", "diverged")  # statuses of a finished run (a sweep does not launch it again)


def fmt(value) -> str:
  """An override value as on the command line and in run dirs."""
  if value is None:
    return "null"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    return f"{value:g}"
  return str(value)


def run_dirname(point: dict) -> str:
  """Hydra's `${hydra.job.override_dirname}` for a point whose only overrides are its keys."""
  return ",".join(sorted(f"{k}={fmt(v)}" for k, v in point.items()))


def parse_dirname(name: str) -> dict:
  """`run_dirname`'s inverse: {key: value as text}."""
  return dict(item.partition("=")[::2] for item in name.split(","))


LONG_ROWS = 500  # a table with more rows is written gzip-compressed (`write_csv`)


def gzipped(path) -> Path:
  """Where `write_csv` puts a long table named `path` (x.csv -> x.csv.gz)."""
  return Path(path).with_name(Path(path).name + ".gz")


def write_csv(df: pd.DataFrame, path) -> Path:
  """df to `path` (x.csv), or to x.csv.gz when it has more than LONG_ROWS rows (per-step or
  per-leaf tables: results/ stays small); the other form, if present, is removed so a reader
  never finds a stale one. The gzip header carries no time: the bytes are reproducible."""
  path = Path(path)
  long = len(df) > LONG_ROWS
  target, other = (gzipped(path), path) if long else (path, gzipped(path))
  df.to_csv(target, index=False,
            compression={"method": "gzip", "mtime": 0} if long else None)
  other.unlink(missing_ok=True)
  return target


def read_csv(path) -> pd.DataFrame:
  """The table `write_csv` wrote as `path` (x.csv or x.csv.gz) as a DataFrame; empty when
  neither exists or it holds no column."""
  path = Path(path)
  path = path if path.exists() or not gzipped(path).exists() else gzipped(path)
  try:
    return pd.read_csv(path) if path.exists() else pd.DataFrame()
  except pd.errors.EmptyDataError:
    return pd.DataFrame()


def unreadable_checkpoint(step_dir: Path) -> str | None:
  """Why the checkpoint in `step_dir` cannot be read, or None (`pergrad.train.checkpoint`)."""
  from pergrad.train.checkpoint import unreadable

  return unreadable(step_dir)


def run_status(run_dir: Path) -> str:
  """'completed' | a summary's other status (e.g. 'diverged') | 'partial' | 'missing'."""
  summ = run_dir / SUMMARY
  if summ.exists():
    try:
      return str(json.loads(summ.read_text()).get("status", "unknown"))
    except json.JSONDecodeError:
      return "partial"
  return "partial" if (run_dir / METRICS).exists() else "missing"


def run_table(run_dir: Path) -> pd.DataFrame:
  """One run's metrics as rows per step: `train/<k>`, `eval/<k>`, stats keys as-is (a step
  logged twice keeps its last value; a NaN loss is stored as inf: NaN is "not logged")."""
  rows: dict[int, dict] = {}
  for r in read_records(run_dir / METRICS):
    step, split = int(r.get("step", -1)), r.get("split", "train")
    row = rows.setdefault(step, {"step": step})
    for k, v in r.items():
      if k in ("step", "split"):
        continue
      if k == "loss" and from_table(v) is None:
        v = math.inf  # a logged non-finite loss; NaN in the table means "not logged"
      row[k if split == "stats" or "/" in k else f"{split}/{k}"] = v
  return pd.DataFrame(sorted(rows.values(), key=lambda r: r["step"]))


def table_value(v: str):
  """An override's text as a table holds it: null/None -> NaN, else int, float or the text."""
  if v in ("null", "None"):
    return np.nan
  for t in (int, float):
    try:
      return t(v)
    except ValueError:
      pass
  return v


def from_table(v):
  """A value read back from a table as the plain Python value of an override."""
  if isinstance(v, float) and math.isnan(v):
    return None
  return int(v) if isinstance(v, np.integer) else float(v) if isinstance(v, np.floating) else v


def aggregate(sweep_dir: Path) -> pd.DataFrame:
  """The tidy table of a sweep: one row per (run, step), swept values as columns."""
  frames = []
  for rd in sorted(p.parent for p in Path(sweep_dir).glob(f"*/{METRICS}")):
    name, df = rd.name, run_table(rd)
    if df.empty:  # no metrics.jsonl, or no record in it
      continue
    for k, v in parse_dirname(name).items():
      df.insert(0, k, table_value(v))
    df.insert(0, "status", run_status(rd))
    df.insert(0, "run", name)
    frames.append(df)
  if not frames:
    return pd.DataFrame(columns=["run", "status", "step"])
  return pd.concat(frames, ignore_index=True, sort=False)


HYDRA_CONFIG = Path(".hydra") / "config.yaml"  # the config Hydra composed for a run


def run_setting(run_dir: Path, key: str):
  """The value of dotted `key` in the config Hydra wrote for the run (None when the run has no
  such file or the key is not set: a value not recorded is never guessed)."""
  import yaml

  path = Path(run_dir) / HYDRA_CONFIG
  node = yaml.safe_load(path.read_text()) if path.exists() else None
  for part in key.split("."):
    node = node.get(part) if isinstance(node, dict) else None
  return node


def x_examples(df: pd.DataFrame) -> pd.Series:
  """Examples seen at each row (from train/examples_seen, else step * batch size)."""
  if "train/examples_seen" in df:
    ex = df.groupby("run")["train/examples_seen"].transform(lambda s: s.ffill())
    if ex.notna().any():
      return ex
  return df["step"] * df.get("data.batch_size", 1)


def finals(table: pd.DataFrame, tail: int = 3) -> pd.DataFrame:
  """One row per run: swept values, status, final eval loss, smoothed final train loss (inf
  for a run whose losses became non-finite or whose summary says diverged)."""
  if table.empty:
    return pd.DataFrame()
  id_cols = [c for c in table.columns if c in ("run", "status") or "." in c and "/" not in c]
  out = []
  for _run, df in table.groupby("run", sort=False):
    row = {c: df[c].iloc[0] for c in id_cols}
    ev = df["eval/loss"].dropna() if "eval/loss" in df else pd.Series(dtype=float)
    tr = df["train/loss"].dropna() if "train/loss" in df else pd.Series(dtype=float)
    diverged = bool((~np.isfinite(ev)).any() or (~np.isfinite(tr)).any()
                    or row["status"] == "diverged")
    row["final_step"] = int(df["step"].max())
    row["final_eval_loss"] = math.inf if diverged or ev.empty else float(ev.iloc[-1])
    row["final_train_loss"] = math.inf if diverged or tr.empty else float(tr.iloc[-tail:].mean())
    row["diverged"] = diverged
    out.append(row)
  return pd.DataFrame(out)


def curves_at(table: pd.DataFrame, best: pd.DataFrame, keys: Sequence[str],
              cols: Sequence[str]) -> pd.DataFrame:
  """Rows of `table` whose (keys) match a row of `best`: examples_seen and the `cols` of either."""
  t = table.copy()
  t["examples_seen"] = x_examples(t)
  b = best[[*keys, *(c for c in cols if c in best)]].copy()
  for k in keys:  # align dtypes (NaN-able keys)
    b[k] = b[k].astype(t[k].dtype) if k in t else b[k]
  m = t.merge(b, on=list(keys), how="inner")
  keep = ["run", *[c for c in t.columns if "." in c and "/" not in c], "step", "examples_seen",
          *[c for c in cols if c in m]]
  return m[list(dict.fromkeys(keep))]


def stat_columns(table: pd.DataFrame, name: str, prefix: str | None = None) -> list[str]:
  """Columns `<prefix>/<leaf path>/<name>` (prefix 'stats' or 'opt'; any if None)."""
  return [c for c in table.columns if len(p := c.split("/")) >= 3 and p[-1] == name
          and (prefix is None or p[0] == prefix)]


def leaf_of(col: str) -> str:
  return "/".join(col.split("/")[1:-1])


def finished(df: pd.DataFrame) -> pd.DataFrame:
  """The rows of finished runs (status in DONE; a table without a status column as it is)."""
  return df[df["status"].isin(DONE)] if "status" in df else df


def crossing(x: np.ndarray, y: np.ndarray, target: float) -> float:
  """The first x where the curve y(x) reaches ≤ target, linear between points (inf if
  never; x[0] if already there)."""
  hit = np.flatnonzero(y <= target)
  if not len(hit):
    return math.inf
  i = int(hit[0])
  if i == 0:
    return float(x[0])
  return float(x[i - 1] + (x[i] - x[i - 1]) * (y[i - 1] - target) / (y[i - 1] - y[i]))


def reach(r: pd.DataFrame, target: float) -> tuple[float, float]:
  """(tokens, train time) where the curve `r` (by tokens) reaches `target` (inf, inf: not within
  its budget, which says nothing about divergence)."""
  x = r["tokens"].to_numpy(float)
  tok = crossing(x, r["eval_loss"].to_numpy(float), target)
  t = np.interp(tok, x, r["train_time_s"].to_numpy(float)) if math.isfinite(tok) else math.inf
  return tok, float(t)


def to_target(cur: pd.DataFrame, best_arm: str, fin: pd.DataFrame) -> pd.DataFrame:
  """Per run: the target (the best fixed arm's seed-mean final eval loss), tokens and time to
  reach it, the final eval loss (+inf for a run the finals `fin` say diverged), totals."""
  ref = cur[cur["arm"] == best_arm]
  if ref.empty:
    return pd.DataFrame()
  target = float(ref.sort_values("tokens").groupby("run")["eval_loss"].last().mean())
  marked = dict(zip(fin["run"], fin["final_eval_loss"], strict=True))
  rows = []
  for run, r in cur.groupby("run", sort=False):
    r = r.sort_values("tokens")
    tok, t = reach(r, target)
    final = float(marked.get(run, r["eval_loss"].iloc[-1]))
    rows.append({"run": run, "arm": r["arm"].iloc[0], "train.seed": r["train.seed"].iloc[0],
                 "target": target, "tokens_to_target": tok, "time_to_target_s": t,
                 "final_eval_loss": final if math.isfinite(final) else math.inf,
                 "tokens_total": float(r["tokens"].iloc[-1]),
                 "time_total_s": float(r["train_time_s"].iloc[-1]),
                 "updates": int(r["step"].iloc[-1])})
  return pd.DataFrame(rows)


def seed_mean(g: pd.DataFrame, cols) -> pd.DataFrame:
  """An arm's seed-mean curve: `cols` averaged over its runs' i-th rows in token order (the
  runs of an arm evaluate and log at the same examples seen, up to one batch)."""
  g = g.sort_values("tokens")
  return g.groupby(g.groupby("run").cumcount())[list(cols)].mean()


# The target (`to_target`: the mean of the best arm's runs' last evals) and that arm's
# seed-mean curve sum the same floats in another order: its last point may lie an ulp above.
TARGET_RTOL = 1e-9


def seed_mean_to_target(cur: pd.DataFrame, best_arm: str, target: float) -> pd.DataFrame:
  """Per arm: `reach` of its `seed_mean` curve (every arm at the target + `TARGET_RTOL`), and
  the token and wall-time savings against the best fixed arm's; NaN savings when that arm's
  own curve does not reach its target (never a saving read against an infinite reference)."""
  at = target + TARGET_RTOL * max(1.0, abs(target))
  rows = []
  for a in sorted(set(cur["arm"])):
    m = seed_mean(cur[cur["arm"] == a], ["tokens", "eval_loss", "train_time_s"])
    rows.append(dict(zip(("arm", "tokens_to_target", "time_to_target_s"), (a, *reach(m, at)),
                         strict=True)))
  out = pd.DataFrame(rows)
  ref = float(out.loc[out["arm"] == best_arm, "tokens_to_target"].iloc[0])
  ref_t = float(out.loc[out["arm"] == best_arm, "time_to_target_s"].iloc[0])
  saving = lambda x, r: 1.0 - x / r if math.isfinite(r) and r > 0 else math.nan
  out["token_saving"] = [saving(x, ref) for x in out["tokens_to_target"]]
  out["time_saving"] = [saving(x, ref_t) for x in out["time_to_target_s"]]
  return out


CURVES = ["run", "arm", "train.seed", "lr", "step", "tokens", "eval_loss", "train_time_s",
          "batch_size"]


def to_target_by_arm(tt: pd.DataFrame, mean_tt: pd.DataFrame) -> pd.DataFrame:
  """Per arm of a `to_target` table: its final loss (mean, std), updates, wall time, seeds and
  seeds that never reached the target, beside `mean_tt` (`seed_mean_to_target`; an infinite
  figure reads "not reached")."""
  by_arm = tt.groupby("arm").agg(
      final_eval_loss=("final_eval_loss", "mean"), final_std=("final_eval_loss", "std"),
      updates=("updates", "mean"), time_total_s=("time_total_s", "mean"), seeds=("run", "count"),
      not_reached=("tokens_to_target", lambda x: int((~np.isfinite(x)).sum()))
  ).reset_index().merge(mean_tt, on="arm")
  for c in ("tokens_to_target", "time_to_target_s", "token_saving", "time_saving"):
    by_arm[c] = by_arm[c].astype(object).where(np.isfinite(by_arm[c].astype(float)), "not reached")
  return by_arm


def eval_curves(table: pd.DataFrame, arm_of) -> pd.DataFrame:
  """`CURVES` per run and evaluation, `arm_of(the run's rows)` its arm (time and batch size
  interpolated from the train records that log them)."""
  rows = []
  for run, g in table.groupby("run", sort=False):
    g = g.sort_values("step")
    ev, tr = g.dropna(subset=["eval/loss"]), g.dropna(subset=["train/tokens_seen"])
    timed = tr.dropna(subset=["train/train_time_s"]) if "train/train_time_s" in tr else tr[:0]
    tokens = ev["eval/tokens_seen"].to_numpy(float)
    time_s = (np.interp(tokens, timed["train/tokens_seen"], timed["train/train_time_s"])
              if len(timed) else np.full(len(ev), np.nan))
    size = np.interp(ev["step"], tr["step"], tr["train/batch_size"]) if len(tr) else np.nan
    rows.append(pd.DataFrame({
        "run": run, "arm": arm_of(g), "train.seed": g["train.seed"].iloc[0],
        "lr": g["optimizer.lr"].iloc[0], "step": ev["step"].to_numpy(), "tokens": tokens,
        "eval_loss": ev["eval/loss"].to_numpy(), "train_time_s": time_s, "batch_size": size}))
  return pd.concat(rows, ignore_index=True)[CURVES] if rows else pd.DataFrame(columns=CURVES)
