"""pergrad.stats.sign_agreement on the synthetic Gaussian source, whose per-coordinate
agreement probability is known: Φ(|μ|√B/σ) for a batch mean, Φ(|E m|/√Var m) for an EMA."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from pergrad.stats import sign_agreement as sa
from pergrad.stats.synthetic import EmaTruth, GaussianSource, grad_stats

B, H, D = 32, 512, 10000  # batch, held-out samples, coordinates per leaf


def _source(seed=0, d=D, top=3.0):
  """Two leaves: 'w' with SNR |μ|√B/σ spread over [0, top] and 30 % exact zeros; 'norm'
  with a strong signal everywhere."""
  rng = np.random.default_rng(seed)
  snr = rng.uniform(0.0, top, d) * (rng.uniform(size=d) > 0.3) * rng.choice([-1, 1], d)
  sigma = {"w": rng.uniform(0.5, 2.0, d), "norm": np.full(d // 10, 0.3)}
  mu = {"w": snr * sigma["w"] / math.sqrt(B), "norm": np.full(d // 10, 0.2)}
  return GaussianSource(mu, sigma, seed=seed), mu, sigma


def _truth(p_SxD, select):
  """Mean of the known agreement probability over the selected coordinates."""
  return float(np.mean(p_SxD[select]))


def _held_out(src, n=H):
  st = grad_stats(src.step(n), want=("mean", "sq"))
  return st, {k: np.asarray(v) for k, v in st.mean.items()}, {
      k: np.asarray(v) for k, v in st.variance.items()}


def test_batch_mean_agreement_recovers_truth_naive_is_biased():
  src, mu, sigma = _source()
  batch = src.step(B)
  u = {k: np.asarray(x).mean(0) for k, x in batch.items()}
  heldout, h, v = _held_out(src)
  c = sa.counts(u["w"], h["w"], v["w"], H)
  p = sps.norm.cdf(np.abs(mu["w"]) * math.sqrt(B) / sigma["w"])  # 1/2 where μ = 0
  sel = h["w"] ** 2 * H / v["w"] >= sa.Z**2
  truth_s = _truth(p, sel)
  n_s = float(c.selected)
  assert n_s == sel.sum() and 0.3 < float(sa.share_resolved(c)) < 0.7
  se = math.sqrt(truth_s * (1 - truth_s) / n_s)
  assert abs(float(sa.agreement(c)) - truth_s) < 4 * se + float(sa.bias_bound(c)), (
      float(sa.agreement(c)), truth_s)
  assert float(sa.bias_bound(c)) < 0.01  # measured: A_S 0.950 vs 0.955 on 48 % of coords
  # raw (all coordinates, no selection): E = 1/2 + mean c_u c_h / 2, attenuated below the
  # all-coordinate truth by the held-out mean's own sign noise; with a held-out batch as
  # small as B the attenuation is large.
  for n_h in (H, B):
    st = grad_stats(src.step(n_h), want=("mean", "sq"))
    raw = sa.raw_agreement(sa.counts(u["w"], st.mean["w"], st.variance["w"], n_h))
    p_h = sps.norm.cdf(np.abs(mu["w"]) * math.sqrt(n_h) / sigma["w"])
    expected_raw = 0.5 + 0.5 * np.mean((2 * p - 1) * (2 * p_h - 1))
    assert float(raw) == pytest.approx(expected_raw, abs=4 * 0.5 / math.sqrt(D))
  assert expected_raw < p.mean() - 0.03 and float(raw) < p.mean() - 0.03  # 0.72 vs 0.76
  # Naive: E g estimated from the same batch as u. For the batch-mean placement sign u and
  # sign h are the same numbers: agreement 1, against a truth of about 0.8.
  naive = sa.counts(u["w"], u["w"], np.asarray(grad_stats(batch, ("mean", "sq")).variance["w"]),
                    B, z=0.0)
  assert float(sa.agreement(naive)) == 1.0 and p.mean() < 0.85
  # alignment: Σ|μ|(2p − 1) / √(D Σμ²), within a few standard errors.
  true_align = np.sum(np.abs(mu["w"]) * (2 * p - 1)) / math.sqrt(D * np.sum(mu["w"] ** 2))
  assert float(sa.alignment(c)) == pytest.approx(true_align, rel=0.05)


def test_ema_agreement_recovers_truth_naive_is_biased():
  """The EMA's SNR is √((1+β)/(1−β)) = 4.4 times the batch mean's, so a coordinate that a
  held-out set of n_h resolves (|μ|√n_h/σ ≳ 4) has EMA agreement ≈ 1 unless n_h ≫
  B (4 · 4.4)²: here a weak signal and n_h = 256 B, so that A_S is not trivially 1."""
  beta, steps, n_h, d = 0.9, 40, 256 * B, 1500
  src, mu, sigma = _source(seed=1, d=d, top=0.5)
  truth = EmaTruth(beta)
  m = {k: np.zeros_like(x) for k, x in mu.items()}
  for _ in range(steps):
    last = src.step(B)
    m = {k: beta * m[k] + (1 - beta) * np.asarray(last[k]).mean(0) for k in m}
    truth.update(mu["w"], sigma["w"] ** 2, B)
  p = sps.norm.cdf(np.abs(truth.M) / np.sqrt(truth.W))
  heldout, h, v = _held_out(src, n_h)
  c = sa.counts(m["w"], h["w"], v["w"], n_h)
  sel = h["w"] ** 2 * n_h / v["w"] >= sa.Z**2
  truth_s = _truth(p, sel)
  se = math.sqrt(truth_s * (1 - truth_s) / float(c.selected))
  assert truth_s < 0.97 and float(c.selected) > 300
  assert abs(float(sa.agreement(c)) - truth_s) < 4 * se + float(sa.bias_bound(c))
  # The EMA agrees more often than one batch mean would, and the alignment shows it.
  p_batch = sps.norm.cdf(np.abs(mu["w"]) * math.sqrt(B) / sigma["w"])
  assert p.mean() > p_batch.mean() + 0.05
  align = lambda q: np.sum(np.abs(mu["w"]) * (2 * q - 1)) / math.sqrt(d * np.sum(mu["w"] ** 2))
  assert float(sa.alignment(c)) == pytest.approx(align(p), rel=0.1)
  assert align(p) > 1.5 * align(p_batch)
  # Naive: E g from the last batch, which is part of m (weight 1 − β). Against an
  # independent batch of the same size the agreement is lower; the same-batch one is
  # biased up.
  v_last = np.asarray(grad_stats(last, ("mean", "sq")).variance["w"])
  naive = sa.raw_agreement(sa.counts(m["w"], np.asarray(last["w"]).mean(0), v_last, B))
  fresh = grad_stats(src.step(B), want=("mean", "sq"))
  honest = sa.raw_agreement(sa.counts(m["w"], fresh.mean["w"], fresh.variance["w"], B))
  expected = 0.5 + 0.5 * np.mean((2 * p - 1) * (2 * p_batch - 1))
  assert float(honest) == pytest.approx(expected, abs=4 * 0.5 / math.sqrt(d))
  assert float(naive) > float(honest) + 0.02, (float(naive), float(honest))


def test_per_leaf_pools_counts_and_summary():
  src, mu, sigma = _source(seed=2)
  u = {k: np.asarray(x).mean(0) for k, x in src.step(B).items()}
  heldout, h, v = _held_out(src)
  leaves = sa.per_leaf(u, heldout)
  assert set(leaves) == {"w", "norm", "total"}
  total = leaves["total"]
  assert float(total.coords) == D + D // 10
  assert float(total.agree) == float(leaves["w"].agree) + float(leaves["norm"].agree)
  assert float(sa.agreement(leaves["norm"])) > 0.99  # |μ|√B/σ = 3.8 everywhere
  s = sa.summary(total)
  assert set(s) == {"agree", "resolved", "agree_raw", "bias_bound", "alignment"}
  with pytest.raises(ValueError, match="'sq'"):
    sa.per_leaf(u, grad_stats(src.step(4), want=("mean",)))


def test_jittable_and_empty_selection():
  import jax

  c = jax.jit(sa.counts, static_argnames="z")(np.ones(5), np.full(5, 1e-3), np.ones(5), 8.0)
  assert float(c.selected) == 0 and math.isnan(float(sa.agreement(c)))
  assert float(sa.raw_agreement(c)) == 1.0


def test_lagged_target_follows_a_drifting_mean():
  """An EMA m of batch means points along past means: with a mean drifting as an AR(1) of
  correlation time ≈ the EMA's window, m agrees with the lagged target h̄ (ρ = β, one
  logging step per update) at its known rate P(sign m = sign E m) = Φ(|M|/√W), and with
  the current held-out mean at the lower known rate Φ(sign(μ_t) M/√W); alignment too."""
  beta, steps, n_h, d, s = 0.9, 40, 2048, 2000, 0.1  # s: the drift's stationary std
  src = GaussianSource({"w": np.zeros(d)}, 1.0, walk_std=s * math.sqrt(1 - 0.81), rho=0.9,
                       seed=3)
  truth, lag, m = EmaTruth(beta), sa.lag_init({"w": np.zeros(d)}), np.zeros(d)
  for _ in range(steps):
    x = src.step(B + n_h)["w"]  # the batch and the held-out set, at the same μ_t
    m = beta * m + (1 - beta) * x[:B].mean(0)
    truth.update(src.mean["w"], 1.0, B)
    now = sa.current(grad_stats({"w": x[B:]}, ("mean", "sq")))
    lag = sa.lag_update(lag, now, beta)
  got = {}
  for name, t, p in (
      ("current", now, sps.norm.cdf(np.sign(src.mean["w"]) * truth.M / np.sqrt(truth.W))),
      ("lagged", sa.lagged(lag), sps.norm.cdf(np.abs(truth.M) / np.sqrt(truth.W)))):
    c = sa.per_leaf({"w": m}, t)["total"]
    sel = np.asarray(t.mean["w"]) ** 2 * float(t.count) / np.asarray(t.var["w"]) >= sa.Z**2
    truth_s = _truth(p, sel)
    se = math.sqrt(truth_s * (1 - truth_s) / float(c.selected))
    assert float(c.selected) == sel.sum() > 300, name
    assert abs(float(sa.agreement(c)) - truth_s) < 4 * se + float(sa.bias_bound(c)), (
        name, float(sa.agreement(c)), truth_s)
    got[name] = (float(sa.agreement(c)), float(sa.alignment(c)))
  assert got["lagged"][0] > got["current"][0] + 0.03, got  # measured 0.90 vs 0.85
  assert got["lagged"][1] > got["current"][1] + 0.1, got  # measured 0.68 vs 0.50


def test_lag_state_is_a_debiased_ema_of_heldout_means():
  """h̄/a and w/a² are the weighted mean of the held-out means and its variance; the first
  step's lagged target is the current one (t² = h²n/v̂)."""
  rho, h, v, n = 0.5, [np.array([1.0, -2.0]), np.array([3.0, 0.5])], np.array([4.0, 1.0]), 8.0
  st = sa.lag_update(sa.lag_init(np.zeros(2)), sa.Target(h[0], v, n), rho)
  first = sa.lagged(st)
  np.testing.assert_allclose(first.mean, h[0])
  np.testing.assert_allclose(first.var, v / n)
  st = sa.lag_update(st, sa.Target(h[1], v, n), rho)
  a = np.array([rho, 1.0]) * (1 - rho) / (1 - rho**2)  # weights of h_1, h_2
  out = sa.lagged(st)
  np.testing.assert_allclose(out.mean, a[0] * h[0] + a[1] * h[1], rtol=1e-6)
  np.testing.assert_allclose(out.var, (a**2).sum() * v / n, rtol=1e-6)
  assert float(out.count) == 1.0
