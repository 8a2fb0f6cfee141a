"""budget.csv: each finished run's budget as it recorded it (`pergrad.analysis.budget.record`)
beside the budget its comparison declares from the plan (`declared`), which every report's
`same_budget` guard reads (`pergrad.analysis.budget.guard`).

A run declares the budget of the config its plan composes: the sweep's base, the `fixed`
settings of the sweep's blocks whose values admit the run (an lr search's block that grows a
group's grid or adds its seeds must inherit its first-stage block's: so a run of such a block
declares the first-stage block's budget, `growth.first_stage_fixed`), and the run's own swept
values (its name). A run of a later stage declares its own settings. Fields: steps (a fixed
batch size only), examples = steps × B_max (a variable batch size: up to B_max − 1 more, its
last update's overshoot: examples_over), warmup steps, model parameters.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Sequence

import pandas as pd

from pergrad.analysis import budget as budget_lib
from pergrad.analysis.runs import (
  finished,
  fmt,
  from_table,
  parse_dirname,
  table_value,
  write_csv,
)
from pergrad.sweep.grid import Sweep
from pergrad.sweep.growth import same

SEED_KEYS = ("train.seed",)


def admits(block, point: dict, lr_key: str | None) -> bool:
  """Whether `block` plans the run of swept values `point`: each of its grid keys (the lr and
  the seed aside: a grid grows, seeds are added) holds the run's value, and each key it fixes
  that the run's name also sets agrees."""
  for k, vals in block.grid.items():
    if k in (lr_key, *SEED_KEYS):
      continue
    if k not in point or not any(same(point[k], v) for v in vals):
      return False
  return all(same(point[k], v) for k, v in block.fixed.items() if k in point)


def planned(sweep: Sweep, point: dict, overrides: Sequence[str] = ()) -> tuple[str, ...]:
  """The overrides that plan the run of swept values `point`: `overrides` (the base and the
  sweep's extra), the `fixed` of the blocks that admit it, its own values."""
  lr_key = sweep.lr_search.lr_key if sweep.lr_search else None
  fixed: dict = {}
  for bl in sweep.blocks:
    if admits(bl, point, lr_key):
      fixed.update(bl.fixed)
  return (*overrides, *(f"{k}={fmt(v)}" for k, v in fixed.items() if k not in point),
          *(f"{k}={fmt(v)}" for k, v in point.items()))


@functools.lru_cache(maxsize=256)
def declared(overrides: tuple) -> budget_lib.Budget:
  """The budget of the config `overrides` compose (`budget` module docstring)."""
  from pergrad.analysis.sizes import _plan, n_params

  p = _plan(overrides)
  fixed = p.batch.kind == "fixed"
  return budget_lib.Budget(examples=p.train.steps * p.batch.max_batch_size,
                           steps=p.train.steps if fixed else None,
                           warmup_steps=int(p.config["schedule"]["warmup_steps"]),
                           n_params=n_params(overrides),
                           examples_over=0 if fixed else p.batch.max_batch_size - 1)


def table(sweep: Sweep, sweep_dir: Path, fin: pd.DataFrame,
          overrides: Sequence[str] = ()) -> pd.DataFrame:
  """One row per completed run of `fin`: run, its recorded budget (`budget.record`: <field>)
  and its declared one (declared_<field>, declared_examples_over)."""
  rows = []
  done = finished(fin)
  for run in (done[done["status"] == "completed"]["run"] if "status" in done else done["run"]):
    point = {k: from_table(table_value(v)) for k, v in parse_dirname(run).items()
             if k not in SEED_KEYS}
    want = declared(planned(sweep, point, tuple(overrides)))
    rec = budget_lib.record(Path(sweep_dir) / run)
    rows.append({"run": run, **rec, **{f"declared_{k}": v for k, v in want.declared().items()},
                 "declared_examples_over": want.examples_over})
  return pd.DataFrame(rows, columns=["run", *budget_lib.FIELDS,
                                     *(f"declared_{k}" for k in budget_lib.FIELDS),
                                     "declared_examples_over"])


def write(sweep: Sweep, sweep_dir: Path, fin: pd.DataFrame, out_dir: Path,
          overrides: Sequence[str] = ()) -> Path:
  path = Path(out_dir) / budget_lib.BUDGET_CSV
  write_csv(table(sweep, sweep_dir, fin, overrides), path)
  return path
