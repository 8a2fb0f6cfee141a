"""What an invocation of the command line may write, and when: nothing before the run is
accepted.

    if accepts(plan, out_dir): ...run...; record_invocation(out_dir, {name: yaml})
    remove_if_empty(out_dir, hydra_dir)

`accepts` runs the checks that refuse a run directory (another run's config, a diverged run,
progress without a checkpoint: `pergrad.config.plan.resume_decision`,
`pergrad.train.checkpoint.check_progress_kept`) before anything is written there. Hydra
writes nothing itself (`hydra.output_subdir: null`, and no `<job>.log`: configs/config.yaml):
`record_invocation` writes its record, `.hydra/{config,hydra,overrides}.yaml`, into the run
directory of a run that was accepted and wrote its config, so a refused run cannot overwrite
the record of the run it was refused for. Hydra still creates its run folder
(`outputs/<date>/<time>` unless hydra.run.dir is set) before the task starts;
`remove_if_empty` removes it, and a run directory that a run failing at start left empty.
A run whose storage fails (a save that cannot write) still writes summary.json with status
"failed" and its error where anything can be written (`write_failed_summary`).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from pergrad import files
from pergrad.config.plan import CONFIG, RunPlan, resume_decision
from pergrad.train.checkpoint import OutputError, check_progress_kept

RECORD = ".hydra"  # the invocation's record in the run directory (Hydra's name for it)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")  # the date folder of Hydra's default run folders


def accepts(plan: RunPlan, out_dir: Path) -> bool:
  """True when the run may write into `out_dir` (new, or to resume); False for a completed
  run (skipped, nothing written); ValueError / OutputError (one line) when it is refused."""
  if resume_decision(out_dir, plan) == "completed":
    return False
  check_progress_kept(out_dir, plan.train, plan.batch.max_batch_size)
  return True


def record_invocation(out_dir: Path, record_yaml: dict[str, str]) -> None:
  """Writes `.hydra/` ({file name: YAML text}: the composed config, Hydra's config, the
  command-line overrides, rendered by the CLI), as Hydra would, once the run has written its
  own config (it started); not where the disk refuses it."""
  if not (out_dir / CONFIG).exists():
    return
  with contextlib.suppress(OSError):  # a full disk: the run's own error is the one to report
    for name, text in record_yaml.items():
      files.write_text(out_dir / RECORD / name, text)


def remove_if_empty(out_dir: Path, hydra_dir: Path) -> None:
  """Removes the run directory and Hydra's run folder when nothing was written into them
  (and, above Hydra's default run folder, `<date>/` and `outputs/` when they are empty then)."""
  for d in dict.fromkeys((out_dir, hydra_dir)):
    with contextlib.suppress(OSError):
      d.rmdir()  # only an empty folder
  if _DATE.fullmatch(hydra_dir.parent.name):
    for d in (hydra_dir.parent, hydra_dir.parent.parent):
      with contextlib.suppress(OSError):
        d.rmdir()


def write_failed_summary(run_dir: Path, summary: dict, error: BaseException | None) -> None:
  """summary.json with status "failed" and the error's line when the run's storage failed
  (OutputError, OSError), where it can still be written (a full disk may refuse even that).
  Other failures (a lost peer, a second Ctrl-C) leave the run as they found it: resumable."""
  if not isinstance(error, (OutputError, OSError)):
    return
  why = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  with contextlib.suppress(OSError):
    files.write_json(Path(run_dir) / files.SUMMARY, {**summary, "status": "failed", "error": why})
