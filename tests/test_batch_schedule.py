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
from pergrad.config.batch import BatchSchedule, default_sizes
from pergrad.config.schema import TrainSpec
from pergrad.optim.schedule import (
  ScheduleConfig,
  make_schedule,
  scale_by_token_schedule,
  token_lr,
)
from pergrad.train.batch_schedule import next_size
from pergrad.train.loop import run
from pergrad.train.metrics import read_records


def _never():
  raise AssertionError("a fixed or linear schedule must not read the tracker")


def test_fixed_and_linear_sizes():
  fixed = BatchSchedule(sizes=(32,), start=32)
  assert [next_size(fixed, k, 32 * k, 32, _never) for k in range(3)] == [32, 32, 32]
  lin = BatchSchedule(kind="linear", sizes=(4, 8, 16, 32), start=4, ramp_examples=280)
  # target = 4 + 28 * min(seen / 280, 1), rounded down to an allowed size
  for seen, want in [(0, 4), (39, 4), (40, 8), (119, 8), (120, 16), (279, 16), (280, 32),
                     (10_000, 32)]:
    assert next_size(lin, 0, seen, 0, _never) == want, seen
  assert default_sizes(8, 64) == (8, 16, 32, 64) and default_sizes(8, 48) == (8, 16, 32, 48)


def test_gns_sizes_follow_b_simple_rounded_down_never_decreasing():
  s = BatchSchedule(kind="gns", sizes=(8, 16, 32, 64), start=8, gns_factor=2.0, every=10)
  read = iter([3.0, 9.0, 5.0, float("nan"), -4.0, 100.0]).__next__
  assert next_size(s, 0, 0, 0, _never) == 8  # the first update
  assert next_size(s, 7, 56, 8, _never) == 8  # between decisions: no read
  got, current = [], 8
  for k in (10, 20, 30, 40, 50, 60):
    current = next_size(s, k, 0, current, read)
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
  lr_of = token_lr(sched, 16, scaling)
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
  unit = 8
  fixed = [k for k in range(1, 11) if spec.evals_at((k - 1) * unit, k * unit, unit)]
  assert fixed == [4, 8, 10]  # a fixed run: every 4 steps and the last
  seen, marks = 0, []
  for B in [2] * 8 + [4] * 6 + [8] * 8:  # 80 examples in total
    if spec.done(seen, unit):
      break
    if spec.evals_at(seen, seen + B, unit):
      marks.append(seen + B)
    seen += B
  assert marks == [32, 64, 80] and spec.done(seen, unit)


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
])
def test_bad_batch_schedules_are_one_line_errors(tiny_overrides, extra, match):
  cfg = compose([*tiny_overrides, *extra])
  if extra == ("batch=gns",):  # the preset is valid
    assert build_plan(cfg).batch.kind == "gns"
    return
  with pytest.raises(ValueError, match=match) as e:
    build_plan(cfg)
  assert "\n" not in str(e.value)


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
