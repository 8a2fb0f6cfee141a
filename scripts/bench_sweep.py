#!/usr/bin/env python
"""What a sweep pays per run, before and after, in one process tree; prints one JSON object.

    python scripts/bench_sweep.py --before /tmp/pergrad_10f64fc      # a checkout to compare
    python scripts/bench_sweep.py --steps 20 --lrs 0.003,0.01,0.03 --seeds 0,1

For each code version (`--before`: another checkout; `after`: this one), in turns over
`--rounds`, a subprocess launches with that version's own launcher
(`pergrad.sweep.launch_blocks`) a small sweep of the cpu preset (an lr grid x seeds of
one experiment, then a second experiment asking for some of the same runs), from empty sweep
directories and compilation cache. Reported per version (`summarize`): runs trained and
reused, the fixed cost (wall time less the steps' time) of the first and the later runs,
compile-cache hits, tokens/s, and paired after/before ratios of the later runs' fixed costs.
The projection (`pergrad.bench.sweep_cost`) rescales the before version's committed
`reproduce.py all --preset cpu` record by them; the floor (`matmul_floor`, `at_floor`) bounds
what a faster step could project. The machine is shared: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pergrad.bench.paired import paired_ratios, summary  # noqa: E402
from pergrad.bench.sweep_cost import project  # noqa: E402
from pergrad.bounds import location  # noqa: E402

# Run in the version's checkout (its own experiments/ and pergrad/ first on sys.path).
DRIVER = r"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
try:
  from pergrad.sweep import Block, RunIndex, launch_blocks
except ImportError:  # a version before pergrad.sweep: its launcher in experiments/
  from experiments.launch import launch_blocks
  from experiments.sweep import Block
  try:
    from experiments.reuse import RunIndex
  except ImportError:  # a version without run reuse
    RunIndex = None
index = RunIndex.at(sys.argv[3]) if RunIndex is not None else None
spec = json.loads(sys.argv[2])
out = {}
for exp, grid in spec["experiments"]:
  t0 = time.time()
  kw = {"index": index} if index is not None else {}
  log = launch_blocks(Path(spec["root"]) / exp / "cpu", spec["base"], [Block(grid)],
                      launcher="basic", extra=tuple(spec["extra"]), echo=lambda line: None,
                      **kw)
  out[exp] = {"wall_s": time.time() - t0, "launched": log.launched, "skipped": log.skipped,
              "reused": list(getattr(log, "reused", [])), "failed": log.failed}
print("BENCH_SWEEP " + json.dumps(out))
"""


def matmul_skeleton(spec, T: int):
  """(params, loss) of `spec`'s matmuls alone (module docstring): loss(p, x_BxTxD,
  y_BxTxV) = Σ logits·y through the same q, k, v, out, QKᵀ, AV, fc_in, fc_out and head
  shapes as pergrad/model.py, residuals summed, every other op left out."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  d, H, K, F, V = spec.d_model, spec.n_heads, spec.head_dim, spec.d_ff, spec.vocab_size
  keys = iter(jax.random.split(jax.random.PRNGKey(0), 8 * spec.n_layers + 1))
  normal = lambda *shape: jax.random.normal(next(keys), shape) / np.sqrt(shape[0])
  params = {"layers": [{"q": normal(d, H, K), "k": normal(d, H, K), "v": normal(d, H, K),
                        "out": normal(H, K, d) / np.sqrt(H), "fc_in": normal(d, F),
                        "fc_out": normal(F, d)} for _ in range(spec.n_layers)],
            "head": normal(d, V)}

  def loss(p, x_BxTxD, y_BxTxV):
    h_BxTxD = x_BxTxD
    for w in p["layers"]:
      q, k, v = (jnp.einsum("btd,dhk->bthk", h_BxTxD, w[n]) for n in "qkv")
      s_BxHxTxT = jnp.einsum("bthk,bshk->bhts", q, k) / T
      o_BxTxHxK = jnp.einsum("bhts,bshk->bthk", s_BxHxTxT, v)
      h_BxTxD = h_BxTxD + jnp.einsum("bthk,hkd->btd", o_BxTxHxK, w["out"])
      h_BxTxD = h_BxTxD + (h_BxTxD @ w["fc_in"]) @ w["fc_out"]
    return jnp.sum((h_BxTxD @ p["head"]) * y_BxTxV)
  return params, loss


def dot_flops(jaxpr) -> int:
  """2·M·N·K summed over the dot_generals of a jaxpr and its sub-jaxprs (a scan's body
  times its length)."""
  import math

  n = 0
  for e in jaxpr.eqns:
    if e.primitive.name == "dot_general":
      (_, rc), (_, rb) = e.params["dimension_numbers"]
      lhs, rhs = (v.aval.shape for v in e.invars)
      n += 2 * math.prod(lhs) * math.prod(d for i, d in enumerate(rhs) if i not in rc + rb)
    times = e.params["length"] if e.primitive.name == "scan" else 1
    for v in e.params.values():
      for sub in v if isinstance(v, tuple | list) else (v,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          n += times * dot_flops(sub)
  return n


def model_dot_flops(plan) -> int:
  """Dot FLOPs of the gradient of the plan's model's mean loss over one batch (`dot_flops`)."""
  import jax
  import jax.numpy as jnp

  from pergrad.loss import make_loss_fn
  from pergrad.model import Transformer, init_params

  loss_fn = make_loss_fn(Transformer(plan.model))
  tokens = jnp.zeros((plan.data.batch_size, plan.data.seq_len), jnp.int32)
  grad = jax.grad(lambda p: loss_fn(p, {"inputs": tokens, "targets": tokens}).mean())
  return dot_flops(jax.make_jaxpr(grad)(
      init_params(plan.model, jax.random.PRNGKey(0), plan.data.seq_len)).jaxpr)


def matmul_floor(plan, reps: int = 15) -> dict:
  """{"tokens_per_s", "chunk", "by_chunk", "dot_flops_per_step", "flops_per_s",
  "square_matmul_flops_per_s"}: the skeleton's gradient over B examples in chunks of c
  (scanned, summed), the fastest c, median of `reps` timings each; beside it, XLA's rate
  on one 2048³ matmul (the machine's best case, for scale)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  def median_s(f, *args):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(reps):
      t0 = time.perf_counter()
      jax.block_until_ready(f(*args))
      times.append(time.perf_counter() - t0)
    return float(np.median(times))

  B, T = plan.data.batch_size, plan.data.seq_len
  params, loss = matmul_skeleton(plan.model, T)
  kx, ky = jax.random.split(jax.random.PRNGKey(1))
  x = jax.random.normal(kx, (B, T, plan.model.d_model))
  y = jax.random.normal(ky, (B, T, plan.model.vocab_size)) / plan.model.vocab_size
  ours = dot_flops(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x, y).jaxpr)
  if ours != (theirs := model_dot_flops(plan)):  # a floor of fewer matmuls is no floor
    raise SystemExit(f"unsupported: the floor's skeleton does {ours:,} dot FLOPs per step, "
                     f"the model's gradient {theirs:,}: matmul_skeleton does not mirror this "
                     "model (pergrad/model.py changed?); make it do the model's matmuls")
  by_chunk, flops, c = {}, {}, B
  while c >= 2 and B % c == 0:
    def grads(p, x, y, c=c):
      def add(acc, xy):  # the input's gradient too: the model's embedding needs it
        g_p, g_x = jax.grad(loss, argnums=(0, 1))(p, *xy)
        return jax.tree.map(jnp.add, acc, g_p), g_x
      xy = (x.reshape(B // c, c, *x.shape[1:]), y.reshape(B // c, c, *y.shape[1:]))
      return jax.lax.scan(add, jax.tree.map(jnp.zeros_like, p), xy)
    flops[c] = dot_flops(jax.make_jaxpr(grads)(params, x, y).jaxpr)
    by_chunk[c] = round(B * T / median_s(jax.jit(grads), params, x, y), 1)
    c //= 2
  best = max(by_chunk, key=by_chunk.get)
  n = 2048
  square = jnp.ones((n, n), jnp.float32)
  return {"tokens_per_s": by_chunk[best], "chunk": best, "by_chunk": by_chunk,
          "dot_flops_per_step": flops[best],
          "flops_per_s": round(flops[best] * by_chunk[best] / (B * T)),
          "square_matmul_flops_per_s": round(2 * n**3 / median_s(
              jax.jit(jnp.matmul), square, square))}


def floor_in_process(experiment: str) -> dict:
  """`matmul_floor` in a fresh process, as each turn's sweep is (rounds then sample the
  spread between processes alike)."""
  proc = subprocess.run([sys.executable, __file__, "--floor-only", "--experiment", experiment],
                        cwd=REPO, capture_output=True, text=True,
                        env={**os.environ, "PYTHONPATH": str(REPO)})
  line = [x for x in proc.stdout.splitlines() if x.startswith("BENCH_FLOOR ")]
  if proc.returncode or not line:
    raise SystemExit(f"the floor failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
  return json.loads(line[0].removeprefix("BENCH_FLOOR "))


def has_compile_cache(repo: Path) -> bool:
  return "compile_cache" in (repo / "pergrad" / "config" / "schema.py").read_text()


def turn(repo: Path, args, root: Path) -> dict:
  """One version's sweep (module docstring): {experiment: launch log} and per-run rows."""
  lrs, seeds = args.lrs, args.seeds
  experiments = [("grid", {"optimizer.lr": lrs, "train.seed": seeds}),
                 ("second", {"optimizer.lr": [lrs[len(lrs) // 2]], "train.seed": seeds})]
  extra = [f"train.compile_cache={root / 'jax_cache'}"] if has_compile_cache(repo) else []
  # as that version's experiments launch their runs (its base_for: pergrad/sweep/presets.py,
  # or experiments/sweep.py before pergrad.sweep)
  base_for = next(p for p in (repo / "pergrad" / "sweep" / "presets.py",
                              repo / "experiments" / "sweep.py") if p.exists())
  figure = {"logging.figure": False} if "logging.figure" in base_for.read_text() else {}
  spec = {"root": str(root), "experiments": experiments, "extra": extra,
          "base": {"experiment": args.experiment, "scale": "cpu", "train.steps": args.steps,
                   "logging.log_every": 5, **figure}}  # tokens/s needs two metric pulls
  env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(repo)}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  t0 = time.time()
  proc = subprocess.run([sys.executable, "-c", DRIVER, str(repo), json.dumps(spec), str(root)],
                        cwd=repo, env=env, capture_output=True, text=True)
  wall = time.time() - t0
  line = [x for x in proc.stdout.splitlines() if x.startswith("BENCH_SWEEP ")]
  if proc.returncode or not line:
    raise SystemExit(f"the sweep of {repo} failed (exit {proc.returncode}):\n"
                     f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
  logs = json.loads(line[0].removeprefix("BENCH_SWEEP "))
  rows = []
  for exp, _ in experiments:
    for name in logs[exp]["launched"]:
      s = json.loads((root / exp / "cpu" / name / "summary.json").read_text())
      steps_s = s["tokens_seen"] / s["tokens_per_s"]
      rows.append({"experiment": exp, "run": name, "wall_s": s["wall_time_s"],
                   "steps_s": steps_s, "fixed_s": s["wall_time_s"] - steps_s,
                   "tokens_per_s": s["tokens_per_s"], "hits": s.get("compile_cache_hits"),
                   "misses": s.get("compile_misses")})
  return {"logs": logs, "rows": rows, "wall_s": wall}


def summarize(turns: list[dict]) -> dict:
  """Per version: its runs, fixed costs, cache hits and tokens/s; paired after/before.

  Per run, from its summary.json: the steps' time tokens_seen / tokens_per_s (the loop's own
  clock) and the fixed cost = wall_time_s - steps' time (data, compiles, restore, evaluations,
  checkpoint, figure); the paired ratios pair run i of one turn with run i of the neighbouring
  turn of the other version. The projection takes the before version's committed clean record
  (`--record`, by default the `--before` checkout's results/cpu: reproduction.json and each
  run_info.json; it must be the before code's) with each training experiment's runs' fixed cost
  rescaled from the measured before to after, their steps' time by the tokens/s ratio, and the
  runs one experiment repeats of another's (finals.csv) left out when after reuses runs;
  benchmarks keep their time.
  """
  rows = [r for t in turns for r in t["rows"]]
  firsts = [t["rows"][0] for t in turns]
  later = [r for t in turns for r in t["rows"][1:]]
  cached = [r for r in later if r["hits"] is not None]
  hits = sum(r["hits"] for r in cached)
  return {
      "turns": len(turns),
      "runs_trained": len(rows) / len(turns),
      "runs_reused": sum(len(t["logs"][e]["reused"]) for t in turns for e in t["logs"])
      / len(turns),
      "fixed_s_first_run": summary([r["fixed_s"] for r in firsts]),
      "fixed_s_later_runs": summary([r["fixed_s"] for r in later]),
      "cache_hits_later_runs": hits if cached else None,
      "cache_misses_later_runs": sum(r["misses"] for r in cached) if cached else None,
      "cache_hit_share_later_runs": (hits / max(hits + sum(r["misses"] for r in cached), 1)
                                     if cached else None),
      "tokens_per_s": summary([r["tokens_per_s"] for r in rows]),
      "sweep_wall_s": summary([t["wall_s"] for t in turns]),
      "failed": [f for t in turns for e in t["logs"] for f in t["logs"][e]["failed"]],
  }


def at_floor(results: Path, turns: dict, floors: list[dict], fixed_before: float) -> dict:
  """The floor (module docstring) against each round's before and after tokens/s, the
  step speed-up a 2x projection needs, and the projection with every step at the floor.

  The floor: every forward and backward matmul of the preset's model and nothing else
  (`matmul_skeleton`, its gradient's dot FLOPs equal to the model's, tested; else
  "unsupported"), jitted by XLA in chunks of c examples scanned and summed (the fastest c
  kept), timed in a fresh process after each round, beside XLA's rate on one 2048³ matmul.
  An exact step does these matmuls and more, so `projection_at_floor` (no fixed cost, runs
  reused, every step at the floor's tokens/s) bounds what a faster step can project;
  `steps_speedup_for_2x` is what 2x would need and `two_x_at_floor` reads the rounds' floor /
  before ratios against it (`two_x_reading`). The projections keep each experiment's packing
  of its runs on the record's jobs (wall / compute): a lone job still has both cores' XLA
  threads, so no bound is drawn from that ratio.
  """
  import statistics

  tps = lambda v, r: statistics.median(x["tokens_per_s"] for x in turns[v][r]["rows"])
  rounds = range(len(floors))
  ratios = {v: [floors[r]["tokens_per_s"] / tps(v, r) for r in rounds] for v in turns}
  over = {v: summary(x) for v, x in ratios.items()}
  lo, hi = 1.0, 100.0  # bisect the steps' speed-up whose projection is 2x
  for _ in range(40):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if project(results, fixed_s=(fixed_before, 0.0), speed=mid,
                                  reuses=True)["speedup"] < 2 else (lo, mid)
  at = project(results, fixed_s=(fixed_before, 0.0), speed=over["before"]["median"],
               reuses=True)
  last = floors[-1]
  return {"floor": {"tokens_per_s": summary([f["tokens_per_s"] for f in floors]),
                    **{k: last[k] for k in ("chunk", "by_chunk", "dot_flops_per_step")},
                    "flops_per_s": summary([f["flops_per_s"] for f in floors]),
                    "square_matmul_flops_per_s": summary(
                        [f["square_matmul_flops_per_s"] for f in floors]),
                    "over_before_tokens_per_s": over["before"],
                    "over_after_tokens_per_s": over["after"]},
          "steps_speedup_for_2x": round(hi, 3),
          "projection_at_floor": {k: v for k, v in at.items() if k != "experiments"},
          "two_x_at_floor": two_x_reading(ratios["before"], hi)}


def two_x_reading(ratios: list[float], need: float) -> str:
  """The rounds' floor / before tokens/s against the steps' speed-up a 2x projection needs,
  by `pergrad.bounds.location` (its 90 % interval): "unreachable" (the upper end under
  need), "reachable" (the lower end over it), else "undetermined: ..."."""
  return {"holds": "unreachable", "fails": "reachable"}.get(
      location(ratios, need).verdict, "undetermined: the floor's rounds' interval holds the "
      "speed-up 2x needs")


def checkout_name(path: Path) -> str:
  """A checkout as the JSON names it: its commit, never its machine path."""
  rev = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
                       capture_output=True, text=True).stdout.strip()
  return f"<checkout of {rev}>" if rev else "<a checkout outside git>"


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--before", type=Path,
                 help="a checkout of the code to compare against (e.g. main); required but "
                      "with --floor-only")
  p.add_argument("--experiment", default="preconditioner",
                 help="the experiment config of the sweep (configs/experiment/)")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")],
                 default=[0.003, 0.01, 0.03])
  p.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1])
  p.add_argument("--rounds", type=int, default=1, help="turns of each version")
  p.add_argument("--record", type=Path, default=None,
                 help="results/cpu of the before code's end-to-end run (default: the --before "
                      "checkout's)")
  p.add_argument("--floor-only", action="store_true",
                 help="print the floor of the experiment's cpu-preset step and exit (what "
                      "each round runs in a fresh process)")
  args = p.parse_args(argv)
  if args.floor_only:
    from pergrad.config import build_plan, compose

    out = matmul_floor(build_plan(compose([f"experiment={args.experiment}", "scale=cpu"])))
    print("BENCH_FLOOR " + json.dumps(out))
    return out
  if args.before is None:
    p.error("--before is required: a checkout of the code to compare against")
  results = (args.record or args.before / "results" / "cpu").resolve()
  if not (results / "reproduction.json").exists():  # before any run
    p.error(f"{results} holds no reproduction.json: the projection rescales the before code's "
            "own end-to-end run; pass --record <its results/cpu>")
  versions = {"before": args.before.resolve(), "after": REPO}
  turns, floors = {v: [] for v in versions}, []
  with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
    for r in range(args.rounds):
      order = list(versions) if r % 2 == 0 else list(versions)[::-1]
      for v in order:
        turns[v].append(turn(versions[v], args, Path(tmp) / f"{v}{r}"))
      floors.append(floor_in_process(args.experiment))
  stats = {v: summarize(t) for v, t in turns.items()}
  later = lambda v: [x["fixed_s"] for t in turns[v] for x in t["rows"][1:]]
  n = min(len(later("before")), len(later("after")))
  ratio = summary(paired_ratios(later("after")[:n], later("before")[:n]))
  reuses = stats["after"]["runs_reused"] > 0
  tps = lambda v: [x["tokens_per_s"] for t in turns[v] for x in t["rows"]]
  m = min(len(tps("before")), len(tps("after")))
  speed = summary(paired_ratios(tps("after")[:m], tps("before")[:m]))
  fixed = (stats["before"]["fixed_s_later_runs"]["median"],
           stats["after"]["fixed_s_later_runs"]["median"])
  out = {"benchmark": "bench_sweep", "machine": "2 CPU cores, shared", "versions":
         {k: checkout_name(v) for k, v in versions.items()},
         "sweep": {"experiment": args.experiment, "preset": "cpu", "steps": args.steps,
                   "lrs": args.lrs, "seeds": args.seeds, "second_experiment":
                   "the grid's middle lr, every seed"},
         **stats,
         "fixed_cost_ratio_later_runs": ratio,
         "tokens_per_s_ratio": speed,
         # the steps as measured, and as fast as before (the same step: read this one
         # when the ratio above is contention, not code)
         "projection": project(results, fixed_s=fixed, speed=speed["median"], reuses=reuses),
         "projection_same_step_speed": {k: v for k, v in project(
             results, fixed_s=fixed, reuses=reuses).items() if k != "experiments"},
         **at_floor(results, turns, floors, fixed[0])}
  print(json.dumps(out, indent=1))
  return out


if __name__ == "__main__":
  main()
