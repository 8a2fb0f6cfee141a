#!/usr/bin/env python
"""Reproduces one experiment of the paper (or all): sweep -> table -> results/PRESET/EXPERIMENT/.

    python scripts/reproduce.py sign_placement --preset cpu
    python scripts/reproduce.py all --preset ci --dry-run
    python scripts/reproduce.py preconditioner --preset cpu --launcher joblib --n-jobs 2
    python scripts/reproduce.py --render-readme     # README.md's claims from results/cpu/
    python scripts/reproduce.py mine --preset ci --plugin path/to/mine.py  # a plugin's
    python scripts/reproduce.py ladder --preset cpu    # the ladder's experiments by model size
    python scripts/reproduce.py moments --preset cpu_xs  # one of them at one rung
    python scripts/reproduce.py --carry-out carry.tar.xz   # a stopped `all`, to move it

Each experiment (`experiments.runner.run_experiment`) launches a Hydra multirun per grid
block (run dirs under runs/sweeps/EXPERIMENT/PRESET/, finished runs skipped: resumable), then
writes CSVs, figures and a README under results/PRESET/EXPERIMENT/ (ci: the sweep's report/),
then results/PRESET/README.md and README.md's claims block. `all` runs every registered
experiment, each after those it `needs`. Config-changing `--hydra-arg` overrides give the
sweep and results a `-<hash>` of them. Launchers: basic, joblib (on a CPU machine, --n-jobs =
its cores; results/bench_cores.json), submitit (configs/hydra/launcher/slurm_gpu.yaml),
submitit_local.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import runner  # noqa: E402
from experiments.reproduction import Record  # noqa: E402
from pergrad import sweep as sweeps  # noqa: E402
from pergrad.sweep import (  # noqa: E402
  LAUNCHERS,
  PRESETS,
  RUNG_PRESETS,
  report_md,  # noqa: E402
)
from pergrad.sweep import record as rec  # noqa: E402


def _render(preset: str) -> None:
  """results/PRESET/README.md, and README.md's claims block from results/cpu/."""
  changed = report_md.render_readme()
  print(f"[readme] {report_md.REPO / 'README.md'} " + ("rewritten" if changed else "unchanged"))
  root = sweeps.RESULTS / preset
  if root.is_dir():
    print(f"[readme] {report_md.write_index(root, preset)}")


def _refused_points(commands: list[list[str]], remote: bool = False) -> list[str]:
  """Runs each multirun command of a dry run with `--dry-run` (every point composed, planned,
  its run directory, data and shapes checked, nothing trained or written:
  `pergrad.train.dry_run`), on this machine with Hydra's basic launcher, a few at a time;
  returns the one-line errors of the points a real run would refuse (a bad --hydra-arg among
  them). `remote`: the runs go to a cluster, where their data is (not checked here)."""
  env = {**os.environ, "WANDB_MODE": "disabled", "PERGRAD_DRY_RUN": "remote" if remote else "1"}
  argvs, records = [], set()
  for cmd in commands:
    i = max(j for j, c in enumerate(cmd) if c == "-m")  # Hydra's multirun flag (python's first)
    argvs.append([*cmd[:i + 1], "--dry-run", *(c for c in cmd[i + 1:] if not c.startswith(
        ("hydra/launcher=", "hydra.launcher.")))])
    sweep = Path(next(c for c in cmd if c.startswith("hydra.sweep.dir=")).split("=", 1)[1])
    if not (sweep / "multirun.yaml").exists():
      records.add(sweep / "multirun.yaml")  # Hydra's record of a sweep not launched: removed

  def check(argv: list[str]) -> list[str]:
    proc = subprocess.run(argv, cwd=report_md.REPO, capture_output=True, text=True, env=env)
    found = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    if proc.returncode and not found:  # Hydra's own: the first line of its message
      found = ([ln for ln in proc.stderr.splitlines() if ln.strip()]
               or [f"exit {proc.returncode}"])[:1]
    print(f"[dry-run] {'REFUSED' if found else 'checked'}: "
          f"{' '.join(argv[argv.index('--dry-run') + 1:])}"[:300], flush=True)
    return found

  with concurrent.futures.ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
    errors = sum(pool.map(check, argvs), [])
  for record in records:
    record.unlink(missing_ok=True)
  return errors


def _check_overrides(extra: list[str], preset: str) -> None:
  """ValueError (one line) when the --hydra-arg overrides that change the runs' config do not
  compose with the preset (an unknown key, a wrong type, no such config group option), before
  any run is launched."""
  from pergrad.config import compose
  from pergrad.sweep import config_extras

  said = config_extras(extra)
  if not said:
    return
  try:
    compose([f"scale={preset}", *said])
  except Exception as e:  # noqa: BLE001 - any composition error, reported in one line
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"--hydra-arg {' '.join(said)}: {first}") from None


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("experiment", nargs="*",
                 help=f"one or more of {rec.builtin()} (or a plugin's), or 'all'")
  p.add_argument("--render-readme", action="store_true",
                 help="rewrite README.md's claims block (from results/cpu/) and "
                 "results/PRESET/README.md (alone: run nothing else)")
  p.add_argument("--plugin", action="append", default=[],
                 help="a module (dotted name or .py file) that registers experiments")
  p.add_argument("--preset", default="cpu", choices=PRESETS + RUNG_PRESETS,
                 help="a scale (configs/scale/); <family>_<rung>: a rung of the scale ladder, "
                 "for its four experiments (`ladder` runs every rung of a family)")
  p.add_argument("--launcher", default="basic", choices=LAUNCHERS)
  p.add_argument("--n-jobs", type=int, default=os.cpu_count() or 1,
                 help="parallel jobs (joblib launcher; default: the machine's cores)")
  p.add_argument("--dry-run", action="store_true",
                 help="print the commands and check every run they would launch (train.py "
                 "--dry-run: config, plan, data, shapes); train nothing; exit 1 if any is refused")
  p.add_argument("--analyze-only", action="store_true",
                 help="launch nothing; rebuild the table and results from existing runs")
  p.add_argument("--sweeps-root", type=Path, default=None,
                 help="where sweeps go (default runs/sweeps)")
  p.add_argument("--results-dir", type=Path, default=None,
                 help="where results go (default results/PRESET/EXPERIMENT; ci: "
                 "<sweep>/report)")
  p.add_argument("--carry-out", type=Path, default=None, metavar="FILE",
                 help="pack the preset's stopped reproduction (finished runs under the sweeps "
                 "root, its record) into FILE (.tar.xz) to continue it on another machine "
                 "(alone, no experiment)")
  p.add_argument("--carry-in", type=Path, default=None, metavar="FILE",
                 help="unpack a --carry-out archive under the (empty) sweeps root and the "
                 "preset's record first, then continue as asked (`all`: the same record)")
  p.add_argument("--hydra-arg", action="append", default=[],
                 help="extra override passed to every run (e.g. logging.wandb.mode=offline)")
  return p


def _carry(a) -> None:
  """--carry-in / --carry-out (`pergrad.sweep.carry`); exits with one line on a bad archive."""
  from pergrad.sweep import carry
  root = a.sweeps_root or report_md.REPO / "runs" / "sweeps"
  record = sweeps.RESULTS / a.preset / report_md.REPRODUCTION
  try:
    if a.carry_in:
      print(f"[carry] {a.carry_in} -> {root}: {carry.unpack(a.carry_in, root, record)}")
    if a.carry_out:
      print(f"[carry] {root} -> {a.carry_out}: {carry.pack(root, record, a.carry_out)}")
  except (FileNotFoundError, ValueError) as e:
    sys.exit(f"error: {e}")


def _experiments(p: argparse.ArgumentParser, a) -> tuple[str, ...]:
  """The experiments asked for, in dependency order, every check that needs no run done
  (names, preset, --results-dir, --hydra-arg): a bad one exits with one line."""
  known = tuple(rec.experiments())
  names = known if a.experiment == ["all"] else tuple(a.experiment)
  for n in names:
    if n not in known:
      p.error(f"unknown experiment {n!r}; choose one of {known} or 'all' (or --plugin)")
  names = rec.in_order(names)
  for n in names:  # a ladder rung runs the ladder's experiments only: one line, before any run
    try:
      runner.check_preset(a.preset, n)
    except ValueError as e:
      p.error(str(e))
  if a.results_dir and len(names) > 1:
    p.error("--results-dir needs a single experiment")
  try:
    if not a.dry_run:  # a dry run checks each of its points, naming the refused ones
      _check_overrides(a.hydra_arg, a.preset)
  except ValueError as e:
    sys.exit(f"error: {e}")
  return names


def _reproduction(a, names: tuple[str, ...], argv: list[str]) -> Record | None:
  """The record of `all` at a real preset (resumable across invocations of one command)."""
  if not (a.experiment == ["all"] and not (a.dry_run or a.analyze_only) and a.preset != "ci"
          and not a.results_dir):
    return None
  root = a.sweeps_root or report_md.REPO / "runs" / "sweeps"
  fresh = not any(any(sweeps.default_sweep_dir(n, a.preset, root, tuple(a.hydra_arg)).glob(
      "*/summary.json")) for n in names)
  said = [x for i, x in enumerate(argv)  # a carried-in record continues the same command
          if not (x.startswith("--carry-in") or i and argv[i - 1] == "--carry-in")]
  command = "python scripts/reproduce.py all --preset " + a.preset + "".join(
      f" {x}" for x in said if x not in ("all", "--preset", a.preset))
  return Record(sweeps.RESULTS / a.preset / report_md.REPRODUCTION, command, fresh)


def _run(n: str, a):
  """Experiment n's sweep and report (`runner.run_experiment`); a dry run also checks every
  point it would launch (ValueError naming the refused ones)."""
  out = runner.run_experiment(
      n, a.preset, launcher=a.launcher, n_jobs=a.n_jobs, dry_run=a.dry_run,
      sweeps_root=a.sweeps_root, results_dir=a.results_dir,
      extra=tuple(a.hydra_arg), analyze_only=a.analyze_only,
      command=f"python scripts/reproduce.py {n} --preset {a.preset}"
      + (f" --launcher {a.launcher}" if a.launcher != "basic" else "")
      + "".join(f" --hydra-arg {shlex.quote(x)}" for x in a.hydra_arg))
  refused = (_refused_points(out.log.commands, remote=a.launcher == "submitit")
             if a.dry_run else [])
  if refused:
    raise ValueError(f"{len(refused)} point(s) a real run would refuse: " + " | ".join(refused))
  return out


def _outcome(out) -> dict:
  """An experiment's line in the reproduction's record."""
  return {"launch_wall_s": round(out.log.wall_s, 1), "launched": len(out.log.launched),
          "skipped": len(out.log.skipped), "reused": len(out.log.reused),
          "status": (f"{len(out.log.failed)} run(s) failed" if out.log.failed else "completed")
          + (f" ({len(out.log.diverged)} diverged)" if out.log.diverged else "")
          + (f", verdict: {out.report.verdict}" if out.report else "")}


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = _parser()
  a = p.parse_args(argv)
  for plugin in a.plugin:
    rec.load_plugin(plugin)
  if a.carry_out and a.experiment:
    p.error("--carry-out packs a stopped reproduction: give it alone, without an experiment")
  if a.carry_in or a.carry_out:
    _carry(a)
    if not a.experiment:
      return 0
  if not a.experiment:
    if not a.render_readme:
      p.error("name an experiment (or 'all'), or pass --render-readme, --carry-in or "
              "--carry-out")
    _render(a.preset)
    return 0
  names = _experiments(p, a)
  record = _reproduction(a, names, argv)
  failed, errors, wrote_results = [], [], record is not None
  for n in names:
    t0 = time.time()
    if record is not None and record.finished_before(n):
      print(f"[all] {n}: completed by an earlier invocation of this reproduction; not re-run")
      continue
    if record is not None:
      record.begin(n)
    try:
      out = _run(n, a)
    except (FileNotFoundError, RuntimeError, ValueError) as e:
      print(f"[error] {n}: {e}")
      errors.append(n)
      if record is not None:
        record.experiment(n, {"wall_s": round(time.time() - t0, 1), "launch_wall_s": 0.0,
                              "launched": 0, "skipped": 0, "status": f"error: {e}"})
      continue
    if record is not None:
      record.experiment(n, {"wall_s": round(time.time() - t0, 1), **_outcome(out)})
    if out.report:
      print(f"[{n}] {out.report.finding}")  # the verdict first
      print(f"[{n}] results in {out.results_dir}")
    failed += out.log.failed
    wrote_results |= out.report is not None and out.results_dir.parent == sweeps.RESULTS / a.preset
  if record is not None:
    d = record.finish()
    print(f"[all] {d['wall_s'] / 60:.1f} min at commit {d['commit']}")
    if len(at := rec.report_commits(sweeps.RESULTS / a.preset)) > 1:  # e.g. a rung that failed
      errors.append(f"reports at {len(at)} analysis commits: " + "; ".join(
          f"{c[:7]}: {', '.join(v)}" for c, v in at.items() if c != d["commit"]))
  if wrote_results or a.render_readme:
    _render(a.preset)
  if failed:
    print(f"[warn] {len(failed)} run(s) did not complete: {failed}")
  if errors:
    print(f"[error] experiments that could not run: {errors}")
  return 1 if errors else 0


if __name__ == "__main__":
  sys.exit(main())
