"""Command-line entry: `python scripts/train.py [overrides]` (= `pergrad-train`).

    python scripts/train.py model=tiny train.steps=200 optimizer.lr=3e-3 logging.wandb.mode=disabled
    python scripts/train.py -m optimizer.lr=1e-3,3e-3 data.batch_size=16,32

Hydra composes `configs/config.yaml` against the typed schema `pergrad.config.schema.Config`
(a typo'd key, a wrong type, an unknown option or a config group's option that does not exist
stops here with one message naming it and the closest choice), then `pergrad.config.build_plan`
checks every cross-field rule, before any data is read or anything compiled.
`plugins=[module,...]` imports user modules before Hydra composes; `--help` lists each group's
choices and every field; `--dry-run` checks what a run would check first, with the same line,
and trains nothing (`pergrad.train.dry_run`). The run writes to `train.out_dir` (default:
Hydra's run directory), one process at a time (`run.lock`); the same command resumes it; a
completed run is skipped. Errors print one line `error: ...` and exit 1 (HYDRA_FULL_ERROR=1:
the traceback); SIGINT, SIGTERM or the pre-emption signal stop it between two updates with a
checkpoint, exit 128 + the signal's number (`pergrad.train.interrupt`). The entry point sets
the process's logging and exception hooks (`pergrad.train.process`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from pergrad.config import composer as pconfig
from pergrad.train import process

# Set by --dry-run ("1"): check everything, train nothing, write nothing; "remote": the runs
# read their data elsewhere (reproduce.py --dry-run of a cluster launcher), data is a note.
DRY_RUN = "PERGRAD_DRY_RUN"


def _hydra_info() -> dict:
  hc = HydraConfig.get()
  return {
      "choices": {k: v for k, v in hc.runtime.choices.items() if not k.startswith("hydra/")},
      "overrides": list(hc.overrides.task),
      "override_dirname": hc.job.override_dirname,
      "output_dir": hc.runtime.output_dir,
  }


@hydra.main(version_base="1.3", config_path=str(pconfig.configs_dir()), config_name="config")
def _main(cfg: DictConfig) -> float | None:
  import jax

  from pergrad.config.plan import build_plan
  from pergrad.train import distributed, run_dir
  from pergrad.train.checkpoint import OutputError
  from pergrad.train.interrupt import Interrupts
  from pergrad.train.loop import NonFiniteLossError, run

  hc = HydraConfig.get()
  hydra_dir = Path(hc.runtime.output_dir)
  out_dir = Path(cfg.train.out_dir) if cfg.train.out_dir else hydra_dir
  stop = Interrupts()
  accepted = False  # the run passed the checks that refuse it (then it may write)
  held = contextlib.ExitStack()  # the run directory's lock, from acceptance to the record
  try:
    d = cfg.dist
    pconfig.load_plugins(cfg.plugins)  # those set in a YAML file, or in a sweep's worker
    if os.environ.get(DRY_RUN):
      from pergrad.train.dry_run import dry_run

      print(dry_run(build_plan(cfg, jax.device_count()), out_dir,
                    data_here=os.environ[DRY_RUN] != "remote"), flush=True)
      return None
    distributed.initialize(d.coordinator_address, d.num_processes, d.process_id, auto=d.auto,
                           timeout_s=d.timeout_s)
    if jax.process_count() > 1 and not cfg.train.out_dir and hc.mode == RunMode.RUN:
      raise ValueError(
          f"a run of {jax.process_count()} processes needs one run directory for all: set "
          "train.out_dir (Hydra's default directory is named by each process's clock).")
    plan = build_plan(cfg, jax.device_count())
    if run_dir.accepts(plan, out_dir):
      if distributed.is_main():  # refused (ValueError) while another process runs there
        held.enter_context(run_dir.locked(out_dir))
      accepted = True
    summary = run(plan, out_dir, hydra_info=_hydra_info(), stop=stop)
  except (ValueError, NonFiniteLossError, OutputError, OSError, KeyboardInterrupt) as e:
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
      raise
    print(f"error: {_one_line(e, out_dir)}", file=sys.stderr, flush=True)
    if isinstance(e, KeyboardInterrupt):  # XLA's threads may be mid-compile: no teardown
      sys.stdout.flush()
      os._exit(130)
    if hc.mode == RunMode.MULTIRUN:
      raise  # Hydra runs the other points, then reports this one
    sys.exit(1)
  finally:
    if accepted and distributed.is_main():
      run_dir.record_invocation(out_dir, {
          "config.yaml": OmegaConf.to_yaml(cfg), "hydra.yaml": OmegaConf.to_yaml({"hydra": hc}),
          "overrides.yaml": OmegaConf.to_yaml(OmegaConf.create(list(hc.overrides.task)))})
    held.close()
    run_dir.remove_if_empty(out_dir, hydra_dir)
  if summary["status"] == "interrupted":
    sys.stdout.flush()
    stop.hand_over()  # submitit's handler requeues the job and exits
    sys.exit(stop.exit_code())
  return summary.get("final_eval_loss")


def _one_line(e: BaseException, out_dir: Path) -> str:
  """The message of an error the run reports in one line."""
  if isinstance(e, KeyboardInterrupt):
    return (f"interrupted twice: stopped without saving; re-run the same command to resume "
            f"{out_dir} from its last checkpoint.")
  if isinstance(e, OSError):
    return (f"{e.strerror or type(e).__name__}: {e.filename or f'writing in {out_dir}'}; "
            "check that path (free disk space there, or set train.out_dir to a writable "
            "folder).")
  return str(e)


def main() -> None:
  """Console-script entry point (`pergrad-train`). The modules of a `plugins=[...]`
  override are imported before Hydra composes the config, so that `optimizer=<name>`
  can select an optimizer they register."""
  process.quiet()  # the process's logging and exception hooks: an entry point's to set
  signal.signal(signal.SIGINT, _interrupted_at_start)  # the loop installs its own
  if "--dry-run" in sys.argv[1:]:  # the environment carries it to a launcher's workers
    sys.argv.remove("--dry-run")
    os.environ.setdefault(DRY_RUN, "1")
  try:
    pconfig.load_plugins(pconfig.plugins_in(sys.argv[1:]))
    if (name := _config_name(sys.argv[1:])) is not None:
      pconfig.check_config_name(name)
  except ValueError as e:
    sys.exit(f"error: {e}")
  _main()


def _config_name(args: list[str]) -> str | None:
  """The value of Hydra's --config-name (-cn) in `args`, if given."""
  for i, a in enumerate(args):
    for flag in ("--config-name", "-cn"):
      if a == flag and i + 1 < len(args):
        return args[i + 1]
      if a.startswith(flag + "="):
        return a[len(flag) + 1:]
  return None


def _interrupted_at_start(signum, frame) -> None:
  """Ctrl-C before training started (composing, importing JAX, preparing data, compiling)."""
  del signum, frame
  sys.stdout.flush()
  print("error: interrupted before training started (nothing to save); re-run the same "
        "command to start or resume the run.", file=sys.stderr, flush=True)
  os._exit(130)  # XLA's threads may be mid-compile: no interpreter teardown


if __name__ == "__main__":
  main()
