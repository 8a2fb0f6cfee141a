"""G3 (Gray et al. 2024): a batch-size schedule guided by the gradient noise scale saves
tokens against the best fixed batch.

Runs (`pergrad.train.batch_schedule`): Adam, every arm spending the same examples E =
train.steps × B_ref (the scale's run; cpu: 400 × 32 = 12,800 sequences), the GNS of
every layer type and of the whole model tracked every step in every arm (so that their
per-step costs match), the warmup fixed in examples, evaluations at the same examples.
  fixed      B = B_ref/2, B_ref, B_max = 2·B_ref (cpu: 16, 32, 64) every update, each at
             its own lr: a factor-2 grid on seed 0 (`lr_search`, extended once past an
             edge), then fresh seeds 1-3 at the chosen lr. The best fixed arm is the one
             with the lowest fresh-seed mean final eval loss (chosen on the seeds it is
             judged on: the baseline's selection bias counts against the schedules).
  gns_norm   online: every 25 updates B = max(B, floor(B_simple)), B_simple = EMA(S) /
             EMA(|G|²) (α = 0.95) of the normalization layers (`batch.gns_group=norm`,
             the paper's predictor), from B_max/8 up to B_max
  gns_total  the same, guided by the whole model's B_simple
  linear_fit a linear ramp in tokens fitted to the measured GNS (`fit_ramp`): a
             least-squares line B_simple ≈ a + b·tokens through the best fixed arm's
             tracked total B_simple (fresh seeds' mean, past the EMA's warm-up)
The schedules run in a follow-up stage (`follow_up`), once the fixed arms' fresh seeds are
done, with the fresh seeds and at the best fixed arm's lr (no search of their own), the lr
unchanged when B changes.

Measured per seed: the target is the best fixed arm's final eval loss; an arm's tokens to
target are where its eval-loss curve first reaches the target, linear between
evaluations (never: inf); its wall time to target is the training time logged there
(evaluation and checkpoints left out), interpolated the same way. The rule is `RULE`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search, verdict
from experiments.figures import plt, savefig, style
from experiments.record import ROWS, Experiment, Report, register
from experiments.report_md import md_table
from experiments.sweep import Block, LrSearch, Sweep, base_for, experiment_value, scale_value

NAME = "gns_schedule"
TITLE = "batch-size schedules (GNS-guided, fitted ramp) against the best fixed batch"
CLAIM = ("A batch-size schedule guided by the gradient noise scale (in the paper a linear "
         "ramp chosen from it) reaches a fixed-batch run's final loss with fewer tokens: 18% "
         "fewer on a Chinchilla-optimal language model (Gray et al., arXiv 2411.00999).")
SIZE, PER_SIZE = "data.batch_size", ("train.steps", "train.eval_every", "schedule.warmup_steps")
GROUP = ("batch.kind", SIZE, *PER_SIZE)  # a fixed arm (in its runs' names: lr_search copies it)
GUIDED = ("gns_norm", "gns_total", "linear_fit")  # the claim's schedules (the verdict's)
SELECT_SEED = 0
SEEDS = {"ci": (1,), "cpu": (1, 2, 3), "paper": (1, 2, 3)}  # fresh: judged on
N_EVALS = {"ci": 5, "cpu": 25, "paper": 25}
PAPER_SAVING = 0.18
WARMUP = 20  # steps of the α = 0.95 EMA left out of the fit (1 / (1 − α))
RULE = ("Fixed batches B_ref/2, B_ref and 2·B_ref, each at its own lr (chosen on seed 0), "
        "then fresh seeds; the best fixed arm has the lowest fresh-seed mean final eval loss. "
        "Per fresh seed the target is that arm's final eval loss, and tokens to target are "
        "where a curve first reaches it. Each GNS-guided schedule (gns_norm and gns_total: "
        "online from the normalization layers' and the whole model's B_simple; linear_fit: "
        "a ramp fitted to the measured total B_simple), at the best fixed arm's lr and "
        "seeds, vs the best fixed arm in tokens to target is "
        f"{verdict.PAIR_WIN}; {verdict.PAIRS_VERDICT}. Wall time to target is compared by "
        "the same rule and reported, not judged (two runs share the two cores).")


def sizes(preset: str) -> tuple[int, int, tuple[int, ...]]:
  """(B_ref, B_max, the fixed arms' sizes): the scale's batch size, 2·B_ref, and B_ref/2,
  B_ref, B_max (ci: B_ref, B_max)."""
  ref = int(scale_value(preset, "data.batch_size"))
  return ref, 2 * ref, ((ref, 2 * ref) if preset == "ci" else (ref // 2, ref, 2 * ref))


def lr_grid(preset: str, b: int) -> list[float]:
  """The fixed arm's first lr grid (factor 2). cpu: around Adam's lrs at this horizon
  (preconditioner, B = 32, 400 steps: 1e-2 → 4.023, 3e-2 → 4.008, 1e-1 → 5.2; at B = 64,
  4.2e-2 over 400 steps → 4.50): smaller B lower. paper: one grid. ci: the config's lr."""
  if preset == "ci":
    return [float(experiment_value(NAME, "optimizer.lr"))]
  if preset == "paper":
    return [2.5e-4, 5e-4, 1e-3]
  return [5e-3, 1e-2, 2e-2] if b < sizes(preset)[0] else [1e-2, 2e-2, 4e-2]


def _per_size(b: int, examples: int, warmup: int, n_evals: int) -> dict:
  steps = examples // b
  return dict(zip(PER_SIZE, (steps, max(steps // n_evals, 1), max(warmup // b, 1)), strict=True))


def sweep(preset: str) -> Sweep:
  """The fixed arms' lr search (the schedules come in `follow_up`)."""
  ref, b_max, fixed = sizes(preset)
  examples, n = ref * int(scale_value(preset, "train.steps")), N_EVALS[preset]
  warmup = ref * int(scale_value(preset, "schedule.warmup_steps"))
  base = base_for(NAME, preset, **{  # ci logs every step: enough points for the ramp's fit
      "data.batch_size": b_max, "batch.start": b_max // 8,
      "logging.log_every": 1 if preset == "ci" else 5, **_per_size(b_max, examples, warmup, n)})
  blocks = tuple(Block({"batch.kind": ["fixed"], SIZE: [b], **{k: [v] for k, v in _per_size(
      b, examples, warmup, n).items()}, "optimizer.lr": lr_grid(preset, b),
      "train.seed": [SELECT_SEED]}) for b in fixed)
  search = LrSearch(GROUP, factor=2.0, max_extend=0 if preset == "ci" else 1,
                    seeds=SEEDS[preset])
  # cpu: 9 selection (+ ≤ 3 extension), 9 fresh, 9 schedule runs; ~1.1 min each on 2 cores
  return Sweep(base, blocks, search, wall_estimate_min={"ci": 1.0, "cpu": 32}.get(preset))


# --- choosing the baseline and the fitted ramp ------------------------------------------
def best_fixed(fin: pd.DataFrame) -> dict | None:
  """The best fixed arm's row of `lr_search.best_lr` (its size, chosen lr, fresh seeds'
  losses): the lowest fresh-seed mean final eval loss (None: no arm has fresh seeds)."""
  fixed = fin[fin["batch.kind"] == "fixed"] if "batch.kind" in fin else fin[:0]
  if fixed.empty:
    return None
  best = lr_search.best_lr(fixed, GROUP, "optimizer.lr", select_seed=SELECT_SEED)
  best = best[best["n_seeds"] > 0]
  if best.empty:
    return None
  return best.assign(_o=best["loss_mean"].fillna(np.inf)).sort_values(
      ["_o", "select_loss"]).drop(columns="_o").iloc[0].to_dict()


def _best_runs(table: pd.DataFrame, best: dict) -> pd.DataFrame:
  """The rows of the best fixed arm's fresh-seed runs."""
  return table[(table["batch.kind"] == "fixed")
               & np.isclose(table["data.batch_size"].astype(float), float(best[SIZE]))
               & np.isclose(table["optimizer.lr"].astype(float), float(best["optimizer.lr"]))
               & (table["train.seed"] != SELECT_SEED)]


def fit_ramp(rows: pd.DataFrame, b_max: int) -> dict | None:
  """The linear ramp through the tracked total B_simple of `rows` (fixed runs): {"batch.start",
  "batch.ramp_tokens", "a", "b_per_token"} (None without enough logged points).

  B_simple ≈ a + b·tokens (least squares over steps past WARMUP, or past the first quarter
  of a shorter run, mean over seeds), then start = the largest power-of-two size ≤ a within
  [b_max/8, b_max], and the ramp from start to b_max at slope b: ramp_tokens = (b_max −
  start) / b (b ≤ 0: no ramp within 100 runs' tokens)."""
  key = "gns/total/b_simple"
  if key not in rows or rows[key].notna().sum() < 3:
    return None
  warmup = min(WARMUP, int(rows["step"].max()) // 4)  # short (ci) runs: their first quarter
  pts = rows[rows["step"] > warmup].dropna(subset=[key, "train/tokens_seen"])
  mean = pts.groupby("train/tokens_seen")[key].mean()
  x, y = mean.index.to_numpy(float), mean.to_numpy(float)
  if len(x) < 3 or not np.isfinite(y).all():
    return None
  b, a = np.polyfit(x, y, 1)
  sizes_ = [b_max >> i for i in range(3, -1, -1)]
  start = max([s for s in sizes_ if s <= a] or [sizes_[0]])
  total = float(x.max())
  ramp = (b_max - start) / b if b > 0 else 100 * total
  return {"batch.start": int(start), "batch.ramp_tokens": int(round(min(ramp, 100 * total))),
          "a": float(a), "b_per_token": float(b)}


def follow_up(preset: str, sweep_dir: Path) -> tuple[Block, ...]:
  """The schedules at the best fixed arm's lr and fresh seeds: gns_norm, gns_total, and
  linear_fit with its ramp fitted to that arm's runs (`fit_ramp`)."""
  from experiments.runs import aggregate, finals

  table = aggregate(sweep_dir)
  best = best_fixed(finals(table)) if not table.empty else None
  if best is None:
    return ()
  lr, seeds = [float(best["optimizer.lr"])], list(SEEDS[preset])
  blocks = [Block({"batch.kind": ["gns"], "batch.gns_group": ["norm", "total"],
                   "optimizer.lr": lr, "train.seed": seeds})]
  fit = fit_ramp(_best_runs(table, best), sizes(preset)[1])
  if fit is not None:
    blocks.append(Block({"batch.kind": ["linear"], "batch.ramp_tokens": [fit["batch.ramp_tokens"]],
                         "optimizer.lr": lr, "train.seed": seeds},
                        fixed={"batch.start": fit["batch.start"]}))
  return tuple(blocks)


# --- analysis ----------------------------------------------------------------------------
def arm(row: dict) -> str:
  """fixed_<B> | gns_norm | gns_total | linear_fit, from a run's swept values."""
  kind = row.get("batch.kind")
  if kind == "fixed":
    return f"fixed_{int(row['data.batch_size'])}"
  if kind == "gns":
    group = row.get("batch.gns_group")
    return f"gns_{'total' if group is None or pd.isna(group) else group}"
  return "linear_fit" if kind == "linear" else str(kind)


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


def compared(table: pd.DataFrame, search: pd.DataFrame, best: dict | None) -> pd.DataFrame:
  """The rows judged: each fixed arm's runs at its chosen lr (`search`: `lr_search.best_lr`
  of the fixed runs) on the fresh seeds, and the schedules' runs at the best arm's lr."""
  if best is None:
    return table[:0]
  chosen = {float(r[SIZE]): float(r["optimizer.lr"]) for _, r in search.iterrows()}
  lr, size = table["optimizer.lr"].astype(float), table["data.batch_size"].astype(float)
  fixed = (table["batch.kind"] == "fixed") & (table["train.seed"] != SELECT_SEED) & np.isclose(
      lr, size.map(chosen).fillna(-1.0))
  sched = (table["batch.kind"] != "fixed") & np.isclose(lr, float(best["optimizer.lr"]))
  return table[fixed | sched]


def curves(table: pd.DataFrame) -> pd.DataFrame:
  """Per run and evaluation: arm, seed, lr, step, tokens, eval loss, training time (s) and
  batch size there (time: interpolated from the train records that log it)."""
  rows = []
  for run, g in table.groupby("run", sort=False):
    g = g.sort_values("step")
    ev = g.dropna(subset=["eval/loss"])
    tr = g.dropna(subset=["train/tokens_seen"])
    timed = tr.dropna(subset=["train/train_time_s"]) if "train/train_time_s" in tr else tr[:0]
    tokens = ev["eval/tokens_seen"].to_numpy(float)
    time_s = (np.interp(tokens, timed["train/tokens_seen"], timed["train/train_time_s"])
              if len(timed) else np.full(len(ev), np.nan))
    size = np.interp(ev["step"], tr["step"], tr["train/batch_size"]) if len(tr) else np.nan
    rows.append(pd.DataFrame({
        "run": run, "arm": arm(g.iloc[0].to_dict()), "train.seed": g["train.seed"].iloc[0],
        "lr": g["optimizer.lr"].iloc[0], "step": ev["step"].to_numpy(), "tokens": tokens,
        "eval_loss": ev["eval/loss"].to_numpy(), "train_time_s": time_s, "batch_size": size}))
  cols = ["run", "arm", "train.seed", "lr", "step", "tokens", "eval_loss", "train_time_s",
          "batch_size"]
  return pd.concat(rows, ignore_index=True)[cols] if rows else pd.DataFrame(columns=cols)


def to_target(cur: pd.DataFrame, best_arm: str) -> pd.DataFrame:
  """Per run: the seed's target (the best fixed arm's final eval loss), tokens and time to
  reach it."""
  rows = []
  for seed, s in cur.groupby("train.seed"):
    ref = s[s["arm"] == best_arm].sort_values("tokens")
    if ref.empty:
      continue
    target = float(ref["eval_loss"].iloc[-1])
    for run, r in s.groupby("run", sort=False):
      r = r.sort_values("tokens")
      x, y = r["tokens"].to_numpy(float), r["eval_loss"].to_numpy(float)
      tok = crossing(x, y, target)
      t = (float(np.interp(tok, x, r["train_time_s"].to_numpy(float)))
           if math.isfinite(tok) else math.inf)
      rows.append({"run": run, "arm": r["arm"].iloc[0], "train.seed": seed, "target": target,
                   "tokens_to_target": tok, "time_to_target_s": t,
                   "final_eval_loss": float(y[-1]), "tokens_total": float(x[-1]),
                   "time_total_s": float(r["train_time_s"].iloc[-1]),
                   "updates": int(r["step"].iloc[-1])})
  return pd.DataFrame(rows)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  """best.csv (fixed arms' lr search; `best_arm` marks the baseline), curves.csv and
  to_target.csv (the runs judged), gns.csv (tracked B_simple per step), ramp_fit.csv."""
  out_dir = Path(out_dir)
  fin.to_csv(out_dir / "finals.csv", index=False)
  best = best_fixed(fin)
  fixed = fin[fin["batch.kind"] == "fixed"] if "batch.kind" in fin else fin[:0]
  search = (lr_search.best_lr(fixed, GROUP, "optimizer.lr", select_seed=SELECT_SEED) if len(fixed)
            else pd.DataFrame(columns=[*GROUP, "optimizer.lr"]))
  search["best_arm"] = [best is not None and r[SIZE] == best[SIZE]
                        for _, r in search.iterrows()]
  search.to_csv(out_dir / "best.csv", index=False)
  judged = compared(table, search, best)
  cur = curves(judged)
  cur.to_csv(out_dir / "curves.csv", index=False)
  best_arm = f"fixed_{int(best[SIZE])}" if best is not None else ""
  to_target(cur, best_arm).to_csv(out_dir / "to_target.csv", index=False)
  keys = [k for k in ("gns/total/b_simple", "gns/norm/b_simple") if k in judged]
  if keys:
    t = judged.dropna(subset=keys, how="all")
    g = pd.DataFrame({"run": t["run"], "arm": [arm(r) for r in t.to_dict("records")],
                      "train.seed": t["train.seed"], "step": t["step"],
                      "tokens": t["train/tokens_seen"],
                      **{k.split("/")[1]: t[k] for k in keys}})
    g.to_csv(out_dir / "gns.csv", index=False)
  fit = None
  if best is not None and "train/batch_size" in table:
    fit = fit_ramp(_best_runs(table, best), int(table["train/batch_size"].max()))
  pd.DataFrame([fit] if fit else []).to_csv(out_dir / "ramp_fit.csv", index=False)


def figures(out_dir: Path) -> list[Path]:
  """Eval loss (whole run, and the end where the target is crossed), batch size and the
  tracked B_simple (total solid, normalization layers dashed) against tokens; means over
  seeds per evaluation (the arms evaluate at the same examples seen, up to one batch)."""
  out_dir = Path(out_dir)
  cur = pd.read_csv(out_dir / "curves.csv")
  cur["eval_index"] = cur.sort_values("tokens").groupby("run").cumcount()
  fig, axes = plt().subplots(1, 4, figsize=(20, 4.2))
  colors = {a: f"C{i}" for i, a in enumerate(sorted(set(cur["arm"])))}
  for name, g in cur.groupby("arm", sort=True):
    agg = g.groupby("eval_index")[["tokens", "eval_loss", "batch_size"]].mean()
    for ax in axes[:2]:
      ax.plot(agg["tokens"], agg["eval_loss"], color=colors[name], label=name)
    axes[2].step(agg["tokens"], agg["batch_size"], where="post", color=colors[name], label=name)
  tt = pd.read_csv(out_dir / "to_target.csv") if (out_dir / "to_target.csv").stat().st_size > 1 \
      else pd.DataFrame()
  if len(tt):
    target = tt.groupby("train.seed")["target"].first().mean()
    for ax in axes[:2]:
      ax.axhline(target, color="k", lw=0.8, ls="--", label="target (best fixed, final)")
    axes[1].set_xlim(0.6 * cur["tokens"].max(), 1.01 * cur["tokens"].max())
    axes[1].set_ylim(target - 0.05, target + 0.35)
  style(axes[0], xlabel="tokens seen", ylabel="eval loss", title="eval loss (mean over seeds)",
        legend=8, grid=True)
  style(axes[1], xlabel="tokens seen", ylabel="eval loss", title="the end of the runs", grid=True)
  style(axes[2], xlabel="tokens seen", ylabel="batch size B (mean over seeds)",
        title="batch size", legend=8, grid=True)
  gpath = out_dir / "gns.csv"
  if gpath.exists():
    gdf = pd.read_csv(gpath).dropna(subset=["tokens"])
    for name, g in gdf.groupby("arm", sort=True):
      for col, ls in (("total", "-"), ("norm", "--")):
        for i, (_, r) in enumerate(g.groupby("run", sort=False)):
          if col in r:
            axes[3].plot(r["tokens"], r[col], color=colors.get(name), lw=0.8, ls=ls,
                         label=f"{name} ({col})" if i == 0 else None)
  style(axes[3], xlabel="tokens seen", ylabel="B_simple (α = 0.95)", yscale="log",
        title="tracked noise scale: total (—), norm layers (--)", legend=7, grid=True)
  return [savefig(fig, out_dir / "gns_schedule.png")]


def _pct(x: np.ndarray) -> str:
  if not len(x):
    return "not run"
  reached = np.isfinite(x)
  if not reached.all():
    return f"target not reached in {int((~reached).sum())} of {len(x)} seeds"
  return f"{100 * float(np.mean(x)):.1f}%" + (
      f" ± {100 * float(np.std(x, ddof=1)):.1f}" if len(x) > 1 else "")


def report(out_dir: Path) -> Report:
  out_dir = Path(out_dir)
  path, bpath = out_dir / "to_target.csv", out_dir / "best.csv"
  tt = pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()
  search = lr_search.load_best(out_dir) if bpath.exists() and bpath.stat().st_size > 1 \
      else pd.DataFrame()
  if tt.empty or search.empty or not search["best_arm"].any():
    return Report(verdict="not measured", rule=RULE, numbers_md="",
                  finding="no fixed arm finished its fresh seeds, so there is no target loss.")
  best = search[search["best_arm"]].iloc[0]
  base = f"fixed_{int(best[SIZE])}"
  tokens = {k: g["tokens_to_target"].tolist() for k, g in tt.groupby("arm")}
  times = {k: g["time_to_target_s"].tolist() for k, g in tt.groupby("arm")}
  pairs_ = [(k, base) for k in GUIDED]
  v, pairs = verdict.decide(tokens, pairs_)
  _, time_pairs = verdict.decide(times, pairs_)
  ref = tt[tt["arm"] == base].set_index("train.seed")["tokens_to_target"]
  saving = {}
  for k in GUIDED:
    s = tt[tt["arm"] == k].set_index("train.seed")["tokens_to_target"]
    saving[k] = 1.0 - (s / ref.reindex(s.index)).to_numpy(float)
  by_arm = tt.groupby("arm").agg(
      tokens_to_target=("tokens_to_target", "mean"), tokens_std=("tokens_to_target", "std"),
      time_to_target_s=("time_to_target_s", "mean"), final_eval_loss=("final_eval_loss", "mean"),
      final_std=("final_eval_loss", "std"), updates=("updates", "mean"),
      seeds=("run", "count")).reset_index()
  arms = lr_search.group_lines(search, lambda r: f"fixed B={int(r[SIZE])}")
  measured = (f"Baseline: the best fixed arm, B = {int(best[SIZE])} at lr "
              f"{best['optimizer.lr']:g} (fixed arms' fresh-seed final eval loss, {arms}). "
              "Token saving to reach its final loss: GNS-guided online by the normalization "
              f"layers {_pct(saving['gns_norm'])}, by the whole model "
              f"{_pct(saving['gns_total'])}, linear ramp fitted to the measured GNS "
              f"{_pct(saving['linear_fit'])} (paper: {100 * PAPER_SAVING:.0f}%). "
              + "; ".join(p.sentence() for p in pairs) + ". Wall time to target: "
              + "; ".join(p.sentence() for p in time_pairs) + ".")
  return Report(verdict=v, rule=RULE, finding=f"Rule: {RULE} {measured}", claim_row=measured,
                numbers_md="Fixed arms (lr chosen on seed 0; fresh seeds):\n\n"
                + lr_search.best_md(search, GROUP, extra=("best_arm",))
                + "\n\nTokens to target (per run):\n\n"
                + md_table(tt.replace(math.inf, "never"))
                + "\n\nBy arm (mean and std over seeds):\n\n" + md_table(by_arm)
                + "\n\nTokens to target:\n\n" + verdict.pairs_md(pairs)
                + "\n\nWall time to target (s; 2 runs shared the 2 cores; not judged):\n\n"
                + verdict.pairs_md(time_pairs) + _fit_md(out_dir))


def _fit_md(out_dir: Path) -> str:
  path = out_dir / "ramp_fit.csv"
  fit = pd.read_csv(path) if path.exists() and path.stat().st_size > 1 else pd.DataFrame()
  if fit.empty:
    return ""
  return ("\n\nThe fitted ramp (best fixed arm's total B_simple ≈ a + b·tokens):\n\n"
          + md_table(fit))


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["G3"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, follow_up=follow_up))
