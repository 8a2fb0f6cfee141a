"""Claim 1: per-example statistics are cheap. The statistics benchmark (`pergrad.bench.stats`:
XLA FLOPs, paired time ratios and peak memory of each backend × granularity × statistic set
over the fastest plain step, in one process); no training runs. Judged as the paper judges:
against `value_and_grad` (each rep's ratio over the contraction step timed beside it, divided
by value_and_grad's), vmap by the paper's figure (≤ 1.17× time, ≈ 1.0× peak memory) and
surgery's per-token statistics by its "≈ free" (declared: ≤ FREE× time and peak). Beside:
the same against the project's contraction path, and surgery's FLOP count (a step is 3
weight-gradient sized contractions, so k more cost 1 + k/3): what it costs.
"""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pergrad import bounds as timing
from pergrad.analysis import calibrate, sequential
from pergrad.analysis.markdown import fmt_num, md_table
from pergrad.analysis.plots import plt, savefig
from pergrad.analysis.report import not_measured
from pergrad.analysis.rules import (
  FAILS,
  HOLDS,
  NOT_REPRODUCED,
  PARTLY,
  REPRODUCED,
  UNDETERMINED,
  bound,
  quartiles,
)
from pergrad.analysis.runs import read_csv, write_csv
from pergrad.analysis.verdict import gated
from pergrad.bench import paired
from pergrad.sweep import How, LaunchLog
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register

NAME = "overhead"
TITLE = "the cost of per-example gradient statistics"
CLAIM = ("Per-example statistics are cheap: graph surgery costs almost nothing over the "
         "mini-batch gradient for per-token (factorable) statistics, and vmap is viable for "
         "transformers (~17% compute, no extra peak memory, at 1.2B parameters).")
PAPER = "vmap ≈ 1.17× time, ≈ 1.0× peak memory; surgery ≈ free"
BENCH = {"ci": {"presets": ("micro",), "batch_sizes": (4,), "reps": 3, "stat_sets": ("sq+sign",),
                "layout_first": False}, "cpu": {"presets": ("tiny", "medium"), "reps": 11},
         "paper": {"presets": ("small", "paper"), "batch_sizes": (32, 128), "reps": 15}}
CONTRACTIONS = {"mean": 0, "norms": 1, "norms@norm": 0, "sq": 1, "sign": 1, "sq+sign": 2, "all": 3}
VMAP_TIME, VMAP_PEAK = 1.17, 1.05  # the paper's figure; ≈ 1.0 peak within 5 %
# the φ maps and reductions beside k extra contractions: O(1/width) of a step
FLOP_SLACK = 0.02
EFFECT = declared(NAME, "effect").value  # below its bound: configs/experiment/overhead.yaml
FREE_D = declared(NAME, "free")  # the paper's "≈ free", as a time and peak bound
FREE = FREE_D.value
REP_CAP_D = declared(NAME, "rep_cap")  # configs/experiment/overhead.yaml
REP_LOOKS, GROWS = 4, ("cpu", "paper")  # looks to the cap at these presets (ci: its reps)
ROW_KEY, PER_REP = ("preset", "B", "backend", "granularity", "stats"), (
    "times", "base_times", "time_ratios")
PAPER_BASE = "value_and_grad"  # the paper's baseline: the plain autodiff step
UNBOUNDED = "reported"  # a ratio shown, not judged
SELF = "contraction"  # the plain candidate timed against itself (its self-ratio)
REPS = ("Reps come in looks of a group-sequential design (Pocock; every look, the first "
        "included, at the design's one-sided critical t, so neither wrong call of a time bound "
        "exceeds 5 % over all the looks; the interval shown is the design's): the preset's "
        "reps, then more, up to the declared cap, while a judged time bound is undetermined.")
RULE = (f"Against {PAPER_BASE} (the paper's baseline): surgery's per-token sq+sign within the "
        f"paper's '≈ free' (declared: ≤ {FREE:g}× time and peak memory; its FLOPs reported); "
        f"vmap within {VMAP_TIME:g}× FLOPs and time and {VMAP_PEAK:g}× peak memory; per shape, "
        f"{timing.BOUND}; the median shape's verdict over shapes (FLOP and peak ratios: "
        "medians). Reproduced if both hold, not reproduced if both fail, partly reproduced if "
        "one holds, else undetermined: not separable (no bound held, one within noise). "
        "Beside, not judged: both against the fastest plain step, surgery against "
        f"its FLOP count 1 + k/3 + {FLOP_SLACK:g} (k = {CONTRACTIONS['sq+sign']} extra "
        f"contractions). {REPS}")


def flop_bound(stats: str) -> float:
  """1 + k/3 (+ FLOP_SLACK when k > 0) for a statistic set needing k extra contractions."""
  k = CONTRACTIONS.get(stats, max(CONTRACTIONS.values()))
  return 1.0 + k / 3.0 + (FLOP_SLACK if k else 0.0)


def rep_design(first: int, cap: float | None) -> sequential.Design:
  """Reps in `REP_LOOKS` looks from `first` to `cap` (None: `first` alone), each at its
  one-sided critical t (`sequential.until_decided`'s design; rates: `sequential.bound_rates`)."""
  return sequential.design(sequential.looks_between(first, max(first, int(cap or first)),
                                                    REP_LOOKS))


def look_path(sweep_dir: Path, k: int) -> Path:
  return Path(sweep_dir) / ("bench.json" if k == 0 else f"bench_look{k + 1}.json")


def looks_of(sweep_dir: Path) -> tuple[list[dict], tuple | None]:
  """(the benchmark documents of the looks run, in order; the design's looks the launch
  recorded, None before it recorded them)."""
  docs, f = [], Path(sweep_dir) / "looks.json"
  while (p := look_path(sweep_dir, len(docs))).exists():
    docs.append(json.loads(p.read_text()))
  return docs, tuple(json.loads(f.read_text())["looks"]) if f.exists() else None


def pooled(docs: list[dict], looks: tuple | None) -> dict:
  """One document of the looks' `docs` (the same rows, each look's reps paired within it):
  each row's per-rep lists concatenated, their time summary recomputed
  (`pergrad.bench.paired.summary`; other fields the first look's); `looks` recorded."""
  rows = [dict(r) for r in docs[0]["rows"]]
  for d in docs[1:]:
    more = {tuple(r[k] for k in ROW_KEY): r for r in d["rows"]}
    for r in rows:
      r |= {f: [*r[f], *more[tuple(r[k] for k in ROW_KEY)][f]] for f in PER_REP}
  for r in rows:
    q = paired.summary(r["time_ratios"])
    r |= {"time_s": float(np.median(r["times"])), "time_ratio": q["median"],
          "time_location": q["location"], "time_lo": q["lo"], "time_hi": q["hi"]}
    r["time_ratio_q25"], r["time_ratio_q75"] = map(float, quartiles(r["time_ratios"]))
  return {**docs[0], "rows": rows, "rep_looks": list(looks or [len(rows[0]["time_ratios"])]),
          "looks": [{"argv": d.get("argv"), "loadavg_at_end": d.get("machine", {}).get(
              "loadavg_at_end")} for d in docs]}


def table(doc: dict) -> pd.DataFrame:
  """A pooled document's rows as the CSV holds them (per-rep lists as JSON, `rep_looks`)."""
  df = pd.json_normalize(doc["rows"])
  for c in PER_REP:
    df[c] = df[c].map(json.dumps)
  df["rep_looks"] = json.dumps(doc["rep_looks"])
  return df


def launch(preset: str, sweep_dir: Path, how: How, benches=BENCH, is_open=None, cap=REP_CAP_D):
  """The benchmark `benches[preset]` at the first look of `rep_design` (each look's JSON kept
  in the sweep dir, one already there skipped), then the next look's reps while
  `is_open(pooled table, the last look's critical t)` (a judged time bound undetermined), to
  the declared `cap` (presets in GROWS; else the first look alone)."""
  from pergrad.bench import stats

  bench, log, echo = benches[preset], LaunchLog(), how.echo
  des = rep_design(bench["reps"], cap.value if preset in GROWS and is_open else None)
  if not how.dry_run:
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "looks.json").write_text(json.dumps({"looks": list(des.looks)}))
  t0 = time.time()
  for k, n in enumerate(des.looks):
    if (out := look_path(sweep_dir, k)).exists():
      echo(f"[skip] {out} exists (delete it to re-measure)")
      log.skipped.append(out.stem)
      continue
    if k and not is_open(table(pooled(*looks_of(sweep_dir))), des.crit_equiv[k - 1]):
      break
    args = {**bench, "reps": n - (des.looks[k - 1] if k else 0)}
    echo(f"[launch] pergrad.bench.stats.run({args})" + (
        f": look {k + 1} of {len(des.looks)}, a time bound open at {des.looks[k - 1]} reps"
        if k else ""))
    log.launched.append(out.stem)
    if how.dry_run:
      return log
    try:
      doc = stats.run(**args, echo=echo)
    except Exception as e:  # one line for `reproduce.py all`, which goes on with the others
      raise RuntimeError(f"the statistics benchmark failed: {type(e).__name__}: {e}") from e
    out.write_text(json.dumps(doc, indent=1))
  log.wall_s = time.time() - t0
  return log


def describe_setup(preset: str, benches=BENCH) -> str:
  from pergrad.bench import stats

  args = " ".join(stats.as_argv(**benches[preset]))
  return f"`python scripts/bench_stats.py {args}` (no training runs)."


def bench_table(runs, out_dir) -> pd.DataFrame:
  """The benchmark's rows, its looks pooled (`pooled`, written to `out_dir` as bench.json)."""
  doc = pooled(*looks_of(runs.sweep_dir))
  (Path(out_dir) / "bench.json").write_text(json.dumps(doc, indent=1))
  return table(doc)


def analyze(runs, out_dir):
  write_csv(bench_table(runs, out_dir), Path(out_dir) / "overhead.csv")


def figures(out_dir):
  df = read_csv(Path(out_dir) / "overhead.csv")
  fig, axes = plt().subplots(1, 3, figsize=(15, 5))
  lab = df[["preset", "B", "backend", "granularity", "stats"]].astype(str).agg(" ".join, axis=1)
  for ax, c in zip(axes, ("time_ratio", "peak_ratio", "flops_ratio"), strict=True):
    ax.barh(range(len(df)), df[c])
    ax.set_yticks(range(len(df)), lab, fontsize=6)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel(f"{c} (1 = fastest plain step)")
  return [savefig(fig, Path(out_dir) / "overhead.png")]


def rebased(df: pd.DataFrame, rows: pd.DataFrame, base: str = PAPER_BASE) -> pd.DataFrame:
  """`rows` over backend `base`'s plain step of the same shape: FLOP and peak ratios over its,
  and each rep's time ratio (over the contraction step timed beside it) divided by `base`'s
  rep of the same index, with their median and quartiles (shapes without `base`: dropped)."""
  ref = df[(df["backend"] == base) & (df["stats"] == "mean")].drop_duplicates(["preset", "B"])
  ref = ref.set_index(["preset", "B"])
  out = []
  for r in rows.to_dict("records"):
    if (key := (r["preset"], r["B"])) not in ref.index:
      continue
    b = ref.loc[key]
    x = np.asarray(json.loads(r["time_ratios"]), float)
    y = np.asarray(json.loads(b["time_ratios"]), float)
    ratios = x[:len(y)] / y[:len(x)]
    q25, q75 = quartiles(ratios)
    out.append({**r, "flops_ratio": r["flops"] / b["flops"], "peak_ratio": r["peak_bytes"]
                / b["peak_bytes"], "time_ratio": float(np.median(ratios)),
                "time_ratio_q25": float(q25), "time_ratio_q75": float(q75),
                "time_ratios": json.dumps([float(x) for x in ratios])})
  return pd.DataFrame(out, columns=list(rows.columns))


def judged(df: pd.DataFrame, rows: pd.DataFrame, limit: float, peak_limit=math.inf,
           flops: bool = True, crit: float | None = None) -> dict:
  """Medians over `rows`' shapes of the FLOP, time (q25, q75) and peak ratios; the time bound
  judged per shape on the location of its paired per-rep ratios (`timing.location`: the
  geometric mean's 90% interval), never tighter than the baseline timed against itself (the
  upper end of its self-ratio's interval there, `self_hi`), and the median shape's verdict
  taken; FLOPs and peak by `rules.bound` on their medians (FLOPs reported, not bounded, when
  not `flops`); `crit`: the critical t of the reps' look (`reading`; None: one look's)."""
  med = lambda c, r=rows: float(r[c].median()) if c in r and len(r) else math.nan
  base = df[(df["backend"] == SELF) & df.set_index(["preset", "B"]).index.isin(
      rows.set_index(["preset", "B"]).index)]
  m = {"flops": med("flops_ratio"), "time": med("time_ratio"), "q25": med("time_ratio_q25"),
       "q75": med("time_ratio_q75"), "peak": med("peak_ratio"), "limit": limit,
       "shapes": len(rows)}
  m["flops_outcome"] = bound(m["flops"], limit) if flops else UNBOUNDED
  mid = lambda xs: float(np.median(xs)) if len(xs) else math.nan
  reps = lambda r: json.loads(str(r["time_ratios"]))
  m["self_hi"] = mid([timing.location(reps(r), 1.0).hi for r in base.to_dict("records")])
  reach = max(limit, m["self_hi"]) if np.isfinite(m["self_hi"]) else limit
  m["reach"] = reach  # the time bound judged: `limit`, or the baseline's self-ratio above it
  locs = [timing.location(reps(r), reach, crit) for r in rows.to_dict("records")]
  m["interval"] = "90%" if crit is None else f"the design's, one-sided t > {crit:.3g}"
  m["time_outcome"] = timing.median_verdict([x.verdict for x in locs])
  m |= {k: mid([getattr(x, a) for x in locs])
        for k, a in (("geo", "ratio"), ("lo", "lo"), ("hi", "hi"), ("log_sd", "log_sd"))}
  m["peak_outcome"] = bound(m["peak"], peak_limit) if math.isfinite(peak_limit) else HOLDS
  return m


def of_sides(outs: dict, missing=()) -> str:
  """Reproduced if every bound holds, not reproduced if every one fails, partly reproduced if
  one holds, else undetermined naming those within noise; a bound not measured (`missing`)
  holds nothing."""
  vals = [*outs.values(), *(["not measured"] * len(missing))]
  if all(o == HOLDS for o in vals):
    return REPRODUCED
  if all(o == FAILS for o in vals):
    return NOT_REPRODUCED
  if HOLDS in vals:
    return PARTLY
  noisy = [k for k, o in outs.items() if o not in (HOLDS, FAILS)]
  return f"{UNDETERMINED}: not separable ({', '.join(noisy) or 'not measured'} within noise)"


def side(m: dict) -> str:
  outs = [o for o in (m["flops_outcome"], m["time_outcome"], m["peak_outcome"]) if o != UNBOUNDED]
  return FAILS if FAILS in outs else HOLDS if all(o == HOLDS for o in outs) else "within noise"


def text(what: str, m: dict) -> str:
  return (f"{what}: FLOPs {fmt_num(m['flops'])}× ({m['flops_outcome']}), time "
          f"{fmt_num(m['geo'])}× [{m.get('interval', '90%')}: {fmt_num(m['lo'])}, "
          f"{fmt_num(m['hi'])}] vs ≤ "
          f"{fmt_num(m.get('reach', m['limit']))}"
          + (f" (the bound {m['limit']:.3g}, raised to the baseline's self-ratio)"
             if m.get("reach", m["limit"]) > m["limit"] else "")
          + f" ({m['time_outcome']}; rep quartiles [{fmt_num(m['q25'])}, "
          f"{fmt_num(m['q75'])}]; baseline self-ratio's 90% upper end "
          f"{fmt_num(m['self_hi'])}), peak memory {fmt_num(m['peak'])}× "
          f"({m['peak_outcome']})")


def reading(df: pd.DataFrame) -> tuple[sequential.Design | None, float | None, str, int]:
  """(the reps' design: the looks the launch recorded, else one look at the reps run; the
  critical t of the look the reps reached, None where none matches: one look's; a sentence;
  the reps counted)."""
  reps = int(np.median([len(json.loads(str(x))) for x in df["time_ratios"]])) if len(df) else 0
  looks = tuple(json.loads(str(df["rep_looks"].iloc[0]))) if "rep_looks" in df else (reps,)
  if reps < 2 or looks[0] < 2 or reps not in looks:
    return None, None, f"Reps: {reps} (one look).", reps
  des, k = sequential.design(looks), looks.index(reps)
  return des, des.crit_equiv[k], (f"Reps: {reps} of up to {des.cap} (look {k + 1} of "
                                  f"{len(looks)}, one-sided t > {des.crit_equiv[k]:.3g})."), reps


def time_calibration(m: dict, reps: int, effect: float = EFFECT,
                     des: sequential.Design | None = None) -> calibrate.Calibration:
  """`timing.RULE` at the judged shapes' median per-rep log-ratio sd by the reps' design
  `des` over its looks (`sequential.bound_rates`; None: one look at `reps`): its false alarm
  (holds at a true ratio on the bound) and its power for a variant `effect` below its bound,
  but never below a ratio of 1: a bound within the effect of the plain step (norm_cost's
  1.01) is powered for a truly free variant, the claim's, not for one faster than the step it
  adds work to."""
  eff = min(effect, m["limit"] - 1.0) if m["limit"] > 1.0 else effect
  sd = m.get("log_sd", math.nan)
  if not (np.isfinite(sd) and reps >= 2):
    return calibrate.Calibration("bound location", sd, reps, eff, math.nan, math.nan)
  des = des or rep_design(reps, None)
  at = lambda ratio: sequential.bound_rates(des, sd, ratio, m["limit"])[timing.HOLDS]
  return calibrate.Calibration("bound location", sd, reps, eff, at(m["limit"]),
                               at(m["limit"] - eff))


def rows_judged(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
  """(surgery's per-token sq+sign rows, vmap's rows): the two the paper judges."""
  return (df[(df["backend"] == "surgery") & (df["granularity"] == "token")
             & (df["stats"] == "sq+sign")], df[df["backend"] == "vmap"])


def paper_sides(df: pd.DataFrame, crit: float | None = None) -> tuple[dict, dict]:
  """The paper's comparisons, against value_and_grad: surgery's per-token sq+sign within
  FREE (its FLOPs reported), vmap within its figure (`judged` at `crit`)."""
  tok, vm = rows_judged(df)
  return (judged(df, rebased(df, tok), FREE, FREE, flops=False, crit=crit),
          judged(df, rebased(df, vm), VMAP_TIME, VMAP_PEAK, crit=crit))


def is_open(df: pd.DataFrame, crit: float) -> bool:
  """A paper's time bound undetermined at the look of critical t `crit` (`launch`)."""
  return any(m["time_outcome"] == UNDETERMINED for m in paper_sides(df, crit))


def report(out_dir):
  df = read_csv(Path(out_dir) / "overhead.csv")
  if "time_ratio_q25" not in df or "backend" not in df:
    return not_measured(RULE, "the benchmark has no paired time ratios")
  des, crit, reps_text, reps = reading(df)
  tok, vm, (s, v) = *rows_judged(df), paper_sides(df, crit)
  outs = side(s), side(v)
  verdict = of_sides({"surgery per-token sq+sign": outs[0], "vmap": outs[1]})
  beside = (judged(df, tok, flop_bound("sq+sign"), crit=crit),
            judged(df, vm, VMAP_TIME, VMAP_PEAK, crit=crit))
  sides = (("surgery per-token sq+sign", s, outs[0]), ("vmap", v, outs[1]))
  cals = {f"{w} vs {PAPER_BASE}": time_calibration(m, reps, des=des) for w, m, _ in sides}
  return gated(verdict, cals, rule=RULE, paper=PAPER,
               decided=list(cals),  # an undetermined bound reads partly reproduced
               ours=f"vs {PAPER_BASE}: surgery/token sq+sign {outs[0]} '≈ free' "
               f"({fmt_num(s['geo'])}× time), vmap {outs[1]} ({fmt_num(v['geo'])}× time)",
               checks=(text(f"surgery per-token sq+sign vs {PAPER_BASE} ('≈ free')", s),
                       text(f"vmap per-example vs {PAPER_BASE}", v),
                       "Beside, against the fastest plain step (contraction): "
                       + text("surgery per-token sq+sign against its FLOP count", beside[0]),
                       text("vmap per-example", beside[1]), reps_text,
                       declared_text(FREE_D, REP_CAP_D)),
               numbers_md=md_table(df.drop(columns=[*PER_REP, "rep_looks"], errors="ignore")))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='C1. Per-example statistics are cheap',
    papers_test=True, rank=1, stream=1, launch=functools.partial(launch, is_open=is_open),
    analyze=analyze, figures=figures, report=report, describe_setup=describe_setup))
