"""Parity tests of pergrad.optim's transformations and diagnostics against NumPy references
and optax, on every leaf (building from configs: tests/test_optim_build.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pergrad.optim import (
  PLACEMENTS,
  VARIANTS,
  ScheduleConfig,
  build_optimizer,
  diagnostics,
  optimizer_config,
  scale_by_adam_family,
  scale_by_sign_placement,
  second_moment_statistic,
  track_snr,
)
from pergrad.optim.moments import Moments
from pergrad.stats.types import GradStats

SHAPES = {"a": (3,), "blk": {"kernel": (4, 5)}, "c": (2, 3, 2)}
B, T, STEPS = 6, 3, 10


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
      coordinate_stats={
          **({"sq": tree(lambda g: (g.astype(np.float64)**2).sum(0).astype(np.float32))}
             if "sq" in want else {}),
          **({"sign": tree(lambda g: np.sign(g).sum(0))} if "sign" in want else {})},
      granularity=granularity)


def _run(tx, samples, granularity="example", want=("mean", "sq", "sign"), params=None,
         max_batch_size=B):
  """Runs tx for len(samples) steps (update k after k·max_batch_size examples, as the train step
  passes them); returns per-step updates as lists of leaves."""
  params = _params() if params is None else params
  state = tx.init(params)
  update = jax.jit(lambda g, s, p, st, seen: tx.update(
      g, s, p, grad_stats=st, examples_seen=seen, batch_size=max_batch_size))
  out = []
  for k, leaves in enumerate(samples):
    stats = _stats(leaves, granularity, want)
    updates, state = update(stats.mean, state, params, stats, jnp.int32(k * max_batch_size))
    out.append([np.asarray(u) for u in jax.tree.leaves(updates)])
  return out, state


def _track(tracker, samples, want=("mean", "sq", "sign"), hparams=None):
  """The state of `tracker` (`pergrad.optim.tracker.Tracker`) after len(samples) steps;
  `hparams`: the optimizer's numbers it may read (`Optimizer.hparams`)."""
  state = tracker.init(_params())
  update = jax.jit(tracker.update)
  for leaves in samples:
    state = update(state, _stats(leaves, "example", want), hparams)
  return state


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
  # Through build_optimizer, whose state holds its numbers (float32): AdamW with weight
  # decay, and Adam with global-norm clipping, equal optax's with its numbers injected.
  const = ScheduleConfig(name="constant", warmup_steps=0)
  held = optax.inject_hyperparams
  adamw = build_optimizer(optimizer_config(name="adamw", lr=0.01, weight_decay=0.1, **kw), const,
                          total_steps=STEPS, batch_size=B)
  _assert_equal(_run(adamw.tx, samples)[0],
                _optax_run(held(optax.adamw)(0.01, weight_decay=0.1, **kw), samples))
  clipped = build_optimizer(optimizer_config(name="adam", lr=0.01, clip_norm=0.5, **kw), const,
                            total_steps=STEPS, batch_size=B)
  ref = optax.chain(optax.clip_by_global_norm(0.5), held(optax.adam)(0.01, **kw))
  _assert_equal(_run(clipped.tx, samples)[0], _optax_run(ref, samples))


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


# --- diagnostics ---------------------------------------------------------------------


def test_diagnostics_match_numpy():
  beta, b2 = 0.8, 0.9
  samples = _samples(seed=14, n=B)
  _, state = _run(scale_by_adam_family("micro_adam", b1=beta, b2=b2), samples)
  snr = _track(track_snr(beta), samples)
  stats = _stats(samples[-1])
  got = jax.jit(diagnostics)(stats, Moments(state, eps=1e-8, eps_root=0.0), snr)
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
  assert len(got) == (len(want) + 2) * (len(keys) + 1)  # and eps_share(_weighted)
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
  assert opt.moments(state) is None
  assert diagnostics(_stats(_samples(seed=16, n=B, steps=1)[0], want=("mean",))) == {}
