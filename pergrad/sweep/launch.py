"""Launching a sweep: one Hydra multirun of `python -m pergrad.train` per grid block with a
point not finished (launched whole: the entry skips completed runs and resumes partial ones).
A point that another sweep of the same sweeps root has run already, at the same code
version (`pergrad.sweep.reuse`), is linked to that run, not trained again."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from pergrad.analysis.runs import DONE, fmt, run_dirname, run_status
from pergrad.sweep.grid import Block, config_extras, override_key
from pergrad.sweep.presets import REPO
from pergrad.sweep.reuse import RunIndex, drop_broken_link, is_reused, is_whole

# Each launcher's overrides (configs/hydra/launcher/{slurm_gpu,local}.yaml for submitit).
LAUNCHERS = {"basic": (), "joblib": ("hydra/launcher=joblib", "hydra.launcher.n_jobs={n_jobs}"),
             "submitit": ("hydra/launcher=slurm_gpu",), "submitit_local": ("hydra/launcher=local",)}
TRAIN_CMD = (sys.executable, "-m", "pergrad.train")  # the installed training entry


def multirun_command(sweep_dir: Path, base: dict, block: Block, *,
                     train_cmd: Sequence[str] = TRAIN_CMD, launcher: str = "basic",
                     n_jobs: int = 2, extra: Sequence[str] = ()) -> list[str]:
  """The `python -m pergrad.train -m ...` command that runs every point of `block`."""
  fixed = {k: v for k, v in {**base, **block.fixed}.items() if k not in block.grid}
  exclude = sorted(set(fixed) | {override_key(e) for e in extra})
  return [*train_cmd, "-m", *(f"{k}={fmt(v)}" for k, v in fixed.items()),
          *(f"{k}={','.join(fmt(v) for v in vals)}" for k, vals in block.grid.items()), *extra,
          f"hydra.sweep.dir={sweep_dir}", "hydra.sweep.subdir=${hydra.job.override_dirname}",
          f"hydra.job.config.override_dirname.exclude_keys=[{','.join(exclude)}]",
          *(o.format(n_jobs=n_jobs) for o in LAUNCHERS[launcher])]


def run_overrides(base: dict, block: Block, point: dict, extra: Sequence[str]) -> list[str]:
  """The overrides that make one run of `block` (what its multirun job composes), without
  the launcher's and the other neutral ones."""
  values = {**base, **block.fixed, **point}
  return [*(f"{k}={fmt(v)}" for k, v in values.items()), *config_extras(extra)]


@dataclasses.dataclass
class LaunchLog:
  """What one `launch` call did: points already done, points run, failures (a run that did
  not finish); `diverged`: the sweep's runs that finished diverged (a finished outcome: an lr
  search steps past them, nothing runs them again), set by the runner from the sweep dir."""

  skipped: list = dataclasses.field(default_factory=list)
  launched: list = dataclasses.field(default_factory=list)
  reused: list = dataclasses.field(default_factory=list)  # linked to another sweep's run
  failed: list = dataclasses.field(default_factory=list)
  diverged: list = dataclasses.field(default_factory=list)
  wall_s: float = 0.0
  commands: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class How:
  """How an experiment's `launch` runs (the runner's options): `run(name, preset,
  sweeps_root=)` runs another experiment end to end (the ladder's rungs)."""

  dry_run: bool = False
  echo: Callable[[str], None] = print
  launcher: str = "basic"
  n_jobs: int = 2
  extra: tuple = ()
  sweeps_root: Path | None = None
  run: Callable | None = None


def launch_blocks(sweep_dir: Path, base: dict, blocks: Iterable[Block], *,
                  train_cmd: Sequence[str] = TRAIN_CMD, launcher: str = "basic", n_jobs: int = 2,
                  extra: Sequence[str] = (), dry_run: bool = False, log: LaunchLog | None = None,
                  echo: Callable[[str], None] = print, index: RunIndex | None = None
                  ) -> LaunchLog:
  """Launches each block whose points are not all done; records skipped points, and links
  the points that `index` knows another sweep has run (module docstring; None: none). With
  the joblib launcher, blocks smaller than its `n_jobs` run side by side (`waves`): a round
  of single-run extensions keeps every core busy, each multirun command as it would be alone."""
  log = log or LaunchLog()
  sweep_dir.mkdir(parents=True, exist_ok=True)
  planned = []  # (block, its points to run, their index keys, the command)
  for block in blocks:
    todo, done, keys = [], [], {}
    for p in block.points():
      name = run_dirname(p)
      if not dry_run:
        drop_broken_link(sweep_dir / name, echo, index.whole if index else is_whole)
      status = run_status(sweep_dir / name)
      if index is not None and status == "missing":
        keys[name] = index.key(run_overrides(base, block, p, extra))
        found = index.find(keys[name], echo)
        if found is not None:
          if not dry_run:
            index.link(sweep_dir / name, found)
          log.reused.append(name)
          echo(f"[reuse] {name} <- {found}")
          continue
      (done if status in DONE else todo).append(name)
    for name in done:  # each run once: a later round lists finished runs again
      if name in log.skipped or name in log.launched or name in log.reused:
        continue
      (log.reused if is_reused(sweep_dir / name) else log.skipped).append(name)
      echo(f"[skip] {name} ({run_status(sweep_dir / name)})")
    if not todo:
      continue
    cmd = multirun_command(sweep_dir, base, block, train_cmd=train_cmd, launcher=launcher,
                           n_jobs=n_jobs, extra=extra)
    log.commands.append(cmd)
    echo(f"[launch] {len(todo)} run(s): "
         + " ".join(f"'{c}'" if any(ch in c for ch in " ${}[]*") else c for c in cmd[1:]))
    log.launched += [n for n in todo if n not in log.launched]
    planned.append((block, todo, keys, cmd))
  for wave in [] if dry_run else waves(planned, n_jobs if launcher == "joblib" else 1):
    t0 = time.time()
    run = lambda cmd: subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    with concurrent.futures.ThreadPoolExecutor(len(wave)) as pool:
      procs = list(pool.map(run, [cmd for *_, cmd in wave]))
    log.wall_s += time.time() - t0
    for (block, todo, keys, _), proc in zip(wave, procs, strict=True):
      log.failed += [n for n in todo if run_status(sweep_dir / n) not in DONE]
      for p in block.points() if index is not None else ():
        if (name := run_dirname(p)) in todo:
          index.add(keys.get(name) or index.key(run_overrides(base, block, p, extra)),
                    sweep_dir / name)
      if proc.returncode:
        echo(f"[warn] multirun exited with code {proc.returncode}; failed: "
             f"{[n for n in todo if n in log.failed]}")
  return log


def waves(planned: Sequence[tuple], slots: int) -> list[list[tuple]]:
  """`planned` (..., points to run, ..., command) in order, grouped into waves run side by side:
  a wave holds consecutive commands whose points (each counted up to `slots`) fit in `slots`
  jobs and share no point; a command that fills them runs alone (slots 1: one by one)."""
  out, used, names = [], slots, set()
  for item in planned:
    k, todo = min(len(item[1]), slots), set(item[1])
    if used + k > slots or names & todo:
      out.append([])
      used, names = 0, set()
    out[-1].append(item)
    used, names = used + k, names | todo
  return out
