"""G3 (Gray et al. 2024): a GNS-guided batch-size schedule saves tokens against a fixed batch.

Every arm: the same examples, every layer type's GNS tracked, warmup and evaluations at the same
examples. Arms: fixed B = 8 ... 64 (extended ×2 past the best at an edge, `B_LIMITS`), each at
its lr (factor-2 grid on seed 0, extended up to 3 times), the best (on seeds 1-3) the baseline,
judged on seeds 4-8 (the first look: a pair still open there gets seeds on both arms up to the
YAML's cap, `pergrad.sweep.more_seeds`); gns_norm (B follows the norm layers' B_simple);
linear_paper (a ramp over the budget from B_max/8); linear_fit (the ramp fitted to the best
fixed arm's B_simple, `fitted_arm`); warmup (Merrill et al. 2025, our reading: from B_max/8
over the first quarter, lr × √ratio; beside); seesaw (arXiv 2510.14717; beside); short (the
best fixed arm on 82 % of the examples: Δ18). Schedules at the best arm's lr on 8 fresh seeds.
Curves to the target: `runs.to_target`.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import gns_ramp, lr_search
from pergrad.analysis import decide, gns_terms, guards, sequential, verdict
from pergrad.analysis.budget import guard as same_budget
from pergrad.analysis.gns_terms import RAMP_TOL, fitted_arm
from pergrad.analysis.markdown import listing, sections
from pergrad.analysis.plots import plt, savefig, style
from pergrad.analysis.report import Report, not_measured
from pergrad.analysis.runs import (
  aggregate,
  eval_curves,
  finals,
  finished,
  from_table,
  read_csv,
  seed_mean,
  seed_mean_to_target,
  to_target,
  to_target_by_arm,
  write_csv,
)
from pergrad.sweep import (
  Block,
  LrSearch,
  MoreSeeds,
  Sweep,
  Tuned,
  base_for,
  best_lr,
  common_seeds,
  experiment_value,
  scale_value,
  with_warmup,
)
from pergrad.sweep.declared import declared, declared_text
from pergrad.sweep.record import Experiment, register

NAME = "gns_schedule"
TITLE = "batch-size schedules (GNS-guided, fitted ramp) against the best fixed batch"
CLAIM = ("A batch-size schedule guided by the gradient noise scale (in the paper a linear "
         "ramp chosen from it) reaches a fixed-batch run's final loss with fewer tokens: 18% "
         "fewer on a Chinchilla-optimal language model (Gray et al., arXiv 2411.00999).")
SIZE, PER_SIZE = "data.batch_size", ("train.steps", "train.eval_every", "schedule.warmup_steps")
GROUP = ("batch.kind", SIZE, *PER_SIZE)  # a fixed arm (in its runs' names: lr_search copies it)
GUIDED = ("gns_norm", "linear_paper", "linear_fit")  # the claim's schedules (the verdict's)
BASELINES = ("warmup", "seesaw")  # published schedules, reported beside
WARMUP_SHARE = 0.25  # warmup: the share of the budget over which B grows
SELECT_SEED, MAX_EXTEND = 0, 3  # every fixed arm's lr grid grows ≤ 3 × 2 past an edge
SEEDS = {"ci": (1,), "cpu": tuple(range(1, 9)), "paper": tuple(range(1, 9))}  # fresh: judged on
N_OTHER = 3  # fresh seeds of the fixed arms other than the best; the best's others: first look
N_EVALS = {"ci": 5, "cpu": 25, "paper": 25}
# The fixed sizes extend ×2 past the best one at an edge (ranked as `fixed_search` ranks), at
# most twice a side, within B = 2 ... 2·B_max (smallest B, largest as a multiple of B_max).
B_LIMITS = (2, 2)
SHORT = 1 - 0.18  # the short arm's share of the examples: the paper's 18 % saving
WARMUP = 20  # steps of the α = 0.95 EMA left out of the fit (1 / (1 − α))
PAPER = "18% fewer tokens to the fixed batch's final loss"
EFFECT = declared(NAME, "effect")  # nats, configs/experiment/gns_schedule.yaml
MOST_SEEDS = int(declared(NAME, "seed_cap").value)  # a pair still open: seeds up to it
RULE = (f"Each GNS-guided schedule ({', '.join(GUIDED)}) at the best fixed arm's lr vs the best "
        "fixed arm (lowest mean final eval loss on its first fresh seeds, judged on its others: "
        f"the first look, a pair still open there gets seeds on both arms up to {MOST_SEEDS}, "
        f"{sequential.READING}) in final eval loss at equal tokens, paired on their shared "
        f"seeds: {decide.READING}. Each pair's effect (and margin): {EFFECT.value:g} nats, "
        "declared (the paper's 18% in loss units); Δ18, the best fixed arm's seed-mean final "
        "loss on 82% of the tokens minus on all, re-measures it beside. "
        f"{decide.VERDICT.capitalize()} (each schedule a pair; linear_fit only where the fit "
        "launched its ramp, else left out with the fit's reason named). Tokens and "
        "wall time to the fixed arm's final loss on seed-mean curves are reported, not judged.")


def sizes(preset: str) -> tuple[int, int, tuple[int, ...]]:
  """(B_ref, B_max = 2·B_ref, the fixed arms' sizes B_ref/4 ... B_max; ci: B_ref, B_max)."""
  ref = int(scale_value(preset, "data.batch_size"))
  return ref, 2 * ref, ((ref,) if preset == "ci" else (ref // 4, ref // 2, ref, 2 * ref))


def lr_grid(preset: str, b: int) -> list[float]:
  """The fixed arm's first lr grid (factor 2; cpu: around Adam's best at this horizon, lower
  for smaller B; ci: the config's lr)."""
  if preset == "ci":
    return [float(experiment_value(NAME, "optimizer.lr"))]
  if preset == "paper":
    return [2.5e-4, 5e-4, 1e-3]
  ref = sizes(preset)[0]
  low = 2.5e-3 if b < ref // 2 else 5e-3 if b < ref else 1e-2
  return [low, 2 * low, 4 * low]


def sweep(preset: str) -> Sweep:
  """The fixed arms' lr search (the schedules come in `follow_up`)."""
  ref, max_batch_size, fixed = sizes(preset)
  examples, n = ref * int(scale_value(preset, "train.steps")), N_EVALS[preset]
  warmup = max(ref * int(scale_value(preset, "schedule.warmup_steps")),  # examples: ≥ 20
               guards.MIN_WARMUP * max_batch_size if preset != "ci" else 0)  # steps at every B
  least = guards.MIN_WARMUP if preset != "ci" else 1  # an added B > B_max: still ≥ 20 steps
  per_size = lambda b: dict(zip(PER_SIZE, (examples // b, max(examples // b // n, 1),
                                           max(warmup // b, least)), strict=True))
  base = base_for(NAME, preset, **{  # ci logs every step: enough points for the ramp's fit
      "data.batch_size": max_batch_size, "batch.start": max_batch_size // 8,
      "logging.log_every": 1 if preset == "ci" else 5, **per_size(max_batch_size)})
  blocks = tuple(Block({"batch.kind": ["fixed"], SIZE: [b], **{k: [v] for k, v in per_size(
      b).items()}, "optimizer.lr": lr_grid(preset, b), "train.seed": [SELECT_SEED]})
      for b in fixed)
  sizes_b = Tuned(SIZE, ("batch.kind",), 2.0, B_LIMITS[0], B_LIMITS[1] * max_batch_size,
                  metric="loss_mean", extra=lambda b: per_size(int(b)))
  more = None if preset == "ci" else MoreSeeds(  # first look: the best arm's follow-up seeds
      functools.partial(guided_pairs, preset), EFFECT.value, most=MOST_SEEDS,
      first=SEEDS[preset][N_OTHER:], reads_finals=True)
  search = LrSearch(GROUP, factor=2.0, max_extend=0 if preset == "ci" else MAX_EXTEND,
                    seeds=SEEDS[preset][:N_OTHER], tuned=sizes_b, more=more)
  return Sweep(base, blocks, search, wall_estimate_min={"ci": 1.0, "cpu": 50}.get(preset))


def design():  # the sequential design the schedules' pairs are read by (`sweep.MoreSeeds`)
  return MoreSeeds(None, EFFECT.value, most=MOST_SEEDS).design(len(SEEDS["cpu"][N_OTHER:]))


def guided_pairs(preset: str, _best, fin: pd.DataFrame) -> list[tuple[dict, dict]]:
  """(each GUIDED schedule run, the best fixed arm) at the best arm's lr (`fixed_search`, as
  `follow_up` chose it): the pairs `MoreSeeds` adds seeds to (none before the follow-up)."""
  best = fixed_search(fin)[1]
  if best is None:
    return []
  lr, tokens = float(best["optimizer.lr"]), paper_tokens(preset)
  names = ("batch.kind", "batch.gns_group", "batch.start", "batch.ramp_tokens")  # in run names
  runs = finished(fin)[lambda d: (d["batch.kind"] != "fixed") & np.isclose(
      d["optimizer.lr"].astype(float), lr)].drop_duplicates([k for k in names if k in fin])
  arms = [{k: from_table(r[k]) for k in names if k in r and from_table(r[k]) is not None}
          for r in runs.to_dict("records") if arm({**r, "_budget": tokens}) in GUIDED]
  fixed = {"batch.kind": "fixed", SIZE: int(best[SIZE]), **{k: int(best[k]) for k in PER_SIZE}}
  return [({**a, "optimizer.lr": lr}, {**fixed, "optimizer.lr": lr}) for a in arms]


def paper_tokens(preset: str) -> int:
  """Every arm's tokens: train.steps × B_ref sequences of T tokens."""
  return sizes(preset)[0] * int(scale_value(preset, "train.steps")) * int(
      scale_value(preset, "data.seq_len"))


def fixed_search(fin: pd.DataFrame) -> tuple[pd.DataFrame, dict | None]:
  """`best_lr` of the fixed arms (short arm left out) on their `common_seeds` (none:
  all; `report` says so), its row of lowest fresh-seed mean (None: no fresh seeds). The best
  arm's follow-up seeds are left out: a resumed follow-up chooses as the first did."""
  full = full_fixed(fin)
  search = best_lr(full, GROUP, "optimizer.lr", select_seed=SELECT_SEED)
  if len(common := common_seeds(search)):
    search = best_lr(full[full["train.seed"].isin([SELECT_SEED, *common])], GROUP,
                               "optimizer.lr", select_seed=SELECT_SEED)
  best = search[search["n_seeds"] > 0] if len(search) else search
  return search, None if best.empty else lr_search.ranked(best).iloc[0].to_dict()


def is_short(df: pd.DataFrame) -> pd.Series:
  """Fixed runs with fewer examples than the fixed arms' budget (the short arm)."""
  fixed = df["batch.kind"] == "fixed"
  examples = df["train.steps"].astype(float) * df[SIZE].astype(float)
  return fixed & (examples < examples[fixed].max())


def full_fixed(df: pd.DataFrame) -> pd.DataFrame:
  """The fixed arms' rows (the short arm left out)."""
  return df[(df["batch.kind"] == "fixed") & ~is_short(df)]


def fit_ramp(table: pd.DataFrame, best: dict, max_batch_size: int) -> dict | None:
  """`gns_terms.linear_ramp` of the seed-mean total B_simple of the best fixed arm's runs on its
  `fresh_seeds` (the common seeds, `fixed_search`) past WARMUP steps (or a short run's first
  quarter), B_max = max_batch_size. None without 3 points."""
  t = full_fixed(table)
  rows = t[np.isclose(t[SIZE].astype(float), float(best[SIZE]))
           & np.isclose(t["optimizer.lr"].astype(float), float(best["optimizer.lr"]))
           & t["train.seed"].isin([int(float(s)) for s in str(best["fresh_seeds"]).split()])]
  key = "gns/total/b_simple"
  if key not in rows or rows[key].notna().sum() < 3:
    return None
  warmup = min(WARMUP, int(rows["step"].max()) // 4)  # short (ci) runs: their first quarter
  pts = rows[rows["step"] > warmup].dropna(subset=[key, "train/tokens_seen"])
  mean = pts.groupby("train/tokens_seen")[key].mean()
  return gns_terms.linear_ramp(mean.index.to_numpy(float), mean.to_numpy(float), max_batch_size)


def follow_up(preset: str, sweep_dir: Path) -> tuple[Block, ...]:
  """The schedules and the short arm at the best fixed arm's lr and fresh seeds (and that
  arm's other fresh seeds)."""
  table = aggregate(sweep_dir)
  best = fixed_search(finals(table))[1] if not table.empty else None
  if best is None:
    return ()
  lr, seeds = [float(best["optimizer.lr"])], list(SEEDS[preset])
  max_batch_size, tokens = sizes(preset)[1], paper_tokens(preset)
  ramp = lambda start, tok, seeds=seeds, **kw: Block(
      {"batch.kind": ["linear"], "batch.ramp_tokens": [int(tok)], **kw, "optimizer.lr": lr,
       "train.seed": seeds}, fixed={"batch.start": start})
  per_size = {k: [int(best[k])] for k in PER_SIZE}
  blocks = [Block({"batch.kind": ["fixed"], SIZE: [int(best[SIZE])], **per_size, "optimizer.lr": lr,
                   "train.seed": seeds[N_OTHER:]}),  # the best arm's other fresh seeds
            Block({"batch.kind": ["gns"], "batch.gns_group": ["norm"], "optimizer.lr": lr,
                   "train.seed": seeds}),
            Block({"batch.kind": ["fixed"], SIZE: [int(best[SIZE])], **per_size,
                   "train.steps": [int(round(SHORT * int(best["train.steps"])))],
                   "optimizer.lr": lr, "train.seed": seeds[:N_OTHER]}),  # Δ18 is a mean
            ramp(max_batch_size // 8, tokens),  # the paper's: over the whole budget
            ramp(max_batch_size // 8, WARMUP_SHARE * tokens, seeds[:2],  # warmup: beside
                 **{"batch.lr_scaling": ["sqrt"]}),
            Block({"batch.kind": ["seesaw"], "schedule.name": ["step"], "optimizer.lr": lr,
                   "train.seed": seeds[:2]}, fixed={"batch.start": int(best[SIZE])})]  # beside
  if preset == "ci":  # the pipeline only: the fixed arm, gns_norm and the short arm
    return tuple(blocks[:3])
  fit = fit_ramp(table, best, max_batch_size)
  if (tok := fitted_arm(fit, tokens, max_batch_size)[0]) is not None:  # the fit's own ramp
    fitted = ramp(fit["batch.start"], tok)  # its start in its name: `guided_pairs` reads it
    blocks.append(Block({**fitted.grid, "batch.start": [int(fit["batch.start"])]}))
  return tuple(blocks)


def arm(row: dict) -> str:
  """fixed_<B>[_short] | gns_<group> | linear_paper | linear_fit | warmup | seesaw, from a
  run's row."""
  kind = row.get("batch.kind")
  if kind == "fixed":
    return f"fixed_{int(row['data.batch_size'])}" + ("_short" if row.get("short") else "")
  if kind == "gns":
    return f"gns_{from_table(row.get('batch.gns_group')) or 'total'}"
  if kind == "linear":
    if str(row.get("batch.lr_scaling", "none")) == "sqrt":
      return "warmup"
    tok = float(row.get("batch.ramp_tokens") or 0)
    return "linear_paper" if abs(tok / row.get("_budget", tok) - 1) <= RAMP_TOL else "linear_fit"
  return str(kind)


def compared(table: pd.DataFrame, search: pd.DataFrame, best: dict | None) -> pd.DataFrame:
  """The finished runs judged: each fixed arm's at its chosen lr (`search`) on the fresh seeds,
  the best one's on those it was not ranked on (its mean there is biased low), the schedules'
  and the short arm's (`short`) at the best arm's lr."""
  if best is None:
    return table[:0].assign(short=False)
  table = finished(table)  # a run stopped part-way has no final loss
  chosen = {float(r[SIZE]): float(r["optimizer.lr"]) for _, r in search.iterrows()}
  lr, batch_size = table["optimizer.lr"].astype(float), table["data.batch_size"].astype(float)
  ranked = np.isclose(batch_size, float(best[SIZE])) & ~is_short(table) & table["train.seed"].isin(
      [int(float(x)) for x in str(best["fresh_seeds"]).split()]) & (len(search) > 1)  # a choice
  fixed = (table["batch.kind"] == "fixed") & (table["train.seed"] != SELECT_SEED) & np.isclose(
      lr, batch_size.map(chosen).fillna(-1.0)) & ~ranked
  sched = (table["batch.kind"] != "fixed") & np.isclose(lr, float(best["optimizer.lr"]))
  return table[fixed | sched].assign(short=is_short(table)[fixed | sched])


def curves(table: pd.DataFrame) -> pd.DataFrame:
  """`runs.eval_curves` with each run's `arm`."""
  return eval_curves(table, lambda g: arm({**g.iloc[0].to_dict(),
                                           "_budget": g["train/tokens_seen"].max()}))


def analyze(runs, out_dir: Path) -> None:
  """best.csv (the fixed arms' search; `best_arm`), curves.csv and to_target.csv (the runs
  judged), gns.csv (tracked B_simple at the logged steps), ramp_fit.csv."""
  out_dir, table = Path(out_dir), runs.table
  fin = with_warmup(runs.finals, runs.sweep_dir)
  write_csv(fin, out_dir / "finals.csv")
  search, best = fixed_search(fin)
  search["best_arm"] = [best is not None and r[SIZE] == best[SIZE]
                        for _, r in search.iterrows()]
  write_csv(search, out_dir / "best.csv")
  judged = compared(table, search, best)
  cur = curves(judged)
  write_csv(cur, out_dir / "curves.csv")
  best_arm = f"fixed_{int(best[SIZE])}" if best is not None else ""
  write_csv(to_target(cur, best_arm, fin), out_dir / "to_target.csv")
  keys = [k for k in ("gns/total/b_simple", "gns/norm/b_simple") if k in judged]
  if keys:
    t = judged.dropna(subset=["train/tokens_seen"]).dropna(subset=keys, how="all")  # log steps
    arms = dict(zip(cur["run"], cur["arm"], strict=True))
    write_csv(pd.DataFrame({"run": t["run"], "arm": t["run"].map(arms),
                  "train.seed": t["train.seed"], "step": t["step"],
                  "tokens": t["train/tokens_seen"], **{k.split("/")[1]: t[k] for k in keys}}
                 ), out_dir / "gns.csv")
  max_batch_size = int(table["train/batch_size"].max())
  fit = fit_ramp(table, best, max_batch_size) if best is not None else None
  budget = float(full_fixed(table)["train/tokens_seen"].max())
  why = fitted_arm(fit, budget, max_batch_size)[1]
  write_csv(pd.DataFrame([{**(fit or {}), "linear_fit": why}]), out_dir / "ramp_fit.csv")
  gns_ramp.write_regime(table, budget, out_dir, NAME)  # the paper's 18 %: a Chinchilla budget


def figures(out_dir: Path) -> list[Path]:
  """Seed-mean eval loss, batch size and tracked B_simple (total —, norm layers --) vs tokens."""
  out_dir = Path(out_dir)
  cur = read_csv(out_dir / "curves.csv")
  fig, axes = plt().subplots(1, 3, figsize=(16, 4.2))
  colors = {a: f"C{i}" for i, a in enumerate(sorted(set(cur["arm"])))}
  for name, g in cur.groupby("arm", sort=True):
    agg = seed_mean(g, ["tokens", "eval_loss", "batch_size"])
    axes[0].plot(agg["tokens"], agg["eval_loss"], color=colors[name], label=name)
    axes[1].step(agg["tokens"], agg["batch_size"], where="post", color=colors[name], label=name)
  tt = read_csv(out_dir / "to_target.csv")
  if len(tt):
    target = float(tt["target"].iloc[0])
    axes[0].axhline(target, color="k", lw=0.8, ls="--", label="target (best fixed, final)")
    axes[0].set_ylim(target - 0.1, target + 0.6)
  for name, g in read_csv(out_dir / "gns.csv").groupby("arm", sort=True):
    cols = [c for c in ("total", "norm") if c in g]
    agg = seed_mean(g, ["tokens", *cols])
    for col in cols:
      axes[2].plot(agg["tokens"], agg[col], color=colors.get(name), lw=0.9,
                   ls="-" if col == "total" else "--", label=name if col == cols[0] else None)
  ylabels = ("eval loss", "batch size", "B_simple (— total, -- norm)")
  for ax, y, title, legend in zip(axes, ylabels, (
      "eval loss", "batch size", "tracked B_simple, seed mean"), (8, 8, 7), strict=True):
    style(ax, xlabel="tokens seen", ylabel=y, title=title, legend=legend, grid=True)
  axes[2].set_yscale("log")
  return [savefig(fig, out_dir / "gns_schedule.png")]


def arm_guards(out_dir: Path, search: pd.DataFrame, best, guided) -> tuple:
  """Every fixed arm's lr in its grid (B is chosen over them), the best B in its grid, the compared
  arms' lr a step below any divergence, ≥ 20 warmup steps, the paper's budget (`gns_ramp`)."""
  label = lambda r: f"fixed_{int(r[SIZE])}" if r["batch.kind"] == "fixed" else r["batch.kind"]
  base = f"fixed_{int(best[SIZE])}"
  lr, stable = lr_search.guards_of(search, label)[0], lr_search.guards_of(search, label, {base})[1]
  sizes_b = guards.bracketed({base: (search[SIZE].astype(float), float(best[SIZE]))}, "B")
  fin = read_csv(out_dir / "finals.csv")
  fin = fin[(fin["train.seed"] != SELECT_SEED) & ~is_short(fin)]
  warm = lr_search.warm_of(fin, label, {base, *(k.split("_")[0] for k in guided)})  # gns, linear
  return lr, sizes_b, stable, warm, gns_ramp.regime_guard(out_dir)[0]


def report(out_dir: Path) -> Report:
  out_dir = Path(out_dir)
  tt = read_csv(out_dir / "to_target.csv")
  if tt.empty:  # no best fixed arm, or none of its seeds left (no seed common to the fixed arms)
    return not_measured(RULE, "no target loss: the best fixed arm has no finished fresh "
                                "seed beyond those it was ranked on", paper=PAPER)
  search = lr_search.load_best(out_dir)
  best = search[search["best_arm"]].iloc[0]
  base, target = f"fixed_{int(best[SIZE])}", float(tt["target"].iloc[0])
  losses = {k: dict(zip(g["train.seed"].astype(float), g["final_eval_loss"].astype(float),
                        strict=True)) for k, g in tt.groupby("arm")}
  fit = read_csv(out_dir / "ramp_fit.csv")
  why = str(fit["linear_fit"].iloc[0]) if "linear_fit" in fit and len(fit) else "launched"
  guided = [k for k in GUIDED if k != "linear_fit" or why == "launched" or k in losses]
  get = lambda k: losses.get(k, {})
  pairs = [verdict.sequential_reading(decide.compare(get(k), get(base), (k, base), effect=EFFECT
                                                     .value, margin=EFFECT.value),
                                      get(k), get(base), design()) for k in guided]  # ci: 1 seed
  pilot = guards.pilot_first({k: decide.shared(get(k), get(base))[0] for k in (*guided, base)},
                             SEEDS["cpu"][N_OTHER:])  # each arm's seeds judged against base's
  short, full = list(get(f"{base}_short").values()), list(get(base).values())  # Δ18
  delta = float(np.mean(short) - np.mean(full)) if len(short) and len(full) else math.nan
  cals = {verdict.key(p): verdict.calibration_of(p) for p in pairs}
  mean_tt = seed_mean_to_target(read_csv(out_dir / "curves.csv"), base, target)
  by_arm = to_target_by_arm(tt, mean_tt)
  saving = mean_tt.set_index("arm")[["token_saving", "time_saving"]]
  pct = lambda x: (f"{100 * x:.0f}%" if math.isfinite(x) else "no reference" if x != x
                   else "not reached")
  save = listing(((a, saving.loc[a]) for a in (*GUIDED, *BASELINES) if a in saving.index),
                 lambda r: pct(r["token_saving"]) + (f" (time {pct(r['time_saving'])})" if
                                                     math.isfinite(r["token_saving"]) else ""))
  checks = (f"baseline: fixed B = {int(best[SIZE])} at lr {best['optimizer.lr']:g}",
            *(p.sentence() for p in pairs), f"Δ18 = {delta:.3g}", declared_text(EFFECT),
            *([f"linear_fit not run: {why}"] if "linear_fit" not in guided else []))
  return verdict.gated(
      decide.verdict_of(pairs), cals, (*arm_guards(out_dir, search, best, guided),
                                       same_budget(out_dir), pilot),
      decided=list(cals),
      rule=RULE, paper=PAPER, checks=checks,
      ours=f"token (wall-time) saving to B={int(best[SIZE])}'s final loss: {save or 'n/a'}; "
      f"{verdict.outcomes(pairs)}",
      numbers_md=sections(
          lr_search.best_md(search, GROUP, extra=("best_arm",)), verdict.pairs_md(pairs),
          f"By arm (seed-mean curves; to the target {target:.4f}):", by_arm,
          "The fitted ramp (B_simple ≈ a + b·tokens):", fit))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='G3, ours: GNS schedules vs the best fixed B', rank=11,
    stream=0, sweep=sweep, analyze=analyze, figures=figures, report=report, follow_up=follow_up))
