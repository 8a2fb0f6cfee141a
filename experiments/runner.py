"""Runs one experiment end to end: sweep -> follow-up lr stages -> table -> results/.

    run_experiment("sign_placement", "cpu")  # what `scripts/reproduce.py` calls

Outputs:
  <sweeps_root>/<name>/<preset>/<run>/...   every run (checkpoints, metrics.jsonl, ...)
  <sweeps_root>/<name>/<preset>/table.csv   one row per run and step
  <results_dir>/                            CSVs of findings, PNGs, README.md, run_info.json
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import shlex
import time
from pathlib import Path

import pandas as pd

from experiments import common

EXPERIMENTS = ("overhead", "sign_placement", "preconditioner", "msq_eps", "batch_scaling", "snr",
               "moments")


def load(name: str):
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; choose one of {EXPERIMENTS} or 'all'.")
  return importlib.import_module(f"experiments.{name}")


def default_sweep_dir(name: str, preset: str, root: Path | None = None) -> Path:
  return Path(root or common.REPO / "runs" / "sweeps") / name / preset


def default_results_dir(name: str, preset: str, sweep_dir: Path) -> Path:
  """results/<name> for the real presets; the ci preset reports beside its sweep."""
  if preset == "ci":
    return sweep_dir / "report"
  return common.REPO / "results" / name


@dataclasses.dataclass
class Outcome:
  name: str
  preset: str
  sweep_dir: Path
  results_dir: Path
  log: common.LaunchLog
  report: dict


def run_experiment(
    name: str,
    preset: str,
    *,
    launcher: str = "basic",
    n_jobs: int = 2,
    dry_run: bool = False,
    sweeps_root: Path | None = None,
    results_dir: Path | None = None,
    train_script: Path | None = None,
    extra: tuple = (),
    analyze_only: bool = False,
    command: str | None = None,
    echo=print,
) -> Outcome:
  """Launches (or resumes) the sweep of `name` at `preset`, then writes its results."""
  if preset not in common.PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {common.PRESETS}.")
  if launcher not in common.LAUNCHERS:
    raise ValueError(f"unknown launcher {launcher!r}; choose one of {common.LAUNCHERS}.")
  mod = load(name)
  sweep_dir = default_sweep_dir(name, preset, sweeps_root)
  out_dir = Path(results_dir) if results_dir else default_results_dir(name, preset, sweep_dir)
  train_script = Path(train_script or common.REPO / "scripts" / "train.py")
  t0 = time.time()
  log = common.LaunchLog()

  if hasattr(mod, "launch"):  # experiments that are not training sweeps (overhead)
    if not analyze_only:
      log = mod.launch(preset, sweep_dir, dry_run=dry_run, echo=echo)
    table = None
  else:
    if not train_script.exists() and not dry_run:
      raise FileNotFoundError(f"{train_script} does not exist; the training entry is needed.")
    sweep = mod.sweep(preset)
    kw = dict(train_script=train_script, launcher=launcher, n_jobs=n_jobs, extra=extra,
              dry_run=dry_run, log=log, echo=echo)
    if not analyze_only:
      common.launch_blocks(sweep_dir, sweep.base, sweep.blocks, **kw)
    # Follow-up stages: extend lr grids past edges, then extra seeds at the best lr.
    n_rounds = (sweep.lr_search.max_extend + 1) if sweep.lr_search else 0
    for r in range(n_rounds):
      if dry_run or analyze_only:
        break
      blocks, kind = common.follow_up_blocks(sweep, common.finals(common.aggregate(sweep_dir)), r)
      if blocks:
        echo(f"[{name}/{preset}] follow-up round {r}: {kind}")
        common.launch_blocks(sweep_dir, sweep.base, blocks, **kw)
      if kind != "extend":
        break
    table = common.aggregate(sweep_dir)
    if not dry_run:
      table.to_csv(sweep_dir / "table.csv", index=False)

  wall = time.time() - t0
  echo(f"[{name}/{preset}] skipped {len(log.skipped)} finished run(s), launched "
       f"{len(log.launched)}, failed {len(log.failed)}; {wall:.0f} s")
  if dry_run:
    return Outcome(name, preset, sweep_dir, out_dir, log, {})

  out_dir.mkdir(parents=True, exist_ok=True)
  if table is not None:
    if table.empty:
      raise RuntimeError(f"no run of {sweep_dir} wrote {common.METRICS}; see the log above.")
    mod.analyze(table, common.finals(table), out_dir)
  else:
    mod.analyze(sweep_dir, out_dir)
  mod.figures(out_dir)
  report = mod.report(out_dir)
  info = _run_info(out_dir, name, preset, sweep_dir, log, wall, command, launcher)
  write_readme(mod, out_dir, report, info)
  if out_dir.parent == common.REPO / "results":
    write_index(common.REPO / "results")
  return Outcome(name, preset, sweep_dir, out_dir, log, report)


def _run_info(out_dir, name, preset, sweep_dir, log, wall, command, launcher) -> dict:
  """Wall times: this invocation, and the runs' own compute summed over summaries."""
  path = out_dir / "run_info.json"
  prev = json.loads(path.read_text()) if path.exists() else {}
  compute_s, n_done = 0.0, 0
  for s in Path(sweep_dir).glob(f"*/{common.SUMMARY}"):
    try:
      d = json.loads(s.read_text())
    except json.JSONDecodeError:
      continue
    n_done += d.get("status") == "completed"
    for k in ("wall_time_s", "wall_s", "wall_time", "time_s"):
      if isinstance(d.get(k), (int, float)):
        compute_s += float(d[k])
        break
  info = {
      "experiment": name,
      "preset": preset,
      "command": command or f"python scripts/reproduce.py {name} --preset {preset}",
      "launcher": launcher,
      "sweep_dir": str(Path(sweep_dir).resolve().relative_to(common.REPO))
      if str(Path(sweep_dir).resolve()).startswith(str(common.REPO)) else str(sweep_dir),
      "n_runs_completed": n_done,
      "runs_compute_s": round(compute_s, 1),
      "last_invocation_wall_s": round(wall, 1),
      # Summed over the invocations that built this sweep; one that launched every run
      # itself (none skipped) starts the sum afresh.
      "launch_wall_s_total": round(
          (0.0 if log.launched and not log.skipped else prev.get("launch_wall_s_total", 0.0))
          + log.wall_s, 1),
      "last_invocation_skipped": len(log.skipped),
      "last_invocation_launched": len(log.launched),
      "last_invocation_failed": log.failed,
      "date": datetime.datetime.now().isoformat(timespec="seconds"),
  }
  path.write_text(json.dumps(info, indent=1))
  return info


def describe_setup(mod, preset: str) -> str:
  """The settings of an experiment at `preset`, as Markdown, from its own definitions."""
  if not hasattr(mod, "sweep"):
    args = " ".join(getattr(mod, "BENCH_ARGS", {}).get(preset, []))
    return f"`python scripts/bench_stats.py {args}` (no training runs)."
  sw = mod.sweep(preset)
  cfg = common.REPO / "configs" / "experiment" / f"{mod.NAME}.yaml"
  lines = []
  if cfg.exists():
    body = [ln for ln in cfg.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    lines += [f"Experiment config `configs/experiment/{mod.NAME}.yaml`:", "", "```yaml",
              *body, "```", ""]
  lines.append("Every run (preset `" + preset + "`): "
               + ", ".join(f"`{k}={common.fmt(v)}`" for k, v in sw.base.items()
                           if k != "experiment") + ".")
  lines.append("")
  for i, bl in enumerate(sw.blocks):
    grid = "; ".join(f"`{k}` ∈ {{{', '.join(common.fmt(v) for v in vals)}}}"
                     for k, vals in bl.grid.items())
    fixed = (" with " + ", ".join(f"`{k}={common.fmt(v)}`" for k, v in bl.fixed.items())
             if bl.fixed else "")
    lines.append(f"- grid {i + 1}: {grid}{fixed}")
  ls = sw.lr_search
  if ls:
    lines += ["", f"Learning-rate search per ({', '.join(f'`{k}`' for k in ls.group_keys)}): "
              f"a grid whose best value lies at an edge is extended by a factor {ls.factor:g} "
              f"past that edge, up to {ls.max_extend} times"
              + (f"; then `{ls.seed_key}` ∈ {{{', '.join(map(str, ls.seeds))}}} is added at "
                 "each group's best learning rate (chosen on the first seed)." if ls.seeds
                 else ".")]
  return "\n".join(lines)


def write_readme(mod, out_dir: Path, report: dict, info: dict) -> None:
  figs = sorted(p.name for p in out_dir.glob("*.png"))
  csvs = sorted(p.name for p in out_dir.glob("*.csv"))
  wall_min = info["launch_wall_s_total"] / 60
  lines = [
      f"# {mod.NAME}: {mod.TITLE}",
      "",
      f"**Claim tested.** {mod.CLAIM}",
      "",
      f"**Verdict: {report['verdict']}.** {report['finding']}",
      "",
      "## Numbers",
      "",
      report.get("numbers_md", ""),
      "",
      "## Setup",
      "",
      report.get("setup_md") or describe_setup(mod, info["preset"]),
      "",
      "## Figures",
      "",
      *[f"![{f}]({f})" for f in figs],
      "",
      "## Regenerate",
      "",
      "```",
      info["command"],
      "```",
      "",
      f"Preset `{info['preset']}`, launcher `{info['launcher']}`. Sweep directory "
      f"`{info['sweep_dir']}` (not committed). Measured wall time of the launches: "
      f"{wall_min:.1f} min in total ({info['n_runs_completed']} completed runs; the runs' own "
      f"summed wall time {info['runs_compute_s'] / 60:.1f} min); last invocation "
      f"{info['last_invocation_wall_s']:.0f} s, of which {info['last_invocation_skipped']} "
      "run(s) were already finished and skipped. Files: " + ", ".join(f"`{c}`" for c in csvs)
      + ". Figures are redrawn from the CSVs alone by `notebooks/figures.ipynb`.",
      "",
  ]
  (out_dir / "README.md").write_text("\n".join(lines))
  (out_dir / "report.json").write_text(json.dumps(
      {k: v for k, v in report.items() if k in ("verdict", "finding", "claim_row")}, indent=1))


CLAIMS = (
    ("1. Per-example statistics are cheap (surgery ~free for some statistics; vmap viable)",
     ("overhead",)),
    ("2. Sign placement: the later the sign, the better (SignEMA wins), following the SNR",
     ("sign_placement", "snr")),
    ("3. Adam's preconditioner is best when dominated by the mean squared μ², not σ²",
     ("preconditioner", "msq_eps", "moments")),
    ("4. sqrt(B) learning-rate scaling collapses loss-vs-examples curves for small/medium B",
     ("batch_scaling",)),
)


def write_index(results_root: Path) -> Path:
  """results/README.md: one row per claim, from the committed results only."""
  rows = ["| Claim | What we measured | Figures | Verdict |", "|---|---|---|---|"]
  for claim, names in CLAIMS:
    measured, figs, verdicts = [], [], []
    for n in names:
      rep = results_root / n / "report.json"
      if not rep.exists():
        measured.append(f"`{n}`: not yet run")
        verdicts.append(f"{n}: not yet run")
        continue
      d = json.loads(rep.read_text())
      measured.append(f"`{n}`: {d.get('claim_row') or d['finding']}")
      verdicts.append(f"{n}: **{d['verdict']}**")
      figs += [f"[{p.name}]({n}/{p.name})" for p in sorted((results_root / n).glob("*.png"))]
    rows.append(f"| {claim} | {'<br>'.join(measured)} | {' '.join(figs) or '—'} | "
                f"{'<br>'.join(verdicts)} |")
  times = []
  for n in EXPERIMENTS:
    p = results_root / n / "run_info.json"
    if p.exists():
      d = json.loads(p.read_text())
      times.append(f"| `{n}` | `{d['command']}` | {d['launch_wall_s_total'] / 60:.1f} | "
                   f"{d['n_runs_completed']} |")
    else:
      times.append(f"| `{n}` | `python scripts/reproduce.py {n} --preset cpu` | not yet run | — |")
  text = "\n".join([
      "# Results",
      "",
      "Reproduction of the findings of Roulet & Agarwala, *Per-example gradients: a new "
      "frontier for understanding and improving optimizers* (arXiv 2510.00236), at the scale "
      "of a 2-core CPU machine (tiny transformers on the embedded Shakespeare corpus), with "
      "`scripts/reproduce.py EXPERIMENT --preset cpu`. Every verdict below comes from runs "
      "actually made; an experiment marked *not yet run* has no verdict. The paper ran "
      "large transformers on TPUs, so a verdict here says whether the *qualitative* finding "
      "holds at this small scale, nothing more. Each experiment's own README gives the "
      "setup, numbers, figures and the exact command.",
      "",
      *rows,
      "",
      "## Cost of each experiment (cpu preset, this machine)",
      "",
      "| Experiment | Command | Wall time (min) | Runs |",
      "|---|---|---|---|",
      *times,
      "",
      "Wall times are those of the launches that made the committed results, often with "
      "other jobs sharing the 2 cores (preconditioner and batch_scaling ran with "
      "`--launcher joblib --n-jobs 2`). Regenerate everything: `python scripts/reproduce.py "
      "all --preset cpu` (resumable: finished runs are skipped; about 2.5 hours). Redraw the "
      "figures from the CSVs: `notebooks/figures.ipynb`.",
      "",
  ])
  path = results_root / "README.md"
  path.write_text(text)
  return path


def command_line(argv) -> str:
  return "python scripts/reproduce.py " + " ".join(shlex.quote(a) for a in argv)


def load_table(sweep_dir: Path) -> pd.DataFrame:
  p = Path(sweep_dir) / "table.csv"
  return pd.read_csv(p) if p.exists() else common.aggregate(sweep_dir)
