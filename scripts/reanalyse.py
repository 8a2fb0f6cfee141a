"""Re-analyse the committed runs of a reproduction with the new decision rules
(`experiments.reanalysis`: paired on shared seeds, decided whatever the power, absence by TOST,
time bounds on the paired ratio's location, same_budget) and write a before/after table per
claim: the verdict each report.json committed, and the new reading. No training.

    python scripts/reanalyse.py [--results results/cpu] [--out results/reanalysis]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import reanalysis as R  # noqa: E402
from experiments.record import get, provenance  # noqa: E402
from experiments.verdict import md_table  # noqa: E402
from pergrad.analysis import decide as D  # noqa: E402


def analyse(root: Path) -> list[dict]:
  jobs = {"overhead": R.do_overhead, "sign_placement": R.do_sign_placement,
          "preconditioner": R.do_preconditioner, "batch_scaling": R.do_batch_scaling,
          "norm_cost": R.do_norm_cost, "gns_ramp": R.do_gns_ramp, "snr": R.do_snr,
          "msq_eps": R.do_msq_eps, "moments": R.do_moments, "lr_exponent": None,
          "gns_schedule": R.do_gns_schedule}
  rows = []
  places = [(n, root / n, "cpu") for n in jobs] + [
      (n, root / "ladder" / rung / n, f"cpu_{rung}") for rung in ("xxs", "xs", "s")
      for n in ("gns_ramp", "moments", "lr_exponent")]
  for name, out, preset in places:
    if not (out / "report.json").exists():
      continue
    old = R.old_report(out)
    fn = jobs.get(name)
    res = (R.do_lr_exponent(out, old, preset) if name == "lr_exponent" else fn(out, old))
    verdict, comps, note = (*res, "") if len(res) == 2 else res
    claim = get(name).row
    rows.append({"claim": claim + ("" if preset == "cpu" else f" (ladder {preset})"),
                 "experiment": name, "where": str(out.relative_to(root.parent.parent)),
                 "old_verdict": old["verdict"], "old_rule_verdict": old["rule_verdict"],
                 "old_commit": old["commit"], "new_verdict": verdict, "note": note,
                 "comparisons": comps})
  return rows


def table(comps: list[dict]) -> pd.DataFrame:
  """A claim's comparisons as the Markdown table's columns."""
  f = lambda x: "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) \
      else f"{x:.3g}"
  if comps and "advantage" not in comps[0]:  # time bounds
    return pd.DataFrame({"comparison": [c["comparison"] for c in comps],
                         "new": [c["new"] for c in comps],
                         "ratio [90%]": [f"{f(c['ratio'])} [{f(c['lo90'])}, {f(c['hi90'])}]"
                                         for c in comps],
                         "bound": [f(c["bound"]) for c in comps], "n": [c["n"] for c in comps]})
  settle = lambda d: ", ".join(f"{k} {v or f'> {D.MOST_SEEDS}'}" for k, v in d.items()) or "–"
  return pd.DataFrame([{
      "comparison": c["comparison"], "old": c["old"] or "–", "new": c["new"], "n": c["n"],
      "advantage [95%]": f"{f(c['advantage'])} [{f(c['lo95'])}, {f(c['hi95'])}]",
      "paired ±": f(c["half_paired"]), "unpaired ±": f(c["half_unpaired"]),
      "power (effect)": f"{f(c['power'])} ({f(c['effect'])})",
      "TOST power (margin)": f"{f(c['power_equivalence'])} ({f(c['margin'])})",
      "seeds to settle": settle(c["seeds_to_settle"])} for c in comps])


def markdown(rows: list[dict], prov: dict) -> str:
  olds = ", ".join(sorted({r["old_commit"][:7] for r in rows}))
  parts = [f"# Re-analysis of the committed runs with the new decision rules\n\n"
           f"`python scripts/reanalyse.py` at commit {prov['commit'][:7]}"
           f"{'' if prov['clean'] else ' (uncommitted changes)'}; the runs as committed in "
           f"results/cpu at commits {olds}. " + NOTE,
           md_table(pd.DataFrame({"claim": [r["claim"] for r in rows],
                                  "before (committed)": [r["old_verdict"] for r in rows],
                                  "rule alone, before": [r["old_rule_verdict"] or "–"
                                                         for r in rows],
                                  "after (new rules)": [r["new_verdict"] for r in rows]}))]
  for r in rows:
    parts.append(f"## {r['claim']} — `{r['where']}`\n\nBefore: **{r['old_verdict']}**; after: "
                 f"**{r['new_verdict']}**." + (f" {r['note']}." if r["note"] else ""))
    if r["comparisons"]:
      parts.append(md_table(table(r["comparisons"])))
  return "\n\n".join(parts) + "\n"


NOTE = ("No training: the same runs, the new rules (`pergrad.analysis.decide`, `timing`, "
        "`budget`). Pairs are read on the shared seeds (paired t, 95%): a detected difference is "
        "decided whatever its power (listed beside as the design's, for the declared effect); "
        "absence is read by TOST (90% interval within ±margin; the declared effect where no "
        "margin is declared), else 'not separable', with the seeds that would settle it at the "
        "observed paired sd and gap. Time bounds: the 90% interval of the geometric mean of the "
        "paired per-rep ratios. The committed guards other than `powered` are carried as they "
        "were; `same_budget` is added where the runs' budgets are recorded (lr_exponent's "
        "finals).")


def plain(x):
  """JSON-safe: NaN and ±inf as null, numpy scalars as Python's, tuples as lists."""
  if isinstance(x, dict):
    return {str(k): plain(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [plain(v) for v in x]
  if isinstance(x, (np.bool_, bool, np.integer, int)) or x is None or isinstance(x, str):
    return x.item() if isinstance(x, np.generic) else x
  return float(x) if math.isfinite(float(x)) else None


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--results", default="results/cpu", help="a reproduction's results dir")
  ap.add_argument("--out", default="results/reanalysis", help="writes OUT.md and OUT.json")
  args = ap.parse_args()
  root = (REPO / args.results).resolve()
  if not (root / "reproduction.json").exists():
    sys.exit(f"reanalyse: {root} holds no reproduction.json; give --results the directory "
             "`scripts/reproduce.py all` wrote")
  rows = analyse(root)
  prov = {"command": "python scripts/reanalyse.py " + " ".join(sys.argv[1:]), **provenance()}
  out = REPO / args.out
  out.with_suffix(".json").write_text(json.dumps(plain({**prov, "claims": rows}), indent=1,
                                                 allow_nan=False) + "\n")
  out.with_suffix(".md").write_text(markdown(rows, prov))
  print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.json')}: {len(rows)} reports")


if __name__ == "__main__":
  main()
