"""The projected wall time of a reproduction from its committed record and measured
per-run costs (`scripts/bench_sweep.py`; plain Python, no JAX).

A training experiment's committed runs took `runs_compute_s` seconds together
(run_info.json), n runs each paying a fixed cost f (data, compiles, evaluations,
checkpoints, figure) beside its steps. With f_b -> f_a and the steps s times as fast:

    compute' = kept · ((compute - n·f_b) / s + n·f_a),   wall' = wall · compute' / compute

where kept = 1 - repeated / n when runs are reused (`repeated_runs`: the same run trained
again by a later experiment, known by its final step and losses) and 1 otherwise, and the
experiment's parallel efficiency (wall / compute) is held. An experiment without runs (a
benchmark) keeps its wall time.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path


def repeated_runs(results: Path, order: list[str]) -> dict[str, int]:
  """Per experiment, its completed runs whose (final step, final eval and train loss)
  an earlier experiment of `order` already has: the same run trained again."""
  seen, out = {}, {}
  for e in order:
    f = results / e / "finals.csv"
    if not f.exists():
      continue
    out[e] = 0
    for r in csv.DictReader(f.open()):
      if r["status"] != "completed":
        continue
      key = (r["final_step"], r["final_eval_loss"], r["final_train_loss"])
      if seen.setdefault(key, e) != e:
        out[e] += 1
  return out


def project(results: Path, *, fixed_s: tuple[float, float], speed: float = 1.0,
            reuses: bool = False) -> dict:
  """The committed reproduction in `results` (reproduction.json, each experiment's
  run_info.json and finals.csv) with each run's fixed cost from fixed_s[0] to fixed_s[1]
  seconds, its steps `speed` times as fast, and, when `reuses`, without the runs that
  repeat an earlier experiment's (module docstring)."""
  rec = json.loads((results / "reproduction.json").read_text())
  repeats = repeated_runs(results, list(rec["experiments"]))
  f_b, f_a = fixed_s
  per, total_b, total_a = {}, 0.0, 0.0
  for e, x in rec["experiments"].items():
    info = json.loads((results / e / "run_info.json").read_text())
    n, compute = info.get("n_runs_completed") or 0, info.get("runs_compute_s") or 0.0
    wall = x["wall_s"]
    if not n or not compute:  # a benchmark: no runs to train
      per[e] = {"wall_s": wall, "projected_s": wall}
    else:
      steps = max(compute - n * f_b, 0.0)
      kept = (n - repeats.get(e, 0)) / n if reuses else 1.0
      after_compute = kept * (steps / speed + n * f_a)
      per[e] = {"wall_s": wall, "runs": n, "repeated_runs": repeats.get(e, 0),
                "projected_s": round(wall * after_compute / compute, 1)}
    total_b += wall
    total_a += per[e]["projected_s"]
  return {"committed_min": round(rec["wall_s"] / 60, 1),
          "committed_experiments_min": round(total_b / 60, 1),
          "projected_min": round(total_a / 60, 1),
          "speedup": round(total_b / total_a, 3),
          "repeated_runs": sum(repeats.values()), "reuse_counted": reuses,
          "assumptions": "per-run fixed cost and tokens/s of the short benchmark runs stand "
                         "for every training run; parallel efficiency of each experiment "
                         "unchanged; repeated runs from equal final step and losses",
          "experiments": per}
