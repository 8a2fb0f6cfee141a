#!/usr/bin/env python
"""Reproduces one experiment of the paper (or all): sweep -> table -> results/PRESET/EXPERIMENT/.

    python scripts/reproduce.py sign_placement --preset cpu
    python scripts/reproduce.py all --preset ci --dry-run
    python scripts/reproduce.py snr moments --preset ci
    python scripts/reproduce.py preconditioner --preset cpu --launcher joblib --n-jobs 2
    python scripts/reproduce.py --render-readme     # README.md's claims from results/cpu/
    python scripts/reproduce.py mine --preset ci --plugin path/to/mine.py  # a plugin's
    python scripts/reproduce.py ladder --preset cpu    # 4 experiments at 3 model sizes
    python scripts/reproduce.py moments --preset cpu_xs  # one of them at one rung
    python scripts/reproduce.py --carry-out carry.tar.xz   # a stopped `all`, to move it
    python scripts/reproduce.py all --carry-in carry.tar.xz ...  # continued elsewhere

Launches a Hydra multirun of `python -m pergrad.train scale=PRESET ...` per grid block
(deterministic run dirs under runs/sweeps/EXPERIMENT/PRESET/), skipping runs that
already finished, so an interrupted sweep resumes where it stopped. Then aggregates every
metrics.jsonl into table.csv (one row per run and step) and writes CSVs, PNGs and a
README.md under results/PRESET/EXPERIMENT/ (under the sweep dir's report/ for --preset ci),
and then rewrites results/PRESET/README.md and, from results/cpu/*/report.json, the claims
block of the top-level README.md (between <!-- claims:begin --> and <!-- claims:end -->).
An experiment that needs another's runs (`Experiment.needs`) runs after it; `all` runs every
registered experiment (the built-in ones and those of --plugin modules) in that order.
Extra overrides that change the runs' config (`--hydra-arg data=txt_folder ...`, not
hydra.*, logging.* or data.tfds_dir) give the sweep its own directory, PRESET-<hash of them>,
recorded in its sweep.json, and results go to results/PRESET/EXPERIMENT-<hash>.

Launchers: basic (sequential, in-process), joblib (parallel local jobs), submitit (a GPU
SLURM cluster, configs/hydra/launcher/slurm_gpu.yaml; needs `pip install -e '.[gpu,slurm]'`;
set partition/account/time with `--hydra-arg hydra.launcher.partition=...
--hydra-arg hydra.launcher.account=... --hydra-arg hydra.launcher.timeout_min=...`),
submitit_local (the same path on this machine, configs/hydra/launcher/local.yaml).
On a CPU machine use joblib with --n-jobs = its cores (the default), each job with XLA's
own threads: 4 runs of the cpu preset (60 steps) on 2 cores took 0.77-0.86 of the
sequential (basic, 1 job x 2 threads) wall time with 2 jobs x 2 threads and 0.81-0.82 with
2 jobs x 1 thread (2 rounds each; `scripts/bench_cores.py`, results/bench_cores.json): 2
jobs pay, and one thread per job does not beat XLA's default measurably.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import record as rec  # noqa: E402
from experiments import report_md, runner  # noqa: E402
from experiments.launch import LAUNCHERS  # noqa: E402
from experiments.reuse import recorded_version, training_version  # noqa: E402
from experiments.sweep import PRESETS, RUNG_PRESETS, check_preset  # noqa: E402


def _render(preset: str) -> None:
  """results/PRESET/README.md, and README.md's claims block from results/cpu/."""
  changed = report_md.render_readme()
  print(f"[readme] {report_md.REPO / 'README.md'} " + ("rewritten" if changed else "unchanged"))
  root = runner.RESULTS / preset
  if root.is_dir():
    print(f"[readme] {report_md.write_index(root, preset)}")


class Record:
  """results/PRESET/reproduction.json of `all`, rewritten after each experiment and every
  minute, so an invocation that is stopped leaves its record. An unfinished record of the
  same command at the same training version (`experiments.reuse.training_version`: the runs
  are the same runs) is continued, whatever its commit: its invocations listed with their
  commits, their wall times summed; a stopped reproduction resumes where it was, skipping
  the runs that finished, and an experiment completed at an older commit is analysed again
  at this one (its runs skipped), so every report is the last commit's."""

  def __init__(self, path: Path, command: str, fresh: bool, heartbeat_s: float = 60.0):
    self.path, self.t0 = Path(path), time.time()
    command = report_md.portable_command(command)  # no machine's path in results/
    prov = {**rec.provenance(), "train_version": training_version(runner.REPO)}
    old = json.loads(self.path.read_text()) if self.path.exists() else {}
    now = datetime.datetime.now().isoformat(timespec="seconds")
    if prov["train_version"] and not old.get("finished") and old.get("command") == command \
        and recorded_version(old, runner.REPO) == prov["train_version"]:
      self.d = old
      for e in [*old["experiments"].values(), *old["invocations"]]:
        e.setdefault("commit", old["commit"])  # written before entries named their commit
      self.d.update(prov, clean=bool(old.get("clean")) and prov["clean"])
    else:
      self.d = {"command": command, **prov, "fresh": fresh, "started": now,
                "experiments": {}, "invocations": []}
    self.done = dict(self.d["experiments"])  # what earlier invocations recorded
    stopped = self.d.pop("running", None)  # the experiment a stopped invocation was in
    if stopped:
      self.done[stopped["name"]] = {"wall_s": stopped["wall_s"],
                                    "launch_wall_s": stopped["wall_s"], "launched": 0,
                                    "skipped": 0, "partial": True}
    self._running = None
    self.d["invocations"].append({"started": now, "wall_s": 0.0, "commit": prov["commit"]})
    self._lock = threading.Lock()
    self._stop = threading.Event()
    self._write()
    threading.Thread(target=self._beat, args=(heartbeat_s,), daemon=True).start()

  def _beat(self, every: float) -> None:
    while not self._stop.wait(every):
      self._write()

  def _write(self) -> None:
    with self._lock:
      now = time.time()
      self.d["invocations"][-1]["wall_s"] = round(now - self.t0, 1)
      if self._running:
        self.d["running"] = {"name": self._running[0], "wall_s": round(now - self._running[1], 1)}
      else:
        self.d.pop("running", None)
      self.d["wall_s"] = round(sum(i["wall_s"] for i in self.d["invocations"]), 1)
      self.path.parent.mkdir(parents=True, exist_ok=True)
      tmp = self.path.with_suffix(".tmp")
      tmp.write_text(json.dumps(self.d, indent=1))
      tmp.replace(self.path)

  def finished_before(self, name: str) -> bool:
    """Whether an earlier invocation of this record completed experiment `name` at this commit,
    or at one that differs from it in results/ only (`rec.same_code`: a carried reproduction's
    commits); it is not run again: its results and run_info.json stay those of the launches
    that made them."""
    e = self.done.get(name)
    return (bool(e) and not e.get("partial") and str(e.get("status", "")).startswith("completed")
            and rec.same_code(e.get("commit"), self.d["commit"]))

  def begin(self, name: str) -> None:
    """Marks `name` running; its clock starts at the wall time earlier stopped invocations
    spent on it, so a record stopped in it again keeps them all."""
    earlier = self.done.get(name, {})
    with self._lock:
      self._running = (name, time.time() - (earlier["wall_s"] if earlier.get("partial") else 0))
    self._write()

  def experiment(self, name: str, entry: dict) -> None:
    """Records one experiment; an earlier invocation's wall time for it is added. Its launches
    are added only where it was stopped (it wrote no run_info.json): otherwise `entry` holds
    them already, as run_info.json sums the invocations at its commit and sweep. The runs a
    stopped invocation of a fresh reproduction finished count as launched, not skipped."""
    old = self.done.get(name)
    if old and old.get("partial") and self.d["fresh"]:
      entry = {**entry, "launched": entry["launched"] + entry["skipped"], "skipped": 0}
    if old:
      summed = ("wall_s", "launch_wall_s", "launched") if old.get("partial") else ("wall_s",)
      entry = {**entry, **{k: round(old.get(k, 0) + entry[k], 1) if k != "launched"
                           else old.get(k, 0) + entry[k] for k in summed},
               "skipped": entry["skipped"] if old.get("partial") else old.get("skipped", 0)}
    with self._lock:
      self.d["experiments"][name] = {**entry, "commit": self.d["commit"]}
      self._running = None
    self._write()

  def finish(self) -> dict:
    self._stop.set()
    self.d["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    self._write()
    return self.d


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
  from experiments.sweep import config_extras
  from pergrad.config import compose

  said = config_extras(extra)
  if not said:
    return
  try:
    compose([f"scale={preset}", *said])
  except Exception as e:  # noqa: BLE001 - any composition error, reported in one line
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise ValueError(f"--hydra-arg {' '.join(said)}: {first}") from None


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("experiment", nargs="*",
                 help=f"one or more of {runner.EXPERIMENTS} (or a plugin's), or 'all'")
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
  a = p.parse_args(argv)
  for plugin in a.plugin:
    rec.load_plugin(plugin)
  if a.carry_out and a.experiment:
    p.error("--carry-out packs a stopped reproduction: give it alone, without an experiment")
  if a.carry_in or a.carry_out:
    from experiments import carry
    root = a.sweeps_root or report_md.REPO / "runs" / "sweeps"
    record = runner.RESULTS / a.preset / report_md.REPRODUCTION
    try:
      if a.carry_in:
        print(f"[carry] {a.carry_in} -> {root}: {carry.unpack(a.carry_in, root, record)}")
      if a.carry_out:
        print(f"[carry] {root} -> {a.carry_out}: {carry.pack(root, record, a.carry_out)}")
    except (FileNotFoundError, ValueError) as e:
      sys.exit(f"error: {e}")
    if not a.experiment:
      return 0
  if not a.experiment:
    if not a.render_readme:
      p.error("name an experiment (or 'all'), or pass --render-readme, --carry-in or "
              "--carry-out")
    _render(a.preset)
    return 0
  known = tuple(rec.experiments())
  names = known if a.experiment == ["all"] else tuple(a.experiment)
  for n in names:
    if n not in known:
      p.error(f"unknown experiment {n!r}; choose one of {known} or 'all' (or --plugin)")
  names = rec.in_order(names)
  for n in names:  # a ladder rung runs the ladder's experiments only: one line, before any run
    try:
      check_preset(a.preset, n)
    except ValueError as e:
      p.error(str(e))
  if a.results_dir and len(names) > 1:
    p.error("--results-dir needs a single experiment")
  try:
    if not a.dry_run:  # a dry run checks each of its points, naming the refused ones
      _check_overrides(a.hydra_arg, a.preset)
  except ValueError as e:
    sys.exit(f"error: {e}")
  failed, errors = [], []
  wrote_results = False
  record = None
  if a.experiment == ["all"] and not (a.dry_run or a.analyze_only) and a.preset != "ci" \
      and not a.results_dir:
    root = a.sweeps_root or report_md.REPO / "runs" / "sweeps"
    fresh = not any(any(runner.default_sweep_dir(n, a.preset, root, tuple(a.hydra_arg)).glob(
        "*/summary.json")) for n in names)
    said = [x for i, x in enumerate(argv)  # a carried-in record continues the same command
            if not (x.startswith("--carry-in") or i and argv[i - 1] == "--carry-in")]
    command = "python scripts/reproduce.py all --preset " + a.preset + "".join(
        f" {x}" for x in said if x not in ("all", "--preset", a.preset))
    record = Record(runner.RESULTS / a.preset / report_md.REPRODUCTION, command, fresh)
  for n in names:
    t0 = time.time()
    if record is not None and record.finished_before(n):
      print(f"[all] {n}: completed by an earlier invocation of this reproduction; not re-run")
      continue
    if record is not None:
      record.begin(n)
    try:
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
        raise ValueError(f"{len(refused)} point(s) a real run would refuse: "
                         + " | ".join(refused))
    except (FileNotFoundError, RuntimeError, ValueError) as e:
      print(f"[error] {n}: {e}")
      errors.append(n)
      if record is not None:
        record.experiment(n, {"wall_s": round(time.time() - t0, 1), "launch_wall_s": 0.0,
                              "launched": 0, "skipped": 0, "status": f"error: {e}"})
      continue
    if record is not None:
      record.experiment(n, {
          "wall_s": round(time.time() - t0, 1),
          "launch_wall_s": round(out.log.wall_s, 1), "launched": len(out.log.launched),
          "skipped": len(out.log.skipped), "reused": len(out.log.reused),
          "status": (f"{len(out.log.failed)} run(s) failed" if out.log.failed else "completed")
          + (f" ({len(out.log.diverged)} diverged)" if out.log.diverged else "")
          + (f", verdict: {out.report.verdict}" if out.report else "")})
    if out.report:
      print(f"[{n}] {out.report.finding}")  # the verdict first
      print(f"[{n}] results in {out.results_dir}")
    failed += out.log.failed
    wrote_results |= out.report is not None and out.results_dir.parent == runner.RESULTS / a.preset
  if record is not None:
    d = record.finish()
    print(f"[all] {d['wall_s'] / 60:.1f} min at commit {d['commit']}")
    wrote_results = True
  if wrote_results or a.render_readme:
    _render(a.preset)
  if failed:
    print(f"[warn] {len(failed)} run(s) did not complete: {failed}")
  if errors:
    print(f"[error] experiments that could not run: {errors}")
  return 1 if errors else 0


if __name__ == "__main__":
  sys.exit(main())
