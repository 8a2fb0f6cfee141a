"""Runs one experiment end to end (what `scripts/reproduce.py` calls): its runs under
<sweeps_root>/<name>/<preset>[-<hash>]/, its CSVs, figures, README.md, report.json and
run_info.json under results/<preset>/<name>/ (ci: the sweep's report/)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from pathlib import Path

from pergrad import sweep as sweeps
from pergrad.analysis.runs import aggregate, fmt, run_status, write_csv
from pergrad.files import METRICS, SUMMARY
from pergrad.sweep import (
  INDEX,
  LAUNCHERS,
  REPO,
  RESULTS,
  SWEEP_JSON,
  How,
  LaunchLog,
  RunIndex,
  budgets,
  config_extras,
  default_results_dir,
  default_sweep_dir,
  family,
  follow_up_blocks,
  is_reused,
  is_rung,
  launch_blocks,
  marked_finals,
  record_sweep,
  recorded_version,
  report_md,
  training_version,
)
from pergrad.sweep.record import Experiment, Inputs, Report, Runs, get, provenance


def check_preset(preset: str, name: str) -> None:
  """One clear error for an unknown preset, or a ladder rung given an experiment without a
  `Rung` (its grids are set per base preset only)."""
  sweeps.check_preset(preset)
  if is_rung(preset) and get(name).rung is None:
    raise ValueError(f"preset {preset!r} is a rung of the scale ladder, which runs only the "
                     f"experiments that declare a Rung, not {name!r}; use --preset "
                     f"{family(preset)}.")


@dataclasses.dataclass
class Outcome:
  name: str
  preset: str
  sweep_dir: Path
  results_dir: Path
  log: LaunchLog
  report: Report | None


def run_experiment(name: str, preset: str, *, launcher: str = "basic", n_jobs: int = 2,
                   dry_run: bool = False, sweeps_root: Path | None = None,
                   results_dir: Path | None = None, extra: tuple = (), analyze_only: bool = False,
                   command: str | None = None, echo=print) -> Outcome:
  """Launches (or resumes) the sweep of `name` at `preset`, then writes its results."""
  check_preset(preset, name)
  if launcher not in LAUNCHERS:
    raise ValueError(f"unknown launcher {launcher!r}; choose one of {tuple(LAUNCHERS)}.")
  exp = get(name)
  prov = provenance()  # before this invocation writes anything
  training = exp.sweep is not None  # else a benchmark (overhead), not a training sweep
  root = sweeps_root or REPO / "runs" / "sweeps"
  sdir = default_sweep_dir(name, preset, root, tuple(extra) if training else ())
  out_dir = Path(results_dir) if results_dir else default_results_dir(name, preset, sdir)
  inputs = Inputs(Path(root), preset, tuple(extra), dry_run=dry_run)
  run = lambda n, p, **kw: run_experiment(n, p, launcher=launcher, n_jobs=n_jobs,
                                          dry_run=dry_run, extra=extra, echo=echo, **kw)
  how = How(dry_run, echo, launcher, n_jobs, tuple(extra), root, run)
  t0, version = time.time(), training_version(REPO)  # the runs must be this code's
  sweep, log, table = None, LaunchLog(), None
  if training:
    sweep, log, table = launch_sweep(exp, preset, sdir, inputs, how, version, analyze_only)
  else:
    if not dry_run or (sdir / SWEEP_JSON).exists():
      record_sweep(sdir, preset, {}, (), version)
    if not analyze_only:
      log = exp.launch(preset, sdir, how)
  wall = time.time() - t0
  if dry_run:
    echo(dry_run_line(exp, preset, sweep, log, inputs))
    return Outcome(name, preset, sdir, out_dir, log, None)
  echo(f"[{name}/{preset}] launched {len(log.launched)} run(s), reused {len(log.reused)} "
       f"another sweep's, skipped {len(log.skipped)} finished, failed {len(log.failed)}, "
       f"diverged {len(log.diverged)}; "
       f"{wall:.0f} s")
  report = write_results(exp, sdir, out_dir, sweep, table, extra)
  setup = report.setup_md or report_md.describe_setup(exp, preset, inputs)  # read live sweeps
  info = run_info(out_dir, name, preset, sdir, log, wall, command, launcher, prov, version,
                  setup)
  report_md.write_readme(exp, out_dir, report, info, inputs)
  if out_dir.parent == RESULTS / preset:
    report_md.write_index(out_dir.parent, preset)
  return Outcome(name, preset, sdir, out_dir, log, report)


def launch_sweep(exp: Experiment, preset: str, sdir: Path, inputs: Inputs, how: How,
                 version: str | None, analyze_only: bool = False):
  """(sweep, log, table): the first stage's blocks, the lr search's follow-up rounds (extend
  the grids, then fresh seeds), the experiment's follow-up stage; the sweep's table."""
  sweep, log, tag = exp.sweep_at(preset, inputs), LaunchLog(), f"[{exp.name}/{preset}]"
  if not how.dry_run or (sdir / SWEEP_JSON).exists():
    record_sweep(sdir, preset, sweep.base, how.extra, version)
  kw = dict(launcher=how.launcher, n_jobs=how.n_jobs, extra=how.extra, dry_run=how.dry_run,
            log=log, echo=how.echo,
            index=RunIndex(Path(how.sweeps_root) / INDEX, version))  # others' runs reused
  if not analyze_only:
    launch_blocks(sdir, sweep.base, sweep.blocks, **kw)
  rounds = sweep.lr_search.rounds if sweep.lr_search else 0
  ran = lambda: len(log.launched) + len(log.reused) + len(log.failed)
  for r in range(0 if how.dry_run or analyze_only else rounds):
    fin = marked_finals(aggregate(sdir), sweep.base, how.extra)
    blocks, kind = follow_up_blocks(sweep, fin)
    before = ran()
    if blocks:
      how.echo(f"{tag} follow-up round {r}: {kind}")
      launch_blocks(sdir, sweep.base, blocks, **kw)
    # a round is a function of the finished runs: one that ran none would repeat itself (a
    # resumed sweep waiting on a pilot that only the follow-up stage below runs)
    if kind not in ("extend", "pilot") or ran() == before:
      break
  if exp.follow_up is not None and not (how.dry_run or analyze_only):
    if blocks := exp.follow_up(preset, sdir):
      how.echo(f"{tag} follow-up stage: {len(blocks)} block(s)")
      launch_blocks(sdir, sweep.base, blocks, **kw)
    if sweep.lr_search is not None and sweep.lr_search.more is not None:  # an arm whose pilot
      blocks, kind = follow_up_blocks(sweep, marked_finals(aggregate(sdir), sweep.base, how.extra))
      if kind == "seeds" and blocks:  # ran in that stage: its more seeds, as a round's
        how.echo(f"{tag} more seeds after the follow-up stage")
        launch_blocks(sdir, sweep.base, blocks, **kw)
  table = aggregate(sdir)
  log.diverged = diverged_runs(sdir)
  if not how.dry_run:
    write_csv(table, sdir / "table.csv")
  return sweep, log, table


def dry_run_line(exp: Experiment, preset: str, sweep, log: LaunchLog, inputs: Inputs) -> str:
  """What a dry run would launch, and what it cannot know yet."""
  rounds = sweep.lr_search.rounds if sweep is not None and sweep.lr_search else 0
  later = f", then up to {rounds} follow-up round(s) chosen from their results" if rounds else ""
  later += ", then a follow-up stage chosen from them" if exp.follow_up else ""
  needs = exp.needs if not is_rung(preset) else (  # a rung's Adam lr: lr_exponent's
      ("lr_exponent",) if exp.needs and exp.name != "lr_exponent" else ())
  missing = [n for n in needs if not any(inputs.sweep_dir(n).glob(f"*/{METRICS}"))]
  later += (f"; {', '.join(missing)} not run yet: the lrs shown are placeholders for those "
            "its search will choose (run it first)" if missing else "")
  return (f"[{exp.name}/{preset}] dry run: would launch {len(log.launched)} run(s) "
          f"({len(log.skipped)} already finished){later}")


def write_results(exp: Experiment, sdir: Path, out_dir: Path, sweep, table, extra) -> Report:
  """The experiment's CSVs (`analyze`), figures and report in `out_dir`, an earlier report's
  files removed first."""
  out_dir.mkdir(parents=True, exist_ok=True)
  clear_outputs(out_dir)
  if table is not None:
    if table.empty:
      raise RuntimeError(f"no run of {sdir} wrote {METRICS}; see the log above.")
    table.attrs["overrides"] = [f"{k}={fmt(v)}" for k, v in sweep.base.items()] + list(
        config_extras(extra))
    fin = marked_finals(table, sweep.base, extra)
    exp.analyze(Runs(sdir, table, fin, sweep), out_dir)
    budgets.write(sweep, sdir, fin, out_dir, table.attrs["overrides"])  # same_budget reads it
  else:
    exp.analyze(Runs(sdir), out_dir)
  exp.figures(out_dir)
  return exp.report(out_dir)


def clear_outputs(out_dir: Path) -> list[Path]:
  """Removes the CSVs and figures of an earlier report in `out_dir` (one with a report.json):
  a file the new report does not write cannot pass for one of its own."""
  out_dir = Path(out_dir)
  if not (out_dir / "report.json").exists():
    return []
  old = sorted([*out_dir.glob("*.csv"), *out_dir.glob("*.csv.gz"), *out_dir.glob("*.png")])
  for p in old:
    p.unlink()
  return old


def diverged_runs(sdir: Path) -> list[str]:
  """The sweep's runs that finished diverged, all of them: not only those this invocation
  launched or skipped (a resumed lr search does not visit its earlier extension rounds)."""
  return sorted(d.name for d in Path(sdir).iterdir() if d.is_dir() and
                run_status(d) == "diverged") if Path(sdir).is_dir() else []


def run_info(out_dir, name, preset, sdir, log, wall, command, launcher, prov,
             version=None, setup_md: str = "") -> dict:
  """run_info.json: the provenance at the start, the launches that made the results (with an
  earlier invocation's of the same sweep at the same training version, whatever its commit),
  the runs' compute from their summaries, the README's setup as the live sweeps gave it (a
  re-render from results/ alone reads it here)."""
  compute_s, n_done = 0.0, 0
  for s in Path(sdir).glob(f"*/{SUMMARY}"):
    try:
      d = json.loads(s.read_text())
    except json.JSONDecodeError:
      continue
    n_done += d.get("status") == "completed"
    if not is_reused(s.parent):  # another sweep's run: its compute is that sweep's
      compute_s += float(d.get("wall_time_s", 0.0))
  old_path = Path(out_dir, "run_info.json")
  old = json.loads(old_path.read_text()) if old_path.exists() else {}
  rel = report_md.portable_sweep_dir(sdir)  # no machine's path in results/
  command = command and report_md.portable_command(command)
  same = old.get("sweep_dir") in (str(sdir), rel) and recorded_version(old, REPO) == version
  if same:  # a resumed invocation adds its launches to those that made the results
    log.wall_s += float(old.get("launch_wall_s", 0.0))
    log.launched = list(dict.fromkeys([*old.get("launched_runs", []), *log.launched]))
  info = dict(experiment=name, preset=preset, command=command or
              f"python scripts/reproduce.py {name} --preset {preset}", launcher=launcher, **prov,
              train_version=version,
              sweep_dir=rel, n_runs_completed=n_done, runs_compute_s=round(compute_s, 1),
              wall_s=round(wall, 1), launch_wall_s=round(log.wall_s, 1),
              launched=len(log.launched), launched_runs=list(log.launched),
              reused=len(log.reused), reused_runs=list(log.reused),
              invocations=int(old.get("invocations", 1)) + 1 if same else 1,
              skipped=len(log.skipped), failed=log.failed, diverged=len(log.diverged),
              date=datetime.datetime.now().isoformat(timespec="seconds"), setup_md=setup_md)
  Path(out_dir, "run_info.json").write_text(json.dumps(info, indent=1))
  return info
