"""`same_budget`: every compared run trained on its comparison's declared budget, as the run's
own record says (summary.json: examples seen, steps run, parameters; the config Hydra wrote:
warmup steps), never as its name or the sweep's plan says. A budget field left None is not
part of the comparison's budget; a declared field a run does not record fails the guard (a
value not recorded is never assumed).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path

from pergrad.analysis.guards import Guard
from pergrad.analysis.runs import run_setting
from pergrad.files import SUMMARY

FIELDS = ("examples", "steps", "warmup_steps", "n_params")


@dataclasses.dataclass(frozen=True)
class Budget:
  """A comparison's declared budget (None: not part of it)."""

  examples: int | None = None
  steps: int | None = None
  warmup_steps: int | None = None
  n_params: int | None = None

  def declared(self) -> dict:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def record(run_dir) -> dict:
  """A run's budget as it recorded it: {examples, steps, warmup_steps, n_params} (a field the
  run does not record: None). steps is the last step it ran."""
  run_dir = Path(run_dir)
  path = run_dir / SUMMARY
  try:
    s = json.loads(path.read_text()) if path.exists() else {}
  except json.JSONDecodeError:
    s = {}
  warm = run_setting(run_dir, "schedule.warmup_steps")
  return {"examples": s.get("examples_seen"), "steps": s.get("last_step"),
          "warmup_steps": None if warm is None else int(warm), "n_params": s.get("n_params")}


def of_finals(row: Mapping, batch_size: int | None = None) -> dict:
  """A run's budget from a finals.csv row (its last step, the warmup its config recorded;
  examples = steps × `batch_size` for a fixed batch size)."""
  num = lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
  steps, warm = num(row.get("final_step")), num(row.get("warmup_steps"))
  ex = steps * int(batch_size) if steps is not None and batch_size else None
  return {"examples": ex, "steps": steps, "warmup_steps": warm, "n_params": None}


def same_budget(records: Mapping[str, Mapping], declared: Budget | Mapping[str, Budget]
                ) -> Guard:
  """The guard over runs (run -> its `record`) against the comparison's `declared` budget (one
  for every run, or run -> its own, e.g. per batch size): fails naming each run whose
  recorded value differs from a declared one, or does not record it."""
  bad, checked = [], 0
  for run, rec in records.items():
    want = (declared if isinstance(declared, Budget) else declared[run]).declared()
    checked += 1
    for k, v in want.items():
      got = rec.get(k)
      if got is None:
        bad.append(f"{run}: {k} not recorded (declared {v})")
      elif int(got) != int(v):
        bad.append(f"{run}: {k} {int(got)}, declared {int(v)}")
  if not records:
    bad = ["no compared run"]
  return Guard("same_budget", not bad, "; ".join(bad) if bad else
               f"every compared run ({checked}) has its declared budget")


# per run: its recorded budget and its declared one (pergrad.sweep.budgets)
BUDGET_CSV = "budget.csv"


def guard(out_dir, runs=None) -> Guard:
  """`same_budget` over budget.csv in `out_dir` (`pergrad.sweep.budgets`: each completed run's
  recorded budget and the one its comparison declares; `runs`: those compared, None: every
  run there). Fails without budget.csv: the compared runs' budgets are then unchecked."""
  from pergrad.analysis.runs import read_csv

  df = read_csv(Path(out_dir) / BUDGET_CSV)
  if df.empty and not (Path(out_dir) / BUDGET_CSV).exists():
    return Guard("same_budget", False, f"no {BUDGET_CSV}: the compared runs' budgets were not "
                 "recorded beside these results (analysed before same_budget); re-run")
  if runs is not None:
    df = df[df["run"].isin(list(runs))]
  num = lambda v: None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)
  recs = {r["run"]: {k: num(r.get(k)) for k in FIELDS} for r in df.to_dict("records")}
  want = {r["run"]: Budget(**{k: num(r.get(f"declared_{k}")) for k in FIELDS})
          for r in df.to_dict("records")}
  return same_budget(recs, want)
