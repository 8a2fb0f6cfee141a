"""The GNS tracker's recurrence offline, on a run's logged raw terms, and the EMA's SNR gain.

    smooth(G2, S, alpha)           e_t = α e_{t−1} + (1 − α) x_t, debiased: B_simple = S/G2
    resmooth(run_dir, alpha)       smooth on a run's logged gns/<group>/{G2,S} terms
    ema_gain(snr2_ema, snr2_batch) SNR_ema / SNR_batch from the logged SNR²s
    part_whole(...)                B = S/|G|² of a group against the total's, regressed
    linear_ramp(tokens, b_simple)  the batch-size ramp a straight line through B_simple gives
    fitted_arm(fit, tokens, B_max) whether that ramp runs as an arm of its own (gns_schedule)
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import numpy as np

from pergrad.fields import check_decay
from pergrad.files import METRICS, read_records

GNS_TOTAL = "total"  # the whole-model group of the logged gns/<group>/ terms


def smooth(G2: Sequence[float], S: Sequence[float], alpha: float) -> dict[str, np.ndarray]:
  """The tracker's float32 recurrence on raw terms: e_t = α e_{t−1} + (1 − α) x_t, debiased
  by w_t = 1 − α^t (the EMA of ones); {"G2_ema", "S_ema", "b_simple" = S_ema / G2_ema}."""
  a, b, one = np.float32(alpha), np.float32(1.0 - alpha), np.float32(1.0)
  e_g, e_s, w = np.float32(0.0), np.float32(0.0), np.float32(0.0)
  rows: dict[str, list] = {"G2_ema": [], "S_ema": [], "b_simple": []}
  for g2, s in zip(np.asarray(G2, np.float32), np.asarray(S, np.float32), strict=True):
    e_g, e_s, w = a * e_g + b * g2, a * e_s + b * s, a * w + b * one
    wd = max(w, np.finfo(np.float32).tiny)
    rows["G2_ema"].append(e_g / wd)
    rows["S_ema"].append(e_s / wd)
    rows["b_simple"].append((e_s / wd) / (e_g / wd))
  return {k: np.asarray(v, np.float32) for k, v in rows.items()}


def resmooth(run_dir: str | Path, alpha: float) -> dict[str, dict[str, np.ndarray]]:
  """B_simple of every logged GNS group recomputed with EMA decay `alpha` from the raw
  terms "gns/<group>/{G2,S}" (`smooth`): {group: {"step", "G2", "S", "G2_ema", "S_ema",
  "b_simple"}}. The terms must be logged at every step from the first."""
  check_decay(alpha, "alpha")
  is_G2 = lambda k: k.startswith("gns/") and k.endswith("/G2")
  recs = [r for r in read_records(Path(run_dir) / METRICS) if any(map(is_G2, r))]
  groups = [k[len("gns/"):-len("/G2")] for k in (recs[0] if recs else {}) if is_G2(k)]
  if not groups:
    raise ValueError(f"{run_dir}/{METRICS} has no gns/<group>/G2 terms; train with "
                     "stats=gns (or stats.gns=true) to log them every step.")
  steps = np.asarray([r["step"] for r in recs])
  if not np.array_equal(steps, np.arange(steps[0], steps[0] + len(steps))):
    raise ValueError(f"{run_dir}: the gns terms are not logged at every step; the EMA "
                     "cannot be recomputed.")
  out = {}
  for g in groups:
    d = {"step": steps, "G2": np.asarray([r[f"gns/{g}/G2"] for r in recs]),
         "S": np.asarray([r[f"gns/{g}/S"] for r in recs])}
    out[g] = {**d, **smooth(d["G2"], d["S"], alpha)}
  return out


def ema_gain(snr2_ema, snr2_batch):
  """SNR_ema / SNR_batch = √(snr2_ema / snr2_batch), NaN unless both are > 0."""
  ok = (snr2_ema > 0) & (snr2_batch > 0)
  return np.sqrt(np.where(ok, snr2_ema, np.nan) / np.where(ok, snr2_batch, np.nan))


@dataclasses.dataclass(frozen=True)
class PartWhole:
  """B = S/|G|² of the complement (total − group) and of the total regressed on the group's;
  the group's shares of Σ|G|² and ΣS, and their medians over steps."""

  r_complement: float
  slope_complement: float
  intercept_complement: float
  r_total: float
  slope_total: float
  share_g2: float
  share_s: float
  median_share_g2: float
  median_share_s: float
  n_steps: int


def _fit(x, y):
  if len(x) < 3 or np.std(x) == 0 or np.std(y) == 0:
    return math.nan, math.nan, math.nan
  slope, icpt = np.polyfit(x, y, 1)
  return float(np.corrcoef(x, y)[0, 1]), float(slope), float(icpt)


def part_whole(g2_total, s_total, g2_group, s_group) -> PartWhole:
  """`PartWhole` over the same steps (a step with |G|² ≤ 0 or a non-finite value dropped)."""
  gt, st, gg, sg = (np.asarray(x, float) for x in (g2_total, s_total, g2_group, s_group))
  if not gt.shape == st.shape == gg.shape == sg.shape:
    raise ValueError("part_whole: the four series differ in length; give them on the same steps")
  gc, sc = gt - gg, st - sg
  ok = np.isfinite(gt) & np.isfinite(st) & np.isfinite(gg) & np.isfinite(sg) & (gg > 0) & (gc > 0)
  rc, slc, ic = _fit(sg[ok] / gg[ok], sc[ok] / gc[ok])
  rt, slt, _ = _fit(sg[ok] / gg[ok], st[ok] / gt[ok])
  share = lambda p, w: float(p.sum() / w.sum()) if w.sum() else math.nan
  med = lambda p, w: float(np.median(p / w)) if len(p) else math.nan
  return PartWhole(rc, slc, ic, rt, slt, share(gg[ok], gt[ok]), share(sg[ok], st[ok]),
                   med(gg[ok], gt[ok]), med(sg[ok], st[ok]), int(ok.sum()))


RAMP_TOL = 0.01  # a ramp within 1% of the budget is the paper's (runs overshoot it < 1 batch)


def linear_ramp(x, y, max_batch_size: int) -> dict | None:
  """B_simple y ≈ a + b·x (x: tokens) by least squares; the ramp starts at the largest
  power-of-two size ≤ a in [B_max/8, B_max] (B_max = max_batch_size) and reaches B_max after
  (B_max − start)/b tokens (b ≤ 0: 100 × the last x). None without 3 finite points."""
  x, y = np.asarray(x, float), np.asarray(y, float)
  if len(x) < 3 or not np.isfinite(y).all():
    return None
  b, a = np.polyfit(x, y, 1)
  start = max([s for s in (max_batch_size >> i for i in range(4)) if s <= a]
              or [max_batch_size >> 3])
  ramp = min((max_batch_size - start) / b if b > 0 else math.inf, 100 * float(x.max()))
  return {"batch.start": int(start), "batch.ramp_tokens": int(round(ramp)),
          "a": float(a), "b_per_token": float(b)}


def fitted_arm(fit: dict | None, tokens: float, max_batch_size: int) -> tuple[int | None, str]:
  """(ramp tokens, "launched") of the fit, run as fitted over the budget `tokens` (ending below
  max_batch_size if longer), or (None, why not): no fit, the paper's ramp, or a B that never
  grows."""
  if fit is None:
    return None, "no fit (fewer than 3 points of B_simple)"
  start, tok = int(fit["batch.start"]), int(fit["batch.ramp_tokens"])
  said = f"the fit's ramp ({tok:,} tokens from B = {start}, budget {int(tokens):,})"
  if start == max_batch_size // 8 and abs(tok / tokens - 1) <= RAMP_TOL:
    return None, f"{said} is linear_paper's"
  if (start >= max_batch_size
      or start + (max_batch_size - start) * tokens / tok < min(2 * start, max_batch_size)):
    return None, f"{said} stays at B = {start} within the budget: fixed_{start}"
  return tok, "launched"
