"""Claim 4: with lr tuned at a reference batch size and scaled by sqrt(B / B_ref), Adam's
loss-vs-examples curves collapse for small to medium B and separate at large B.

Design. Adam's lr at B_ref (the scale's batch size; cpu: 32) is scaled by (B / B_ref)^κ,
κ = 1/2 (`optimizer.lr_scaling=sqrt`), beside κ = 1 (`linear`) and κ = 0 (`none`). Every
run sees B_ref's examples (train.steps × B_ref; cpu: 12,800), raised so that the largest B
takes ≥ `MIN_STEPS` steps, with the warmup in examples and evals at the same examples.
B_ref runs once (labelled `sqrt`). Its lr is one step of the preconditioner search's
factor-3 grid below the lr it chose for Adam (`LR_STEP`): at this horizon (400 steps of
B = 32) that search ends at 4.008 with 3e-2, 4.023 with 1e-2 and 5.2 with 1e-1 (Adam's
stability cliff), and from 3e-2 sqrt scaling put B = 64 (4.2e-2) at 4.50 against B_ref's
3.81. From 1e-2 sqrt stays ≤ 3e-2 up to B = 128 (2e-2); linear reaches 4e-2 there.

The rule (`RULE`): `rules.equivalence` within ±`MARGIN` over the second half of training.
At the cpu runs' noise at B_ref (spread of the seeds' curve averages 0.0115, per point
0.013, 13 points) identical curves pass with 3 seeds at margin 0.02 about 21% of the time,
with 5 seeds at 0.03 about 96% (`rules.simulate_curves`; tests/test_batch_scaling.py): so
sqrt and B_ref run 5 seeds at margin 0.03 nats, the contrasts (linear, none) 3. A failed
test is "breaks" when its interval lies beyond the margin, a seed diverged
(`rules.diverged`: eval loss above ln V) or identical curves at its measured noise pass
≥ `POWER` of the time (`power`); otherwise "undetermined" (underpowered).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search, rules
from experiments import verdict as V
from experiments.figures import plot_curves, plt, savefig, style
from experiments.record import ROWS, Experiment, Inputs, Report, register
from experiments.report_md import md_table
from experiments.sweep import PRESETS, Block, Sweep, base_for, scale_value

NAME = "batch_scaling"
TITLE = "square-root learning-rate scaling with batch size"
CLAIM = ("With lr tuned at a reference batch size and scaled by sqrt(B / B_ref), Adam's "
         "loss-vs-examples curves nearly coincide for small to medium batch sizes and "
         "separate at large batch sizes; sqrt scaling does this better than linear or no "
         "scaling.")
KEY = "data.batch_size"
SCALING = "optimizer.lr_scaling"
REF = "optimizer.ref_batch_size"
SEED = "train.seed"
SCALINGS = ("sqrt", "linear", "none")  # sqrt first: the claim's; B_ref runs once, as sqrt

SIZES = {"ci": [8, 32], "cpu": [8, 16, 64, 128], "paper": [32, 64, 128, 256, 512, 1024, 2048]}
SEEDS = {"ci": [0], "cpu": [0, 1, 2, 3, 4], "paper": [0, 1, 2, 3, 4]}  # sqrt and B_ref
CONTRAST_SEEDS = {"ci": [0], "cpu": [0, 1, 2], "paper": [0, 1, 2]}  # linear, none
SCALINGS_AT = {"ci": ("sqrt", "linear"), "cpu": SCALINGS, "paper": SCALINGS}
MIN_STEPS = {"ci": 4, "cpu": 100, "paper": 200}  # steps of the largest B, at least
N_EVALS = {"ci": 4, "cpu": 25, "paper": 40}  # evaluations per run, at the same examples
LR_STEP = 3.0  # B_ref's lr = the preconditioner search's Adam lr / LR_STEP (one grid step)
MARGIN = 0.03  # nats: the equivalence margin
POWER = 0.9  # a failed test is "breaks" only if identical curves would pass this often
POWER_REPS = 400  # simulated pairs of identical families per power estimate
STEP_S_B32 = 0.085  # s per step at B = 32 (∝ B) on 2 cores (Adam, scale=cpu, 2026-11-23)
RUN_OVERHEAD_S = 10.0  # s per run: start-up, compilation, evaluations, checkpoints
COLLAPSES, BREAKS, UNDETERMINED = "collapses", "breaks", "undetermined"
RULE = (f"Over the second half of training's eval points, B collapses onto B_ref when the "
        f"{100 * (1 - 2 * rules.ALPHA):g}% Welch interval of the gap of the seeds' curve "
        f"averages lies within ±{MARGIN:g} nats and no point's gap of seed means exceeds "
        f"{rules.GUARD:g} × {MARGIN:g} (rules.equivalence, ≥ 2 seeds a side); if not, it breaks "
        f"when the interval lies beyond the margin, a seed diverged (eval loss above ln V), "
        f"or identical curves at the measured noise pass ≥ {POWER:.0%} of the time, else it is "
        "undetermined (underpowered). "
        "Reproduced when under √ scaling every B below the smallest B that breaks collapses, "
        "at least one B above B_ref does, some B breaks, and there √ beats linear and none "
        "(each seed's mean |gap| to B_ref's seed-mean curve, lower by more than the combined "
        "seed spread, experiments.verdict); not reproduced when another scaling beats √ "
        "there or √ collapses at no B that was decided; undetermined when no B was decided.")


@dataclasses.dataclass(frozen=True)
class Plan:
  """What every run of the sweep sees at one preset."""

  sizes: tuple
  ref: int  # B_ref: the scale's batch size
  examples: int  # examples per run (every B)
  warmup_examples: int
  eval_examples: int  # examples between two evaluations (every B)
  seeds: tuple  # of sqrt (and B_ref)
  contrast_seeds: tuple  # of the other scalings
  scalings: tuple

  def steps(self, b: int) -> int:
    return self.examples // b

  def runs(self, b: int) -> int:
    if b == self.ref:
      return len(self.seeds)
    return len(self.seeds) + (len(self.scalings) - 1) * len(self.contrast_seeds)


def plan(preset: str) -> Plan:
  """The examples budget is the reference run's (the scale's steps times B_ref), raised so
  that the largest B takes at least MIN_STEPS steps, and rounded up to a multiple of
  N_EVALS times the largest B, so that every B evaluates at the same examples counts."""
  ref = int(scale_value(preset, "data.batch_size"))
  sizes = tuple(sorted(set(SIZES[preset]) | {ref}))
  top = max(sizes)
  examples = max(ref * int(scale_value(preset, "train.steps")), MIN_STEPS[preset] * top)
  unit = N_EVALS[preset] * top
  examples = math.ceil(examples / unit) * unit
  every = examples // N_EVALS[preset]
  assert all(every % b == 0 for b in sizes), (sizes, every)
  warm = ref * int(scale_value(preset, "schedule.warmup_steps"))
  return Plan(sizes, ref, examples, warm, every, tuple(SEEDS[preset]),
              tuple(CONTRAST_SEEDS[preset]), SCALINGS_AT[preset])


def wall_estimate_min(p: Plan) -> float:
  """Minutes on 2 cores: runs × (steps × STEP_S_B32 · B/32 + RUN_OVERHEAD_S)."""
  s = sum(p.runs(b) * (p.steps(b) * STEP_S_B32 * b / 32 + RUN_OVERHEAD_S) for b in p.sizes)
  return s / 60


def sweep(preset: str, inputs: Inputs | None = None) -> Sweep:
  """At cpu and paper, B_ref's lr is the preconditioner search's Adam lr (no clipping)
  / LR_STEP, re-derived from its runs (`inputs`); at ci, the config's."""
  p = plan(preset)
  tuned = {}
  if preset != "ci":
    lr = lr_search.tuned_lr(inputs, "preconditioner",
                            {"optimizer.variant": "adam", "optimizer.clip_norm": None})
    tuned = {"optimizer.lr": float(f"{lr / LR_STEP:.3g}")}
  base = base_for(NAME, preset, **tuned)
  blocks = []
  for b in p.sizes:
    steps = p.steps(b)
    fixed = {"train.steps": steps, "train.eval_every": p.eval_examples // b,
             "train.checkpoint_every": max(steps // 4, 1),
             "logging.log_every": max(steps // 40, 1),
             "schedule.warmup_steps": max(p.warmup_examples // b, 1)}
    groups = [(p.scalings[:1], p.seeds)]
    if b != p.ref and len(p.scalings) > 1:
      groups.append((p.scalings[1:], p.contrast_seeds))
    blocks += [Block({KEY: [b], REF: [p.ref], SCALING: list(sc), SEED: list(seeds)},
                     fixed=fixed) for sc, seeds in groups]
  est = {"ci": 1.0}.get(preset, round(wall_estimate_min(p)) if preset == "cpu" else None)
  return Sweep(base, tuple(blocks), wall_estimate_min=est)


# --------------------------------------------------------------------------- analysis


def vocab_size(out_dir: Path) -> int:
  """data.vocab_size of `experiment=batch_scaling scale=<preset>`, the preset read from
  where the runner writes (results/<preset>/<name>, <sweeps>/<name>/<preset>/report)."""
  from pergrad.analysis import composed

  preset = Path(out_dir).resolve().parent.name.split("-")[0]
  scale = [f"scale={preset}"] if preset in PRESETS else []
  return int(composed([f"experiment={NAME}", *scale])["data"]["vocab_size"])


def eval_curves(table: pd.DataFrame, fin: pd.DataFrame, vocab: int) -> pd.DataFrame:
  """Eval rows: batch size, scaling, seed, examples seen (= step × B), eval loss, and
  whether the run diverged (non-finite, or `rules.diverged` with V = vocab)."""
  t = table.copy()
  t["examples_seen"] = t["step"] * t[KEY]
  div = dict(zip(fin["run"], fin["diverged"], strict=False)) if "diverged" in fin else {}
  by_lnv = rules.diverged_runs(t, vocab) if "eval/loss" in t else pd.Series(dtype=bool)
  t["diverged"] = (t["run"].map(div).fillna(False).astype(bool)
                   | t["run"].map(by_lnv).fillna(False).astype(bool))
  cols = ["run", KEY, SCALING, SEED, "step", "examples_seen", "diverged",
          *[c for c in ("eval/loss", "train/loss", "train/lr") if c in t]]
  return t[cols]


def _seed_curves(g: pd.DataFrame, xs) -> np.ndarray:
  """seeds × len(xs) eval losses; a diverged run is +inf everywhere, a point a run has
  not reached is NaN."""
  out = []
  for _, r in g.groupby(SEED):
    ev = r.dropna(subset=["eval/loss"]).drop_duplicates("examples_seen", keep="last")
    y = ev.set_index("examples_seen")["eval/loss"].reindex(xs).to_numpy(dtype=float)
    out.append(np.full(len(xs), np.inf) if bool(r["diverged"].any()) else
               np.where(np.isnan(y) | np.isfinite(y), y, np.inf))
  return np.array(out).reshape(len(out), len(xs))


def power(a_SxP, b_SxP, margin: float = MARGIN, reps: int = POWER_REPS, rho: float = 0.5) -> float:
  """How often `rules.equivalence` passes two families of IDENTICAL curves with the seeds,
  points and noise of a and b (`rules.simulate_curves`, AR(1) ρ along the points): each
  family's per-point seed std σ, and the shared per-seed offset that gives its spread of
  curve averages s̄. NaN: < 2 seeds on a side, or a non-finite value."""
  a, b = np.asarray(a_SxP, float), np.asarray(b_SxP, float)
  keep = ~(np.isnan(a).any(axis=0) | np.isnan(b).any(axis=0))
  a, b = a[:, keep], b[:, keep]
  if min(len(a), len(b)) < 2 or not keep.any() or not np.isfinite([a.sum(), b.sum()]).all():
    return math.nan
  k = np.arange(a.shape[1])  # v_avg: the variance of the mean of a unit AR(1) over k
  v_avg = float(np.mean(rho ** np.abs(k[:, None] - k[None, :])))

  def sim(rng, x):
    sigma = float(np.sqrt(np.mean(np.var(x, axis=0, ddof=1))))
    r = float(np.var(x.mean(axis=1), ddof=1)) / sigma**2 if sigma > 0 else 1.0
    shared = float(np.clip((r - v_avg) / (1 - v_avg), 0.0, 1.0))
    return rules.simulate_curves(rng, len(x), x.shape[1], sigma, rho, shared=shared)

  rng = np.random.default_rng(0)
  return sum(bool(rules.equivalence(sim(rng, a), sim(rng, b), margin).equivalent)
             for _ in range(reps)) / reps


def outcome(eq: rules.Equivalence, pw: float) -> str:
  """collapses | breaks | undetermined from an equivalence test and its power (RULE)."""
  if eq.equivalent:
    return COLLAPSES
  if eq.equivalent is None:
    return UNDETERMINED
  beyond = eq.lo > eq.margin or eq.hi < -eq.margin or math.isinf(eq.max_abs_gap)
  return BREAKS if beyond or (not math.isnan(pw) and pw >= POWER) else UNDETERMINED


def collapse_tables(curves: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
  """(points, mismatch, summary) of every (scaling, B) against B_ref's curve: per
  second-half eval point the seed means and their gap; per seed the mean |gap| of its
  curve to B_ref's seed-mean curve (inf: diverged); per (scaling, B) the equivalence test
  (gap, interval, max point gap), its power and outcome, steps, final eval loss."""
  ref_b = int(curves["ref"].iloc[0])
  ref = curves[curves[KEY] == ref_b]
  x_ref = ref.dropna(subset=["eval/loss"])["examples_seen"]
  xs = np.array(sorted(x for x in x_ref.unique() if x > ref["examples_seen"].max() / 2))
  ref_y = _seed_curves(ref, xs)  # B_ref's runs are the same under every scaling
  with np.errstate(invalid="ignore"):
    m_ref = ref_y.mean(axis=0) if len(ref_y) else np.full(len(xs), np.nan)
  points, mismatch, summary = [], [], []
  scalings = [s for s in SCALINGS if s in set(curves[SCALING])] + sorted(
      set(curves[SCALING]) - set(SCALINGS))
  for scaling in scalings:
    for b in sorted(int(b) for b in curves[KEY].unique()):
      runs = ref if b == ref_b else curves[(curves[KEY] == b) & (curves[SCALING] == scaling)]
      if runs.empty:
        continue
      y = ref_y if b == ref_b else _seed_curves(runs, xs)
      with np.errstate(invalid="ignore"):
        sd = y.std(axis=0, ddof=1) if len(y) > 1 else np.nan * xs
        points.append(pd.DataFrame({SCALING: scaling, KEY: b, "examples_seen": xs.astype(int),
                                    "mean": y.mean(axis=0), "std": sd, "n_seeds": len(y),
                                    "mean_ref": m_ref, "gap": y.mean(axis=0) - m_ref}))
      for seed, row in zip(sorted(runs[SEED].unique()), y, strict=False):
        d = np.abs(row - m_ref)
        mis = math.inf if np.isinf(d).any() else float(np.nanmean(d)) if len(d) else math.nan
        mismatch.append({SCALING: scaling, KEY: b, SEED: int(seed), "mean_abs_gap": mis})
      eq = rules.equivalence(y, ref_y, MARGIN)
      pw = math.nan if b == ref_b else power(y, ref_y)
      steps = runs.groupby("run")["step"].max()
      fm = V.summarize(y[:, -1] if len(xs) else [])
      summary.append({
          SCALING: scaling, KEY: b, "reference": b == ref_b, "n_seeds": len(y),
          "n_diverged": int(runs.groupby("run")["diverged"].any().sum()),
          "steps": int(steps.max()) if len(steps) else 0,
          "examples": int(runs["examples_seen"].max()),
          "peak_lr": float(runs["train/lr"].max()) if "train/lr" in runs else math.nan,
          "n_points": len(xs), "gap": eq.gap, "lo": eq.lo, "hi": eq.hi,
          "max_abs_gap": eq.max_abs_gap, "power": pw,
          "outcome": "reference" if b == ref_b else outcome(eq, pw),
          "final_eval_loss": fm.mean, "final_eval_loss_std": fm.std})
  points = pd.concat(points, ignore_index=True) if points else pd.DataFrame()
  return points, pd.DataFrame(mismatch), pd.DataFrame(summary)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path,
            vocab: int | None = None) -> None:
  """curves.csv (with ref and vocab_size), collapse_points.csv, mismatch.csv, collapse.csv;
  vocab: V of `rules.diverged` (default: `vocab_size(out_dir)`)."""
  fin.to_csv(Path(out_dir) / "finals.csv", index=False)
  out_dir, vocab = Path(out_dir), vocab or vocab_size(out_dir)
  curves = eval_curves(table, fin, vocab)
  curves.insert(1, "ref", int(table[REF].dropna().iloc[0]))
  curves.insert(2, "vocab_size", vocab)
  curves.to_csv(out_dir / "curves.csv", index=False)
  points, mismatch, summary = collapse_tables(curves)
  for df, name in ((points, "collapse_points"), (mismatch, "mismatch"), (summary, "collapse")):
    df.to_csv(out_dir / f"{name}.csv", index=False)


# --------------------------------------------------------------------------- figures


def figures(out_dir: Path) -> list[Path]:
  out_dir = Path(out_dir)
  curves = pd.read_csv(out_dir / "curves.csv")
  col = pd.read_csv(out_dir / "collapse.csv")
  ref_b = int(curves["ref"].iloc[0])
  scalings = [s for s in SCALINGS if s in set(curves[SCALING])]
  n = len(scalings) + 1
  axes = (fig := plt().figure(figsize=(4.6 * n, 4.2))).subplots(1, n, squeeze=False)[0]
  y = curves["eval/loss"].replace([np.inf, -np.inf], np.nan).dropna()
  half = curves.groupby(KEY)["examples_seen"].max().max() / 2
  for ax, scaling in zip(axes, scalings, strict=False):
    sel = (curves[SCALING] == scaling) | (curves[KEY] == ref_b)
    c = curves[sel].replace([np.inf, -np.inf], np.nan)
    plot_curves(ax, c, [KEY], "eval/loss", labeler=lambda g: f"B={int(g[KEY])}")
    ax.axvline(half, color="grey", ls=":", lw=1)
    if not y.empty:
      ax.set_ylim(y.min() - 0.05, np.percentile(y, 85) + 0.1)
    style(ax, title=f"lr_scaling={scaling}: eval loss vs examples", legend=7)
  ax = axes[-1]
  for i, scaling in enumerate(scalings):  # side by side
    g = col[(col[SCALING] == scaling) & np.isfinite(col["gap"]) & (col[KEY] != ref_b)]
    ax.errorbar(g[KEY] * 2 ** (0.06 * (i - 1)), g["gap"], fmt="o", capsize=3, label=scaling,
                yerr=[g["gap"] - g["lo"], g["hi"] - g["gap"]])
  ax.axhspan(-MARGIN, MARGIN, color="grey", alpha=0.2, label=f"±{MARGIN:g} (margin)")
  ax.set_xscale("log", base=2)
  ax.set_yscale("symlog", linthresh=MARGIN)
  style(ax, xlabel="batch size B", ylabel="gap of curve averages to B_ref (90% interval)",
        title=f"collapse onto B_ref = {ref_b}", legend=8, grid=True)
  return [savefig(fig, out_dir / "batch_scaling.png")]


# --------------------------------------------------------------------------- report


def _at(sizes) -> str:  # "at B = 8, 64" or "at no B"
  return "at B = " + ", ".join(str(int(b)) for b in sizes) if len(sizes) else "at no B"


def judge(col: pd.DataFrame, mismatch: pd.DataFrame) -> dict:
  """The rule's outcome from collapse.csv and mismatch.csv (see RULE)."""
  ref_b = int(col.loc[col["reference"].astype(bool), KEY].iloc[0])
  out = {"ref": ref_b, "scalings": {}}
  for scaling, g in col[~col["reference"].astype(bool)].groupby(SCALING, sort=False):
    by = {o: sorted(int(b) for b in g.loc[g["outcome"] == o, KEY]) for o in
          (COLLAPSES, BREAKS, UNDETERMINED)}
    out["scalings"][scaling] = {"collapsed": by[COLLAPSES], "not_collapsed": by[BREAKS],
                                "undetermined": by[UNDETERMINED],
                                "break": min(by[BREAKS]) if by[BREAKS] else None}
  sq = out["scalings"].get("sqrt")
  sizes = sorted(int(b) for b in col[KEY].unique() if int(b) != ref_b)
  out["at"] = at = (sq["break"] if sq and sq["break"] is not None
                    else (max(sizes) if sizes else None))
  vals = lambda s: list(mismatch.loc[(mismatch[SCALING] == s) & (mismatch[KEY] == at),
                                     "mean_abs_gap"])
  out["pairs"] = pairs = [V.compare(vals("sqrt"), vals(o), (f"sqrt at B={at}", f"{o} at B={at}"))
                          for o in ("linear", "none") if at is not None and o in out["scalings"]]
  if not sq or not (sq["collapsed"] or sq["not_collapsed"]):
    v = "undetermined"
  elif any(p.outcome == V.LOSS for p in pairs) or not (sq["collapsed"] or sq["undetermined"]):
    v = "not reproduced"
  elif (sq["break"] is not None and any(ref_b < b < sq["break"] for b in sq["collapsed"])
        and all(b in sq["collapsed"] for b in sizes if b < sq["break"])
        and pairs and all(p.outcome == V.WIN for p in pairs)):
    v = "reproduced"
  else:
    v = "partly reproduced"
  out["verdict"] = v
  return out


def report(out_dir: Path) -> Report:
  col = pd.read_csv(Path(out_dir) / "collapse.csv")
  j = judge(col, pd.read_csv(Path(out_dir) / "mismatch.csv"))
  ref_b, ref_row = j["ref"], col[col["reference"].astype(bool)].iloc[0]
  seeds, steps = int(ref_row["n_seeds"]), col.drop_duplicates(KEY).sort_values(KEY)
  steps_text = ", ".join(f"B={int(r[KEY])}: {int(r['steps'])}" for _, r in steps.iterrows())
  brk = lambda d: (f"breaks at B = {d['break']}" if d.get("break") is not None
                   else "break undetermined" if d.get("undetermined") else "never breaks")
  per = [f"{s}: collapses {_at(d['collapsed'])}, {brk(d)}"
         + (f" (undetermined {_at(d['undetermined'])})" if d["undetermined"] else "")
         for s, d in j["scalings"].items()]
  finding = (f"Eval-loss curves against B_ref = {ref_b} over the second half of training "
             f"({int(ref_row['n_points'])} eval points; {int(ref_row['examples']):,} examples "
             f"per run, steps {steps_text}; {seeds} seed(s) at B_ref and under √, margin "
             f"±{MARGIN:g} nats). " + "; ".join(per)
             + f". At B = {j['at']} (mean |gap| to the reference curve per seed): "
             + ("; ".join(p.sentence() for p in j["pairs"]) or "no other scaling") + ".")
  sq = j["scalings"].get("sqrt", {})
  row = ("√B: collapses " + _at(sq.get("collapsed", [])) + f", {brk(sq)}"
         + (f", undetermined {_at(sq['undetermined'])}" if sq.get("undetermined") else "")
         + "".join(f"; {s}: {brk(d)}" for s, d in j["scalings"].items() if s != "sqrt")
         + f" (B_ref = {ref_b}, {seeds} seed(s), ±{MARGIN:g} nats, "
         + f"{int(ref_row['examples']):,} examples). At B = {j['at']}: "
         + ", ".join(f"√ {p.outcome} vs {p.b.split(' ')[0]}" for p in j["pairs"]) + ".")
  show = col.rename(columns={KEY: "B", SCALING: "lr_scaling"})[
      ["lr_scaling", "B", "n_seeds", "n_diverged", "steps", "peak_lr", "gap", "lo", "hi",
       "max_abs_gap", "power", "outcome", "final_eval_loss", "final_eval_loss_std"]]
  numbers = (md_table(show) + f"\n\n`gap` [`lo`, `hi`]: the gap of the seeds' curve averages "
             f"to B_ref's and its {100 * (1 - 2 * rules.ALPHA):g}% Welch interval; "
             f"`max_abs_gap`: the largest gap of seed means at one point; `power`: how often "
             f"identical curves at this noise pass (≥ {POWER:g} for a decided break). The "
             f"scalings compared at B = {j['at']}:\n\n"
             + (V.pairs_md(j["pairs"]) if j["pairs"] else "(none)"))
  return Report(verdict=j["verdict"], finding=finding, claim_row=row, rule=RULE,
                numbers_md=numbers)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["4"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("preconditioner",)))
