"""The statistics benchmark's statistics on constructed timings (nothing is timed here):
paired per-rep ratios and their location, the fastest-baseline choice, the checks; and
that the plain-step candidates compute one gradient."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pergrad.bench import baselines, paired, stats
from pergrad.loss import make_loss_fn
from pergrad.model import Transformer, init_params


def test_paired_ratios_and_their_summary():
  r = paired.paired_ratios([1.1, 2.2, 0.9, 1.2, 1.0], [1.0, 2.0, 1.0, 1.0, 1.0])
  assert np.allclose(r, [1.1, 1.1, 0.9, 1.2, 1.0])
  q = paired.summary(r)
  assert np.isclose(q["median"], 1.1) and q["n"] == 5
  assert np.isclose(q["location"], np.exp(np.mean(np.log(r))))
  assert q["lo"] < q["location"] < q["hi"]
  # A slow rep of both sides (contention) cancels in the pair (the second rep).
  with pytest.raises(ValueError, match="one baseline time per rep"):
    paired.paired_ratios([1.0, 1.0], [1.0])


def test_fastest_baseline_by_median_over_reps():
  times = {"value_and_grad": [0.10, 0.10, 0.30], "contraction": [0.08, 0.12, 0.09],
           "surgery": [0.05, 0.20, 0.20]}  # one fast outlier does not win
  assert paired.fastest(times) == "contraction"
  assert paired.fastest({"a": [1.0], "b": [1.0]}) == "a"  # ties: the first
  with pytest.raises(ValueError, match="no baseline candidate"):
    paired.fastest({})


def test_bracketed_baseline_times():
  # B V B V B: a slow stretch over the second variant rep slows its neighbours too.
  assert paired.bracketed([1.0, 1.0, 2.0]) == [1.0, 1.5]
  assert np.allclose(paired.paired_ratios([1.0, 1.8], paired.bracketed([1.0, 1.0, 2.0])),
                     [1.0, 1.2])
  with pytest.raises(ValueError, match="n \\+ 1 >= 2"):
    paired.bracketed([1.0])


def _out(**leaves):
  return (0.0, types.SimpleNamespace(sum={k: np.asarray(v, np.float32) for k, v in leaves.items()}))


def test_choose_baseline_checks_gradients_and_dedupes_programs():
  cands = [dict(name="value_and_grad", compiled="P"), dict(name="surgery", compiled="P"),
           dict(name="contraction", compiled="Q")]
  outs = {"value_and_grad": _out(w=[1.0, 2.0]), "surgery": _out(w=[1.0, 2.0]),
          "contraction": _out(w=[1.0, 2.00001])}
  timed = baselines.choose_baseline(cands, outs, 1e-4, key=lambda c: c)
  assert [c["name"] for c in timed] == ["value_and_grad", "contraction"]
  assert cands[1]["same_program_as"] == "value_and_grad"
  outs["contraction"] = _out(w=[1.0, 2.1])
  with pytest.raises(ValueError, match="'contraction' computes another gradient"):
    baselines.choose_baseline(cands, outs, 1e-4, key=lambda c: c)


def _row(backend, stats_, gran="example", flops=1.0, reps=(1.0, 1.0, 1.0), peak=1.0, **kw):
  return dict(preset="tiny", B=8, backend=backend, granularity=gran, stats=stats_,
              flops_ratio=flops, time_ratios=list(reps), time_ratio=float(np.median(reps)),
              peak_ratio=peak, mem_ratio=1.0, time_vs_micro_grad=None, **kw)


def test_checks_flops_exact_time_on_the_location():
  rows = [_row("surgery", "norms", flops=1.02, reps=(0.98, 1.02, 1.06)),
          _row("surgery", "norms@norm", flops=1.001, reps=(1.02, 1.03, 1.04)),
          _row("surgery", "sq+sign", "token", flops=1.3, reps=(1.25, 1.3, 1.35), peak=1.05)]
  got = {(c["check"], c["where"].split()[-1]): c for c in stats.checks(rows)}
  norms = "tiny B=8 surgery/example/norms".split()[-1]
  f = got[("all-layer per-example norms: flops_ratio <= 1.05", norms)]
  t = got[("all-layer per-example norms: time_ratio <= 1.03", norms)]
  assert f["outcome"] == "holds" and f["ok"] is True
  assert t["outcome"] == "undetermined" and t["ok"] is None  # its interval holds 1.03
  assert t["lo"] < 1.03 < t["hi"] and t["median"] == 1.02 and t["bound"] == 1.03
  only = got[("normalization-layer norms only: time_ratio <= 1.01", "surgery/example/norms@norm")]
  assert only["outcome"] == "fails" and only["ok"] is False and only["lo"] > 1.01
  tok = got[("surgery time_ratio <= 1.15 * flops_ratio", "surgery/token/sq+sign")]
  assert tok["outcome"] == "holds" and tok["value"] == 1.0  # time / FLOP ratio
  assert got[("surgery per-token peak_ratio <= 1.1", "surgery/token/sq+sign")]["ok"] is True
  # the fastest plain step timed against itself: no bound is tighter than its interval's end
  self_row = _row("contraction", "mean", reps=(0.9, 1.1, 1.0, 1.2, 0.95), candidate=True,
                  baseline="contraction")
  got = {c["check"]: c for c in stats.checks([self_row, rows[1]])}
  only = got["normalization-layer norms only: time_ratio <= 1.01"]
  assert only["bound"] > 1.1 and only["outcome"] == "holds"


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_plain_candidates_compute_one_gradient():
  spec, T = stats.PRESETS["micro"]
  params = init_params(spec, jax.random.key(0))
  loss_fn = make_loss_fn(Transformer(spec))
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, spec.vocab_size, (4, T)), jnp.int32)
           for k in ("inputs", "targets")}
  compiled = {n: jax.jit(f).lower(params, batch).compile()
              for n, f in baselines.candidates(loss_fn)}
  assert tuple(compiled) == baselines.NAMES
  outs = {n: c(params, batch) for n, c in compiled.items()}
  for n in baselines.NAMES:
    assert baselines.same_gradient(outs["value_and_grad"], outs[n]) == [], n
    assert np.isclose(float(outs[n][0]), float(outs["value_and_grad"][0]), rtol=1e-6)
  key = {n: baselines.program_key(c) for n, c in compiled.items()}
  assert key["surgery"] == key["value_and_grad"]  # no statistic asked: no layer is changed
  assert key["contraction"] != key["value_and_grad"]


def test_sweep_projection_from_a_record(tmp_path):
  """`pergrad.bench.sweep_cost` on a constructed record: per-run fixed costs and step
  speed rescale each training experiment, a repeated run (same final step and losses as an
  earlier experiment's) drops out when runs are reused, a benchmark keeps its time."""
  import json

  from pergrad.bench.sweep_cost import project, repeated_runs

  rec = {"wall_s": 400.0, "experiments": {"a": {"wall_s": 200.0}, "b": {"wall_s": 100.0},
                                          "bench": {"wall_s": 100.0}}}
  (tmp_path / "reproduction.json").write_text(json.dumps(rec))
  head = "run,status,final_step,final_eval_loss,final_train_loss\n"
  for name, n, compute, rows in (("a", 2, 400.0, ["x,completed,400,4.1,4.0",
                                                  "y,completed,400,4.2,4.1"]),
                                 ("b", 2, 200.0, ["z,completed,400,4.1,4.0",
                                                  "w,diverged,3,inf,inf"]),
                                 ("bench", 0, 0.0, [])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "run_info.json").write_text(
        json.dumps({"n_runs_completed": n, "runs_compute_s": compute}))
    if rows:
      (tmp_path / name / "finals.csv").write_text(head + "\n".join(rows) + "\n")
  assert repeated_runs(tmp_path, ["a", "b", "bench"]) == {"a": 0, "b": 1}
  same = project(tmp_path, fixed_s=(10.0, 10.0))
  assert same["projected_min"] == same["committed_experiments_min"] and same["speedup"] == 1
  p = project(tmp_path, fixed_s=(20.0, 5.0), speed=2.0, reuses=True)
  # a: ((400 - 2·20)/2 + 2·5) / 400 = 0.475 of its wall; b: ½ of ((200 - 40)/2 + 10) / 200
  assert p["experiments"]["a"]["projected_s"] == 200.0 * 0.475
  assert p["experiments"]["b"]["projected_s"] == 100.0 * 0.225
  assert p["experiments"]["bench"]["projected_s"] == 100.0
  assert p["repeated_runs"] == 1 and p["reuse_counted"]


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_versus_nanodo_reports_ours_and_its_controls():
  """`pergrad.bench.nanodo`: ours, the baseline against itself and the gradient alone,
  each as wall and CPU-time summaries of paired ratios (two reps of one step: the shape of
  the report, not a time bound)."""
  from conftest import TINY, compose

  from pergrad.bench.nanodo import versus_nanodo
  from pergrad.config import build_plan

  plan = build_plan(compose(["optimizer=adamw", *TINY, "stats.backend=value_and_grad",
                             "stats.log_every=0"]))
  out = versus_nanodo(plan, reps=2, steps_per_rep=1)
  assert out["backend"] == "value_and_grad" and out["nanodo_s"] > 0
  for q in (out["ratio"], out["cpu_ratio"], *out["self"].values(), *out["grad"].values()):
    assert q["n"] == 2 and 0 < q["lo"] <= q["location"] <= q["hi"] and q["median"] > 0


def _bench_sweep():
  """scripts/bench_sweep.py as a module."""
  import importlib.util
  from pathlib import Path

  path = Path(__file__).resolve().parents[1] / "scripts" / "bench_sweep.py"
  spec = importlib.util.spec_from_file_location("bench_sweep", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_bench_sweep_projects_the_before_codes_own_record(tmp_path, capsys):
  """scripts/bench_sweep.py rescales the before version's end-to-end record; a --before
  checkout without one is refused in one line before any turn (the committed record of this
  checkout was trained by the after code: rescaling it would count the speed-up twice)."""
  from pathlib import Path

  mod = _bench_sweep()
  path = Path(mod.__file__)
  with pytest.raises(SystemExit) as e:
    mod.main(["--before", str(tmp_path)])
  assert e.value.code == 2 and not any(tmp_path.iterdir())
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert "holds no reproduction.json" in err and "--record" in err
  name = mod.checkout_name(path.parents[1])
  assert name.startswith("<checkout of ") and str(path.parents[1]) not in name


@pytest.mark.parametrize("extra", [[], ["model.tie_embeddings=true", "model.positions=rope",
                                        "model.n_layers=2"]])
def test_bench_sweeps_floor_is_the_models_matmuls(extra):
  """bench_sweep's floor: the skeleton's gradient does exactly the model's matmuls (its dot
  FLOPs equal those of the model's loss gradient, the embedding's input gradient included),
  and matmul_floor times it in chunks that divide the batch, keeping the fastest."""
  import jax
  import jax.numpy as jnp
  from conftest import TINY, compose

  from pergrad.config import build_plan
  from pergrad.loss import make_loss_fn
  from pergrad.model import Transformer, init_params

  mod = _bench_sweep()
  plan = build_plan(compose([*TINY, *extra]))
  s, B, T = plan.model, 4, plan.data.seq_len
  loss_fn = make_loss_fn(Transformer(s))
  tok = jnp.zeros((B, T), jnp.int32)
  model = jax.make_jaxpr(jax.grad(lambda p: loss_fn(p, {"inputs": tok, "targets": tok}).mean()))(
      init_params(s, jax.random.PRNGKey(0), T))
  params, loss = mod.matmul_skeleton(s, T)
  skeleton = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(
      params, jnp.zeros((B, T, s.d_model)), jnp.zeros((B, T, s.vocab_size)))
  assert mod.dot_flops(model.jaxpr) == mod.dot_flops(skeleton.jaxpr) > 0
  floor = mod.matmul_floor(plan, reps=1)
  assert set(floor["by_chunk"]) == {8, 4, 2} and floor["chunk"] in floor["by_chunk"]
  assert floor["tokens_per_s"] == max(floor["by_chunk"].values()) > 0
  B, T = plan.data.batch_size, plan.data.seq_len  # dot FLOPs of B examples, chunks or not
  whole = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(
      params, jnp.zeros((B, T, s.d_model)), jnp.zeros((B, T, s.vocab_size)))
  assert floor["dot_flops_per_step"] == mod.dot_flops(whole.jaxpr)
  assert floor["flops_per_s"] > 0 and floor["square_matmul_flops_per_s"] > 0


def test_bench_sweeps_floor_refuses_a_model_it_does_not_mirror(monkeypatch):
  """A skeleton with fewer matmuls than the model (here: half its MLP width) would be no
  floor: matmul_floor refuses it in one line before timing anything."""
  import dataclasses

  from conftest import TINY, compose

  from pergrad.config import build_plan

  mod = _bench_sweep()
  real = mod.matmul_skeleton
  monkeypatch.setattr(mod, "matmul_skeleton", lambda spec, T: real(
      dataclasses.replace(spec, d_ff=spec.d_ff // 2), T))
  with pytest.raises(SystemExit) as e:
    mod.matmul_floor(build_plan(compose(TINY)), reps=1)
  assert str(e.value).startswith("unsupported: the floor's skeleton does")


def test_bench_sweeps_two_x_reading():
  """two_x_reading: the rounds' floor / before ratios judged by `pergrad.bounds.location`
  against the speed-up 2x needs (its error rates: tests/test_timing.py)."""
  mod = _bench_sweep()
  assert mod.two_x_reading([1.6, 1.7, 1.8], 1.93) == "unreachable"
  assert mod.two_x_reading([2.0, 2.1, 2.2], 1.93) == "reachable"
  assert mod.two_x_reading([1.8, 1.95, 2.1], 1.93).startswith("undetermined")
