#!/usr/bin/env python
"""The statistics benchmark's command line (`pergrad.bench.stats`): prints its JSON document.

  .venv/bin/python scripts/bench_stats.py                    # full run (minutes)
  .venv/bin/python scripts/bench_stats.py --quick            # smoke test (seconds)

Prints one JSON document (rows, the plain-step baselines, the "done when" checks) on
stdout, and tables and the checks on stderr (time checks with the location of their paired
per-rep ratios and its 90 % interval [lo, hi] against the bound; UNDET: the interval holds
the bound, `pergrad.bounds.RULE`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pergrad.bench import stats  # noqa: E402


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=stats.__doc__,
                              formatter_class=argparse.RawTextHelpFormatter)
  p.add_argument("--quick", action="store_true",
                 help="micro preset, B=4, 3 reps, 'all', 'sq+sign', 'norms', 'clip'")
  p.add_argument("--presets", "--preset", default="tiny,medium",
                 help="comma-separated: micro, tiny, medium, small, paper, 1b")
  p.add_argument("--peak-flops", type=float, default=None,
                 help="device peak FLOP/s for MFU (default: pergrad.bench.mfu's table)")
  p.add_argument("--batch-sizes", default="8,32", help="for tiny; medium uses --medium-batch-sizes")
  p.add_argument("--medium-batch-sizes", default="8")
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--stat-sets", default="sq+sign,norms,all,clip",
                 help="of sq+sign, norms, all, clip (per-example clipping, vmap and surgery)")
  p.add_argument("--no-layout-first", dest="layout_first", action="store_false")
  p.add_argument("--out", default=None, help="write the JSON document here")
  args = p.parse_args(argv)
  doc = stats.run(
      quick=args.quick, presets=args.presets.split(","), batch_sizes=args.batch_sizes.split(","),
      medium_batch_sizes=args.medium_batch_sizes.split(","), reps=args.reps,
      stat_sets=args.stat_sets.split(","), layout_first=args.layout_first,
      peak_flops=args.peak_flops,
      argv=sys.argv[1:], echo=lambda s: print(s, file=sys.stderr))
  print(json.dumps(doc))
  print("\n" + stats.table(doc["rows"]), file=sys.stderr)
  for c in doc["checks"]:
    mark = {"holds": "OK   ", "fails": "FAIL ", "undetermined": "UNDET"}[c["outcome"]]
    mark = mark if c["gating"] else ("ok   " if c["ok"] else "over ")
    ci = f' [{c["lo"]}, {c["hi"]}] vs {c["bound"]}' if "lo" in c else ""
    print(f'{mark} {c["check"]:52} {c["value"]!s:>7}{ci}  {c["where"]}', file=sys.stderr)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(doc, f, indent=1)
  return doc


if __name__ == "__main__":
  main()
