"""The scale ladder: the claims whose verdict may depend on scale, each at three model sizes
at the same tokens per parameter, one figure per claim with the trend and the paper's value
marked, so that a "not reproduced" at one size says which way it moves.

An experiment takes part by declaring a `Rung` (`pergrad.sweep.record`): the quantity it reads
from a rung's CSVs, the paper's value, the runs it launches at a rung. A rung is a scale preset
`<family>_<rung>` (`configs/scale/`, written by `write_presets` from `plan`): the family's
batch and sequence sizes, a smaller model (`RUNGS`), the steps that give it
`TOKENS_PER_PARAM`. Those experiments run there as anywhere (`reproduce.py moments --preset
cpu_xs`; results under results/<family>/ladder/<rung>/); the `ladder` experiment launches them
rung by rung (resumable) and collects them, each rung's value with that experiment's verdict
there ("undetermined: <guard>" where a validity guard fails).

A run at 20 tokens per parameter costs ∝ N², so the cpu ladder stops below the family's own
model (`projected_min`); each figure marks the family's own model beside the rungs (a star,
at its fewer tokens per parameter: `family_points`).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from pergrad.analysis.markdown import md_table, sections
from pergrad.analysis.plots import plt, savefig, style
from pergrad.analysis.report import Report
from pergrad.analysis.runs import read_csv, write_csv
from pergrad.sweep import (
  RUNG_PRESETS,
  How,
  LaunchLog,
  default_results_dir,
  default_sweep_dir,
  family,
  scale_file,
  scale_value,
)
from pergrad.sweep.record import Experiment, Rung, experiments, in_order, register

NAME = "ladder"
RUNGS = {  # model overrides per family; each family's last rung is its own scale's model
    "ci": {"xxs": {"model.d_model": 8, "model.n_heads": 2, "model.d_ff": 16},
           "xs": {"model.d_model": 16, "model.n_heads": 2, "model.d_ff": 32},
           "s": {}},
    "cpu": {"xxs": {"model.n_layers": 2, "model.d_model": 8, "model.n_heads": 2, "model.d_ff": 32},
            "xs": {"model.n_layers": 2, "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 64},
            "s": {"model.n_layers": 2, "model.d_model": 32, "model.n_heads": 4,
                  "model.d_ff": 128}},
    "paper": {"xxs": {"model.d_model": 128, "model.n_heads": 2, "model.d_ff": 512},
              "xs": {"model.d_model": 256, "model.n_heads": 4, "model.d_ff": 1024},
              "s": {}},
}
TOKENS_PER_PARAM = {"ci": 0.5, "cpu": 20.0, "paper": 20.0}  # Chinchilla-proportioned (G3's)
LADDER_CSV, LADDER_JSON = "ladder.csv", "ladder.json"
TITLE = "the scale ladder: C3c, C4, G2, G3 at three model sizes, same tokens per parameter"
CLAIM = ("Ours, beside the papers: whether each scale-dependent quantity moves toward the "
         "paper's value as the model grows at a fixed tokens-per-parameter budget.")
RULE = ("Per claim and rung, the quantity from that rung's run of the claim's experiment, with "
        "that experiment's own verdict (its validity guards first); the trend is the sign of "
        "the change in the distance to the paper's value (|value − paper|; for C3c and G2, whose "
        "paper value is a floor, how far below it) from the smallest to the largest rung whose "
        "verdict is decided, the rungs left out named: 'toward', 'away' or 'flat' (equal "
        "distances, as for a floor met at both ends), 'undetermined: <guard> at <rung>' when "
        "fewer than two rungs are decided. Descriptive (no interval): "
        "no claim is decided here.")


def presets(fam: str) -> list[str]:
  """The rung presets of a family, smallest first."""
  return [f"{fam}_{r}" for r in RUNGS[fam]]


@functools.lru_cache(maxsize=None)
def rung_size(fam: str, rung: str) -> int:
  """The parameters of a rung's model (shapes only; composed once per process)."""
  from pergrad.analysis import n_params

  return n_params([f"scale={fam}", *(f"{k}={v}" for k, v in RUNGS[fam][rung].items())])


def plan(fam: str = "cpu") -> pd.DataFrame:
  """Per rung: its parameters, the steps at the family's batch size and sequence length that
  give it TOKENS_PER_PARAM, those tokens, and the steps relative to the family's own run."""
  per_step = int(scale_value(fam, "data.batch_size")) * int(scale_value(fam, "data.seq_len"))
  rows = []
  for rung in RUNGS[fam]:
    n = rung_size(fam, rung)
    steps = math.ceil(TOKENS_PER_PARAM[fam] * n / per_step)
    rows.append({"rung": rung, "preset": f"{fam}_{rung}", "n_params": n, "train.steps": steps,
                 "tokens": steps * per_step, "tokens_per_param": steps * per_step / n,
                 "steps_vs_family": steps / int(scale_value(fam, "train.steps"))})
  return pd.DataFrame(rows)


FIXED_S = 3.6  # a later run's fixed cost in seconds (results/bench_sweep.json)
# Seconds per step ≈ a + c·N·B·T, fitted to gns_layers runs at cpu, cpu_s and cpu_xxs; only
# ratios enter `projected_min`.
STEP_S = (0.042, 2.555e-10)


def rungs() -> dict[str, Rung]:
  """{experiment: what it measures on the ladder}, in launch order: the most runs first (the
  lr_exponent search, whose lr the others take at a rung, first)."""
  have = {n: e.rung for n, e in experiments().items() if e.rung is not None}
  runs = lambda n: -len(have[n].runs(8, 64, "ci"))
  return {n: have[n] for n in in_order(sorted(have, key=runs))}


def rung_runs(fam: str, steps: int) -> list[tuple[int, int]]:
  """(batch size, steps) of every run the ladder's experiments launch at a rung of `steps`
  steps at the family's B (first stage and follow-ups, no grid extension)."""
  b = int(scale_value(fam, "data.batch_size"))
  return [r for rung in rungs().values() for r in rung.runs(b, steps, fam)]


def projected_min(fam: str = "cpu", results_root: Path | None = None) -> pd.DataFrame:
  """Per rung, the projected wall minutes of `rung_runs` on 2 cores: `FIXED_S` plus steps ×
  `STEP_S` per run, scaled so that a gns_layers run at the family's own scale costs what its
  committed run_info.json measured (its wall per run, joblib with 2 jobs)."""
  from pergrad.analysis import n_params

  root = Path(results_root or Path(__file__).resolve().parents[1] / "results" / fam)
  info = json.loads((root / "gns_layers" / "run_info.json").read_text())
  a, c = STEP_S
  b, t = int(scale_value(fam, "data.batch_size")), int(scale_value(fam, "data.seq_len"))
  step = lambda n, size: a + c * n * size * t
  load = (info["launch_wall_s"] / info["n_runs_completed"] - FIXED_S) / (
      int(scale_value(fam, "train.steps")) * step(n_params([f"scale={fam}"]), b))
  p = plan(fam)
  runs = [rung_runs(fam, int(n)) for n in p["train.steps"]]
  wall = [sum(FIXED_S + k * step(n, size) * load for size, k in r)
          for n, r in zip(p["n_params"], runs, strict=True)]
  return p[["rung", "n_params", "tokens"]].assign(
      runs=[len(r) for r in runs], minutes=[round(w / 60, 1) for w in wall])


def preset_text(fam: str, row: dict) -> str:
  """configs/scale/<family>_<rung>.yaml: the family's file with the rung's model and steps."""
  doc = yaml.safe_load(scale_file(fam).read_text())
  for key, v in {**RUNGS[fam][row["rung"]], "train.steps": int(row["train.steps"])}.items():
    group, k = key.split(".")
    doc[group][k] = v
  head = (f"# @package _global_\n# Scale `{row['preset']}`: a rung of the scale ladder "
          f"(experiments/ladder.py), the `{fam}` preset with a {row['n_params']:,}-parameter "
          f"model and {int(row['train.steps'])} steps: {row['tokens_per_param']:.1f} tokens per "
          "parameter, as every rung of its family.\n# Written by `python -m experiments.ladder "
          "--write-presets`; do not edit by hand.\n")
  return head + yaml.safe_dump(doc, sort_keys=False)


def write_presets() -> list[Path]:
  paths = []
  for fam in RUNGS:
    for row in plan(fam).to_dict("records"):
      path = scale_file(row["preset"])
      path.write_text(preset_text(fam, row))
      paths.append(path)
  return paths


def rung_dirs(fam: str, sweeps_root: Path, extra: tuple = ()) -> dict[tuple[str, str], Path]:
  """{(rung, experiment): where the runner writes that rung's results}."""
  return {(p.split("_", 1)[1], n): default_results_dir(
      n, p, default_sweep_dir(n, p, sweeps_root, extra)) for p in presets(fam) for n in rungs()}


def launch(preset: str, sweep_dir: Path, how: How) -> LaunchLog:
  """Runs (or resumes) the experiments with a `Rung` at every rung of `preset`'s family,
  smallest first (`how.run`); an experiment that fails at a rung is reported and the others
  go on."""
  log, root, echo = LaunchLog(), Path(how.sweeps_root or Path(sweep_dir).parents[1]), how.echo
  if not how.dry_run:  # what `analyze` reads back: the rungs' sweeps root and config extras
    Path(sweep_dir).mkdir(parents=True, exist_ok=True)
    Path(sweep_dir, LADDER_JSON).write_text(json.dumps(
        {"preset": preset, "sweeps_root": str(root), "extra": list(how.extra)}))
  for p in presets(family(preset)):
    for n in rungs():
      try:
        out = how.run(n, p, sweeps_root=root)
      except (FileNotFoundError, RuntimeError, ValueError) as e:
        echo(f"[ladder] {n} at {p}: {e}")
        log.failed.append(f"{n}/{p}")
        continue
      for f in ("launched", "skipped", "reused", "failed", "diverged", "commands"):
        getattr(log, f).extend(getattr(out.log, f))
      log.wall_s += out.log.wall_s
  return log


def verdict_at(out_dir: Path) -> str:
  """The verdict of the rung's report.json ("not yet run" without one)."""
  f = Path(out_dir) / "report.json"
  return json.loads(f.read_text()).get("verdict", "") if f.exists() else "not yet run"


def collect(dirs: dict[tuple[str, str], Path], sizes: pd.DataFrame) -> pd.DataFrame:
  """One row per (claim, rung): the rung's size, the quantity, its verdict, the paper's value."""
  by_rung, spec = sizes.set_index("rung"), rungs()
  return pd.DataFrame([{
      "claim": spec[n].claim, "experiment": n, "rung": rung,
      "n_params": int(by_rung.loc[rung, "n_params"]),
      "tokens_per_param": float(by_rung.loc[rung, "tokens_per_param"]),
      "value": spec[n].value(d), "paper": spec[n].paper, "verdict": verdict_at(d),
      "on_ladder": True}
      for (rung, n), d in dirs.items()])


def family_points(fam: str, results_dir: Path) -> pd.DataFrame:
  """Beside the ladder, not on it: each claim's value from the family's own experiment (its
  own model, e.g. `tiny`, at the family's budget: fewer tokens per parameter than the rungs),
  so a figure shows where the family's committed verdict sits against the rungs' trend; not
  for an experiment whose preset runs a rung-sized model already (`Rung.own_model`)."""
  from pergrad.analysis import n_params

  n_fam = n_params([f"scale={fam}"])
  tokens = (int(scale_value(fam, "data.batch_size")) * int(scale_value(fam, "data.seq_len"))
            * int(scale_value(fam, "train.steps")))
  return pd.DataFrame([{
      "claim": r.claim, "experiment": n, "rung": f"{fam} (own model)", "n_params": n_fam,
      "tokens_per_param": tokens / n_fam, "value": r.value(Path(results_dir) / n),
      "paper": r.paper, "verdict": verdict_at(Path(results_dir) / n), "on_ladder": False}
      for n, r in rungs().items() if r.own_model])


def analyze(runs, out_dir: Path) -> None:
  """ladder.csv from the rungs' results (`collect`), found where `launch` said."""
  f = Path(runs.sweep_dir) / LADDER_JSON
  if not f.exists():
    raise FileNotFoundError(f"{f} is missing: the ladder was not launched there; run "
                            "`python scripts/reproduce.py ladder --preset PRESET` first")
  d = json.loads(f.read_text())
  fam = family(d["preset"])
  dirs = rung_dirs(fam, Path(d["sweeps_root"]), tuple(d["extra"]))
  write_csv(pd.concat([collect(dirs, plan(fam)), family_points(fam, Path(out_dir).parent)],
            ignore_index=True), Path(out_dir) / LADDER_CSV)


def decided(verdict: str) -> bool:
  return bool(verdict) and not verdict.startswith(("undetermined", "not yet run", "not measured"))


def on_ladder(g: pd.DataFrame) -> pd.DataFrame:
  """The rungs' rows (a ladder.csv without the column predates the family's own points)."""
  return g[g["on_ladder"].astype(bool)] if "on_ladder" in g else g


def distance(value: float, paper: float, one_sided: bool) -> float:
  """How far `value` is from the paper's (0 past a floor, `Rung.one_sided`)."""
  return max(0.0, paper - value) if one_sided else abs(value - paper)


def trend(g: pd.DataFrame) -> str:
  """toward | away | flat (the paper's `distance` from the smallest to the largest decided rung
  with a finite value; the rungs left out named), else "undetermined: <why>"."""
  g = on_ladder(g).sort_values("n_params")
  ok = g[g["verdict"].map(decided) & np.isfinite(g["value"].astype(float))]
  if len(ok) < 2:
    why = "; ".join(f"{v.removeprefix('undetermined: ')} at {r}"
                    for r, v in zip(g["rung"], g["verdict"], strict=True) if not decided(v))
    return f"undetermined: {why or 'fewer than two finite values'}"
  paper, one_sided = float(ok["paper"].iloc[0]), rungs()[str(ok["experiment"].iloc[0])].one_sided
  first, last = (distance(float(ok["value"].iloc[i]), paper, one_sided) for i in (0, -1))
  out = "flat" if math.isclose(first, last) else "toward" if last < first else "away"
  left = [str(r) for r in g["rung"] if r not in set(ok["rung"])]
  return out + (f" ({', '.join(left)} undetermined or not measured, left out)" if left else "")


def figures(out_dir: Path) -> list[Path]:
  """ladder_<experiment>.png: the quantity against the parameter count (log), decided rungs
  filled, undetermined ones hollow, the paper's value dashed."""
  points, paths, spec = read_csv(Path(out_dir) / LADDER_CSV), [], rungs()
  for name, g in (points.groupby("experiment", sort=False) if len(points) else ()):
    g, own = on_ladder(g).sort_values("n_params"), g.drop(on_ladder(g).index)
    fig, ax = plt().subplots(figsize=(5, 3.8))
    ax.plot(g["n_params"], g["value"], "-", color="C0", lw=1)
    ok = g["verdict"].map(decided)
    ax.plot(g.loc[ok, "n_params"], g.loc[ok, "value"], "o", color="C0", label="ours: decided")
    ax.plot(g.loc[~ok, "n_params"], g.loc[~ok, "value"], "o", mfc="none", color="C0",
            label="ours: undetermined")
    for _, r in own.iterrows():  # the family's own model, at fewer tokens per parameter
      ax.plot(r["n_params"], r["value"], "*", ms=10, color="C3", mfc="C3" if decided(
          r["verdict"]) else "none", label=f"{r['rung']}, {r['tokens_per_param']:.2g} tok/param")
    ax.axhline(spec[name].paper, color="k", ls="--", lw=0.8, label="paper")
    ax.set_xscale("log")  # the rungs' span even where no value is finite (not yet measured)
    span = pd.concat([g["n_params"], own["n_params"]])
    ax.set_xlim(span.min() / 1.5, span.max() * 1.5)
    style(ax, xlabel="parameters", ylabel=spec[name].label, legend=8, grid=True,
          title=f"{spec[name].claim}: {trend(g).split(':')[0]}")
    paths.append(savefig(fig, Path(out_dir) / f"ladder_{name}.png"))
  return paths


def report(out_dir: Path) -> Report:
  points = read_csv(Path(out_dir) / LADDER_CSV)
  if points.empty:
    return Report(verdict="not measured", rule=RULE, ours="no rung has results")
  trends = {n: trend(g) for n, g in points.groupby("experiment", sort=False)}
  claim = {n: r.claim for n, r in rungs().items()}
  fmt = lambda x: "—" if not math.isfinite(float(x)) else f"{float(x):.3g}"
  cells = "; ".join(
      f"{claim[n]} " + "→".join(fmt(v) for v in on_ladder(g).sort_values("n_params")["value"])
      + f" ({trends[n].split(':')[0]})" for n, g in points.groupby("experiment", sort=False))
  count = lambda word: sum(t.startswith(word) for t in trends.values())
  verdict = (f"{count('toward')} toward, {count('away')} away, {count('flat')} flat, "
             f"{count('undetermined')} undetermined (of {len(trends)})")
  table = points.assign(value=points["value"].map(fmt))
  return Report(
      verdict=verdict, rule=RULE, ours=cells,
      paper="; ".join(f"{r.claim} {r.paper:g}" for r in sorted(
          rungs().values(), key=lambda r: r.claim)),
      checks=tuple(f"{claim[n]}: {t}" for n, t in trends.items()),
      numbers_md=sections("Per claim and rung (the rung's own verdict beside its value):",
                          table, "Trend per claim:", md_table(pd.DataFrame(
                              [{"claim": claim[n], "trend": t} for n, t in trends.items()]))))


def describe_setup(preset: str) -> str:
  fam = family(preset)
  try:
    cost = projected_min(fam)
    spent = (f"Projected on 2 cores ({cost['runs'].iloc[0]} runs a rung, `projected_min`): "
             f"{cost['minutes'].sum():.0f} min.")
  except (FileNotFoundError, KeyError, ZeroDivisionError):
    spent = ""
  return sections(f"Rungs of `{fam}` (`configs/scale/{fam}_<rung>.yaml`, "
                  f"{TOKENS_PER_PARAM[fam]:g} tokens per parameter each):", plan(fam),
                  f"Experiments at every rung, in this order: {', '.join(rungs())}. "
                  + spent)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row='Ours: C3c, C4, G2, G3 across 3 model sizes', rank=13,
    analyze=analyze, figures=figures, report=report, launch=launch, describe_setup=describe_setup))

assert set(RUNG_PRESETS) == {p for f in RUNGS for p in presets(f)}  # sweep.RUNG_PRESETS names them

if __name__ == "__main__":
  import sys

  if sys.argv[1:] == ["--write-presets"]:
    print("\n".join(str(p) for p in write_presets()))
  else:
    for fam in RUNGS:
      print(plan(fam).to_string())
