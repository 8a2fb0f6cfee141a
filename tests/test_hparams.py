"""The optimizer's numbers held in its state (`pergrad.optim.hparams`): every optimizer
whose state holds another config's numbers (traced: the jitted init's argument) gives the
updates, learning rates and tracker states of the one built from that config; runs that
differ only in those numbers (lr, seed, steps, weight decay, ε, β's, warmup) lower to the
same program, which the persistent compilation cache serves."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compose
from test_optim import B, T, _assert_close, _params, _run, _samples, _stats, _track
from test_optim_build import _all_options

from pergrad.config import build_plan
from pergrad.optim import build_optimizer, optimizer_config
from pergrad.optim.adam_family import scale_by_adam_family
from pergrad.optim.hparams import numbers
from pergrad.optim.schedule import ScheduleConfig
from pergrad.train import compile_cache
from pergrad.train.loop import run
from pergrad.train.mesh import make_mesh
from pergrad.train.step import Steps

SCHEDULES = (ScheduleConfig(), ScheduleConfig(name="constant", warmup_steps=0),
             ScheduleConfig(name="step", warmup_steps=2, decay_steps=(2, 3)),
             ScheduleConfig(name="step", warmup_steps=0))


def _other(cfg, sched):
  """`cfg` and `sched` with other numbers, of the same structure (what a grid varies)."""
  change = {"lr": cfg.lr * 3}
  change.update({f: v for f, v in (("b1", 0.5), ("b2", 0.9), ("eps", 1e-3),
                                   ("eps_root", 1e-9)) if hasattr(cfg, f)})
  if cfg.weight_decay > 0:
    change["weight_decay"] = cfg.weight_decay / 2
  if cfg.clip_norm is not None:
    change["clip_norm"] = cfg.clip_norm * 2
  cosine = sched.name == "cosine"
  return (dataclasses.replace(cfg, **change),
          dataclasses.replace(sched, warmup_steps=sched.warmup_steps + 1,
                              final_lr_frac=0.3 if cosine else sched.final_lr_frac))


def _run_held(opt, hparams, samples, req):
  """`test_optim._run` of `opt` with its state holding `hparams` (arrays), given to the
  jitted init as an argument, as the train state's init does."""
  params = _params()
  state = jax.jit(opt.init)(params, hparams)
  update = jax.jit(lambda g, s, p, st, seen: opt.tx.update(
      g, s, p, grad_stats=st, examples_seen=seen, batch_size=B))
  out = []
  for k, leaves in enumerate(samples):
    stats = _stats(leaves, req.granularity, req.want)
    updates, state = update(stats.mean, state, params, stats, jnp.int32(k * B))
    out.append([np.asarray(u) for u in jax.tree.leaves(updates)])
  return out, state


MAIN = (0, 3, 6, 12, 13)  # DP noise; adamw, sign batch, mix, micro_adam clipped: 4 schedules


@pytest.mark.parametrize("i", [i if i in MAIN else pytest.param(i, marks=pytest.mark.extended)
                               for i in range(len(_all_options()))])
def test_held_numbers_give_the_optimizer_of_those_numbers(i):
  cfg = _all_options()[i]
  if i == 0:  # DP-SGD's noise, seeded by a held seed
    cfg = optimizer_config(name="sgd", per_example_clip=1.0, noise_multiplier=0.5)
  sched = SCHEDULES[i % len(SCHEDULES)]
  opt = build_optimizer(cfg, sched, total_steps=5, batch_size=B, track_snr=True, seed=3)
  other_cfg, other_sched = _other(cfg, sched)
  other = build_optimizer(other_cfg, other_sched, total_steps=7, batch_size=B,
                          track_snr=True, seed=5)
  assert other.hparams != opt.hparams
  req, hp = opt.request, other.hparams.as_arrays()
  samples = _samples(seed=4, n=B * T if req.granularity == "token" else B, steps=4)
  want, state_want = _run(other.tx, samples, req.granularity, req.want)
  got, state_got = _run_held(opt, hp, samples, req)
  _assert_close(got, want, rtol=2e-6, atol=1e-7)
  assert jax.tree.structure(state_got) == jax.tree.structure(state_want)
  for a, b in zip(jax.tree.leaves(state_got), jax.tree.leaves(state_want), strict=True):
    np.testing.assert_allclose(a, b, rtol=2e-6, atol=1e-7)
  state = jax.jit(opt.init)(_params(), hp)
  lr = jax.jit(lambda state, seen: opt.lr(state, seen, B))
  for k in range(7):
    np.testing.assert_allclose(lr(state, jnp.int32(k * B)), other.learning_rate(k), rtol=1e-6)
    np.testing.assert_allclose(other.lr(other.tx.init(_params()), jnp.int32(k * B), B),
                               other.learning_rate(k), rtol=1e-6)
  snr = jax.jit(lambda s, state: opt.snr.update(
      s, _stats(samples[0], req.granularity, req.want), numbers(state)))
  np.testing.assert_allclose(
      jax.tree.leaves(snr(opt.snr.init(_params()), state))[0],
      jax.tree.leaves(_track(other.snr, samples[:1], req.want, other.hparams))[0], rtol=1e-6)


def test_bad_numbers_are_refused_where_built_not_where_held():
  with pytest.raises(ValueError, match="total_steps=0"):
    build_optimizer(optimizer_config(), ScheduleConfig(), total_steps=0, batch_size=B)
  with pytest.raises(ValueError, match="eps"):
    scale_by_adam_family("adam", eps=-1.0)
  # A held number is a tracer in the compiled step: checked where built, not again.
  opt = build_optimizer(optimizer_config("adamw"), ScheduleConfig(), total_steps=5,
                        batch_size=B)
  state = jax.jit(opt.init)(_params(), opt.hparams._replace(eps=-1.0).as_arrays())
  assert float(numbers(state).eps) == -1.0
  jax.jit(lambda s: opt.tx.update(_params(), s, _params(), examples_seen=0))(state)


def _lowered(tiny, *overrides):
  plan = build_plan(compose([*tiny, "train.steps=12", *overrides]))
  steps = Steps(plan, make_mesh())
  max_batch_size = plan.batch.max_batch_size
  batch = {k: jax.ShapeDtypeStruct((max_batch_size, plan.data.seq_len), jnp.int32,
                                   sharding=steps.batch_sharding) for k in ("inputs", "targets")}
  init = steps.init_jit.lower(jnp.int32(0), steps.hparams).as_text()
  return tuple(fn.lower(steps.abstract_sharded_state(), batch).as_text()
               for fn in (steps.train_jit, steps.logged_jit)) + (init,)


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_runs_of_a_sweep_are_one_program(tiny_overrides):
  """lr, seed, steps, weight decay, ε, β's, warmup are held in the optimizer state: the
  same lowered train step, logging step (the diagnostics read ε, the SNR tracker β1) and
  init (so the same persistent-cache key)."""
  base = ("optimizer=adam_family", "optimizer.variant=micro_adam", "schedule.name=step",
          "optimizer.weight_decay=0.1", "stats.log_every=5", "stats.track_snr=true")
  other = ("optimizer.lr=0.3", "train.seed=7", "train.steps=40", "optimizer.weight_decay=0.01",
           "optimizer.eps=1e-3", "optimizer.b1=0.5", "optimizer.b2=0.9",
           "schedule.warmup_steps=7")
  assert _lowered(tiny_overrides, *base) == _lowered(tiny_overrides, *base, *other)


def test_second_run_of_a_grid_compiles_nothing(tiny_overrides, tmp_path):
  """Two runs of an lr grid in one process with train.compile_cache set: the second reads
  every program the first compiled from the cache (and JAX's settings come back after)."""
  cache = tmp_path / "cache"
  out = []
  for lr, seed in ((1e-2, 0), (3e-2, 1)):
    cfg = compose([*tiny_overrides, "train.steps=4", f"optimizer.lr={lr}", f"train.seed={seed}",
                   f"train.compile_cache={cache}"])
    plan = build_plan(cfg)
    out.append(run(plan, tmp_path / f"lr{lr}", echo=lambda _: None))
  assert jax.config.jax_compilation_cache_dir is None
  first, second = out
  assert first["compile_misses"] >= 2 and first["compile_cache_hits"] == 0, first
  assert second["compile_misses"] == 0, second
  assert second["compile_cache_hits"] == first["compile_misses"], (first, second)
  assert second["final_train_loss"] != first["final_train_loss"]
  assert json.loads((tmp_path / "lr0.03" / "summary.json").read_text())["compile_misses"] == 0


def test_compile_cache_setting(tmp_path):
  """null leaves JAX as it is; JAX's own directory wins over the run's; JAX's settings come
  back after the block."""
  with compile_cache.using(None) as d:
    assert d is None and jax.config.jax_compilation_cache_dir is None
  with compile_cache.using(str(tmp_path / "c")) as d:
    assert d == tmp_path / "c" and jax.config.jax_compilation_cache_dir == str(d)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_COMPILE_S
  assert jax.config.jax_compilation_cache_dir is None
  jax.config.update("jax_compilation_cache_dir", str(tmp_path / "own"))
  try:
    with compile_cache.using(str(tmp_path / "c")) as d:
      assert d == tmp_path / "own"
  finally:
    jax.config.update("jax_compilation_cache_dir", None)


def test_the_default_cache_gives_way_to_the_environment(tmp_path, monkeypatch):
  """PERGRAD_COMPILE_CACHE replaces the default directory (this suite sets it: no test
  writes to ~/.cache), never a directory the config sets."""
  from pergrad.config.schema import DEFAULT_COMPILE_CACHE, TrainSpec

  assert TrainSpec.__dataclass_fields__["compile_cache"].default == DEFAULT_COMPILE_CACHE
  monkeypatch.setenv("PERGRAD_COMPILE_CACHE", str(tmp_path / "env"))
  with compile_cache.using(DEFAULT_COMPILE_CACHE) as d:
    assert d == tmp_path / "env"
  with compile_cache.using(str(tmp_path / "set")) as d:
    assert d == tmp_path / "set"


def test_hparams_arrays_are_scalars():
  opt = build_optimizer(optimizer_config("adamw", clip_norm=1.0), ScheduleConfig(name="step"),
                        total_steps=50, batch_size=B, seed=5)
  hp = opt.hparams.as_arrays()
  assert hp.halvings.dtype == np.float32 and hp.halvings.ndim == 1 and len(hp.halvings) > 0
  assert hp.noise_seed.dtype == np.int32 and int(hp.noise_seed) == 5
  assert all(np.asarray(x).shape == () for f, x in hp._asdict().items() if f != "halvings")
  held = opt.tx.init(_params()).hyperparams  # what the state holds: every number, as arrays
  assert set(held) == set(hp._fields) and held["lr"].dtype == jnp.float32
  # No clipping and no halving points are structural: None, held by no array (Orbax saves
  # no array of size 0).
  plain = build_optimizer(optimizer_config("adamw"), ScheduleConfig(), total_steps=5,
                          batch_size=B)
  assert plain.hparams.as_arrays().clip_norm is None
  assert plain.hparams.as_arrays().halvings is None
  assert set(plain.tx.init(_params()).hyperparams) == set(hp._fields) - {"clip_norm",
                                                                         "halvings"}
