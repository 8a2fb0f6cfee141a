"""Runs one experiment end to end: sweep -> follow-up lr stages -> table -> results/.

    run_experiment("sign_placement", "cpu")  # what `scripts/reproduce.py` calls

Outputs:
  <sweeps_root>/<name>/<preset>/<run>/...   every run (checkpoints, metrics.jsonl, ...)
  <sweeps_root>/<name>/<preset>/sweep.json  the preset, base overrides and extra overrides
  <sweeps_root>/<name>/<preset>/table.csv   one row per run and step
  <results_dir>/                            CSVs of findings, PNGs, README.md, run_info.json

Extra overrides that change the runs' config (`--hydra-arg data=txt_folder`, not
`hydra.*`, `logging.*` or `data.tfds_dir`) put the sweep in `<preset>-<hash of those
overrides>` instead (`experiments.sweep.sweep_dir`).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import json
import time
from pathlib import Path

from experiments import lr_search, report_md
from experiments.launch import LAUNCHERS, LaunchLog, launch_blocks
from experiments.runs import METRICS, SUMMARY, aggregate, finals
from experiments.sweep import PRESETS, REPO, record_sweep, sweep_dir

EXPERIMENTS = ("overhead", "sign_placement", "preconditioner", "msq_eps", "batch_scaling", "snr",
               "moments", "norm_cost", "gns_layers", "gns_schedule")


def load(name: str):
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; choose one of {EXPERIMENTS} or 'all'.")
  return importlib.import_module(f"experiments.{name}")


def default_sweep_dir(name: str, preset: str, root: Path | None = None,
                      extra: tuple = ()) -> Path:
  return sweep_dir(root or REPO / "runs" / "sweeps", name, preset, extra)


def default_results_dir(name: str, preset: str, sweep: Path) -> Path:
  """results/<name>[-<hash>] for the real presets; the ci preset reports beside its sweep."""
  if preset == "ci":
    return sweep / "report"
  return REPO / "results" / (name + sweep.name.removeprefix(preset))


@dataclasses.dataclass
class Outcome:
  name: str
  preset: str
  sweep_dir: Path
  results_dir: Path
  log: LaunchLog
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
    extra: tuple = (),
    analyze_only: bool = False,
    command: str | None = None,
    echo=print,
) -> Outcome:
  """Launches (or resumes) the sweep of `name` at `preset`, then writes its results."""
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose one of {PRESETS}.")
  if launcher not in LAUNCHERS:
    raise ValueError(f"unknown launcher {launcher!r}; choose one of {LAUNCHERS}.")
  mod = load(name)
  training = hasattr(mod, "sweep")  # overhead is a benchmark, not a training sweep
  sdir = default_sweep_dir(name, preset, sweeps_root, tuple(extra) if training else ())
  out_dir = Path(results_dir) if results_dir else default_results_dir(name, preset, sdir)
  t0 = time.time()
  log = LaunchLog()

  if not training:
    if not analyze_only:
      log = mod.launch(preset, sdir, dry_run=dry_run, echo=echo)
    table = None
  else:
    sweep = mod.sweep(preset)
    if not dry_run or (sdir / "sweep.json").exists():
      record_sweep(sdir, preset, sweep.base, extra)
    kw = dict(launcher=launcher, n_jobs=n_jobs, extra=extra, dry_run=dry_run, log=log, echo=echo)
    if not analyze_only:
      launch_blocks(sdir, sweep.base, sweep.blocks, **kw)
    # Follow-up stages: extend lr grids past edges, then extra seeds at the best lr.
    n_rounds = sweep.lr_search.rounds if sweep.lr_search else 0
    for r in range(n_rounds):
      if dry_run or analyze_only:
        break
      blocks, kind = lr_search.follow_up_blocks(sweep, finals(aggregate(sdir)), r)
      if blocks:
        echo(f"[{name}/{preset}] follow-up round {r}: {kind}")
        launch_blocks(sdir, sweep.base, blocks, **kw)
      if kind != "extend":
        break
    # A follow-up stage chosen from the first stage's runs (e.g. gns_schedule's ramp
    # fitted to the measured noise scale).
    if hasattr(mod, "follow_up") and not (dry_run or analyze_only):
      blocks = mod.follow_up(preset, sdir)
      if blocks:
        echo(f"[{name}/{preset}] follow-up stage: {len(blocks)} block(s)")
        launch_blocks(sdir, sweep.base, blocks, **kw)
    table = aggregate(sdir)
    if not dry_run:
      table.to_csv(sdir / "table.csv", index=False)

  wall = time.time() - t0
  echo(f"[{name}/{preset}] skipped {len(log.skipped)} finished run(s), launched "
       f"{len(log.launched)}, failed {len(log.failed)}; {wall:.0f} s")
  if dry_run:
    return Outcome(name, preset, sdir, out_dir, log, {})

  out_dir.mkdir(parents=True, exist_ok=True)
  if table is not None:
    if table.empty:
      raise RuntimeError(f"no run of {sdir} wrote {METRICS}; see the log above.")
    mod.analyze(table, finals(table), out_dir)
  else:
    mod.analyze(sdir, out_dir)
  mod.figures(out_dir)
  report = mod.report(out_dir)
  info = _run_info(out_dir, name, preset, sdir, log, wall, command, launcher)
  report_md.write_readme(mod, out_dir, report, info)
  if out_dir.parent == REPO / "results":
    report_md.write_index(REPO / "results", EXPERIMENTS)
  return Outcome(name, preset, sdir, out_dir, log, report)


def _run_info(out_dir, name, preset, sdir, log, wall, command, launcher) -> dict:
  """Wall times: this invocation, and the runs' own compute summed over summaries."""
  path = out_dir / "run_info.json"
  prev = json.loads(path.read_text()) if path.exists() else {}
  compute_s, n_done = 0.0, 0
  for s in Path(sdir).glob(f"*/{SUMMARY}"):
    try:
      d = json.loads(s.read_text())
    except json.JSONDecodeError:
      continue
    n_done += d.get("status") == "completed"
    compute_s += float(d.get("wall_time_s", 0.0))
  resolved = Path(sdir).resolve()
  info = {
      "experiment": name,
      "preset": preset,
      "command": command or f"python scripts/reproduce.py {name} --preset {preset}",
      "launcher": launcher,
      "sweep_dir": str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO)
      else str(sdir),
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
