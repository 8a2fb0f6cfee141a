"""Re-analyse the committed runs of a reproduction with the decision rules of
`pergrad.analysis.decide` (paired on shared seeds: a detected difference decided whatever its
power, absence read by TOST equivalence or non-inferiority, else "not separable" with the
seeds that would settle it), `pergrad.analysis.timing` (a time bound on the paired ratio's
geometric mean) and `pergrad.analysis.budget` (same_budget, where a run's budget is recorded).
No training: the same runs, read from their committed CSVs. Each experiment's other guards
(bracketed, stable, warm, in_regime, pilot) are carried as committed; `powered` no longer
gates, its power is reported beside. Writes a before/after table per claim.

    python scripts/reanalyse.py [--results results/cpu] [--out results/reanalysis]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import (  # noqa: E402
  batch_scaling,
  gns_ramp,
  gns_schedule,
  lr_exponent,
  lr_search,
  moments,
  msq_eps,
  overhead,
  preconditioner,
  sign_placement,
  snr,
)
from experiments.claims import OURS, PAPERS_TEST  # noqa: E402
from pergrad.analysis import budget, decide, guards, leafwise, rules, timing  # noqa: E402

D = decide
REPRODUCED, NOT_REPRODUCED, PARTLY = rules.REPRODUCED, rules.NOT_REPRODUCED, rules.PARTLY
UNDET = "undetermined"


def old_report(out: Path) -> dict:
  doc = json.loads((out / "report.json").read_text())
  return {"verdict": doc.get("verdict", ""), "rule_verdict": doc.get("rule_verdict", ""),
          "commit": doc.get("commit", ""), "guards": doc.get("guards") or [],
          "calibrations": doc.get("calibrations") or {}, "ours": doc.get("ours", "")}


def old_effect(old: dict, key: str, default: float = math.nan) -> float:
  c = old["calibrations"].get(key) or {}
  return float(c.get("effect", default))


def carried(verdict: str, old: dict, extra=()) -> str:
  """`verdict` after the committed guards but `powered` (and any `extra` guards)."""
  kept = [guards.Guard(g["name"], g["ok"], g["why"]) for g in old["guards"]
          if g["name"] != "powered"]
  return guards.apply(verdict, [*kept, *extra])


def pairs_verdict(ps) -> str:
  """Each comparison expected a win: reproduced if all win, not reproduced if one loses or all
  are shown equivalent, partly if some win, else undetermined: not separable (naming them)."""
  out = [p.outcome for p in ps]
  if D.LOSS in out or (out and all(o == D.EQUIVALENT for o in out)):
    return NOT_REPRODUCED
  if out and all(o == D.WIN for o in out):
    return REPRODUCED
  if D.WIN in out:
    return PARTLY
  open_ = [f"{p.a} vs {p.b}" for p in ps if p.outcome == D.NOT_SEPARABLE]
  return f"{UNDET}: not separable ({'; '.join(open_)})" if open_ else UNDET


def by_seed(seeds, values) -> dict:
  return {float(s): float(v) for s, v in zip(seeds, values, strict=True)}


def best_arms(out: Path, labeler) -> dict:
  best = lr_search.load_best(out)
  seeds, vals = lr_search.seeds_by_label(best, labeler), lr_search.by_label(best, labeler)
  return {k: by_seed(seeds[k], vals[k]) for k in vals if len(seeds[k]) == len(vals[k])}


def row(p: D.Paired, old_outcome: str = "") -> dict:
  r = {k: v for k, v in p.row().items() if k not in ("why",)}
  return {"comparison": f"{p.a} vs {p.b}", "old": old_outcome, "new": p.outcome,
          **{k: r[k] for k in ("n", "advantage", "lo95", "hi95", "sd_paired", "half_paired",
                               "half_unpaired", "power", "power_equivalence", "effect", "margin",
                               "within_margin",
                               "seeds_to_settle", "sign_flip_p")}}


def old_outcomes(old: dict) -> dict:
  """{"a vs b": outcome} from the committed `ours` ("a vs b: win; ...")."""
  out = {}
  for part in old["ours"].split(";"):
    if " vs " in part and ":" in part:
      k, _, v = part.rpartition(":")
      out[k.strip()] = v.strip()
  return out


def pairs_claim(old, arms, expected, effect, lower_is_better=True, verdict_fn=pairs_verdict):
  """Each expected pair (a beats b) read on its shared seeds, absence by TOST at ±effect."""
  ps = [D.compare(arms.get(a, {}), arms.get(b, {}), (a, b), effect=effect, margin=effect,
                  lower_is_better=lower_is_better) for a, b in expected]
  was = old_outcomes(old)
  return carried(verdict_fn(ps), old), [row(p, was.get(f"{p.a} vs {p.b}", "")) for p in ps]


def do_sign_placement(out, old):
  arms = best_arms(out, lambda r: str(r["optimizer.placement"]))
  exp = rules.adjacent([p for p in c if p in arms] for c in sign_placement.CHAINS)
  return pairs_claim(old, arms, exp, old_effect(old, "ema vs batch", 0.05))


def do_preconditioner(out, old):
  every = lr_search.load_best(out)
  best = preconditioner.chosen(every)
  arms = {preconditioner.label(r): by_seed(str(r["fresh_seeds"]).split(), r["values"])
          for r in best.to_dict("records")}
  exp = preconditioner.expected_pairs(best.to_dict("records"))
  verdict, rows = pairs_claim(old, arms, exp, preconditioner.EFFECT.value)
  msq = every[every["optimizer.variant"] == "micro_adam_msq"]  # the ε choice, on every seed
  name = lambda r: f"eps={float(r['optimizer.eps']):g}"
  eps = {name(r): by_seed(str(r["fresh_seeds"]).split(), r["values"])
         for r in msq.to_dict("records") if r["n_seeds"]}
  chosen = name(best[best["optimizer.variant"] == "micro_adam_msq"].iloc[0])
  eff = preconditioner.EFFECT.value
  tuned = [row(D.compare(eps[k], eps[chosen], (f"msq {k}", f"msq {chosen} (chosen on seed 0)"),
                         effect=eff, margin=eff), "") for k in eps if k != chosen]
  sel = {name(r): float(r["select_loss"])
         for r in msq.to_dict("records")}
  note = ("ε chosen on the selection seed alone (seed 0: " + ", ".join(
      f"{k} {v:.4f}" for k, v in sorted(sel.items())) + "); the rows 'msq eps=… vs msq "
      f"{chosen}' compare every other ε on the fresh seeds (not a re-choice: fresh seeds are "
      "for reporting)")
  return verdict, rows + tuned, note


def do_msq_eps(out, old):
  a = msq_eps.arms(out)
  g = {k: by_seed(s, v) for k, (s, v) in a.items()}
  msq = next(n for n in g if n.startswith(msq_eps.MSQ))
  eps = msq.split("eps=")[-1]
  adam = next(n for n in g if n.startswith(msq_eps.ADAM + ",") and n.split("eps=")[-1] != eps
              and n != msq_eps.CONTROL)
  controls = [c for c in (msq_eps.CONTROL, f"{msq_eps.ADAM}, eps={eps}") if c in g]
  m, eff = msq_eps.MARGIN.value, msq_eps.EFFECT.value
  ps = [D.compare(g[msq], g[adam], (msq, adam), effect=m, margin=m, noninferiority=True),
        *(D.compare(g[msq], g[c], (msq, c), effect=eff, margin=eff) for c in controls)]
  head = ps[0].outcome
  v = (NOT_REPRODUCED if head == D.WORSE else f"{UNDET}: not separable ({ps[0].a} vs {ps[0].b})"
       if head == D.NOT_SEPARABLE else REPRODUCED
       if all(p.outcome == D.WIN for p in ps[1:]) else PARTLY)
  was = old_outcomes(old)
  return carried(v, old), [row(p, was.get(f"{p.a} vs {p.b}", "")) for p in ps]


def do_gns_ramp(out, old):
  tt = pd.read_csv(out / "to_target.csv")
  arms = {k: by_seed(g["train.seed"], g["final_eval_loss"]) for k, g in tt.groupby("arm")}
  eff = old_effect(old, "ramp vs fixed", gns_ramp.EFFECT.value)
  p = D.compare(arms.get("ramp", {}), arms.get("fixed", {}), ("ramp", "fixed"), effect=eff,
                margin=eff)
  v = (REPRODUCED if p.outcome == D.WIN else NOT_REPRODUCED if p.outcome in (D.LOSS, D.EQUIVALENT)
       else f"{UNDET}: not separable (ramp vs fixed)")
  return carried(v, old), [row(p, old_outcomes(old).get("ramp vs fixed", ""))]


def do_gns_schedule(out, old):
  tt = pd.read_csv(out / "to_target.csv")
  search = lr_search.load_best(out)
  base = f"fixed_{int(search[search['best_arm']].iloc[0][gns_schedule.SIZE])}"
  arms = {k: by_seed(g["train.seed"], g["final_eval_loss"]) for k, g in tt.groupby("arm")}
  exp = [(k, base) for k in gns_schedule.GUIDED if k in arms]
  return pairs_claim(old, arms, exp, gns_schedule.EFFECT.value)


def do_snr(out, old):
  per_leaf = pd.read_csv(out / "snr_per_leaf.csv")
  sizes = leafwise.read_sizes(out)
  keys = snr._by(per_leaf) + ["train.seed", "stage", "leaf"]
  means = leafwise.second_half(per_leaf).groupby(keys, dropna=False)["snr2"].mean().reset_index()
  views = snr.leaf_views(means, sizes)
  arms, exp, effects = {}, [], {}
  for k in snr._placements(views):
    v, tag = (views, "") if k is None else (views[views[snr.PLACEMENT] == k], f"{k}:")
    for st in ("snr2_ema", "snr2_batch"):
      s = v[v["stage"] == st].dropna(subset=[snr.VIEW])
      arms[tag + st[5:]] = by_seed(s["train.seed"], s[snr.VIEW])
    exp.append((tag + "ema", tag + "batch"))
    effects[tag] = snr.EFFECT.value * float(np.mean(list(arms[tag + "batch"].values())))
  was = old_outcomes(old)
  ps = [D.compare(arms[a], arms[b], (a, b), effect=effects[a[:-3]], margin=effects[a[:-3]],
                  lower_is_better=False) for a, b in exp]
  return carried(pairs_verdict(ps), old), [row(p, was.get(f"{p.a} vs {p.b}", "")) for p in ps]


def do_moments(out, old):
  raw = pd.read_csv(out / "moments_all.csv")
  big = raw[raw["B"].notna()] if "B" in raw else raw[:0]
  sizes = [None, *sorted(int(b) for b in big["B"].unique())] if len(big) else [None]
  ps, was = [], old_outcomes(old)
  for b in sizes:
    for w in moments.WINDOWS:
      v = moments.leaf_views(out, w, b)
      for name, col in ([] if v is None else moments.VIEWS.items()):
        cell = f"{w} half, B={'ref' if b is None else b}, {name}"
        r = v.dropna(subset=[col])
        one = {float(s): 1.0 for s in r["train.seed"]}  # the claim's threshold, every seed
        ps.append(D.compare(by_seed(r["train.seed"], r[col]), one, (f"μ² ({cell})",
                            f"1 ({cell})"), effect=moments.EFFECT.value,
                            margin=moments.EFFECT.value, lower_is_better=False))
  return carried(pairs_verdict(ps), old), [row(p, was.get(f"{p.a} vs {p.b}", "")) for p in ps]


def do_batch_scaling(out, old):
  curves = pd.read_csv(out / "curves.csv")
  key, seed, sc_key = batch_scaling.KEY, batch_scaling.SEED, batch_scaling.SCALING
  ref_b = int(curves["ref"].iloc[0])
  ref = curves[curves[key] == ref_b]
  xs = np.array(sorted(x for x in ref.dropna(subset=["eval/loss"])["examples_seen"].unique()
                       if x > ref["examples_seen"].max() / 2))
  split = ref[seed].isin(batch_scaling.MARGIN_SEEDS["cpu"])
  m = batch_scaling.margin(batch_scaling._seed_curves(ref[split], xs))
  main = ref[~split]
  ref_y = batch_scaling._seed_curves(main, xs)
  ref_by = {float(s): float(np.nanmean(y)) for s, y in zip(sorted(main[seed].unique()), ref_y,
                                                             strict=True)}
  col, _, _ = batch_scaling.collapse(curves)  # the committed rule's outcomes
  was = {(r[sc_key], int(r[key])): r["outcome"] for r in col.to_dict("records")}
  was_pairs = old_outcomes(old)
  rows_, outs, mis = [], {}, {}
  for (sc, b), runs in curves[curves[key] != ref_b].groupby([sc_key, key], sort=False):
    k = batch_scaling.LONG_FACTOR if sc == batch_scaling.LONG else 1
    y = batch_scaling._seed_curves(runs, xs * k)
    seeds = sorted(runs[seed].unique())
    arm = {float(s): float(np.nanmean(r)) for s, r in zip(seeds, y, strict=True)}
    p = D.compare(arm, ref_by, (f"{sc} at B={int(b)}", "B_ref"), effect=m, margin=m)
    guard_ok = float(np.max(np.abs(np.nanmean(y, 0) - ref_y.mean(0)))) <= rules.GUARD * m
    beyond = p.lo95 > m or p.hi95 < -m
    outs[(sc, int(b))] = ("collapses" if p.within_margin and guard_ok else "breaks" if beyond
                          else "undetermined")
    mis.update({(sc, int(b), float(s)): float(np.nanmean(np.abs(r - ref_y.mean(0))))
                for s, r in zip(seeds, y, strict=True)})
    rr = row(p, was.get((sc, int(b)), ""))
    rr["new"] = outs[(sc, int(b))]
    rows_.append(rr)
  sq = {o: sorted(b for (s, b), x in outs.items() if s == "sqrt" and x == o)
        for o in ("collapses", "breaks", "undetermined")}
  sizes = sorted({b for (_, b) in outs if True})
  at = min(sq["breaks"]) if sq["breaks"] else max(sizes)
  gap = lambda s: {sd: v for (a, b, sd), v in mis.items() if a == s and b == at}
  ps = [D.compare(gap("sqrt"), gap(o), (f"sqrt at B={at}", f"{o} at B={at}"), effect=m,
                  margin=m)
        for o in ("linear", "none") if gap(o)]
  rows_ += [row(p, was_pairs.get(f"{p.a} vs {p.b}", "")) for p in ps]
  if not (sq["collapses"] or sq["breaks"]):
    v = f"{UNDET}: not separable (no √ arm collapses or breaks)"
  elif any(p.outcome == D.LOSS for p in ps) or not (sq["collapses"] or sq["undetermined"]):
    v = NOT_REPRODUCED
  elif (sq["breaks"] and any(ref_b < b < at for b in sq["collapses"])
        and all(b in sq["collapses"] for b in sizes if b < at) and ps
        and all(p.outcome == D.WIN for p in ps)):
    v = REPRODUCED
  else:
    v = PARTLY
  note = (f"margin ±{m:.4g}; √: collapses at B={sq['collapses']}, breaks at B={sq['breaks']}, "
          f"undetermined at B={sq['undetermined']} (paired TOST on the per-seed second-half "
          "curve averages, the point guard kept)")
  return carried(v, old), rows_, note


ORDER = (timing.HOLDS, timing.UNDETERMINED, timing.FAILS)


def median_verdict(verdicts) -> str:
  """The median shape's verdict (holds < undetermined < fails; of an even count, the two middle
  ones where they agree, else undetermined), as the old rule took medians over shapes."""
  v = sorted(verdicts, key=ORDER.index)
  if not v:
    return timing.UNDETERMINED
  lo, hi = v[(len(v) - 1) // 2], v[len(v) // 2]
  return lo if lo == hi else timing.UNDETERMINED


def bench_side(df, rows, limit, peak_limit=math.inf, flops=True):
  """Per shape: the paired ratios over value_and_grad's (`overhead.rebased`'s) judged on their
  location; over shapes, the median shape's time verdict, the FLOP and peak ratios' medians
  against their bounds as before. (side, rows)."""
  out = []
  reb = overhead.rebased(df, rows)
  ref = df[(df["backend"] == overhead.PAPER_BASE) & (df["stats"] == "mean")].drop_duplicates(
      ["preset", "B"]).set_index(["preset", "B"])
  for r in reb.to_dict("records"):
    b = ref.loc[(r["preset"], r["B"])]
    x = np.asarray(json.loads(r["time_ratios"]), float)
    y = np.asarray(json.loads(b["time_ratios"]), float)
    loc = timing.location(x[:len(y)] / y[:len(x)], limit)
    out.append({"comparison": f"{r['backend']}/{r['granularity']}/{r['stats']} at "
                f"{r['preset']} B={r['B']} vs {overhead.PAPER_BASE}", "new": loc.verdict,
                "ratio": loc.ratio, "lo90": loc.lo, "hi90": loc.hi, "n": loc.n,
                "bound": limit, "flops_ratio": r["flops_ratio"], "peak_ratio": r["peak_ratio"],
                "old_median_q25_q75": [r["time_ratio"], r["time_ratio_q25"],
                                       r["time_ratio_q75"]]})
  fl, pk = float(reb["flops_ratio"].median()), float(reb["peak_ratio"].median())
  outs = [median_verdict([o["new"] for o in out]),
          *([timing.HOLDS if fl <= limit else timing.FAILS] if flops else []),
          timing.HOLDS if pk <= peak_limit else timing.FAILS]
  side = (timing.FAILS if timing.FAILS in outs else timing.HOLDS
          if all(o == timing.HOLDS for o in outs) else timing.UNDETERMINED)
  return side, out, f"time {outs[0]}, FLOPs {fl:.3g}×, peak {pk:.3g}×"


def do_overhead(out, old):
  df = pd.read_csv(out / "overhead.csv")
  tok = df[(df["backend"] == "surgery") & (df["granularity"] == "token")
           & (df["stats"] == "sq+sign")]
  s, rs, ts = bench_side(df, tok, overhead.FREE, overhead.FREE, flops=False)
  v, rv, tv = bench_side(df, df[df["backend"] == "vmap"], overhead.VMAP_TIME, overhead.VMAP_PEAK)
  outs = (s, v)
  verdict = (REPRODUCED if outs == (timing.HOLDS,) * 2 else NOT_REPRODUCED
             if outs == (timing.FAILS,) * 2 else PARTLY)
  return (carried(verdict, old), rs + rv,
          f"surgery per-token sq+sign: {s} ({ts}); vmap: {v} ({tv})")


def do_norm_cost(out, old):
  from experiments import norm_cost

  df = pd.read_csv(out / "paired.csv")
  rows_, outs = [], {}
  for variant, what, lim in norm_cost.BOUNDS:
    times, flops = [], []
    for (preset, b), g in df[df["variant"] == variant].groupby(["preset", "B"]):
      loc = timing.location(g.sort_values("rep")["time_ratio"], lim)
      times.append(loc.verdict)
      flops.append(float(g["flops_ratio"].iloc[0]))
      rows_.append({"comparison": f"{what} ({variant}) at {preset} B={b} vs the fastest plain "
                    "step", "new": loc.verdict, "ratio": loc.ratio, "lo90": loc.lo,
                    "hi90": loc.hi, "n": loc.n, "bound": lim, "flops_ratio": flops[-1]})
    t, fl = median_verdict(times), float(np.median(flops)) if flops else math.nan
    o = [t, timing.HOLDS if fl <= lim else timing.FAILS]
    outs[what] = (timing.FAILS if timing.FAILS in o else timing.HOLDS
                  if all(x == timing.HOLDS for x in o) else timing.UNDETERMINED)
  verdict = (NOT_REPRODUCED if timing.FAILS in outs.values() else REPRODUCED
             if all(o == timing.HOLDS for o in outs.values()) else PARTLY)
  return carried(verdict, old), rows_, "; ".join(f"{w}: {o}" for w, o in outs.items())


def declared_budget(fin: pd.DataFrame, preset: str) -> dict:
  """run -> its B's declared budget, as `lr_exponent.sweep` plans each B's first-stage block."""
  from experiments.sweep import family, scale_value

  rb = int(scale_value(preset, "data.batch_size"))
  examples = rb * int(scale_value(preset, "train.steps"))
  warm = max(rb * int(scale_value(preset, "schedule.warmup_steps")),
             guards.MIN_WARMUP * max(lr_exponent.SIZES[family(preset)]))
  out = {}
  for r in fin.to_dict("records"):
    b = int(r[lr_exponent.KEY])
    out[r["run"]] = budget.Budget(examples=examples // b * b, steps=examples // b,
                                  warmup_steps=max(warm // b, 1))
  return out


def do_lr_exponent(out, old, preset: str):
  fin = pd.read_csv(out / "finals.csv")
  recs = {r["run"]: budget.of_finals(r, int(r[lr_exponent.KEY])) for r in fin.to_dict("records")}
  g = budget.same_budget(recs, declared_budget(fin, preset))
  bad = {r.split(":")[0] for r in g.why.split("; ")} if not g.ok else set()
  f_all = lr_exponent.fit(lr_exponent.lr_star(fin))
  right = fin[~fin["run"].isin(bad)]
  star = lr_exponent.lr_star(right)
  f = lr_exponent.fit(star)
  bracket, _ = lr_exponent.star_guards(star, right)
  v_right = guards.apply(lr_exponent.judge(f), [bracket])
  note = (f"same_budget: {'passes' if g.ok else 'FAILS'} ({len(bad)} of {len(fin)} runs off "
          f"their B's budget); α on all runs {f_all['alpha']:.2f} [{f_all['lo95']:.2f}, "
          f"{f_all['hi95']:.2f}] (95%); on the right-budget runs alone {f['alpha']:.2f} "
          f"[{f['lo95']:.2f}, {f['hi95']:.2f}], which reads {v_right}")
  return carried(lr_exponent.judge(f_all), old, [g]), [], note


def analyse(root: Path) -> list[dict]:
  jobs = {"overhead": do_overhead, "sign_placement": do_sign_placement,
          "preconditioner": do_preconditioner, "batch_scaling": do_batch_scaling,
          "norm_cost": do_norm_cost, "gns_ramp": do_gns_ramp, "snr": do_snr,
          "msq_eps": do_msq_eps, "moments": do_moments, "lr_exponent": None,
          "gns_schedule": do_gns_schedule}
  rows = []
  places = [(n, root / n, "cpu") for n in jobs] + [
      (n, root / "ladder" / rung / n, f"cpu_{rung}") for rung in ("xxs", "xs", "s")
      for n in ("gns_ramp", "moments", "lr_exponent")]
  for name, out, preset in places:
    if not (out / "report.json").exists():
      continue
    old = old_report(out)
    fn = jobs.get(name)
    res = (do_lr_exponent(out, old, preset) if name == "lr_exponent" else fn(out, old))
    verdict, comps, note = (*res, "") if len(res) == 2 else res
    claim = PAPERS_TEST.get(name) or OURS.get(name, name)
    rows.append({"claim": claim + ("" if preset == "cpu" else f" (ladder {preset})"),
                 "experiment": name, "where": str(out.relative_to(root.parent.parent)),
                 "old_verdict": old["verdict"], "old_rule_verdict": old["rule_verdict"],
                 "old_commit": old["commit"], "new_verdict": verdict, "note": note,
                 "comparisons": comps})
  return rows


def fmt(x) -> str:
  if isinstance(x, float):
    return "n/a" if math.isnan(x) else f"{x:.3g}"
  return str(x)


def markdown(rows: list[dict], prov: dict) -> str:
  head = ["# Re-analysis of the committed runs with the new decision rules", "",
          f"`python scripts/reanalyse.py` at commit {prov['commit'][:7]}"
          f"{'' if prov['clean'] else ' (uncommitted changes)'}; the runs as committed in "
          f"results/cpu at commits {', '.join(sorted({r['old_commit'][:7] for r in rows}))}. "
          "No training: the same runs, the new rules (`pergrad.analysis.decide`, `timing`, "
          "`budget`). Pairs are read on the shared seeds (paired t, 95%): a detected difference "
          "is decided whatever its power (listed beside as the design's, for the declared "
          "effect); absence is read by TOST (90% interval within ±margin; the declared effect "
          "where no margin is declared), else 'not separable', with the seeds that would settle "
          "it at the observed paired sd and gap. Time bounds: the 90% interval of the geometric "
          "mean of the paired per-rep ratios. The committed guards other than `powered` are "
          "carried as they were; `same_budget` is added where the runs' budgets are recorded "
          "(lr_exponent's finals).", "",
          "| claim | before (committed) | rule alone, before | after (new rules) |",
          "|---|---|---|---|"]
  head += [f"| {r['claim']} | {r['old_verdict']} | {r['old_rule_verdict'] or '–'} | "
           f"{r['new_verdict']} |" for r in rows]
  for r in rows:
    head += ["", f"## {r['claim']} — `{r['where']}`", "",
             f"Before: **{r['old_verdict']}**; after: **{r['new_verdict']}**."
             + (f" {r['note']}." if r["note"] else "")]
    comps = r["comparisons"]
    if not comps:
      continue
    if "advantage" in comps[0]:
      head += ["", "| comparison | old | new | n | advantage [95%] | paired ± | unpaired ± | "
               "power (effect) | TOST power (margin) | seeds to settle |",
               "|---|---|---|---|---|---|---|---|---|---|"]
      head += [f"| {c['comparison']} | {c['old'] or '–'} | {c['new']} | {c['n']} | "
               f"{fmt(c['advantage'])} [{fmt(c['lo95'])}, {fmt(c['hi95'])}] | "
               f"{fmt(c['half_paired'])} | {fmt(c['half_unpaired'])} | {fmt(c['power'])} "
               f"({fmt(c['effect'])}) | {fmt(c['power_equivalence'])} ({fmt(c['margin'])}) | "
               + (", ".join(f"{k} {v or f'> {D.MOST_SEEDS}'}"
                            for k, v in c["seeds_to_settle"].items()) or "–") + " |"
               for c in comps]
    else:
      head += ["", "| comparison | new | ratio [90%] | bound | n |", "|---|---|---|---|---|"]
      head += [f"| {c['comparison']} | {c['new']} | {fmt(c['ratio'])} [{fmt(c['lo90'])}, "
               f"{fmt(c['hi90'])}] | {fmt(c['bound'])} | {c['n']} |" for c in comps]
  return "\n".join(head) + "\n"


def plain(x):
  """JSON-safe: NaN and ±inf as null, numpy scalars as Python's, tuples as lists."""
  if isinstance(x, dict):
    return {str(k): plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [plain(v) for v in x]
  if isinstance(x, (np.bool_, bool)):
    return bool(x)
  if isinstance(x, (np.integer, int)):
    return int(x)
  if isinstance(x, (np.floating, float)):
    return float(x) if math.isfinite(x) else None
  return x if x is None or isinstance(x, str) else str(x)


def provenance() -> dict:
  git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout
  return {"command": "python scripts/reanalyse.py " + " ".join(sys.argv[1:]),
          "commit": git("rev-parse", "HEAD").strip(),
          "clean": not git("status", "--porcelain", "--", "pergrad", "experiments",
                           "scripts").strip()}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--results", default="results/cpu", help="a reproduction's results dir")
  ap.add_argument("--out", default="results/reanalysis", help="writes OUT.md and OUT.json")
  args = ap.parse_args()
  root = (REPO / args.results).resolve()
  if not (root / "reproduction.json").exists():
    sys.exit(f"reanalyse: {root} holds no reproduction.json; give --results the directory "
             "`scripts/reproduce.py all` wrote")
  rows, prov = analyse(root), provenance()
  out = REPO / args.out
  out.with_suffix(".json").write_text(json.dumps(plain({**prov, "claims": rows}), indent=1,
                                                 allow_nan=False) + "\n")
  out.with_suffix(".md").write_text(markdown(rows, prov))
  print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}: {len(rows)} reports")


if __name__ == "__main__":
  main()
