"""The committed runs of each experiment re-read with the decision rules of
`pergrad.analysis.decide` (paired on shared seeds: a detected difference decided whatever its
power, absence by TOST equivalence or non-inferiority, else "not separable" with the seeds that
would settle it), `pergrad.analysis.timing` (a time bound on the paired ratio's geometric mean)
and `pergrad.analysis.budget` (same_budget, where the runs' budgets are recorded), from the CSVs
each experiment's `analyze` wrote; each returns (verdict, comparison rows[, note]) with the
committed guards but `powered` carried (`carried`). Read by `scripts/reanalyse.py`; the
experiments' own reports move to these rules when they are rewired.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import (
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
from pergrad.analysis import budget, decide, guards, leafwise, rules, timing
from pergrad.analysis.runs import read_csv

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


def by_seed(seeds, values) -> dict:
  return {float(s): float(v) for s, v in zip(seeds, values, strict=True)}


def best_arms(out: Path, labeler) -> dict:
  best = lr_search.load_best(out)
  seeds, vals = lr_search.seeds_by_label(best, labeler), lr_search.by_label(best, labeler)
  return {k: by_seed(seeds[k], vals[k]) for k in vals if len(seeds[k]) == len(vals[k])}


KEPT = ("n", "advantage", "lo95", "hi95", "sd_paired", "half_paired", "half_unpaired", "power",
        "power_equivalence", "effect", "margin", "within_margin", "seeds_to_settle", "sign_flip_p")


def row(p: D.Paired, old_outcome: str = "") -> dict:
  r = p.row()
  return {"comparison": f"{p.a} vs {p.b}", "old": old_outcome, "new": p.outcome,
          **{k: r[k] for k in KEPT}}


def rows_of(ps, old) -> list[dict]:
  was = old_outcomes(old)
  return [row(p, was.get(f"{p.a} vs {p.b}", "")) for p in ps]


def old_outcomes(old: dict) -> dict:
  """{"a vs b": outcome} from the committed `ours` ("a vs b: win; ...")."""
  out = {}
  for part in old["ours"].split(";"):
    if " vs " in part and ":" in part:
      k, _, v = part.rpartition(":")
      out[k.strip()] = v.strip()
  return out


def pairs_claim(old, arms, expected, effect, lower_is_better=True, verdict_fn=D.verdict_of):
  """Each expected pair (a beats b) read on its shared seeds, absence by TOST at ±effect."""
  ps = [D.compare(arms.get(a, {}), arms.get(b, {}), (a, b), effect=effect, margin=effect,
                  lower_is_better=lower_is_better) for a, b in expected]
  return carried(verdict_fn(ps), old), rows_of(ps, old)


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
  return carried(v, old), rows_of(ps, old)


def do_gns_ramp(out, old):
  tt = read_csv(out / "to_target.csv")
  arms = {k: by_seed(g["train.seed"], g["final_eval_loss"]) for k, g in tt.groupby("arm")}
  eff = old_effect(old, "ramp vs fixed", gns_ramp.EFFECT.value)
  p = D.compare(arms.get("ramp", {}), arms.get("fixed", {}), ("ramp", "fixed"), effect=eff,
                margin=eff)
  v = (REPRODUCED if p.outcome == D.WIN else NOT_REPRODUCED if p.outcome in (D.LOSS, D.EQUIVALENT)
       else f"{UNDET}: not separable (ramp vs fixed)")
  return carried(v, old), [row(p, old_outcomes(old).get("ramp vs fixed", ""))]


def do_gns_schedule(out, old):
  tt = read_csv(out / "to_target.csv")
  search = lr_search.load_best(out)
  base = f"fixed_{int(search[search['best_arm']].iloc[0][gns_schedule.SIZE])}"
  arms = {k: by_seed(g["train.seed"], g["final_eval_loss"]) for k, g in tt.groupby("arm")}
  exp = [(k, base) for k in gns_schedule.GUIDED if k in arms]
  return pairs_claim(old, arms, exp, gns_schedule.EFFECT.value)


def do_snr(out, old):
  per_leaf = read_csv(out / "snr_per_leaf.csv")
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
  ps = [D.compare(arms[a], arms[b], (a, b), effect=effects[a[:-3]], margin=effects[a[:-3]],
                  lower_is_better=False) for a, b in exp]
  return carried(D.verdict_of(ps), old), rows_of(ps, old)


def do_moments(out, old):
  raw = read_csv(out / "moments_all.csv")
  big = raw[raw["B"].notna()] if "B" in raw else raw[:0]
  sizes = [None, *sorted(int(b) for b in big["B"].unique())] if len(big) else [None]
  ps = []
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
  return carried(D.verdict_of(ps), old), rows_of(ps, old)


def do_batch_scaling(out, old):
  curves = read_csv(out / "curves.csv")
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


def shapes_side(shapes, limit, peak_limit=math.inf, flops=True):
  """shapes: (name, paired per-rep time ratios, FLOP ratio, peak ratio) each. Per shape the time
  ratio's location against `limit`; over shapes, the median shape's time verdict and the FLOP and
  peak ratios' medians against their bounds, as the old rule took medians. (side, rows, text)"""
  rows_ = []
  for name, ratios, fl, pk in shapes:
    loc = timing.location(ratios, limit)
    rows_.append({"comparison": name, "new": loc.verdict, "ratio": loc.ratio, "lo90": loc.lo,
                  "hi90": loc.hi, "n": loc.n, "bound": limit, "flops_ratio": fl,
                  "peak_ratio": pk})
  fl, pk = (float(np.median([r[k] for r in rows_])) for k in ("flops_ratio", "peak_ratio"))
  outs = [timing.median_verdict([r["new"] for r in rows_]),
          *([timing.HOLDS if fl <= limit else timing.FAILS] if flops else []),
          timing.HOLDS if pk <= peak_limit else timing.FAILS]
  return timing.combine(outs), rows_, f"time {outs[0]}, FLOPs {fl:.3g}×, peak {pk:.3g}×"


def do_overhead(out, old):
  df = read_csv(out / "overhead.csv")
  base = df[(df["backend"] == overhead.PAPER_BASE) & (df["stats"] == "mean")].drop_duplicates(
      ["preset", "B"]).set_index(["preset", "B"])
  ratios = lambda r, b: (np.asarray(json.loads(r["time_ratios"]), float)
                         / np.asarray(json.loads(b["time_ratios"]), float))
  shapes = lambda rows: [(f"{r['backend']}/{r['granularity']}/{r['stats']} at {r['preset']} "
                          f"B={r['B']} vs {overhead.PAPER_BASE}",
                          ratios(r, base.loc[(r["preset"], r["B"])]), r["flops_ratio"],
                          r["peak_ratio"]) for r in overhead.rebased(df, rows).to_dict("records")]
  tok = df[(df["backend"] == "surgery") & (df["granularity"] == "token")
           & (df["stats"] == "sq+sign")]
  s, rs, ts = shapes_side(shapes(tok), overhead.FREE, overhead.FREE, flops=False)
  v, rv, tv = shapes_side(shapes(df[df["backend"] == "vmap"]), overhead.VMAP_TIME,
                          overhead.VMAP_PEAK)
  verdict = (REPRODUCED if (s, v) == (timing.HOLDS,) * 2 else NOT_REPRODUCED
             if (s, v) == (timing.FAILS,) * 2 else PARTLY)
  return carried(verdict, old), rs + rv, f"surgery per-token sq+sign: {s} ({ts}); vmap: {v} ({tv})"


def do_norm_cost(out, old):
  from experiments import norm_cost

  df = read_csv(out / "paired.csv")
  rows_, outs = [], {}
  for variant, what, lim in norm_cost.BOUNDS:
    shapes = [(f"{what} ({variant}) at {p} B={b} vs the fastest plain step",
               g.sort_values("rep")["time_ratio"], float(g["flops_ratio"].iloc[0]),
               float(g["peak_ratio"].iloc[0]))
              for (p, b), g in df[df["variant"] == variant].groupby(["preset", "B"])]
    outs[what], r, _ = shapes_side(shapes, lim)  # (peak reported, not bounded)
    rows_ += r
  verdict = (NOT_REPRODUCED if timing.FAILS in outs.values() else REPRODUCED
             if all(o == timing.HOLDS for o in outs.values()) else PARTLY)
  return carried(verdict, old), rows_, "; ".join(f"{w}: {o}" for w, o in outs.items())


def declared_budget(fin: pd.DataFrame, preset: str) -> dict:
  """run -> its B's declared budget, as `lr_exponent.sweep` plans each B's first-stage block."""
  from pergrad.sweep import family, scale_value

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
  fin = read_csv(out / "finals.csv")
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
