"""Parity tests of pergrad.optim against NumPy references and optax, on every leaf."""

from __future__ import annotations

import dataclasses
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pergrad import config as config_lib
from pergrad.optim import (
    PLACEMENTS,
    VARIANTS,
    ScheduleConfig,
    build_optimizer,
    diagnostics,
    optimizer_config,
    scale_by_adam_family,
    scale_by_sign_placement,
    scaled_hparams,
    second_moment_statistic,
    track_snr,
)
from pergrad.optim.configs import names as optimizer_names
from pergrad.stats.types import GradStats

SHAPES = {"a": (3,), "blk": {"kernel": (4, 5)}, "c": (2, 3, 2)}
B, T, STEPS = 6, 3, 10
CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def _shape_leaves():
  return jax.tree.leaves(SHAPES, is_leaf=lambda x: isinstance(x, tuple))


def _params():
  treedef = jax.tree.structure(SHAPES, is_leaf=lambda x: isinstance(x, tuple))
  return jax.tree.unflatten(treedef, [jnp.ones(s, jnp.float32) for s in _shape_leaves()])


def _samples(seed: int, n: int, steps: int = STEPS):
  """Per-sample gradients, a list over steps of lists over leaves of float32[n, *shape]."""
  rng = np.random.default_rng(seed)
  means = [rng.normal(size=s) for s in _shape_leaves()]  # fixed μ, SNRs of order 1
  return [[(mu + rng.normal(size=(n,) + mu.shape) * rng.uniform(0.5, 2.0)).astype(np.float32)
           for mu in means] for _ in range(steps)]


def _stats(leaves, granularity="example", want=("mean", "sq", "sign")):
  """GradStats built directly from per-sample gradients (the test's own engine)."""
  treedef = jax.tree.structure(SHAPES, is_leaf=lambda x: isinstance(x, tuple))
  tree = lambda f: jax.tree.unflatten(treedef, [jnp.asarray(f(g)) for g in leaves])
  return GradStats(
      count=jnp.float32(leaves[0].shape[0]),
      sum=tree(lambda g: g.sum(0)),
      sum_sq=tree(lambda g: (g.astype(np.float64)**2).sum(0).astype(np.float32))
      if "sq" in want else None,
      sum_sign=tree(lambda g: np.sign(g).sum(0)) if "sign" in want else None,
      granularity=granularity)


def _run(tx, samples, granularity="example", want=("mean", "sq", "sign"), params=None):
  """Runs tx for len(samples) steps; returns per-step updates as lists of leaves."""
  params = _params() if params is None else params
  state = tx.init(params)
  update = jax.jit(lambda g, s, p, st: tx.update(g, s, p, grad_stats=st))
  out = []
  for leaves in samples:
    stats = _stats(leaves, granularity, want)
    updates, state = update(stats.mean, state, params, stats)
    out.append([np.asarray(u) for u in jax.tree.leaves(updates)])
  return out, state


def _assert_close(got, want, rtol=1e-5, atol=1e-6):
  for step, (g_leaves, w_leaves) in enumerate(zip(got, want, strict=True)):
    assert len(g_leaves) == len(w_leaves) == len(_shape_leaves())
    for leaf, (g, w) in enumerate(zip(g_leaves, w_leaves, strict=True)):
      np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"step {step} leaf {leaf}")


def _assert_equal(got, want):
  for g_leaves, w_leaves in zip(got, want, strict=True):
    for g, w in zip(g_leaves, w_leaves, strict=True):
      np.testing.assert_array_equal(g, w)


def _optax_run(tx, samples):
  """Runs a plain optax transformation on the batch means."""
  params = _params()
  state = tx.init(params)
  out = []
  for leaves in samples:
    grads = _stats(leaves, want=("mean",)).mean
    updates, state = jax.jit(tx.update)(grads, state, params)
    out.append([np.asarray(u) for u in jax.tree.leaves(updates)])
  return out


# --- NumPy references ---------------------------------------------------------


def _ema(prev, x, beta):
  return beta * prev + (1 - beta) * x


def _sign_reference(samples, placement, beta):
  m = [np.zeros(g.shape[1:]) for g in samples[0]]
  out = []
  for t, leaves in enumerate(samples, start=1):
    step = []
    for i, g in enumerate(leaves):
      g = g.astype(np.float64)
      if placement in ("example", "token"):
        x = np.mean(np.sign(g), axis=0)
      elif placement == "batch":
        x = np.sign(g.mean(0))
      else:
        x = g.mean(0)
      m[i] = _ema(m[i], x, beta)
      step.append(np.sign(m[i]) if placement == "ema" else m[i] / (1 - beta**t))
    out.append(step)
  return out


def _second_moment_reference(g, variant, a=1.0, b=0.0):
  n = g.shape[0]
  mean = g.mean(0)
  var = np.var(g, axis=0, ddof=1) if n > 1 else np.zeros_like(mean)
  mu2 = mean**2 - var / n
  return {"adam": mean**2, "micro_adam": np.mean(g**2, axis=0), "micro_adam_var": var,
          "micro_adam_msq": np.maximum(mu2, 0), "mix": np.maximum(a * mu2 + b * var, 0)}[variant]


def _adam_reference(samples, variant, b1, b2, eps, eps_root, a=1.0, b=0.0):
  m = [np.zeros(g.shape[1:]) for g in samples[0]]
  v = [np.zeros(g.shape[1:]) for g in samples[0]]
  out = []
  for t, leaves in enumerate(samples, start=1):
    step = []
    for i, g in enumerate(leaves):
      g = g.astype(np.float64)
      m[i] = _ema(m[i], g.mean(0), b1)
      v[i] = _ema(v[i], _second_moment_reference(g, variant, a, b), b2)
      m_hat, v_hat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
      step.append(m_hat / (np.sqrt(v_hat + eps_root) + eps))
    out.append(step)
  return out


# --- sign family ----------------------------------------------------------------


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("beta", [0.0, 0.8])
def test_sign_placement_matches_numpy(placement, beta):
  n = B * T if placement == "token" else B
  samples = _samples(seed=1, n=n)
  granularity = "token" if placement == "token" else "example"
  got, _ = _run(scale_by_sign_placement(placement, beta), samples, granularity)
  _assert_close(got, _sign_reference(samples, placement, beta))


def test_sign_ema_equals_optax_signum():
  samples = _samples(seed=2, n=B)
  mine = optax.chain(scale_by_sign_placement("ema", 0.85), optax.scale_by_learning_rate(0.01))
  _assert_equal(_run(mine, samples)[0], _optax_run(optax.signum(0.01, beta=0.85), samples))
  opt = build_optimizer(optimizer_config(name="sign", placement="ema", b1=0.85, lr=0.01),
                        ScheduleConfig(name="constant", warmup_steps=0), total_steps=STEPS,
                        batch_size=B)
  _assert_equal(_run(opt.tx, samples)[0], _optax_run(optax.signum(0.01, beta=0.85), samples))


def test_sign_batch_beta0_equals_optax_sign_sgd():
  samples = _samples(seed=3, n=B)
  opt = build_optimizer(optimizer_config(name="sign", placement="batch", b1=0.0, lr=0.02),
                        ScheduleConfig(name="constant", warmup_steps=0), total_steps=STEPS,
                        batch_size=B)
  _assert_equal(_run(opt.tx, samples)[0], _optax_run(optax.sign_sgd(0.02), samples))


# --- Adam family ----------------------------------------------------------------

ADAM_KW = dict(b1=0.8, b2=0.9, eps=1e-6, eps_root=1e-9)


@pytest.mark.parametrize("variant,a,b", [(v, 1.0, 0.0) for v in VARIANTS if v != "mix"]
                         + [("mix", 0.7, 0.3), ("mix", 0.0, 2.0)])
def test_adam_family_matches_numpy(variant, a, b):
  samples = _samples(seed=4, n=B)
  tx = scale_by_adam_family(variant, mix_a=a, mix_b=b, **ADAM_KW)
  got, _ = _run(tx, samples)
  _assert_close(got, _adam_reference(samples, variant, a=a, b=b, **ADAM_KW), rtol=2e-5)


def test_adam_variant_equals_optax_adam_exactly():
  samples = _samples(seed=5, n=B)
  kw = dict(b1=0.8, b2=0.9, eps=1e-6)
  mine = optax.chain(scale_by_adam_family("adam", **kw), optax.scale_by_learning_rate(0.01))
  _assert_equal(_run(mine, samples)[0], _optax_run(optax.adam(0.01, **kw), samples))
  # Through build_optimizer: AdamW with weight decay, and Adam with global-norm clipping.
  const = ScheduleConfig(name="constant", warmup_steps=0)
  adamw = build_optimizer(optimizer_config(name="adamw", lr=0.01, weight_decay=0.1, **kw), const,
                          total_steps=STEPS, batch_size=B)
  _assert_equal(_run(adamw.tx, samples)[0],
                _optax_run(optax.adamw(0.01, weight_decay=0.1, **kw), samples))
  clipped = build_optimizer(optimizer_config(name="adam", lr=0.01, clip_norm=0.5, **kw), const,
                            total_steps=STEPS, batch_size=B)
  _assert_equal(_run(clipped.tx, samples)[0],
                _optax_run(optax.chain(optax.clip_by_global_norm(0.5), optax.adam(0.01, **kw)),
                           samples))


def test_micro_adam_with_batch_of_one_equals_adam():
  samples = _samples(seed=6, n=1)
  adam, _ = _run(scale_by_adam_family("adam", **ADAM_KW), samples)
  for variant in ("micro_adam", "micro_adam_msq"):  # equal up to XLA's float32 rounding
    _assert_close(_run(scale_by_adam_family(variant, **ADAM_KW), samples)[0], adam, rtol=1e-6,
                  atol=0)


def test_named_variants_are_mix_special_cases():
  samples = _samples(seed=7, n=B)
  stats = _stats(samples[0])
  cases = {"adam": (1.0, 1.0 / B), "micro_adam": (1.0, 1.0), "micro_adam_var": (0.0, 1.0),
           "micro_adam_msq": (1.0, 0.0)}
  for variant, (a, b) in cases.items():
    named = second_moment_statistic(variant, stats.mean, stats)
    mix = second_moment_statistic("mix", stats.mean, stats, mix_a=a, mix_b=b)
    for x, y in zip(jax.tree.leaves(named), jax.tree.leaves(mix), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6, err_msg=variant)
    got, _ = _run(scale_by_adam_family("mix", mix_a=a, mix_b=b, **ADAM_KW), samples)
    _assert_close(got, _run(scale_by_adam_family(variant, **ADAM_KW), samples)[0], rtol=1e-4)


def test_adam_family_clip_scales_statistics_consistently():
  """clip_norm = scaling every g_i by c: same as feeding the scaled samples unclipped."""
  samples = _samples(seed=8, n=B)
  tx = scale_by_adam_family("micro_adam", clip_norm=1.0, **ADAM_KW)
  got, _ = _run(tx, samples)
  scaled = []
  for leaves in samples:
    norm = np.sqrt(sum(np.sum(g.astype(np.float64).mean(0)**2) for g in leaves))
    scaled.append([g * np.float32(min(1.0, 1.0 / norm)) for g in leaves])
  assert any(np.sqrt(sum(np.sum(g.mean(0)**2) for g in leaves)) > 1.0 for leaves in samples)
  _assert_close(got, _adam_reference(scaled, "micro_adam", **ADAM_KW), rtol=1e-4)


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
  for opt, lrs in ((small, lr_small), (large, lr_large)):
    got, _ = _run(opt.tx, samples, want=("mean",))
    want = [[-lrs[k] * g.astype(np.float64).mean(0) for g in leaves]
            for k, leaves in enumerate(samples)]
    _assert_close(got, want)


def test_sde_scaling():
  cfg = optimizer_config(name="adam", lr=1e-3, b1=0.9, b2=0.99, eps=1e-8, eps_root=1e-10,
                        lr_scaling="sqrt", sde_scaling=True, ref_batch_size=16)
  hp = scaled_hparams(cfg, batch_size=64)
  np.testing.assert_allclose([hp.peak_lr, hp.b1, hp.b2, hp.eps, hp.eps_root],
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


# --- build_optimizer over every option ------------------------------------------


def _all_options():
  opts = [optimizer_config(name=n) for n in optimizer_names() if n not in ("sign", "adam_family")]
  opts += [optimizer_config(name="sign", placement=p, lr=1e-3) for p in PLACEMENTS]
  opts += [optimizer_config(name="adam_family", variant=v, mix_b=0.5) for v in VARIANTS]
  opts += [optimizer_config(name="adam_family", variant="micro_adam", clip_norm=1.0,
                           per_example_clip=2.0, weight_decay=0.1, lr_scaling="sqrt",
                           sde_scaling=True),
           optimizer_config(name="sign", placement="example", clip_norm=1.0, weight_decay=0.1,
                           lr_scaling="linear")]
  return opts


@pytest.mark.parametrize("track", [False, True])
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
      assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state)
                 if jnp.issubdtype(x.dtype, jnp.floating)), cfg
      for u, shape in zip(updates, _shape_leaves(), strict=True):
        assert u.shape == shape and np.all(np.isfinite(u)) and np.any(u != 0), cfg
      lrs = np.array([opt.learning_rate(k) for k in range(STEPS)])
      assert np.all(lrs > 0) and np.all(np.isfinite(lrs))
      stats = _stats(_samples(seed=12, n=n, steps=1)[0], req.granularity, req.want)
      diag = jax.jit(diagnostics)(state, stats)
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
    _run(track_snr(0.9), samples, want=("mean",))


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
  with pytest.raises(ValueError, match="unknown schedule"):
    build_optimizer(optimizer_config(), ScheduleConfig(name="linear"), total_steps=10,
                    batch_size=B)


# --- diagnostics ---------------------------------------------------------------------


def test_diagnostics_match_numpy():
  beta, b2 = 0.8, 0.9
  samples = _samples(seed=14, n=B)
  tx = optax.chain(track_snr(beta), scale_by_adam_family("micro_adam", b1=beta, b2=b2))
  _, state = _run(tx, samples)
  stats = _stats(samples[-1])
  got = jax.jit(diagnostics)(state, stats)
  keys = ["a", "blk/kernel", "c"]
  m = [np.zeros(s) for s in _shape_leaves()]
  w = [np.zeros(s) for s in _shape_leaves()]
  v = [np.zeros(s) for s in _shape_leaves()]
  for leaves in samples:
    for i, g in enumerate(leaves):
      g = g.astype(np.float64)
      var = np.var(g, axis=0, ddof=1)
      m[i] = _ema(m[i], g.mean(0), beta)
      w[i] = beta**2 * w[i] + (1 - beta)**2 * var / B
      v[i] = _ema(v[i], np.mean(g**2, axis=0), b2)
  v_hat = [x / (1 - b2**STEPS) for x in v]
  g = [x.astype(np.float64) for x in samples[-1]]
  mean, var = [x.mean(0) for x in g], [np.var(x, axis=0, ddof=1) for x in g]
  mu2 = [a**2 - s / B for a, s in zip(mean, var, strict=True)]
  want = {  # name -> per leaf (numerator, denominator) of the ratio of sums
      "snr2_example": [(u, s) for u, s in zip(mu2, var, strict=True)],
      "snr2_batch": [(u, s / B) for u, s in zip(mu2, var, strict=True)],
      "snr2_ema": [(a**2 - s, s) for a, s in zip(m, w, strict=True)],
      "share_mu2": [(u, d) for u, d in zip(mu2, v_hat, strict=True)],
      "share_var_b": [(s / B, d) for s, d in zip(var, v_hat, strict=True)],
      "share_var": [(s, d) for s, d in zip(var, v_hat, strict=True)],
  }
  assert len(got) == len(want) * (len(keys) + 1)
  for name, per_leaf in want.items():
    for key, (a, b) in zip(keys, per_leaf, strict=True):
      np.testing.assert_allclose(got[f"opt/{key}/{name}"], a.sum() / b.sum(), rtol=1e-4,
                                 err_msg=f"{key}/{name}")
    num, den = sum(a.sum() for a, _ in per_leaf), sum(b.sum() for _, b in per_leaf)
    np.testing.assert_allclose(got[f"opt/all/{name}"], num / den, rtol=1e-4, err_msg=name)
  np.testing.assert_allclose(got["opt/all/snr2_batch"], B * got["opt/all/snr2_example"],
                             rtol=1e-5)  # by construction


def test_diagnostics_without_sq_reports_only_what_it_can():
  opt = build_optimizer(optimizer_config(name="sign", placement="ema"), ScheduleConfig(),
                        total_steps=STEPS, batch_size=B)
  _, state = _run(opt.tx, _samples(seed=15, n=B, steps=2), want=("mean",))
  assert diagnostics(state, _stats(_samples(seed=16, n=B, steps=1)[0], want=("mean",))) == {}


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
  assert set(names) == set(optimizer_names())
  with initialize_config_dir(config_dir=str(tmp_path), version_base="1.3"):
    for name in names:
      for sched in ("cosine", "constant"):
        cfg = compose("probe", overrides=[f"optimizer={name}", f"schedule={sched}"])
        obj = OmegaConf.to_object(cfg)
        assert obj.optimizer.name == name and obj.schedule.name == sched
        assert isinstance(obj.optimizer.lr, float)
        build_optimizer(obj.optimizer, obj.schedule, total_steps=100, batch_size=32)
        build_optimizer(cfg.optimizer, cfg.schedule, total_steps=100, batch_size=32)
    sign = compose("probe", overrides=["optimizer=sign"]).optimizer
    adam = compose("probe", overrides=["optimizer=adam"]).optimizer
    assert sign.lr < adam.lr / 5
