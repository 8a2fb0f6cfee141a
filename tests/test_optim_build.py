"""`build_optimizer` from configs: learning-rate scaling and schedules, every option, the
statistics each asks for, the errors of bad settings, and the Hydra YAMLs."""

from __future__ import annotations

import dataclasses
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_optim import (
  STEPS,
  B,
  T,
  _assert_close,
  _assert_equal,
  _optax_run,
  _params,
  _run,
  _samples,
  _shape_leaves,
  _stats,
  _track,
)

from pergrad.config import composer as config_lib
from pergrad.optim import build_optimizer, optimizer_config, scaled_hparams
from pergrad.optim.adam_family import VARIANTS, scale_by_adam_family
from pergrad.optim.configs import REGISTRY as OPTIMIZERS
from pergrad.optim.diagnostics import diagnostics
from pergrad.optim.schedule import ScheduleConfig
from pergrad.optim.sign import PLACEMENTS, scale_by_sign_placement
from pergrad.optim.snr import track_snr

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


# --- learning-rate scaling and schedules --------------------------------------


@pytest.mark.parametrize("scaling,ratio", [("sqrt", 2.0), ("linear", 4.0), ("none", 1.0)])
def test_lr_scaling_ratio_at_every_step(scaling, ratio):
  opt_cfg = optimizer_config(name="sgd", lr=0.1, lr_scaling=scaling, ref_batch_size=16)
  sched = ScheduleConfig(name="cosine", warmup_steps=5, final_lr_frac=0.1)
  small = build_optimizer(opt_cfg, sched, total_steps=30, batch_size=8)
  large = build_optimizer(opt_cfg, sched, total_steps=30, batch_size=32)
  steps = np.arange(30)
  lr_small = np.array([small.learning_rate(k) for k in steps])
  lr_large = np.array([large.learning_rate(k) for k in steps])
  assert np.all(lr_small > 0)
  np.testing.assert_allclose(lr_large / lr_small, ratio, rtol=1e-6)
  # Warmup rises to the peak, then the cosine decays to final_lr_frac * peak.
  peak = 0.1 * (8 / 16) ** {"sqrt": 0.5, "linear": 1.0, "none": 0.0}[scaling]
  np.testing.assert_allclose(lr_small[:5], peak * np.arange(1, 6) / 5, rtol=1e-6)
  assert np.all(np.diff(lr_small[5:]) < 0) and lr_small[-1] >= 0.1 * peak
  # The transformation applies the same schedule: SGD steps are -lr(k) * ḡ.
  samples = _samples(seed=9, n=B, steps=7)
  for opt, lrs, max_batch_size in ((small, lr_small, 8), (large, lr_large, 32)):
    got, _ = _run(opt.tx, samples, want=("mean",), max_batch_size=max_batch_size)
    want = [[-lrs[k] * g.astype(np.float64).mean(0) for g in leaves]
            for k, leaves in enumerate(samples)]
    _assert_close(got, want)


def test_sde_scaling():
  cfg = optimizer_config(name="adam", lr=1e-3, b1=0.9, b2=0.99, eps=1e-8, eps_root=1e-10,
                        lr_scaling="sqrt", sde_scaling=True, ref_batch_size=16)
  hp = scaled_hparams(cfg, batch_size=64)
  np.testing.assert_allclose([hp.lr, hp.b1, hp.b2, hp.eps, hp.eps_root],
                             [2e-3, 0.6, 0.96, 5e-9, 2.5e-11], rtol=1e-9)
  assert scaled_hparams(cfg, batch_size=16 * 20).b1 == 0.0  # 1 - b clipped at 1
  hp = scaled_hparams(cfg, batch_size=4)
  np.testing.assert_allclose([hp.b1, hp.b2, hp.eps], [0.975, 0.9975, 2e-8], rtol=1e-9)
  # The built transformation uses the scaled constants: equal to optax.adam with them.
  samples = _samples(seed=10, n=B)
  opt = build_optimizer(cfg, ScheduleConfig(name="constant", warmup_steps=0), total_steps=STEPS,
                        batch_size=64)
  ref = optax.adam(2e-3, b1=0.6, b2=0.96, eps=5e-9, eps_root=2.5e-11)
  _assert_close(_run(opt.tx, samples)[0], _optax_run(ref, samples), rtol=1e-6)
  with pytest.raises(ValueError, match="sde_scaling"):
    scaled_hparams(dataclasses.replace(cfg, lr_scaling="linear"), batch_size=64)


@pytest.mark.parametrize("name", ["adamw", "momentum", "sgd"])
@pytest.mark.parametrize("sched", [ScheduleConfig(name="constant", warmup_steps=0),
                                   ScheduleConfig(), ScheduleConfig(name="step")])
def test_the_chain_is_optax_own(name, sched):
  """adamw (clipped, weight decay), momentum (clipped) and sgd, their numbers held in the
  state (`pergrad.optim.hparams`), are optax's own adamw and sgd with the same schedule and
  their numbers injected too (float32 in the state): to the bit where the schedule is a
  constant lr (optax's schedule of Python numbers lets XLA fold its constants, e.g. a
  division by W); with optax's Python constants, to float32 rounding (1 − β of a float32 β
  vs of a Python float)."""
  kw = {"adamw": dict(b1=0.8, b2=0.9, eps=1e-6, weight_decay=0.1, clip_norm=0.05),
        "momentum": dict(b1=0.8, clip_norm=0.05), "sgd": {}}[name]
  opt = build_optimizer(optimizer_config(name, lr=3e-2, **kw), sched, total_steps=STEPS,
                        batch_size=B)
  lr, clip = opt.learning_rate, kw.pop("clip_norm", None)
  if name == "adamw":
    own = lambda inject: inject(optax.adamw)(lr, **kw)
  else:
    own = lambda inject: inject(optax.sgd)(lr, momentum=kw.get("b1"))
  refs = [own(optax.inject_hyperparams), own(lambda f: f)]
  if clip is not None:
    refs = [optax.chain(optax.clip_by_global_norm(clip), ref) for ref in refs]
  samples = _samples(seed=13, n=B, steps=STEPS)
  got = _run(opt.tx, samples, want=("mean",))[0]
  if sched.warmup_steps == 0:  # else XLA may fold the schedule's constants (lr/W) in refs
    _assert_equal(got, _optax_run(refs[0], samples))
  _assert_close(got, _optax_run(refs[1], samples), rtol=1e-5, atol=1e-9)


# --- build_optimizer over every option ------------------------------------------


def _all_options():
  opts = [optimizer_config(name=n) for n in OPTIMIZERS.names() if n not in ("sign", "adam_family")]
  opts += [optimizer_config(name="sign", placement=p, lr=1e-3) for p in PLACEMENTS]
  opts += [optimizer_config(name="adam_family", variant=v, mix_b=0.5) for v in VARIANTS]
  opts += [optimizer_config(name="adam_family", variant="micro_adam", clip_norm=1.0,
                           per_example_clip=2.0, weight_decay=0.1, lr_scaling="sqrt",
                           sde_scaling=True),
           optimizer_config(name="sign", placement="example", clip_norm=1.0, weight_decay=0.1,
                           lr_scaling="linear")]
  return opts


@pytest.mark.parametrize("track", [False, pytest.param(True, marks=pytest.mark.extended)])
def test_build_optimizer_every_option(track):
  params = _params()
  params["c"] = params["c"].astype(jnp.bfloat16)  # statistics f32, a param bf16
  scheds = (ScheduleConfig(), ScheduleConfig(name="constant", warmup_steps=0))
  for i, cfg in enumerate(_all_options()):
    for sched in scheds[i % 2:i % 2 + 1]:  # both schedules, alternately (compile time)
      opt = build_optimizer(cfg, sched, total_steps=STEPS, batch_size=B, track_snr=track)
      req = opt.request
      n = B * T if req.granularity == "token" else B
      assert ("sq" in req.want) == (track or (cfg.name == "adam_family"
                                              and cfg.variant != "adam"))
      assert req.per_example_clip == cfg.per_example_clip
      (updates, *_), state = _run(opt.tx, _samples(seed=11, n=n, steps=2), req.granularity,
                                  req.want, params)
      snr = (_track(opt.snr, _samples(seed=11, n=n, steps=2), req.want, opt.hparams)
             if track else None)
      assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state)
                 if jnp.issubdtype(x.dtype, jnp.floating)), cfg
      for u, shape in zip(updates, _shape_leaves(), strict=True):
        assert u.shape == shape and np.all(np.isfinite(u)) and np.any(u != 0), cfg
      lrs = np.array([opt.learning_rate(k) for k in range(STEPS)])
      assert np.all(lrs > 0) and np.all(np.isfinite(lrs))
      stats = _stats(_samples(seed=12, n=n, steps=1)[0], req.granularity, req.want)
      diag = jax.jit(diagnostics)(stats, opt.moments(state), snr)
      assert ("opt/all/snr2_ema" in diag) == track
      assert all(np.isfinite(v) for v in diag.values())


def test_request_per_option():
  build = lambda **kw: build_optimizer(optimizer_config(**kw), ScheduleConfig(),
                                       total_steps=STEPS, batch_size=B).request
  assert build(name="sign", placement="example").want == ("mean", "sign")
  assert build(name="sign", placement="token").granularity == "token"
  assert build(name="sign", placement="ema").want == ("mean",)
  assert build(name="adam_family", variant="micro_adam_var").want == ("mean", "sq")
  assert build(name="adamw").want == ("mean",)


# --- errors -----------------------------------------------------------------------


def test_missing_statistic_gives_clear_error():
  samples = _samples(seed=13, n=B, steps=1)
  with pytest.raises(ValueError, match="needs the 'sq' statistic"):
    _run(scale_by_adam_family("micro_adam"), samples, want=("mean", "sign"))
  with pytest.raises(ValueError, match="needs the 'sign' statistic"):
    _run(scale_by_sign_placement("example", 0.9), samples, want=("mean", "sq"))
  with pytest.raises(ValueError, match="needs token-level statistics"):
    _run(scale_by_sign_placement("token", 0.9), samples, "example")
  tx = scale_by_sign_placement("example", 0.9)
  with pytest.raises(ValueError, match="grad_stats=stats"):
    tx.update(_params(), tx.init(_params()), _params())
  with pytest.raises(ValueError, match="needs the 'sq' statistic"):
    _track(track_snr(0.9), samples, want=("mean",))


@pytest.mark.parametrize("kw,match", [
    (dict(name="sign", placement="diagonal"), "placement"),
    (dict(name="adam_family", variant="adam2"), "variant"),
    (dict(name="lion"), "unknown optimizer"),
    (dict(name="sign", b1=1.0), r"b1=1.0 is outside \[0, 1\)"),
    (dict(name="adam", b2=-0.1), "b2"),
    (dict(name="adam", eps=-1e-8), "eps"),
    (dict(name="adam_family", variant="mix", mix_a=0.0, mix_b=0.0), "mix_a"),
    (dict(name="sgd", lr_scaling="cubic"), "lr_scaling"),
    (dict(name="adam", sde_scaling=True), "sde_scaling"),
    (dict(name="sign", placement="token", per_example_clip=1.0), "per_example_clip"),
    (dict(name="adamw", clip_norm=0.0), "clip_norm"),
])
def test_bad_settings_raise_before_compute(kw, match):
  with pytest.raises(ValueError, match=match):
    build_optimizer(optimizer_config(**kw), ScheduleConfig(), total_steps=STEPS, batch_size=B)


def test_bad_schedule_raises():
  with pytest.raises(ValueError, match="warmup_steps"):
    build_optimizer(optimizer_config(), ScheduleConfig(warmup_steps=-1), total_steps=10,
                    batch_size=B)
  with pytest.raises(ValueError, match="total_steps"):
    build_optimizer(optimizer_config(), ScheduleConfig(), total_steps=0, batch_size=B)
  # A run shorter than its warmup ends during the warmup (smoke tests).
  short = build_optimizer(optimizer_config(lr=1.0), ScheduleConfig(warmup_steps=20),
                          total_steps=5, batch_size=B)
  np.testing.assert_allclose([short.learning_rate(k) for k in range(5)],
                             np.arange(1, 6) / 20, rtol=1e-6)
  with pytest.raises(ValueError, match="schedule.name=linear is unknown"):
    build_optimizer(optimizer_config(), ScheduleConfig(name="linear"), total_steps=10,
                    batch_size=B)


def test_clipped_noise_scale_seed_and_resume():
  """DP-SGD noise: std σ·C/B at the update's own B (a batch schedule's, not B_max),
  stateless, keyed by (seed, examples_seen): the same after a resume, new per update."""
  from pergrad.optim.dp_noise import add_clipped_noise
  sigma, clip, max_batch_size = 0.7, 2.0, 32
  zeros = {"w": jnp.zeros((256, 256)), "b": jnp.zeros((256,))}
  tx = add_clipped_noise(sigma, clip, max_batch_size, seed=3)
  state = tx.init(zeros)
  assert state == optax.EmptyState()
  noise = lambda seen, bs, t=tx: t.update(zeros, state, examples_seen=seen, batch_size=bs)[0]
  for bs in (8, 32, None):
    std = float(np.std(np.asarray(noise(64, bs)["w"])))
    want = sigma * clip / (max_batch_size if bs is None else bs)
    assert abs(std / want - 1) < 0.02, (bs, std, want)
  first = noise(64, 8)
  np.testing.assert_array_equal(first["w"], noise(64, 8)["w"])  # resume: same draw
  assert not np.allclose(first["w"], noise(72, 8)["w"])  # next update: new draw
  other = add_clipped_noise(sigma, clip, max_batch_size, seed=4)
  assert not np.allclose(first["w"], noise(64, 8, other)["w"])  # seed: new draw
  assert not np.allclose(first["w"][0], first["b"])  # leaves draw apart


# --- Hydra configs ---------------------------------------------------------------------


def test_yaml_options_compose_and_build(tmp_path):
  from hydra import compose, initialize_config_dir
  from omegaconf import OmegaConf

  config_lib.register()
  for group in ("optimizer", "schedule"):
    shutil.copytree(CONFIGS / group, tmp_path / group)
  (tmp_path / "probe.yaml").write_text(
      "defaults:\n  - pergrad_schema\n  - optimizer: adamw\n  - schedule: cosine\n  - _self_\n")
  names = sorted(p.stem for p in (CONFIGS / "optimizer").glob("*.yaml"))
  assert set(names) == set(OPTIMIZERS.names())
  with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
    for name in names:
      for sched in ("cosine", "constant", "step"):
        cfg = compose("probe", overrides=[f"optimizer={name}", f"schedule={sched}"])
        obj = OmegaConf.to_object(cfg)
        assert obj.optimizer.name == name and obj.schedule.name == sched
        assert isinstance(obj.optimizer.lr, float)
        build_optimizer(obj.optimizer, obj.schedule, total_steps=100, batch_size=32)
        build_optimizer(cfg.optimizer, cfg.schedule, total_steps=100, batch_size=32)
    sign = compose("probe", overrides=["optimizer=sign"]).optimizer
    adam = compose("probe", overrides=["optimizer=adam"]).optimizer
    assert sign.lr < adam.lr / 5
