"""Batch-size schedules: the sizes they choose, the learning rate indexed by examples,
the example stream, their config errors, and one scheduled run end to end (the SIGKILL
resume of a GNS-guided run is in test_train.py)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import compose

from pergrad.config import build_plan
from pergrad.config.batch import BatchConfig, BatchSchedule, default_sizes, resolve
from pergrad.config.schema import TrainSpec
from pergrad.optim.schedule import (
  ScheduleConfig,
  by_examples,
  decay_steps,
  make_schedule,
  scale_by_token_schedule,
)
from pergrad.train.batch_schedule import next_batch_size
from pergrad.train.loop import run
from pergrad.train.metrics import read_records


def _never():
  raise AssertionError("a fixed or linear schedule must not read the tracker")


def test_fixed_and_linear_sizes():
  fixed = BatchSchedule(sizes=(32,), start=32)
  assert [next_batch_size(fixed, k, 32 * k, 32, _never) for k in range(3)] == [32, 32, 32]
  lin = BatchSchedule(kind="linear", sizes=(4, 8, 16, 32), start=4, ramp_examples=280)
  # target = 4 + 28 * min(seen / 280, 1), rounded down to an allowed size
  for seen, want in [(0, 4), (39, 4), (40, 8), (119, 8), (120, 16), (279, 16), (280, 32),
                     (10_000, 32)]:
    assert next_batch_size(lin, 0, seen, 0, _never) == want, seen
  assert default_sizes(8, 64) == (8, 16, 32, 64) and default_sizes(8, 48) == (8, 16, 32, 48)


def test_gns_sizes_follow_b_simple_rounded_down_never_decreasing():
  s = BatchSchedule(kind="gns", sizes=(8, 16, 32, 64), start=8, gns_factor=2.0, every=10)
  read = iter([3.0, 9.0, 5.0, float("nan"), -4.0, 100.0]).__next__
  assert next_batch_size(s, 0, 0, 0, _never) == 8  # the first update
  assert next_batch_size(s, 7, 56, 8, _never) == 8  # between decisions: no read
  got, current = [], 8
  for k in (10, 20, 30, 40, 50, 60):
    current = next_batch_size(s, k, 0, current, read)
    got.append(current)
  # 2·3 = 6 -> 8 (the smallest); 18 -> 16; 10 -> 8 but never decreases; nan and < 0 keep B;
  # 200 -> 64 (the largest)
  assert got == [8, 16, 16, 16, 16, 64]


def test_token_schedule_equals_optax_for_a_fixed_batch():
  sched = make_schedule(ScheduleConfig(warmup_steps=5, final_lr_frac=0.1), 0.1, total_steps=50)
  mine, ref = scale_by_token_schedule(sched, 32), optax.scale_by_learning_rate(sched)
  u = {"w": jnp.linspace(-1.0, 1.0, 7)}
  s_mine, s_ref = mine.init(u), ref.init(u)
  assert s_mine == optax.EmptyState()  # stateless: the examples seen are the train state's
  for k in range(60):
    a, s_mine = mine.update(u, s_mine, examples_seen=jnp.int32(32 * k), batch_size=32)
    b, s_ref = ref.update(u, s_ref)
    np.testing.assert_array_equal(np.asarray(a["w"]), np.asarray(b["w"]))
  with pytest.raises(ValueError, match="examples_seen"):
    mine.update(u, s_mine, batch_size=32)


@pytest.mark.parametrize("scaling,kappa", [("none", 0.0), ("sqrt", 0.5), ("linear", 1.0)])
def test_token_schedule_follows_examples_seen_with_lr_scaling(scaling, kappa):
  sched = make_schedule(ScheduleConfig(warmup_steps=4, final_lr_frac=0.1), 0.1, total_steps=20)
  tx = scale_by_token_schedule(sched, 16, scaling)
  lr_of = by_examples(sched, 16, scaling)
  u = {"w": jnp.ones(3)}
  state, seen = tx.init(u), 0
  for B in (4, 4, 8, 8, 8, 16, 16, 4):
    out, state = jax.jit(lambda s, n, B=B: tx.update(u, s, examples_seen=n, batch_size=B))(
        state, jnp.int32(seen))
    # the NumPy reference of the schedule's formula at τ = seen / 16
    t = min(max((seen / 16 - 4) / 16, 0.0), 1.0)
    warm = min((seen / 16 + 1) / 4, 1.0)
    lr = 0.1 * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t))) * (B / 16) ** kappa
    np.testing.assert_allclose(np.asarray(out["w"]), -lr, rtol=2e-6)
    np.testing.assert_array_equal(np.asarray(out["w"]), -lr_of(jnp.int32(seen), B))
    seen += B


def test_evaluations_fall_at_the_same_examples_whatever_the_batch():
  spec = TrainSpec(steps=10, eval_every=4, checkpoint_every=5)
  max_batch_size = 8
  fixed = [k for k in range(1, 11)
           if spec.evals_at((k - 1) * max_batch_size, k * max_batch_size, max_batch_size)]
  assert fixed == [4, 8, 10]  # a fixed run: every 4 steps and the last
  seen, marks = 0, []
  for B in [2] * 8 + [4] * 6 + [8] * 8:  # 80 examples in total
    if spec.done(seen, max_batch_size):
      break
    if spec.evals_at(seen, seen + B, max_batch_size):
      marks.append(seen + B)
    seen += B
  assert marks == [32, 64, 80] and spec.done(seen, max_batch_size)


def test_example_stream_is_a_pure_function_of_the_example_index(tiny_overrides):
  from pergrad.data import make_data

  data = make_data(build_plan(compose(tiny_overrides)).data)  # byte tokens here
  whole = data.train_examples(5, 12)["inputs"]
  parts = [data.train_examples(5, 4), data.train_examples(9, 8)]
  np.testing.assert_array_equal(whole, np.concatenate([p["inputs"] for p in parts]))
  rows = data.train_examples(5, 12, part=(1, 3))["inputs"]  # process 1 of 3
  np.testing.assert_array_equal(rows, whole[4:8])
  B = data.batch_size
  np.testing.assert_array_equal(data.train_batch(3)["inputs"],
                                data.train_examples(3 * B, B)["inputs"])
  np.testing.assert_array_equal(whole[:, 1:], data.train_examples(5, 12)["targets"][:, :-1])


def test_example_positions_are_uniform():
  from pergrad.data.pipeline import example_positions

  n = 1000
  pos = example_positions(3, np.arange(200_000), n)
  assert pos.min() >= 0 and pos.max() < n
  counts = np.bincount(pos, minlength=n)
  # χ² of a uniform draw: mean n - 1, sd sqrt(2(n - 1)) ≈ 45
  chi2 = ((counts - 200.0) ** 2 / 200.0).sum()
  assert abs(chi2 - (n - 1)) < 5 * math.sqrt(2 * (n - 1)), chi2
  assert not np.array_equal(pos[:50], example_positions(4, np.arange(50), n))


@pytest.mark.parametrize("extra,match", [
    (("batch=gns",), r"stats.gns=true|stats.gns"),  # batch=gns turns the tracker on itself
    (("batch.kind=gns",), r"batch.kind=gns reads the tracked gradient noise scale; set "
                          r"stats.gns=true"),
    (("batch=linear",), r"batch.kind=linear needs batch.ramp_tokens > 0"),
    (("batch=linear", "batch.ramp_tokens=100", "batch.sizes=[2,4]"),
     r"batch.sizes=\[2, 4\] must end at data.batch_size=8"),
    (("batch=linear", "batch.ramp_tokens=100", "batch.sizes=[3,8]", "batch.start=3",
      "stats.microbatch_size=2", "stats=vmap"), r"batch.sizes holds 3, not divisible by "
                                                r"stats.microbatch_size=2"),
    (("batch=gns", "batch.gns_group=mlpp"), r"batch.gns_group=mlpp is not tracked"),
    (("batch=linear", "batch.ramp_tokens=100", "optimizer.lr_scaling=sqrt",
      "optimizer.sde_scaling=true"), r"optimizer.sde_scaling=true .* batch schedule"),
    (("batch.kind=seesaw",), r"batch.kind=seesaw doubles B where a step schedule .* "
                             r"set schedule=step"),
    (("batch=seesaw", "batch.start=2", "batch.sizes=[2,6,8]"), r"leave batch.sizes empty"),
    (("batch=seesaw", "batch.lr_scaling=linear"), r"lr_scaling=linear contradicts it"),
    (("schedule=step", "schedule.decay_steps=[5,3]"), r"schedule.decay_steps=\[5, 3\] must"),
])
def test_bad_batch_schedules_are_one_line_errors(tiny_overrides, extra, match):
  cfg = compose([*tiny_overrides, *extra])
  if extra == ("batch=gns",):  # the preset is valid
    assert build_plan(cfg).batch.kind == "gns"
    return
  with pytest.raises(ValueError, match=match) as e:
    build_plan(cfg)
  assert "\n" not in str(e.value)


@pytest.mark.extended
def test_linear_ramp_run(tmp_path, tiny_overrides):
  """Sizes follow the ramp, each record's lr is the schedule's at its examples seen, and
  evaluations come at multiples of eval_every x B_max examples, then the end."""
  cfg = compose([*tiny_overrides, "train.steps=12", "train.eval_every=4",
                 "train.checkpoint_every=0", "logging.log_every=1", "batch=linear",
                 "batch.start=2", "batch.ramp_tokens=1536", "batch.lr_scaling=sqrt"])
  plan = build_plan(cfg)
  summary = run(plan, tmp_path, echo=lambda s: None)
  recs = read_records(tmp_path / "metrics.jsonl")
  train = [r for r in recs if r["split"] == "train"]
  seen, T = 0, 32
  for r in train:
    B = plan.batch.floor(2 + 6 * min(seen / (1536 // T), 1.0))
    assert r["batch_size"] == B, (r, seen)
    lr = float(plan.optimizer.learning_rate(seen / 8)) * math.sqrt(B / 8)
    np.testing.assert_allclose(r["lr"], lr, rtol=1e-6)
    seen += B
    assert r["examples_seen"] == seen and r["tokens_seen"] == seen * T
  assert {r["batch_size"] for r in train} == {2, 4, 8}
  assert 96 <= seen < 96 + 8 and summary["examples_seen"] == seen
  evals = [r["examples_seen"] for r in recs if r["split"] == "eval"]
  assert evals[0] == 0 and [e // 32 for e in evals[1:-1]] == [1, 2] and evals[-1] == seen
  assert summary["final_eval_loss"] is not None and summary["last_step"] == len(train)


def test_step_schedule_equals_optax_piecewise_constant():
  """Without warmup, the step schedule is optax's piecewise-constant one with scale 1/2 at
  each point, also through the examples-indexed last link at a fixed batch."""
  cfg = ScheduleConfig(name="step", warmup_steps=0, decay_steps=(3, 7, 8))
  sched = make_schedule(cfg, 0.1, total_steps=12)
  ref = optax.piecewise_constant_schedule(0.1, {3: 0.5, 7: 0.5, 8: 0.5})
  mine, by_count = scale_by_token_schedule(sched, 16, exact_floor=True), \
      optax.scale_by_learning_rate(ref)
  u = {"w": jnp.linspace(-1.0, 1.0, 5)}
  st = by_count.init(u)
  for k in range(14):
    halvings = sum(k >= d for d in (3, 7, 8))
    assert float(sched(k)) == float(ref(k)) == np.float32(0.1 * 0.5**halvings)
    a, _ = mine.update(u, optax.EmptyState(), examples_seen=jnp.int32(16 * k), batch_size=16)
    b, st = by_count.update(u, st)
    np.testing.assert_array_equal(np.asarray(a["w"]), np.asarray(b["w"]))


def test_step_schedule_points_default_to_the_cosines_halvings():
  cfg = ScheduleConfig(name="step", warmup_steps=20, final_lr_frac=0.1)
  points = decay_steps(cfg, 400)
  cosine = make_schedule(ScheduleConfig(warmup_steps=20, final_lr_frac=0.1), 1.0,
                         total_steps=400)
  assert len(points) == 3  # 1/2, 1/4, 1/8 > 0.1 >= 1/16
  for i, d in enumerate(points, 1):  # the first step at which the cosine is <= 2^-i
    assert float(cosine(d)) <= 0.5**i + 1e-6 < float(cosine(d - 1))
  step = make_schedule(cfg, 1.0, total_steps=400)
  assert [float(step(k)) for k in (19, 20, points[0] - 1, points[0], 399)] == \
      [1.0, 1.0, 1.0, 0.5, 0.125]
  assert decay_steps(ScheduleConfig(name="step", decay_steps=(5,)), 400) == (5,)


def test_seesaw_doubles_b_and_scales_the_lr_by_one_over_sqrt2():
  """Points at 3, 5, 7 full steps of B_max = 8: B = 2 -> 4 at 24 examples -> 8 at 40, the
  lr x 1/√2 at each; at 56 B is capped, and the lr halves (the plain step decay)."""
  sched = resolve(BatchConfig(kind="seesaw", start=2), max_batch_size=8, seq_len=4, n_devices=1,
                  microbatch=None, gns_groups=None, decay_steps=(3, 5, 7))
  assert sched.sizes == (2, 4, 8) and sched.decay_examples == (24, 40, 56)
  assert sched.lr_scaling == "sqrt" and sched.lr_ref == 2
  step = make_schedule(ScheduleConfig(name="step", warmup_steps=0, decay_steps=(3, 5, 7)),
                       0.1, total_steps=10)
  lr_of = by_examples(step, 8, sched.lr_scaling, sched.lr_ref, exact_floor=True)
  seen, k, B, rows = 0, 0, 0, []
  while seen < 80:
    B = next_batch_size(sched, k, seen, B, _never)
    rows.append((seen, B, float(lr_of(jnp.int32(seen), B))))
    seen, k = seen + B, k + 1
  changes = [(s, B, lr) for i, (s, B, lr) in enumerate(rows) if i and B != rows[i - 1][1]]
  assert [(s, B) for s, B, _ in changes] == [(24, 4), (40, 8)]
  lr = {s: v for s, _, v in rows}
  assert lr[0] == pytest.approx(0.1, rel=1e-6)  # optimizer.lr at B = batch.start
  assert lr[24] / lr[22] == pytest.approx(2**-0.5, rel=1e-6)
  assert lr[40] / lr[36] == pytest.approx(2**-0.5, rel=1e-6)
  assert lr[56] / lr[48] == pytest.approx(0.5, rel=1e-6)  # capped: the plain halving
  assert len({v for s, _, v in rows if 24 <= s < 40}) == 1  # constant between points
  assert [B for s, B, _ in rows if s < 24] == [2] * 12


@pytest.mark.extended
def test_seesaw_run(tmp_path, tiny_overrides):
  """batch=seesaw end to end: B doubles at the schedule's points, each record's lr is the
  step schedule's at its examples seen times √(B / start), and the run completes."""
  cfg = compose([*tiny_overrides, "train.steps=8", "train.eval_every=4",
                 "train.checkpoint_every=0", "logging.log_every=1", "batch=seesaw",
                 "batch.start=2", "schedule.decay_steps=[2,4,6]"])
  plan = build_plan(cfg)
  summary = run(plan, tmp_path, echo=lambda s: None)
  train = [r for r in read_records(tmp_path / "metrics.jsonl") if r["split"] == "train"]
  seen = 0
  for r in train:
    B = min(2 * 2 ** sum(seen >= p for p in (16, 32, 48)), 8)
    assert r["batch_size"] == B, (r, seen)
    lr = float(plan.optimizer.learning_rate(seen / 8)) * math.sqrt(B / 2)
    np.testing.assert_allclose(r["lr"], lr, rtol=1e-6)
    seen += B
  assert [r["batch_size"] for r in train] == [2] * 8 + [4] * 4 + [8] * 4
  assert summary["status"] == "completed" and summary["examples_seen"] == seen == 64
