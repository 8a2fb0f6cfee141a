"""The logged estimators against known truth (`pergrad.stats.synthetic`).

The REAL code is driven: `grad_stats` builds the `GradStats` of Gaussian per-example
gradients with known per-coordinate μ_t and σ (summed as the reference backend sums,
checked below), which `track_snr`, `scale_by_adam_family`, `diagnostics`,
`layer_summaries` and `pergrad.stats.noise` consume unchanged. Tolerances come from the
known sampling distribution: an estimator passes when it lies within K = 4 standard
errors of its truth (standard errors by the delta method, `synthetic.ratio_truth`; a
single check fails by chance with probability ≈ 6e-5), and, where many independent draws
are taken, the z-scores must also have a mean and a spread consistent with N(0, 1), which
checks the standard errors themselves. Sizes: ≈ 3,600 coordinates, B = 32 (16 for the zero-signal
source), at most 200 tracker steps.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import stats as sps

from pergrad.optim import diagnostics, scale_by_adam_family, track_snr
from pergrad.optim.moments import Moments
from pergrad.stats import compute, noise, synthetic
from pergrad.stats.summaries import layer_summaries

K = 4.0  # tolerance in standard errors
B = 32
SHAPES = {"dense": {"kernel": (32, 64), "bias": (64,)}, "quiet": (1024,), "loud": (16, 32)}
MU_SCALE = {"dense/kernel": 0.25, "dense/bias": 1.0, "quiet": 0.0, "loud": 0.8}


def _tree(fn):
  """A tree like SHAPES with fn(key, shape) at each leaf."""
  def walk(node, prefix):
    if isinstance(node, dict):
      return {k: walk(v, f"{prefix}/{k}" if prefix else k) for k, v in node.items()}
    return fn(prefix, node)
  return walk(SHAPES, "")


KEYS = tuple(jax.tree.leaves(_tree(lambda k, s: k)))  # leaf keys, in tree order


def _leaves(tree):
  return dict(zip(KEYS, jax.tree.leaves(tree), strict=True))


def _source(seed=0, mu_factor=1.0, noise_seed=None, **kw):
  """μ (scaled by mu_factor) and σ drawn from `seed`; samples from `noise_seed` (= seed)."""
  rng = np.random.default_rng(100 + seed)
  mu = _tree(lambda k, s: mu_factor * MU_SCALE[k] * rng.standard_normal(s))
  sigma = _tree(lambda k, s: rng.uniform(0.5, 2.0, s))
  return synthetic.GaussianSource(mu, sigma, seed=seed if noise_seed is None else noise_seed,
                                  **kw)


def _batch_truth(src, n, key=None, stage="batch"):
  """(R, se) of snr2_<stage> for one leaf (or all coordinates if key is None)."""
  mu, var = _leaves(src.mean), _leaves(src.variance)
  keys = KEYS if key is None else (key,)
  M = np.concatenate([mu[k].ravel() for k in keys])
  s2 = np.concatenate([var[k].ravel() for k in keys])
  return synthetic.ratio_truth(M, s2 / n, synthetic.var_of_variance(s2, n) / n**2,
                               c=n if stage == "example" else 1.0)


_diag = jax.jit(diagnostics)
_summ = jax.jit(layer_summaries)


def _check_z(zs, what):
  zs = np.asarray(zs)
  assert np.all(np.abs(zs) < 5), (what, zs)
  assert abs(zs.mean()) < K / np.sqrt(zs.size), (what, zs.mean())
  assert 0.6 < zs.std() < 1.5, (what, zs.std())  # the standard errors are right


# --- the source -------------------------------------------------------------------------


def test_grad_stats_sums_as_the_reference_backend():
  """grad_stats == the loop backend on a linear loss whose gradients are the samples."""
  src = _source(seed=1)
  samples = src.step(4)

  def loss_fn(params, batch):  # per-example loss ⟨θ, g_b⟩: ∇_θ = g_b
    return sum(jnp.sum(p[None] * g, axis=tuple(range(1, g.ndim)))
               for p, g in zip(jax.tree.leaves(params), jax.tree.leaves(batch), strict=True))

  params = jax.tree.map(lambda x: jnp.zeros(x.shape[1:], jnp.float32), samples)
  _, ref = compute(loss_fn, params, samples, want=("mean", "sq", "norms"), backend="loop")
  got = synthetic.grad_stats(samples)
  for a, b in ((got.sum, ref.sum), (got.sum_sq, ref.sum_sq), (got.sq_norms, ref.sq_norms)):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
      np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  assert float(got.count) == 4.0


def test_source_moments_and_drift():
  """The samples have the stated mean and std; the AR(1) drift has the stated std and ρ."""
  src = _source(seed=2)
  g = src.step(2000)["loud"]
  mu, sd = src.mean["loud"], np.sqrt(src.variance["loud"])
  z = (g.mean(0) - mu) / (sd / np.sqrt(2000))
  assert abs(z.mean()) < K / np.sqrt(z.size) and 0.9 < z.std() < 1.1
  tau, rho = 0.1, 0.8
  src = synthetic.GaussianSource({"w": np.zeros(4000)}, {"w": 1.0}, walk_std=tau, rho=rho)
  d0 = src.mean["w"].copy()
  src.step(1)
  src.step(1)
  d1 = src.mean["w"]
  s = tau / np.sqrt(1 - rho**2)
  assert abs(d0.std() / s - 1) < K * np.sqrt(0.5 / 4000)
  assert abs(np.corrcoef(d0, d1)[0, 1] - rho) < K * (1 - rho**2) / np.sqrt(4000)


# --- example and batch stages, summaries -------------------------------------------------


def test_snr2_example_and_batch_recover_truth():
  """30 independent steps: per leaf and over all coordinates, snr2_example and snr2_batch
  (diagnostics) match Σμ²/Σσ² and Σμ²/(Σσ²/B); mu2_mean and var_mean (summaries) match
  mean μ² and mean σ²."""
  src = _source(seed=3)
  zs = {k: [] for k in ("example", "batch", "mu2_mean", "var_mean")}
  for _ in range(30):
    stats = synthetic.grad_stats(src.step(B), want=("mean", "sq"))
    d, s = _diag(stats), _summ(stats)
    mu, var = _leaves(src.mean), _leaves(src.variance)
    for key in (*KEYS, None):
      dk, sk = (f"opt/{key}", f"stats/{key}") if key else ("opt/all", "stats/total")
      for stage in ("example", "batch"):
        R, se = _batch_truth(src, B, key, stage)
        zs[stage].append((float(d[f"{dk}/snr2_{stage}"]) - R) / se)
      np.testing.assert_allclose(d[f"{dk}/snr2_batch"], B * d[f"{dk}/snr2_example"],
                                 rtol=1e-5)  # by construction
      if key is None:
        continue
      m2, s2 = mu[key].ravel(), var[key].ravel()
      D = m2.size
      se_mu2 = np.sqrt(np.sum(4 * m2**2 * s2 / B + 2 * s2**2 / B**2
                              + synthetic.var_of_variance(s2, B) / B**2)) / D
      zs["mu2_mean"].append((float(s[f"{sk}/mu2_mean"]) - np.mean(m2**2)) / se_mu2)
      se_var = np.sqrt(np.sum(synthetic.var_of_variance(s2, B))) / D
      zs["var_mean"].append((float(s[f"{sk}/var_mean"]) - np.mean(s2)) / se_var)
  for what, z in zs.items():
    _check_z(z, what)
  R, se = _batch_truth(src, B)
  print(f"\nsnr2_batch (all): last {float(d['opt/all/snr2_batch']):.4f}, truth {R:.4f} ± {se:.4f}")


def test_noise_scale_recovers_trace_and_signal():
  """GNS from per-example norms (`noise.group_terms`, whole model): over 20 steps the mean
  of |G|² recovers Σμ², of S recovers tr Σ = Σσ², and their ratio B_simple = tr Σ / |μ|²;
  each step's S/|G|² is 1 / the whole-model snr2_example of the diagnostics."""
  src = _source(seed=4)
  steps = 20
  G2, S = [], []
  groups = noise.groups_of(noise.leaf_paths(src.mean))
  for _ in range(steps):
    stats = synthetic.grad_stats(src.step(B), want=("mean", "sq", "norms"))
    g2, s = (float(t[noise.TOTAL]) for t in noise.group_terms(stats, groups))
    G2.append(g2)
    S.append(s)
    np.testing.assert_allclose(g2 / s, _diag(stats)["opt/all/snr2_example"],
                               rtol=1e-3)  # per-example norms vs coordinate sums
  mu2 = np.concatenate([x.ravel() for x in jax.tree.leaves(src.mean)]) ** 2
  s2 = np.concatenate([x.ravel() for x in jax.tree.leaves(src.variance)])
  var_s2 = synthetic.var_of_variance(s2, B)
  var_G2 = np.sum(4 * mu2 * s2 / B + 2 * s2**2 / B**2 + var_s2 / B**2) / steps
  var_S = np.sum(var_s2) / steps
  cov = -np.sum(var_s2) / B / steps  # Cov(Σμ̂², Σσ̂²) = −Σ Var(σ̂²)/B
  g2, sm = np.mean(G2), np.mean(S)
  assert abs(g2 - mu2.sum()) < K * np.sqrt(var_G2), (g2, mu2.sum())
  assert abs(sm - s2.sum()) < K * np.sqrt(var_S), (sm, s2.sum())
  b_true = s2.sum() / mu2.sum()
  se_b = b_true * np.sqrt(var_S / s2.sum()**2 + var_G2 / mu2.sum()**2
                          - 2 * cov / (s2.sum() * mu2.sum()))
  assert abs(sm / g2 - b_true) < K * se_b, (sm / g2, b_true, se_b)
  print(f"\nGNS: |G|² {g2:.2f} (Σμ² {mu2.sum():.2f}), S {sm:.1f} (Σσ² {s2.sum():.1f}), "
        f"B_simple {sm / g2:.2f} (truth {b_true:.2f} ± {se_b:.2f})")


# --- EMA stage ----------------------------------------------------------------------------


def _run_tracker(src, beta, steps, checkpoints, adam=None):
  """Drives track_snr(β) (and an Adam-family transform) on the source; at each checkpoint
  t returns (diagnostics, EmaTruth copy, true mean, true variance)."""
  tracker = track_snr(beta)
  tx = adam if adam is not None else optax.with_extra_args_support(optax.identity())
  params = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), src.mean)
  snr, state = tracker.init(params), tx.init(params)
  update = jax.jit(lambda g, s, st: tx.update(g, s, params, grad_stats=st))
  track = jax.jit(tracker.update)
  truth = {k: synthetic.EmaTruth(beta) for k in KEYS}
  out = {}
  for t in range(1, steps + 1):
    stats = synthetic.grad_stats(src.step(B), want=("mean", "sq"))
    _, state = update(stats.mean, state, stats)
    snr = track(snr, stats)
    mu, var = _leaves(src.mean), _leaves(src.variance)
    for k in KEYS:
      truth[k].update(mu[k], var[k], B)
    if t in checkpoints:
      moments = None if adam is None else Moments(state, eps=0.0, eps_root=0.0)
      out[t] = (_diag(stats, moments, snr), {k: (v.M, v.W, v.U) for k, v in truth.items()}, mu,
                var)
  return out


def _ema_truth(tr, key=None):
  keys = KEYS if key is None else (key,)
  cat = lambda i: np.concatenate([np.ravel(tr[k][i]) for k in keys])
  return synthetic.ratio_truth(cat(0), cat(1), cat(2))


def _gain2_and_se(d, tr, mu, var):
  """Measured gain² = snr2_ema / snr2_batch (all), its truth for this path and its se."""
  Re, se_e = _ema_truth(tr)
  M = np.concatenate([mu[k].ravel() for k in KEYS])
  s2 = np.concatenate([var[k].ravel() for k in KEYS])
  Rb, se_b = synthetic.ratio_truth(M, s2 / B, synthetic.var_of_variance(s2, B) / B**2)
  g2 = float(d["opt/all/snr2_ema"]) / float(d["opt/all/snr2_batch"])
  # ratio of two estimates (positively correlated through the last step: this se is
  # conservative)
  return g2, Re / Rb, Re / Rb * np.hypot(se_e / Re, se_b / Rb)


def test_ema_snr_and_gain_constant_mean():
  """Constant μ, β = 0.9: snr2_ema matches its truth at t = 3, 10, 30, 200 (transient
  included) per leaf and overall, and the gain² → (1+β)/(1−β)·(1−β^t)/(1+β^t)."""
  beta = 0.9
  checkpoints = (3, 10, 30, 200)
  res = _run_tracker(_source(seed=5), beta, 200, checkpoints)
  zs = []
  for t, (d, tr, mu, var) in res.items():
    for key in (*KEYS, None):
      R, se = _ema_truth(tr, key)
      zs.append((float(d[f"opt/{key or 'all'}/snr2_ema"]) - R) / se)
    g2, g2_path, se = _gain2_and_se(d, tr, mu, var)
    pred = synthetic.ema_gain2(beta, 1.0, t)
    np.testing.assert_allclose(g2_path, pred, rtol=1e-9)  # constant mean: no path noise
    assert abs(g2 - pred) < K * se, (t, g2, pred, se)
    print(f"\nconstant mean, t={t}: gain {np.sqrt(g2):.3f}, predicted {np.sqrt(pred):.3f} "
          f"(stationary √((1+β)/(1−β)) = {np.sqrt(synthetic.ema_gain2(beta)):.3f})")
  _check_z(zs, "snr2_ema")
  assert synthetic.ema_gain2(beta, 1.0, 200) == pytest.approx((1 + beta) / (1 - beta))


def test_ema_gain_smaller_with_drift():
  """μ = 0 plus an AR(1) drift (ρ = 0.9, stationary std s): snr2_ema matches its truth on
  the realized path, and the gain² matches (1+βρ)/(1−βρ) = 9.53 (not (1+β)/(1−β) = 19)
  within estimator + path sampling error."""
  beta, rho, steps = 0.9, 0.9, 200
  s = 0.35  # batch SNR² ≈ s² / (E σ² / B) ≈ 2.2
  src = _source(seed=6, mu_factor=0.0, walk_std=s * np.sqrt(1 - rho**2), rho=rho)
  (d, tr, mu, var), = _run_tracker(src, beta, steps, (steps,)).values()
  for key in (*KEYS, None):
    R, se = _ema_truth(tr, key)
    assert abs(float(d[f"opt/{key or 'all'}/snr2_ema"]) - R) < K * se, key
  g2, g2_path, se_est = _gain2_and_se(d, tr, mu, var)
  assert abs(g2 - g2_path) < K * se_est, (g2, g2_path, se_est)
  # Path noise of Σ(E m)²/Σμ_t² over D coordinates (bivariate normal (E m_t, μ_t) with
  # variances a, b and covariance c): Var ≈ 4r(r − c²/b²)/D, r = a/b; the gain² is
  # (1+β)/(1−β) times that ratio at stationarity.
  D = sum(x.size for x in mu.values())
  r = (1 - beta) * (1 + beta * rho) / ((1 + beta) * (1 - beta * rho))
  cb = (1 - beta) / (1 - beta * rho)
  se_path = (1 + beta) / (1 - beta) * np.sqrt(4 * r * (r - cb**2) / D)
  pred = synthetic.ema_gain2(beta, rho)
  assert abs(g2 - pred) < K * np.hypot(se_est, se_path), (g2, pred, se_est, se_path)
  const = synthetic.ema_gain2(beta)
  assert g2 + K * np.hypot(se_est, se_path) < const  # smaller than a constant mean's
  print(f"\ndrift ρ={rho}: gain {np.sqrt(g2):.3f}, on this path {np.sqrt(g2_path):.3f}, "
        f"predicted √((1+βρ)/(1−βρ)) = {np.sqrt(pred):.3f}; constant mean {np.sqrt(const):.3f}")
  # finite-t formula at stationarity start matches the closed form
  assert synthetic.ema_gain2(beta, rho, 400) == pytest.approx(pred, rel=1e-6)


# --- Adam shares --------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["adam", "micro_adam"])
def test_adam_shares_recover_truth(variant):
  """share_mu2 = Σμ̂²/Σv̂, share_var_b = Σ(σ̂²/B)/Σv̂, share_var = Σσ̂²/Σv̂ against
  Σμ²/ΣE v̂ etc., with E v̂ = μ² + σ²/B (adam) or μ² + σ² (micro_adam) at every t."""
  b2, steps = 0.95, 100
  src = _source(seed=7)
  (d, _, mu, var), = _run_tracker(src, 0.9, steps, (steps,),
                                  adam=scale_by_adam_family(variant, b1=0.9, b2=b2)).values()
  w = (1 - b2) * b2 ** np.arange(steps) / (1 - b2**steps)  # weights of v̂ over the steps
  out = {}
  for key in (*KEYS, None):
    keys = KEYS if key is None else (key,)
    m2 = np.concatenate([mu[k].ravel() for k in keys]) ** 2
    s2 = np.concatenate([var[k].ravel() for k in keys])
    vs2 = synthetic.var_of_variance(s2, B)
    if variant == "adam":  # v averages ḡ²
      Ev, var_s = m2 + s2 / B, 4 * m2 * s2 / B + 2 * s2**2 / B**2
    else:  # v averages q = mean g_i²
      Ev, var_s = m2 + s2, (4 * m2 * s2 + 2 * s2**2) / B
    C, sd_C = Ev.sum(), np.sqrt(var_s.sum() * np.sum(w**2))
    nums = {"share_mu2": (m2.sum(), np.sqrt(np.sum(4 * m2 * s2 / B + 2 * s2**2 / B**2
                                                   + vs2 / B**2))),
            "share_var_b": (s2.sum() / B, np.sqrt(vs2.sum()) / B),
            "share_var": (s2.sum(), np.sqrt(vs2.sum()))}
    for name, (A, sd_A) in nums.items():
      R = A / C
      se = (sd_A + R * sd_C) / C  # bound on the delta-method se for any correlation
      got = float(d[f"opt/{key or 'all'}/{name}"])
      assert abs(got - R) < K * se, (variant, key, name, got, R, se)
      if key is None:
        out[name] = (got, R)
  print(f"\n{variant}: " + ", ".join(f"{k} {g:.3f} (truth {r:.3f})" for k, (g, r) in out.items()))


# --- medians over coordinates sit on a noise floor; ratios of sums do not ---------------


def test_zero_signal_medians_on_floor_ratios_of_sums_at_zero():
  """μ = 0 everywhere (B = 16, 3,648 coordinates): a median over coordinates of
  √n|ḡ|/σ̂ sits at the median of |t_15| ≈ 0.69 (and that of |m|/√V at the median of
  |t_143| ≈ 0.68, ≈ |N(0,1)|'s 0.67), while snr2_batch and snr2_ema are 0 within their
  standard error."""
  n, beta = 16, 0.9
  src = _source(seed=8, mu_factor=0.0)
  tracker = track_snr(beta)
  params = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), src.mean)
  state = tracker.init(params)
  update = jax.jit(tracker.update)
  truth = synthetic.EmaTruth(beta)
  var_all = np.concatenate([x.ravel() for x in jax.tree.leaves(src.variance)])
  for _ in range(50):
    stats = synthetic.grad_stats(src.step(n), want=("mean", "sq"))
    state = update(state, stats)
    truth.update(np.zeros_like(var_all), var_all, n)
  d = _diag(stats, snr=state)
  flat = lambda t: np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(t)])
  gbar, sd = flat(stats.mean), np.sqrt(flat(stats.variance))
  old_batch = np.median(np.sqrt(n) * np.abs(gbar) / sd)  # the removed snr_batch
  m, V = flat(state.mu), flat(state.var_mu)
  old_ema = np.median(np.abs(m) / np.sqrt(V))  # the removed snr_ema
  D = gbar.size
  # √n ḡ/σ̂ is t_{n−1}; m/√V is ≈ t with Satterthwaite's (n−1)(1+β²)/(1−β²) ≈ 143 dof
  # (V sums σ̂²'s with weights ∝ β^2k), asymptotically N(0, 1)
  dof_e = (n - 1) * (1 + beta**2) / (1 - beta**2)
  floor_b, floor_e = sps.t.ppf(0.75, n - 1), sps.t.ppf(0.75, dof_e)
  se_med = lambda f: np.sqrt(0.25 / D) / f  # se of a sample median, f: density there
  assert abs(old_batch - floor_b) < K * se_med(2 * sps.t.pdf(floor_b, n - 1))
  assert abs(old_ema - floor_e) < K * se_med(2 * sps.t.pdf(floor_e, dof_e))
  _, se_b = synthetic.ratio_truth(np.zeros(D), var_all / n, synthetic.var_of_variance(
      var_all, n) / n**2)
  _, se_e = synthetic.ratio_truth(np.zeros(D), truth.W, truth.U)
  new_b, new_e = float(d["opt/all/snr2_batch"]), float(d["opt/all/snr2_ema"])
  assert abs(new_b) < K * se_b and abs(new_e) < K * se_e
  assert old_batch > 0.6 and abs(new_b) < 0.2  # the floor vs zero, in plain numbers
  print(f"\nzero signal, B={n}, D={D}: OLD median √n|ḡ|/σ̂ = {old_batch:.3f} (median |t_{n - 1}|"
        f" = {floor_b:.3f}), OLD median |m|/√V = {old_ema:.3f} (median |t_{dof_e:.0f}| = "
        f"{floor_e:.3f}); NEW snr2_batch = {new_b:+.4f} ± {se_b:.4f} (SNR √max(·,0) = "
        f"{np.sqrt(max(new_b, 0)):.3f}), snr2_ema = {new_e:+.4f} ± {se_e:.4f}")


def test_new_estimator_separates_two_known_snrs():
  """Sources with batch SNR² R and 2R (μ scaled by √2; independent samples): the new
  estimator recovers both and tells them apart beyond K combined standard errors."""
  got = []
  for noise_seed, factor in ((9, 1.0), (10, np.sqrt(2.0))):
    src = _source(seed=9, mu_factor=factor, noise_seed=noise_seed)
    d = _diag(synthetic.grad_stats(src.step(B), want=("mean", "sq")))
    R, se = _batch_truth(src, B)
    assert abs(float(d["opt/all/snr2_batch"]) - R) < K * se
    got.append((float(d["opt/all/snr2_batch"]), R, se))
  (a, Ra, sa), (b, Rb, sb) = got
  assert Rb == pytest.approx(2 * Ra)
  assert b - a > K * np.hypot(sa, sb), got
  print(f"\nseparation: snr2_batch {a:.3f} (truth {Ra:.3f}) vs {b:.3f} (truth {Rb:.3f})")
