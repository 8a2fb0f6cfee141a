"""Tokens to a target loss and the schedule verdict of `gns_schedule`.

A curve reaches a target T where its eval loss first gets ≤ T, linear between evaluations
(inf: not within its budget, which says nothing about divergence).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from experiments import rules
from experiments.calibrate import MIN_POWER


def crossing(x: np.ndarray, y: np.ndarray, target: float) -> float:
  """The first x where the curve y(x) reaches ≤ target, linear between points (inf if
  never; x[0] if already there)."""
  hit = np.flatnonzero(y <= target)
  if not len(hit):
    return math.inf
  i = int(hit[0])
  if i == 0:
    return float(x[0])
  x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
  return float(x0 + (x1 - x0) * (y0 - target) / (y0 - y1))


def reach(r: pd.DataFrame, target: float) -> tuple[float, float]:
  """(tokens, train time) where the curve `r` (tokens, eval_loss, train_time_s in token
  order) reaches `target`; inf, inf when it does not."""
  x = r["tokens"].to_numpy(float)
  tok = crossing(x, r["eval_loss"].to_numpy(float), target)
  t = np.interp(tok, x, r["train_time_s"].to_numpy(float)) if math.isfinite(tok) else math.inf
  return tok, float(t)


def to_target(cur: pd.DataFrame, best_arm: str, fin: pd.DataFrame | None = None
              ) -> pd.DataFrame:
  """Per run: the target T (the best fixed arm's seed-mean final eval loss), tokens and
  time to reach it (`reach`), and the final eval loss (+inf for a run `fin`, the marked
  finals, says diverged)."""
  ref = cur[cur["arm"] == best_arm]
  if ref.empty:
    return pd.DataFrame()
  target = float(ref.sort_values("tokens").groupby("run")["eval_loss"].last().mean())
  marked = {} if fin is None else dict(zip(fin["run"], fin["final_eval_loss"], strict=True))
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


def delta_short(finals: dict[str, list[float]], base: str) -> float:
  """Δ18 = the short arm's seed-mean final eval loss minus the best fixed arm's (NaN
  without short runs; inf when a short run diverged)."""
  short, full = finals.get(f"{base}_short", []), finals.get(base, [])
  return float(np.mean(short) - np.mean(full)) if len(short) and len(full) else math.nan


def schedule_verdict(pairs: list[rules.Comparison], power: float) -> str:
  """`gns_schedule.RULE`: `rules.verdict_of`, except that without a win and a loss, ties
  all round say "not reproduced" at power ≥ `calibrate.MIN_POWER`, else "undetermined"."""
  out, verdict = [p.outcome for p in pairs], rules.verdict_of(pairs)
  if verdict in (rules.REPRODUCED, rules.NOT_REPRODUCED) or rules.WIN in out:
    return verdict
  tied = all(o == rules.TIE for o in out) and power >= MIN_POWER
  return rules.NOT_REPRODUCED if tied else rules.UNDETERMINED


def seed_mean_to_target(cur: pd.DataFrame, best_arm: str, target: float) -> pd.DataFrame:
  """Per arm: tokens and train time where its seed-mean curve (averaged per evaluation: the
  arms evaluate at the same examples seen, up to one batch) first reaches `target` (inf: not
  reached), and the token saving against the best fixed arm's."""
  rows = []
  for a in sorted(set(cur["arm"])):
    g = cur[cur["arm"] == a].sort_values("tokens")
    m = g.groupby(g.groupby("run").cumcount())[["tokens", "eval_loss", "train_time_s"]].mean()
    rows.append(dict(zip(("arm", "tokens_to_target", "time_to_target_s"), (a, *reach(m, target)),
                         strict=True)))
  out = pd.DataFrame(rows)
  ref = float(out.loc[out["arm"] == best_arm, "tokens_to_target"].iloc[0])
  out["token_saving"] = 1.0 - out["tokens_to_target"] / ref
  return out


CURVES = ["run", "arm", "train.seed", "lr", "step", "tokens", "eval_loss", "train_time_s",
          "batch_size"]


def curves(table: pd.DataFrame, arm_of) -> pd.DataFrame:
  """`CURVES` per run and evaluation (time and batch size interpolated from the train records
  that log them); `arm_of` names a run's arm from its first row."""
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
        "run": run, "arm": arm_of({**g.iloc[0].to_dict(), "_budget": g["train/tokens_seen"].max()}),
        "train.seed": g["train.seed"].iloc[0], "lr": g["optimizer.lr"].iloc[0],
        "step": ev["step"].to_numpy(), "tokens": tokens, "eval_loss": ev["eval/loss"].to_numpy(),
        "train_time_s": time_s, "batch_size": size}))
  return pd.concat(rows, ignore_index=True)[CURVES] if rows else pd.DataFrame(columns=CURVES)
