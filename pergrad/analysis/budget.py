"""`same_budget`: every compared run trained on its comparison's declared budget, as the run's
own record says (summary.json: examples seen, steps run, parameters; the config Hydra wrote:
warmup steps), never as its name or the sweep's plan says. A budget field left None is not
part of the comparison's budget; a declared field a run does not record fails the guard (a
value not recorded is never assumed).

Examples are exact for a fixed batch size. A variable-batch run (a ramp, a GNS-guided schedule)
ends at the first update that reaches its budget E (`pergrad.train.batch_schedule`), so it
sees E + o examples with 0 ≤ o < its last batch ≤ B_max: its comparison declares that
overshoot (`examples_over` = B_max − 1), and the guard names the largest one it admitted.
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
  examples_over: int | None = None  # examples ∈ [examples, examples + examples_over]

  def declared(self) -> dict:
    """The declared fields of `FIELDS` (examples_over qualifies examples)."""
    return {k: getattr(self, k) for k in FIELDS if getattr(self, k) is not None}


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
  recorded value differs from a declared one (examples: lies outside [examples, examples +
  examples_over]), or does not record it; passing, it names the largest overshoot admitted."""
  bad, over = [], []
  for run, rec in records.items():
    budget = declared if isinstance(declared, Budget) else declared[run]
    for k, v in budget.declared().items():
      got = rec.get(k)
      slack = int(budget.examples_over or 0) if k == "examples" else 0
      if got is None:
        bad.append(f"{run}: {k} not recorded (declared {v})")
      elif not 0 <= int(got) - int(v) <= slack:
        bad.append(f"{run}: {k} {int(got)}, declared {int(v)}"
                   + (f" (+ at most {slack})" if slack else ""))
      elif int(got) > int(v):
        over.append((int(got) - int(v), int(v)))
  if not records:
    bad = ["no compared run"]
  if bad:
    return Guard("same_budget", False, "; ".join(bad))
  why = f"every compared run ({len(records)}) has its declared budget"
  if over:
    o, e = max(over)
    why += (f"; {len(over)} variable-batch run(s) end past it at the first update that reaches "
            f"it, by ≤ {o} examples ({100 * o / e:.2g} % of {e})")
  return Guard("same_budget", True, why)


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
  want = {r["run"]: Budget(**{k: num(r.get(f"declared_{k}")) for k in (*FIELDS, "examples_over")})
          for r in df.to_dict("records")}
  return same_budget(recs, want)
